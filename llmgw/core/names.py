"""Names clients use, and the slugs derived from them for Nomad and Consul.

A model or alias name is what an OpenAI client sends as ``model``; names like
``meta-llama/Llama-3.1-8B-Instruct`` are normal. Wherever a name becomes a Nomad
job ID, a Consul service tag or a file name, ``slug`` makes it safe. Slugs never
collide: the readable part is lossy (case and punctuation fold), so a short hash
of the exact name is always appended.
"""

from __future__ import annotations

import hashlib
import re
from typing import NewType

ModelName = NewType("ModelName", str)
AliasName = NewType("AliasName", str)
Slug = NewType("Slug", str)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"
_NAME = re.compile(NAME_PATTERN)
_UNSAFE = re.compile(r"[^a-z0-9]+")

# Readable prefix length: with "-" and 8 hex digits the slug stays within the
# 63 characters a DNS label (and so a Consul service name) may have.
_READABLE_MAX = 40
_HASH_HEX = 8


def is_valid_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def slug(name: str) -> Slug:
    """``meta-llama/Llama-3.1-8B`` -> ``meta-llama-llama-3-1-8b-1a2b3c4d``."""
    readable = _UNSAFE.sub("-", name.lower()).strip("-")[:_READABLE_MAX].rstrip("-") or "model"
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:_HASH_HEX]
    return Slug(f"{readable}-{digest}")
