"""The tool-call and reasoning parsers each vendored vLLM and SGLang release registers.

Owns: reading ``engines/engine-parsers.json`` (packaged data written by
``scripts/engine_parser_tables.py`` from each release's own wheel) into the core's
``ParserRegistry``, keyed by engine and release as ``tag_release`` names it (``0.34.0``,
``0.5.23``).

Must not: decide anything (``llmgw.core.catalog.tool_calling`` does), or read anything but
its packaged file.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from types import MappingProxyType

from llmgw.core.catalog.model import Engine
from llmgw.core.catalog.tool_calling import EngineParsers, ParserRegistry

FILE = "engine-parsers.json"


@cache
def parser_registry() -> ParserRegistry:
    """Every vendored release's parsers."""
    text = resources.files("llmgw.apispec").joinpath("engines", FILE).read_text(encoding="utf-8")
    data = json.loads(text)
    registry: dict[tuple[Engine, str], EngineParsers] = {}
    for engine, releases in data["engines"].items():
        for release, raw in releases.items():
            registry[(Engine(engine), release)] = EngineParsers(
                tool_call=frozenset(raw["tool_call_parsers"]), reasoning=frozenset(raw["reasoning_parsers"])
            )
    return MappingProxyType(registry)
