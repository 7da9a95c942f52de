"""What the simulated model "says" and how it counts tokens.

Owns: the Greek-alphabet vocabulary, the deterministic choice of where in it a
completion starts (a hash of the prompt), whitespace token counting, and the
deterministic embedding vectors. Pure functions: no I/O, no clock, no state.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from collections.abc import Iterator

GREEK: tuple[str, ...] = (
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta",
    "iota", "kappa", "lambda", "mu", "nu", "xi", "omicron", "pi",
    "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega",
)  # fmt: skip


def count_tokens(text: str) -> int:
    """One token per whitespace-separated word: cheap, deterministic, tokenizer-free."""
    return len(text.split())


def start_offset(prompt: str) -> int:
    """Where in the alphabet a completion of `prompt` starts: same prompt, same text."""
    digest = hashlib.sha256(prompt.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % len(GREEK)


def greek_pieces(prompt: str, count: int) -> Iterator[str]:
    """The `count` streamed pieces of a completion: ``"alpha"``, ``" beta"``, ``" gamma"`` ...

    Joined, they read as words separated by single spaces, so a client that
    concatenates deltas gets the same text as the non-streamed answer.
    """
    offset = start_offset(prompt)
    for index in range(count):
        word = GREEK[(offset + index) % len(GREEK)]
        yield word if index == 0 else " " + word


def greek_text(prompt: str, count: int) -> str:
    return "".join(greek_pieces(prompt, count))


def judge_pieces(prompt: str, unsafe_phrase: str, count: int) -> Iterator[str]:
    """A guard judge's verdict on `prompt`, as Llama Guard words it: ``"unsafe"`` when
    the prompt contains `unsafe_phrase` (any case, runs of whitespace read as one
    space), else ``"safe"``. One piece (at most `count`). No category line follows
    "unsafe": the sim tells no category of harm from another, and says none."""
    if count < 1:
        return
    words = " ".join(prompt.casefold().split())
    phrase = " ".join(unsafe_phrase.casefold().split())
    yield "unsafe" if phrase in words else "safe"


def embedding_vector(text: str, dimension: int) -> tuple[float, ...]:
    """A unit vector derived from SHAKE-256 of `text`, rounded to float32.

    The values are float32 so the ``float`` and ``base64`` encodings of one
    input carry exactly the same numbers. A shorter `dimension` is the prefix
    of the longer vector, renormalised (as OpenAI's shortened embeddings are).
    """
    raw = hashlib.shake_256(text.encode("utf-8")).digest(4 * dimension)
    unsigned = struct.unpack(f">{dimension}I", raw)
    centred = [value / 2**31 - 1.0 for value in unsigned]
    norm = math.sqrt(math.fsum(value * value for value in centred)) or 1.0
    unit = [value / norm for value in centred]
    return struct.unpack(f"<{dimension}f", struct.pack(f"<{dimension}f", *unit))


def embedding_base64(vector: tuple[float, ...]) -> str:
    """OpenAI's ``encoding_format: "base64"``: little-endian float32 bytes, base64."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
