"""Parsed JSON values, named for the people who read error messages.

Owns ``json_kind``: what a value from ``json.loads`` (or a document llmgw built to
send) is, in words (``"a string"``, ``"an array"``), for messages of the shape
``expected a whole number, got a string``. The records' decoder, the API
document checker and the simulated engine's OpenAI errors all say it this way.

The door's checks of a client's body, which every API and the admin API run before
any code walks it: ``MAX_JSON_DEPTH`` and ``nested_deeper_than`` (how deep it may
nest), ``utf8_encodable`` (whether it is text at all: a lone surrogate such as
``"\\ud800"`` is valid JSON syntax that no UTF-8 holds), and ``one_of`` for every
test of a client's value against a set of strings (``value in frozenset(...)``
raises TypeError on a list or an object, which the router answered with a 500).

Must not: do I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

# The deepest a request body may nest (the body object is level 1). No API body llmgw
# serves needs more than a dozen levels (a tool's JSON schema is the deepest part;
# OpenAI's structured outputs allow 10 levels of schema nesting), and every reader
# past the door may recurse: the guard's walk of the text, the error message quoting a
# value, a JSON encoder. The engines stop far deeper and differently: vLLM 0.34.0
# parses with FastAPI's ``await request.json()`` (the stdlib, RecursionError near
# Python's limit of 1000, a 500), SGLang 0.5.23 with ``orjson.loads``
# (``ORJSONRequest`` in ``sglang/srt/entrypoints/http_server.py``; orjson refuses
# nesting past 1024 since 3.9.15, CVE-2024-27454). So a depth every engine parses
# and nothing here recurses near: refused at 65 with a 400 that says so.
MAX_JSON_DEPTH = 64


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


def utf8_encodable(value: object) -> bool:
    """Whether every string of ``value`` (object keys too) can be written as UTF-8:
    false for a lone surrogate, which ``json.loads`` reads from ``"\\ud800"`` (and
    from its bytes, with ``surrogatepass``). Check the depth first
    (``nested_deeper_than``): the encoder recurses."""
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True


def one_of(value: object, choices: frozenset[str]) -> bool:
    """Whether ``value`` is a string among ``choices`` (never hashes anything else)."""
    return isinstance(value, str) and value in choices


def nested_deeper_than(value: object, limit: int) -> bool:
    """Whether ``value`` nests arrays and objects more than ``limit`` levels (``value``
    itself, when one, is level 1). Level by level, without recursion, and it stops at
    ``limit + 1``: a body nested 100,000 deep costs no more than one nested 65."""
    level: list[object] = [value] if isinstance(value, list | Mapping) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list[object] = []
        for container in level:
            items = container.values() if isinstance(container, Mapping) else container
            assert isinstance(items, Iterable)  # a list or a mapping's values
            below.extend(item for item in items if isinstance(item, list | Mapping))
        level = below
    return False
