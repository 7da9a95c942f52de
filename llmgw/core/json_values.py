"""Parsed JSON values, named for the people who read error messages.

Owns ``json_kind``: what a value from ``json.loads`` (or a document llmgw built to
send) is, in words (``"a string"``, ``"an array"``), for messages of the shape
``expected a whole number, got a string``. The records' decoder, the API
document checker and the simulated engine's OpenAI errors all say it this way.

Must not: do I/O.
"""

from __future__ import annotations

from collections.abc import Mapping


def json_kind(value: object) -> str:
    """``"null"``, ``"a boolean"``, ``"a number"``, ``"a string"``, ``"an array"`` or
    ``"an object"``; for a value no JSON parser makes, its Python type's name."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    return "an object" if isinstance(value, Mapping) else type(value).__name__
