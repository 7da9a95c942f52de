"""The flag tables of the engine releases llmgw's images pin, and argv checked against them.

Owns: reading ``engines/*-flags.json`` (packaged data written by
``scripts/engine_flag_tables.py`` from each release's own parser) into frozen values;
which release tables an image stands for; and checking one program's argv the way
that release's parser reads it (unknown flags, missing or extra values, stray
positionals).

A flag's ``risks`` are a reviewed reading of the engine's source: it reads or writes
a path, loads code, runs remote code, opens or connects to an address, or downloads
another model. The engine security policy must refuse every such flag (the policy
tests hold that); this module only carries the classes.

Must not: decide what a catalog may pass (that is :mod:`llmgw.core.catalog.security`),
or read anything but its packaged tables.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

from llmgw.core.catalog.images import ImageError, parse_image
from llmgw.core.catalog.model import Engine

_NEGATIVE_NUMBER = re.compile(r"^-\d+(\.\d+)?([eE][-+]?\d+)?$")


class Risk(StrEnum):
    READS_PATH = "reads_path"
    WRITES_PATH = "writes_path"
    LOADS_CODE = "loads_code"
    REMOTE_CODE = "remote_code"
    NETWORK = "network"  # opens or connects to an address
    DOWNLOADS_MODEL = "downloads_model"  # a llama.cpp preset that sets a Hub repository


@dataclass(frozen=True, slots=True)
class FlagSpec:
    """One option: its name, other spellings, arity (argparse's nargs), and risks.

    ``risks`` is None for a flag nobody has reviewed yet (the script writes it so).
    Negations (``--no-x``) take no value and carry no risk of their own.
    """

    flag: str
    aliases: tuple[str, ...]
    negations: tuple[str, ...]
    nargs: int | str
    risks: frozenset[Risk] | None
    env: str | None = None  # llama.cpp's LLAMA_ARG_* variable for the flag
    negation_env: tuple[tuple[str, str], ...] = ()  # (negation, its variable)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.flag, *self.aliases)


@dataclass(frozen=True, slots=True)
class ParserFacts:
    allow_abbrev: bool
    underscores_as_dashes: bool
    equals_form: bool  # --flag=value
    dotted_json_keys: bool  # --some-config.key value is --some-config
    max_positionals: int
    values_are_next_words: bool  # a value may start with "-" (llama.cpp's and click's parsers)


@dataclass(frozen=True, slots=True)
class ProgramTable:
    """Every option one program of one release parses, by every spelling."""

    engine: Engine
    release: str
    program: str
    parser: ParserFacts
    flags: tuple[FlagSpec, ...]
    image_tags: tuple[str, ...] = ()
    by_name: Mapping[str, FlagSpec] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        names: dict[str, FlagSpec] = {}
        for spec in self.flags:
            for name in (*spec.names, *spec.negations):
                names[name] = spec
        object.__setattr__(self, "by_name", MappingProxyType(names))

    def lookup(self, name: str) -> FlagSpec | None:
        """The option an exact spelling (or negation) names, after the parser's normalisation."""
        return self.by_name.get(self.normalised(name))

    def normalised(self, name: str) -> str:
        if self.parser.underscores_as_dashes and name.startswith("--"):
            head, dot, rest = name.partition(".")
            return head.replace("_", "-") + dot + rest
        return name


@dataclass(frozen=True, slots=True)
class ArgvProblem:
    """One word of an argv the release's parser would refuse (``index`` into the argv)."""

    index: int
    word: str
    problem: str

    def __str__(self) -> str:
        return f"argument {self.index} {self.word!r}: {self.problem}"


_FILES: Mapping[Engine, str] = {
    Engine.VLLM: "vllm-flags.json",
    Engine.SGLANG: "sglang-flags.json",
    Engine.LLAMACPP: "llamacpp-flags.json",
}


@cache
def _raw(engine: Engine) -> Mapping[str, Any]:
    text = resources.files("llmgw.apispec").joinpath("engines", _FILES[engine]).read_text(encoding="utf-8")
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{_FILES[engine]} is not a JSON object")
    return data


def _spec(raw: Mapping[str, Any]) -> FlagSpec:
    risks = raw.get("risks")
    return FlagSpec(
        flag=str(raw["flag"]),
        aliases=tuple(raw.get("aliases", ())),
        negations=tuple(raw.get("negations", ())),
        nargs=raw["nargs"],
        risks=None if risks is None else frozenset(Risk(r) for r in risks),
        env=raw.get("env"),
        negation_env=tuple(sorted(raw.get("negation_env", {}).items())),
    )


@cache
def release_tables(engine: Engine) -> Mapping[str, ProgramTable]:
    """Every vendored release of ``engine``'s server, by release name."""
    data = _raw(engine)
    out: dict[str, ProgramTable] = {}
    for name, raw in data["releases"].items():
        facts = raw["parser"]
        out[name] = ProgramTable(
            engine=engine,
            release=name,
            program=str(raw["program"]),
            parser=ParserFacts(
                allow_abbrev=bool(facts["allow_abbrev"]),
                underscores_as_dashes=bool(facts["underscores_as_dashes"]),
                equals_form=bool(facts["equals_form"]),
                dotted_json_keys=bool(facts["dotted_json_keys"]),
                max_positionals=int(facts["max_positionals"]),
                values_are_next_words=bool(facts["values_are_next_words"]),
            ),
            flags=tuple(_spec(f) for f in raw["flags"]),
            image_tags=tuple(raw["image_tags"]),
        )
    return MappingProxyType(out)


@cache
def ray_start_table() -> ProgramTable:
    """``ray start`` (click) as the vLLM images carry it, for llmgw's multi-node vLLM."""
    raw = _raw(Engine.VLLM)["ray_start"]
    return ProgramTable(
        engine=Engine.VLLM,
        release="ray",
        program="ray start",
        parser=ParserFacts(False, False, True, False, 0, values_are_next_words=True),
        flags=tuple(_spec(f) for f in raw["flags"]),
    )


class UnknownImage(LookupError):
    """An image tag no vendored table stands for."""


def tables_for_image(engine: Engine, image: str) -> tuple[ProgramTable, ...]:
    """The release tables an image's tag stands for: one, or the two commits that bracket a
    llama.cpp build (a flag is known for it only if both have it). UnknownImage otherwise."""
    try:
        tag = parse_image(image).tag
    except ImageError as error:
        raise UnknownImage(str(error)) from error
    releases = release_tables(engine)
    found = tuple(table for table in releases.values() if tag in table.image_tags)
    if found:
        return found
    brackets = _raw(engine).get("image_tag_brackets", {})
    if tag in brackets:
        return tuple(releases[name] for name in brackets[tag])
    raise UnknownImage(
        f"no vendored flag table for {engine} image {image!r}: add its release with "
        "scripts/engine_flag_tables.py (see its --help)"
    )


def check_argv(table: ProgramTable, argv: Sequence[str]) -> list[ArgvProblem]:
    """What ``table``'s parser would refuse in ``argv`` (the words after the program).

    Flags must be spelt exactly (no abbreviations, even where the parser allows them:
    llmgw's own argv is not the place for them). argparse takes as a value any word
    that does not look like a flag (``-5`` is a value); llama.cpp and click take the
    next word whatever it looks like (``values_are_next_words``).
    """
    problems: list[ArgvProblem] = []
    positionals = 0
    index = 0
    while index < len(argv):
        word = argv[index]
        index += 1
        if not _looks_like_flag(word):
            positionals += 1
            if positionals > table.parser.max_positionals:
                problems.append(ArgvProblem(index - 1, word, f"{table.program} takes no further positional"))
            continue
        name, equals, _ = word.partition("=") if table.parser.equals_form else (word, "", "")
        if table.parser.dotted_json_keys:
            name = re.split(r"[.+]", name, maxsplit=1)[0]
        spec = table.lookup(name)
        if spec is None:
            problems.append(ArgvProblem(index - 1, word, f"{table.program} {table.release} has no such flag"))
            continue
        negation = table.normalised(name) in spec.negations
        nargs = 0 if negation else spec.nargs
        if equals:
            if nargs not in (1, "?", "+", "*"):
                problems.append(
                    ArgvProblem(index - 1, word, f"{spec.flag} takes {_arity(nargs)}, not an =value")
                )
            continue
        available = len(argv) - index if table.parser.values_are_next_words else _values_after(argv, index)
        if isinstance(nargs, int):
            if available < nargs:
                problems.append(ArgvProblem(index - 1, word, f"{spec.flag} takes {_arity(nargs)}"))
            index += min(available, nargs)
        elif nargs == "+":
            if available == 0:
                problems.append(ArgvProblem(index - 1, word, f"{spec.flag} takes {_arity(nargs)}"))
            index += available
        elif nargs == "*":
            index += available
        else:  # "?"
            index += min(available, 1)
    return problems


def _arity(nargs: int | str) -> str:
    match nargs:
        case 0:
            return "no value"
        case 1:
            return "one value"
        case "+":
            return "one or more values"
        case "*" | "?":
            return "optional values"
    return f"{nargs} values"


def _looks_like_flag(word: str) -> bool:
    return word.startswith("-") and word != "-" and not _NEGATIVE_NUMBER.match(word)


def _values_after(argv: Sequence[str], index: int) -> int:
    count = 0
    while index + count < len(argv) and not _looks_like_flag(argv[index + count]):
        count += 1
    return count
