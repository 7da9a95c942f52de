"""A tiny GGUF chat model for agents on a real llama-server: it answers a turn with one word
(or first a call of the client's tool) and stops, and it reads a 100,000-character prompt in
seconds on a CPU.

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
- **A tool call, then the word** (``tool_call=``): the call is one token (the whole
  ``<tool_call>...</tool_call>`` text, which llama-server's template parser turns into the
  response's ``tool_calls``), scored highest on A alone; ``<tool_response>``, which the
  template writes before a tool's result, is a token of its own (direction D) that the one
  attention head finds from the last prompt token wherever it is and adds as direction E,
  on which the word scores highest. So the first turn calls the client's tool, the turn
  after its result answers the word, and both stop. Queries and keys live on the last
  RoPE pair, which a huge ``rope.freq_base`` keeps from turning.
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
TOOL_RESPONSE = "<tool_response>"
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


def write_bigram_chat(path: Path, *, context: int = 131072, tool_call: str | None = None) -> Path:
    """The one-word chat model in ``path`` (a few MB), trained (its metadata says) on
    ``context`` tokens. With ``tool_call`` (a call as the template writes one, ``<tool_call>``
    and all), a turn whose prompt holds no ``<tool_response>`` is answered with that call
    instead, and a turn after a tool's result with the word (see below)."""
    tokens, scores, types = vocabulary(corpus_words())
    if tool_call is not None:
        # The call is one token the tokenizer never produces, but the model may; the tool's
        # result opens with a token of its own (a user-defined token, split out of the
        # text before the SPM merges, as the specials are).
        tokens += [tool_call.replace(" ", "▁"), TOOL_RESPONSE]
        scores += [0.0, 0.0]
        types += [int(gguf.TokenType.NORMAL), int(gguf.TokenType.USER_DEFINED)]
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
    # RoPE turns dimension pair i by position * base^(-2i/WIDTH) radians: at this base the
    # last pair, which alone carries queries and keys, does not turn over a million positions.
    writer.add_rope_freq_base(1e30)
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
    attention = {part: np.zeros((WIDTH, WIDTH), dtype=np.float32) for part in ("q", "k", "v", "output")}
    if tool_call is not None:
        call, response = tokens.index(tool_call.replace(" ", "▁")), tokens.index(TOOL_RESPONSE)
        # A tool's result (direction D) is what every prompt token (A) looks for: the last
        # one finds it, if there is one, with a score of q.k/sqrt(WIDTH) = 50 (every other
        # key is 0: past e^-50 times a million tokens), and takes its value, which the
        # output projection writes into the residual as direction E, 10 long.
        embedding[response] = 0.0
        embedding[response, 2] = 1.0
        reach = np.sqrt(50 * np.sqrt(WIDTH)) / np.sqrt(WIDTH)
        attention["q"][WIDTH - 1, 0] = attention["k"][WIDTH - 1, 2] = reach
        attention["v"][2, 2] = 1.0
        attention["output"][3, 2] = 10.0 / np.sqrt(WIDTH)
        # The call answers A alone (sqrt(WIDTH) long), the word answers A+E (normed: A a
        # tenth as long as E): 60 against 6 for the call, and the call, like the word,
        # ends the turn (B).
        embedding[call] = embedding[answer]
        output[answer, 0] = 0.0
        output[call, 0] = MARGIN / np.sqrt(WIDTH)
        output[answer, 3] = 1.1 * MARGIN / np.sqrt(WIDTH)
    writer.add_tensor("token_embd.weight", embedding)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(WIDTH, dtype=np.float32))
    for part, weight in attention.items():
        writer.add_tensor(f"blk.0.attn_{part}.weight", weight)
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
