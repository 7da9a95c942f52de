"""The request models of the vLLM and SGLang releases llmgw supports, and the checks
their pydantic validators make that JSON schema cannot carry.

Owns: reading ``engines/requests/<engine>-<release>.json`` (packaged data written by
``scripts/engine_request_schemas.py`` from each release's own pydantic classes: the
JSON schema of each API's request body, what the classes do with a field they do not
declare, and where each validator is); which vendored releases an engine release or
image tag stands for (as the flag tables are picked by image tag); and
``validator_problems``, llmgw's reading of the validators that matter for a body
llmgw sends (each cites its source line in the release's wheel), with the checks the
engine's server makes at request time from its own flags (vLLM's
``--enable-auto-tool-choice``).

The schemas themselves are validated in the tests (``tests/support/engine_bodies.py``,
with ``jsonschema``, a dev dependency): nothing at run time needs them.

Must not: decide what llmgw sends (the translations in ``llmgw.core`` do), or read
anything but its packaged files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

from llmgw.core.catalog.images import ImageError, Release, parse_image, tag_release
from llmgw.core.catalog.model import Engine

REQUESTS_DIR = "requests"
# The engines whose request models are vendored (llama.cpp's server has none: it reads
# JSON by hand, tools/server/server-common.cpp; the sim is llmgw's own).
ENGINES = (Engine.VLLM, Engine.SGLANG)


class RequestApi(StrEnum):
    """The APIs whose request models a release's file holds (an API a release does not
    serve is left out of its file)."""

    CHAT = "chat_completions"
    COMPLETIONS = "completions"
    EMBEDDINGS = "embeddings"
    RESPONSES = "responses"
    MESSAGES = "messages"


class Extra(StrEnum):
    """What a pydantic class does with a field it does not declare (``model_config``)."""

    ALLOW = "allow"  # kept (vLLM's OpenAI models: logged as ignored, then unused)
    IGNORE = "ignore"  # dropped silently (SGLang's models, both engines' Messages)
    FORBID = "forbid"  # refused


@dataclass(frozen=True, slots=True)
class RequestModel:
    """One release's request class of one API: its JSON schema and its unknown-field rule."""

    engine: Engine
    release: str
    api: RequestApi
    where: str  # "module:Class" in the release's wheel
    extra: Extra
    schema: Mapping[str, Any]
    validators: tuple[str, ...]  # "Class.name at file:line", every one pydantic runs

    @property
    def declared(self) -> frozenset[str]:
        """The top-level fields the class declares."""
        properties = self.schema.get("properties")
        return frozenset(properties) if isinstance(properties, Mapping) else frozenset()


@dataclass(frozen=True, slots=True)
class ServerFlags:
    """What the engine was started with that its request-time checks read."""

    # vLLM: --enable-auto-tool-choice (with --tool-call-parser, which 0.34's cli_args.py:563
    # requires beside it); SGLang: --tool-call-parser.
    tool_calling: bool = True


@dataclass(frozen=True, slots=True)
class BodyProblem:
    """Why a release would refuse (or silently lose part of) a body: the field, the
    engine's own words, and where in its source the check is."""

    param: str
    message: str
    source: str

    def __str__(self) -> str:
        return f"{self.param}: {self.message} ({self.source})"


# A chat profile's engine as llmgw renders it: with its tool-call flags
# (``tool_calling.tool_call_args``).
TOOL_CALLING = ServerFlags(tool_calling=True)


def _files() -> Any:
    return resources.files("llmgw.apispec").joinpath("engines", REQUESTS_DIR)


@cache
def request_models(engine: Engine) -> Mapping[str, Mapping[RequestApi, RequestModel]]:
    """Every vendored release of ``engine``, by release name (``0.34.0``), and its APIs."""
    out: dict[str, Mapping[RequestApi, RequestModel]] = {}
    prefix = f"{engine.value}-"
    for entry in sorted(_files().iterdir(), key=lambda e: e.name):
        if not (entry.name.startswith(prefix) and entry.name.endswith(".json")):
            continue
        data = json.loads(entry.read_text(encoding="utf-8"))
        release = str(data["release"])
        apis: dict[RequestApi, RequestModel] = {}
        for api_name, raw in data["apis"].items():
            api = RequestApi(api_name)
            apis[api] = RequestModel(
                engine=engine,
                release=release,
                api=api,
                where=str(raw["class"]),
                extra=_extra(str(raw["extra"])),
                schema=raw["schema"],
                validators=tuple(f"{v['class']}.{v['name']} at {v['where']}" for v in raw["validators"]),
            )
        out[release] = MappingProxyType(apis)
    return MappingProxyType(out)


def _extra(value: str) -> Extra:
    """The strictest rule of the classes a model is a union of (one, for every vendored API)."""
    settings = {Extra(part) for part in value.split(",")}
    for rule in (Extra.FORBID, Extra.IGNORE, Extra.ALLOW):
        if rule in settings:
            return rule
    raise ValueError(f"no extra rule in {value!r}")


def _numbers(release: str) -> tuple[int, ...]:
    numbers = tuple(int(part) for part in re.findall(r"\d+", release))
    return numbers + (0,) * (4 - len(numbers))


def releases_for(engine: Engine, release: Release) -> tuple[str, ...]:
    """The vendored releases whose models stand for ``release``: its own; for a release
    between two vendored ones both (a body must pass each); for one newer than every
    vendored release the newest. Empty for one older than every vendored release."""
    vendored = sorted(request_models(engine), key=_numbers)
    own = [name for name in vendored if _numbers(name) == release.numbers]
    if own:
        return (own[0],)
    below = [name for name in vendored if _numbers(name) < release.numbers]
    above = [name for name in vendored if _numbers(name) > release.numbers]
    if not below:
        return ()
    return (below[-1],) if not above else (below[-1], above[0])


def releases_for_image(engine: Engine, image: str) -> tuple[str, ...]:
    """``releases_for`` the release an image's tag names (empty: it names none)."""
    try:
        release = tag_release(engine, parse_image(image).tag)
    except ImageError:
        return ()
    return () if release is None else releases_for(engine, release)


def dropping_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` with every object that declares its fields and says nothing of others
    closed (``additionalProperties: false``): pydantic writes no ``additionalProperties``
    for a class or TypedDict that drops an undeclared field (``extra="ignore"``, its
    default, and openai-python's TypedDicts), ``true`` for one that keeps it and ``false``
    for one that refuses it. A body valid under ``schema`` but not under this one is
    accepted with a part silently lost."""

    def close(value: Any) -> Any:
        if isinstance(value, Mapping):
            out = {key: close(item) for key, item in value.items()}
            if "properties" in value and "additionalProperties" not in value:
                out["additionalProperties"] = False
            return out
        if isinstance(value, list):
            return [close(item) for item in value]
        return value

    closed = close(schema)
    assert isinstance(closed, dict)
    return closed


# --- the validators JSON schema cannot carry -----------------------------------------------------


def validator_problems(
    model: RequestModel, body: Mapping[str, object], flags: ServerFlags = TOOL_CALLING
) -> list[BodyProblem]:
    """What ``model``'s pydantic validators (and its server's request-time checks from
    its flags) refuse in ``body``, beside its JSON schema (fields it drops: validate
    against ``dropping_schema``)."""
    problems: list[BodyProblem] = []
    match (model.engine, model.api):
        case (Engine.VLLM, RequestApi.CHAT):
            problems.extend(_vllm_chat(model, body, flags))
        case (Engine.SGLANG, RequestApi.CHAT):
            problems.extend(_sglang_chat(model, body, flags))
        case (_, RequestApi.MESSAGES):
            problems.extend(_messages(model, body))
        case _:
            pass
    return problems


def _vllm_chat(model: RequestModel, body: Mapping[str, object], flags: ServerFlags) -> list[BodyProblem]:
    new = _numbers(model.release) >= _numbers("0.34.0")
    protocol = (
        "vllm/entrypoints/openai/chat_completion/protocol.py"
        if new
        else "vllm/entrypoints/openai/protocol.py"
    )
    problems: list[BodyProblem] = []
    if body.get("stream_options") and not body.get("stream"):
        problems.append(
            BodyProblem(
                "stream_options",
                "Stream options can only be defined when `stream=True`.",
                f"validate_stream_options, {protocol}",
            )
        )
    tools = body.get("tools")
    choice = body.get("tool_choice")
    check = f"check_tool_usage, {protocol}"
    if new and tools == [] and not isinstance(choice, dict):
        # 0.34: an empty list is no tools, and auto/required fall back to none.
        tools = None
        choice = "none" if choice in ("auto", "required") else choice
    if "tool_choice" not in body and tools:
        choice = "auto"  # both releases assume auto when tools come without a choice
    if choice is not None and choice != "none":
        if tools is None:
            problems.append(
                BodyProblem("tool_choice", "When using `tool_choice`, `tools` must be set.", check)
            )
        elif choice not in ("auto", "required") and not isinstance(choice, dict):
            problems.append(BodyProblem("tool_choice", f"Invalid value for `tool_choice`: {choice}!", check))
        elif isinstance(choice, dict):
            function = choice.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            names = [
                tool.get("function", {}).get("name")
                for tool in (tools if isinstance(tools, list) else [])
                if isinstance(tool, dict) and isinstance(tool.get("function"), dict)
            ]
            if not isinstance(name, str) or not name or name not in names:
                problems.append(
                    BodyProblem(
                        "tool_choice",
                        f"The tool `{name}` specified in `tool_choice` does not match any of the "
                        "specified `tools`",
                        check,
                    )
                )
        if not flags.tool_calling and tools is not None:
            # The server's check at request time, from its flags.
            source = "vllm/renderers/online_renderer.py" if new else "vllm/entrypoints/openai/serving_chat.py"
            if choice == "auto":
                problems.append(
                    BodyProblem(
                        "tool_choice",
                        '"auto" tool choice requires --enable-auto-tool-choice and '
                        "--tool-call-parser to be set",
                        source,
                    )
                )
            elif new:
                problems.append(BodyProblem("tool_choice", "requires --tool-call-parser to be set", source))
    response_format = body.get("response_format")
    if (
        new
        and isinstance(response_format, dict)
        and response_format.get("type") == "json_schema"
        and response_format.get("json_schema") is None
    ):
        problems.append(
            BodyProblem(
                "response_format",
                "When response_format type is 'json_schema', the 'json_schema' field must be provided.",
                f"validate_response_format, {protocol}",
            )
        )
    return problems


def _sglang_chat(model: RequestModel, body: Mapping[str, object], flags: ServerFlags) -> list[BodyProblem]:
    new = _numbers(model.release) >= _numbers("0.5.23")
    problems: list[BodyProblem] = []
    if new and isinstance(body.get("reasoning_effort"), bool):
        problems.append(
            BodyProblem(
                "reasoning_effort",
                "reasoning_effort must not be a boolean",
                "validate_reasoning_effort_type, sglang/srt/entrypoints/openai/protocol.py:1087",
            )
        )
    tools = body.get("tools")
    choice = body.get("tool_choice")
    serving = "OpenAIServingChat._validate_request, sglang/srt/entrypoints/openai/serving_chat.py"
    if not body.get("messages"):
        problems.append(BodyProblem("messages", "Messages cannot be empty.", serving))
    if choice == "required" and not tools:
        problems.append(
            BodyProblem("tool_choice", "Tools cannot be empty if tool choice is set to required.", serving)
        )
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        names = [
            tool.get("function", {}).get("name")
            for tool in (tools if isinstance(tools, list) else [])
            if isinstance(tool, dict) and isinstance(tool.get("function"), dict)
        ]
        if name not in names:
            problems.append(BodyProblem("tool_choice", f"Tool '{name}' not found in tools list.", serving))
    return problems


def _messages(model: RequestModel, body: Mapping[str, object]) -> list[BodyProblem]:
    protocol = f"{model.where.split(':')[0].replace('.', '/')}.py"
    problems: list[BodyProblem] = []
    if not body.get("model"):
        problems.append(BodyProblem("model", "Model is required", f"validate_model, {protocol}"))
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, int) and max_tokens <= 0:
        problems.append(
            BodyProblem("max_tokens", "max_tokens must be positive", f"validate_max_tokens, {protocol}")
        )
    thinking = body.get("thinking")
    if (
        model.engine is Engine.VLLM
        and isinstance(thinking, dict)
        and thinking.get("type") == "enabled"
        and isinstance(thinking.get("budget_tokens"), int)
        and isinstance(max_tokens, int)
        and thinking["budget_tokens"] >= max_tokens
    ):
        problems.append(
            BodyProblem(
                "thinking.budget_tokens",
                "thinking.budget_tokens must be less than max_tokens",
                f"validate_thinking_budget, {protocol}",
            )
        )
    return problems
