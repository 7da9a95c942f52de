"""A tiny GGUF chat model for agents on a real llama-server: it answers every turn with one
word and stops, and it reads a 100,000-character prompt in seconds on a CPU.

An agent CLI sends tens of thousands of characters a turn (system prompt, tool schemas) and
ends only on a stop; a random-weight model (tinygguf.py) reads them a byte a token and
never stops. This one is built so that neither happens, with llama.cpp's own machinery:

- **A bigram model.** One llama layer whose attention and feed-forward output weights
  (``attn_output``, ``ffn_down``) are zero adds nothing to the residual stream, so the
  last hidden state is the RMS-normed embedding of the last token (llama.cpp b11434,
  ``src/models/llama.cpp``: ``ffn_inp = cur + inpSA``, ``cur = ffn_out + ffn_inp``, then
  ``output_norm`` and ``output``) and the next token is a fixed function of the current one.
  Every token's embedding is direction A but the answer word's, which is B; the output
  matrix scores the answer word highest on A and ``<|im_end|>`` (the end of the turn,
  an end-of-generation token: ``llama-vocab.cpp`` adds ``<|im_end|>`` to the EOG set) on B,
  by a margin of ``MARGIN`` logits, so at any temperature or top-p an agent sends the
  answer is the word, then the stop.
- **A packed vocabulary.** A SentencePiece-style ("llama") vocabulary, read by llama.cpp's
  SPM tokenizer (``llm_tokenizer_spm_session``: it merges the adjacent pair whose text is a
  token with the highest score, leftmost first, and falls back to ``<0xXX>`` bytes for the
  rest). The tokens are every prefix of the most frequent words of Python's own standard
  library (prose and code, as an agent's prompt is), with and without the ``▁`` of a leading
  space, scored by length: a known word grows from its first letter into one token. About
  four characters a token on an agent's prompt instead of one.
- **A tool-capable chat template**: Qwen2.5-Instruct's, as llama.cpp b11434 vendors it
  (``models/templates/Qwen-Qwen2.5-7B-Instruct.jinja``): tools in the system turn, calls
  in ``<tool_call>`` tags, results as ``<tool_response>``. llama-server (jinja on by
  default at b11434) accepts ``tools`` with it and parses the answer as plain content.
- Width 16, one head: prefill costs little beyond the attention over the prompt.
"""

from __future__ import annotations

import collections
import re
import sysconfig
from pathlib import Path

import gguf
import numpy as np

WIDTH = 16
FEED_FORWARD = 16
MARGIN = 60.0
ANSWER = "llama-ok"
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# The most frequent words of the corpus whose prefixes become tokens.
WORDS = 6000
# Modules of the standard library read for the word counts (a few MB of prose and code).
CORPUS = (
    "argparse.py", "subprocess.py", "typing.py", "pathlib", "json", "http", "email",
    "asyncio", "unittest", "logging", "shutil.py", "tarfile.py", "zipfile", "inspect.py",
    "dataclasses.py", "functools.py", "collections", "textwrap.py", "string.py", "os.py",
    "tempfile.py", "urllib", "xml", "sqlite3", "csv.py", "configparser.py", "pydoc.py",
    "doctest.py", "difflib.py", "enum.py", "contextlib.py", "pickle.py", "threading.py",
)  # fmt: skip
WORD_PATTERN = re.compile(r" ?[A-Za-z]+| ?[0-9]+")

# Qwen2.5-Instruct's chat template, a copy of the one llama.cpp b11434 vendors
# (models/templates/Qwen-Qwen2.5-7B-Instruct.jinja).
CHAT_TEMPLATE = (
    Path(__file__).resolve().parents[1] / "fixtures" / "chat-templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
).read_text()


def corpus_words(limit: int = WORDS) -> list[str]:
    """The ``limit`` most frequent words (with their leading space, if any) of the corpus
    modules, most frequent first, ties by spelling: the same list for the same Python."""
    library = Path(sysconfig.get_paths()["stdlib"])
    counts: collections.Counter[str] = collections.Counter()
    for name in CORPUS:
        path = library / name
        for source in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            if source.is_file():
                counts.update(WORD_PATTERN.findall(source.read_text(errors="replace")))
    return [word for word, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:limit]]


def vocabulary(words: list[str]) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types: the specials, 256 byte tokens, the printable
    characters, every prefix of every word (``▁`` for its leading space) scored by its
    length so that longer merges win, and the answer word last but one."""
    tokens = list(SPECIALS)
    types = [gguf.TokenType.CONTROL] * len(SPECIALS)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    pieces: dict[str, None] = dict.fromkeys(["▁", "\n", "\t", *(chr(c) for c in range(33, 127))])
    for word in words:
        spelled = word.replace(" ", "▁")
        for end in range(2, len(spelled) + 1):
            pieces[spelled[:end]] = None
    pieces.pop(ANSWER, None)
    tokens += [*pieces, ANSWER]
    types += [gguf.TokenType.NORMAL] * (len(pieces) + 1)
    scores = [0.0] * (len(SPECIALS) + 256) + [float(len(piece)) for piece in pieces] + [0.0]
    return tokens, scores, [int(t) for t in types]


def write_bigram_chat(path: Path, *, context: int = 131072) -> Path:
    """The one-word chat model in ``path`` (a few MB), trained (its metadata says) on
    ``context`` tokens."""
    tokens, scores, types = vocabulary(corpus_words())
    answer, end_of_turn = tokens.index(ANSWER), tokens.index("<|im_end|>")
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("llmgw-bigram-chat")
    writer.add_context_length(context)
    writer.add_embedding_length(WIDTH)
    writer.add_block_count(1)
    writer.add_feed_forward_length(FEED_FORWARD)
    writer.add_head_count(1)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(WIDTH)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(end_of_turn)
    writer.add_eot_token_id(end_of_turn)
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    # numpy shapes are (out, in): gguf reverses them into ggml's ne.
    embedding = np.zeros((len(tokens), WIDTH), dtype=np.float32)
    embedding[:, 0] = 1.0  # direction A
    embedding[answer] = 0.0
    embedding[answer, 1] = 1.0  # direction B
    # RMS norm makes a unit axis sqrt(WIDTH) long: the winner scores MARGIN, the rest 0.
    output = np.zeros((len(tokens), WIDTH), dtype=np.float32)
    output[answer, 0] = output[end_of_turn, 1] = MARGIN / np.sqrt(WIDTH)
    zeros = np.zeros((WIDTH, WIDTH), dtype=np.float32)
    writer.add_tensor("token_embd.weight", embedding)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(WIDTH, dtype=np.float32))
    for part in ("q", "k", "v", "output"):
        writer.add_tensor(f"blk.0.attn_{part}.weight", zeros)
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(WIDTH, dtype=np.float32))
    writer.add_tensor("blk.0.ffn_gate.weight", np.zeros((FEED_FORWARD, WIDTH), dtype=np.float32))
    writer.add_tensor("blk.0.ffn_up.weight", np.zeros((FEED_FORWARD, WIDTH), dtype=np.float32))
    writer.add_tensor("blk.0.ffn_down.weight", np.zeros((WIDTH, FEED_FORWARD), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(WIDTH, dtype=np.float32))
    writer.add_tensor("output.weight", output)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
