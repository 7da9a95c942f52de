"""A body llmgw sends an engine, checked as each supported vLLM and SGLang release checks it.

Each release's vendored request model (``llmgw.apispec.engine_requests``): its JSON
schema (pydantic 2 writes draft 2020-12), validated with ``jsonschema`` (what the
release refuses), the same schema closed where pydantic drops undeclared fields
(``dropping_schema``: what it would accept and silently lose), the validators the
schema cannot carry (``validator_problems``), and SGLang's own check of every tool's
``parameters`` as a draft 2020-12 schema (``OpenAIServingChat._validate_request``,
sglang/srt/entrypoints/openai/serving_chat.py of 0.5.23).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError

from llmgw.apispec.engine_requests import (
    ENGINES,
    TOOL_CALLING,
    RequestApi,
    RequestModel,
    ServerFlags,
    dropping_schema,
    request_models,
    validator_problems,
)
from llmgw.core.catalog.model import Engine


def supported(api: RequestApi) -> list[RequestModel]:
    """Every vendored release's model of ``api`` (a release without the API is left out)."""
    return [
        models[api]
        for engine in ENGINES
        for _, models in sorted(request_models(engine).items())
        if api in models
    ]


@cache
def _validators(
    engine: Engine, release: str, api: RequestApi
) -> tuple[Draft202012Validator, Draft202012Validator]:
    model = request_models(engine)[release][api]
    return Draft202012Validator(model.schema), Draft202012Validator(dropping_schema(model.schema))


def _shown(error: ValidationError) -> str:
    """The error's deepest cause: of the branches of an ``anyOf`` a body fits none of,
    the one that got furthest into it (a field it closes, before a type mismatch)."""
    deepest = error
    while deepest.context:
        deepest = max(
            deepest.context,
            key=lambda e: (len(e.absolute_path), e.validator == "additionalProperties"),
        )
    path = ".".join(str(part) for part in deepest.absolute_path) or "<body>"
    return f"{path}: {deepest.message[:300]}"


def problems(model: RequestModel, body: Mapping[str, object], flags: ServerFlags = TOOL_CALLING) -> list[str]:
    """Everything ``model``'s release would refuse or drop in ``body`` (empty: it takes it whole)."""
    refusing, dropping = _validators(model.engine, model.release, model.api)
    found = [f"refused: {_shown(error)}" for error in refusing.iter_errors(body)]
    if not found:
        found = [f"dropped: {_shown(error)}" for error in dropping.iter_errors(body)]
    found.extend(f"refused: {problem}" for problem in validator_problems(model, body, flags))
    if model.engine is Engine.SGLANG and model.api is RequestApi.CHAT:
        tools = body.get("tools")
        for index, tool in enumerate(tools if isinstance(tools, list) else []):
            function = tool.get("function") if isinstance(tool, dict) else None
            parameters = function.get("parameters") if isinstance(function, dict) else None
            if parameters is None:
                continue
            try:
                Draft202012Validator.check_schema(parameters)
            except SchemaError as exc:
                found.append(f"refused: tools.{index}: invalid 'parameters' schema: {exc.message}")
    return found


def label(model: RequestModel) -> str:
    return f"{model.engine.value}-{model.release}"
