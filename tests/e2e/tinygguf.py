"""Tiny random-weight llama GGUFs that llama.cpp's llama-server loads in well under a second.

Written with the ``gguf`` package (the writer llama.cpp's own converters use): 2 layers,
width 64, 4 heads, and a SentencePiece-style ("llama") vocabulary of 300 tokens: the three
special tokens, the 256 byte-fallback tokens ``<0x00>``..``<0xFF>`` and a few dozen word
pieces. The output is noise, but it is the real engine's: random tokens include lone bytes
of multi-byte UTF-8 sequences and control characters, which a client must get as sent.

The chat model carries a chat template (``tokenizer.chat_template``), so ``/v1/chat/completions``
formats messages with it; the embedding model is the same shape, served with ``--embeddings``.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

WIDTH = 64
LAYERS = 2
HEADS = 4
FEED_FORWARD = 128
CONTEXT = 2048
WORDS = tuple(
    [
        "▁the",
        "▁a",
        "▁and",
        "▁of",
        "▁to",
        "▁in",
        "▁is",
        "▁it",
        "▁you",
        "▁that",
        "▁he",
        "▁was",
        "▁for",
        "▁on",
        "▁are",
        "▁with",
        "▁as",
        "▁I",
        "▁his",
        "▁they",
        "▁be",
        "▁at",
        "▁one",
        "▁have",
        "▁this",
        "▁from",
        "▁hello",
        "▁world",
        "▁llama",
        "▁model",
        "▁token",
        "▁engine",
        "▁router",
        "▁é",
        "▁ü",
        "▁日本",
        "▁🙂",
        "s",
        "ed",
        "ing",
        "▁",
    ]
)
CHAT_TEMPLATE = (
    "{% for message in messages %}<s>{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types: <unk> <s> </s>, 256 byte tokens, then word pieces."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    tokens += WORDS
    types += [gguf.TokenType.NORMAL] * len(WORDS)
    scores = [0.0] * 259 + [-float(i) for i in range(len(WORDS))]
    return tokens, scores, [int(t) for t in types]


def write_llama(
    path: Path,
    *,
    seed: int = 0,
    chat_template: bool = True,
    context: int = CONTEXT,
    width: int = WIDTH,
    layers: int = LAYERS,
) -> Path:
    """A 2-layer width-64 llama in ``path`` (a few hundred KB), random weights from ``seed``,
    trained (its metadata says) on ``context`` tokens. ``width`` and ``layers`` make a
    larger one, whose prompts cost a CPU more time (bench/prefix_routing_llamacpp.py)."""
    feed_forward = FEED_FORWARD * width // WIDTH
    rng = np.random.default_rng(seed)
    tokens, scores, types = vocabulary()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("llmgw-tiny-llama")
    writer.add_context_length(context)
    writer.add_embedding_length(width)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(feed_forward)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(width // HEADS)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    if chat_template:
        writer.add_chat_template(CHAT_TEMPLATE)

    def weight(name: str, *shape: int, scale: float = 0.3) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def ones(name: str) -> None:
        writer.add_tensor(name, np.ones(width, dtype=np.float32))

    # numpy shapes are (out, in): gguf reverses them into ggml's ne.
    weight("token_embd.weight", len(tokens), width)
    for layer in range(layers):
        block = f"blk.{layer}"
        ones(f"{block}.attn_norm.weight")
        for part in ("q", "k", "v", "output"):
            weight(f"{block}.attn_{part}.weight", width, width)
        ones(f"{block}.ffn_norm.weight")
        weight(f"{block}.ffn_gate.weight", feed_forward, width)
        weight(f"{block}.ffn_up.weight", feed_forward, width)
        weight(f"{block}.ffn_down.weight", width, feed_forward)
    ones("output_norm.weight")
    # Flat logits over the vocabulary: sampling wanders through bytes and words alike.
    weight("output.weight", len(tokens), width, scale=0.05)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
