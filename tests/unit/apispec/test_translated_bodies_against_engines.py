"""Every body llmgw's translations send a vLLM or SGLang engine, checked against each
supported release's own request model (``llmgw/apispec/engines/requests/``): the chat
completion a Responses request and a Messages request become, and a client's chat
completion as the router passes it on, each as the router sends it to a model that runs
that release (``calls.release_shaper``: the effort word it takes, no field it drops).

A release that would refuse a body, or take it and silently lose part of it, fails here:
the fix is in the translation (or a 400 from llmgw naming the field), never a skip.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import pytest

from llmgw.apispec.engine_requests import (
    RequestApi,
    RequestModel,
    ServerFlags,
    dropping_schema,
    releases_for,
    releases_for_image,
    request_models,
    validator_problems,
)
from llmgw.bundled import read_security_policy
from llmgw.core import anthropic, engine_chat_fields, responses
from llmgw.core.catalog import Catalog, Engine, load_catalog
from llmgw.core.catalog.images import Release
from llmgw.core.routing import Api
from llmgw.gateway.calls import ApiCall, parse_call, release_shaper
from llmgw.render.settings import DEFAULT_IMAGES
from tests.support.engine_bodies import label, problems, supported

CHAT_MODELS = supported(RequestApi.CHAT)
IMAGES = {
    (Engine.VLLM, "0.34.0"): "vllm/vllm-openai:v0.34.0",
    (Engine.VLLM, "0.11.0"): "vllm/vllm-openai:v0.11.0",
    (Engine.SGLANG, "0.5.23"): "lmsysorg/sglang:v0.5.23-cu130",
    (Engine.SGLANG, "0.5.3"): "lmsysorg/sglang:v0.5.3-cu129",
}


def _model_name(model: RequestModel) -> str:
    return label(model).replace(".", "-")


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    """One chat model per vendored release, each running that release's image."""
    lines = ["models:"]
    for model in CHAT_MODELS:
        image = IMAGES[(model.engine, model.release)]
        lines.append(
            f"  {_model_name(model)}: {{roles: [chat], profiles: [{{engine: {model.engine.value}, "
            f"source: org/m, image: '{image}', tool_call_parser: hermes}}]}}"
        )
    result = load_catalog("\n".join(lines) + "\n", filename="c.yaml", policy=read_security_policy())
    assert result.catalog is not None, result.diagnostics
    return result.catalog


def test_every_vendored_release_has_a_chat_model_and_the_images_are_those_releases() -> None:
    assert {(m.engine, m.release) for m in CHAT_MODELS} == set(IMAGES)
    for (engine, release), image in IMAGES.items():
        assert releases_for_image(engine, image) == (release,)
    # The default images run a vendored release each.
    for engine in (Engine.VLLM, Engine.SGLANG):
        assert releases_for_image(engine, DEFAULT_IMAGES[engine]) != ()


# --- the requests, as the clients send them ------------------------------------------------------

_TOOL = {
    "type": "function", "name": "exec_command", "description": "run a command", "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}  # fmt: skip
_CODEX_INPUT = [
    {"type": "message", "id": "msg_1", "role": "developer",
     "content": [{"type": "input_text", "text": "rules"}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]},
]  # fmt: skip
_CODEX_FOLLOW_UP = [
    *_CODEX_INPUT,
    {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "ls"}]},
    {"type": "function_call", "id": "fc_1", "status": "completed", "call_id": "call_1",
     "name": "exec_command", "arguments": '{"cmd": "ls"}'},
    {"type": "function_call_output", "id": "fco_1", "call_id": "call_1", "output": "a\nb\n"},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "two files"}]},
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "later rules"}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
]  # fmt: skip
_CODEX: dict[str, Any] = {
    "model": "m", "stream": True, "instructions": "be brief", "input": _CODEX_INPUT, "tools": [_TOOL],
    "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"}, "store": False,
    "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k",
    "client_metadata": {"session_id": "s"},
}  # fmt: skip

RESPONSES: dict[str, dict[str, Any]] = {
    "codex turn": _CODEX,
    "codex follow-up after a tool ran": {**_CODEX, "input": _CODEX_FOLLOW_UP},
    "a string input, whole, sampling": {
        "model": "m", "input": "hi", "max_output_tokens": 32, "temperature": 0.2, "top_p": 0.9,
        "user": "u", "metadata": {"a": "b"}, "store": True, "truncation": "disabled", "service_tier": "auto",
    },
    "images by URL and data URL": {
        "model": "m", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "what is this"},
            {"type": "input_image", "image_url": "https://example.invalid/a.png", "detail": "high"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"},
        ]}],
    },
    "tool_choice required": {**_CODEX, "tool_choice": "required", "parallel_tool_calls": False},
    "tool_choice none": {**_CODEX, "tool_choice": "none"},
    "a named tool": {**_CODEX, "tool_choice": {"type": "function", "name": "exec_command"}},
    "tools and no choice": {k: v for k, v in _CODEX.items() if k != "tool_choice"},
    "structured output: json_schema": {
        "model": "m", "input": "hi",
        "text": {"format": {"type": "json_schema", "name": "answer", "strict": True, "description": "d",
                            "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}},
    },
    "structured output: json_object": {"model": "m", "input": "json please",
                                       "text": {"format": {"type": "json_object"}}},
    "plain text format": {"model": "m", "input": "hi", "text": {"format": {"type": "text"}}},
    "streamed with stream_options": {"model": "m", "input": "hi", "stream": True,
                                      "stream_options": {"include_obfuscation": False}},
    **{
        f"reasoning.effort {effort}": {**_CODEX, "reasoning": {"effort": effort, "summary": "auto"}}
        for effort in ("none", "minimal", "low", "medium", "high", "xhigh")
    },
}  # fmt: skip

_CLAUDE_TOOLS = [
    {"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {
        "command": {"type": "string"}, "description": {"type": "string"}}, "required": ["command"]},
     "cache_control": {"type": "ephemeral"}},
    {"name": "Read", "description": "read", "input_schema": {"type": "object"}, "defer_loading": True},
]  # fmt: skip
_CLAUDE: dict[str, Any] = {
    "model": "m", "max_tokens": 32000, "stream": True,
    "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "list the files"}]},
        {"role": "system", "content": [{"type": "text", "text": "<env>cwd=/w</env>"}]},
    ],
    "tools": _CLAUDE_TOOLS, "metadata": {"user_id": "user_1"},
    "thinking": {"type": "adaptive", "display": "omitted"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "temperature": 1,
}  # fmt: skip
_CLAUDE_FOLLOW_UP = [
    *_CLAUDE["messages"],
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "use ls", "signature": ""},
        {"type": "text", "text": "Listing."},
        {"type": "tool_use", "id": "call_1", "name": "Bash",
         "input": {"command": "ls", "description": "list"}},
    ]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "a\nb", "is_error": False,
         "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "and now?"},
    ]},
    {"role": "assistant", "content": [
        {"type": "tool_use", "id": "call_2", "name": "Read", "input": {"path": "a"}},
    ]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "call_2", "is_error": True,
         "content": [{"type": "text", "text": "no such file"}]},
    ]},
]  # fmt: skip

MESSAGES: dict[str, dict[str, Any]] = {
    "claude code turn": _CLAUDE,
    "claude code follow-up after tools ran": {**_CLAUDE, "messages": _CLAUDE_FOLLOW_UP},
    "a string system, whole, sampling, stops": {
        "model": "m", "max_tokens": 100, "system": "sys", "top_p": 0.9, "top_k": 40,
        "stop_sequences": ["END"], "messages": [{"role": "user", "content": "hi"}], "service_tier": "auto",
    },
    "images, base64 and URL": {
        "model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
            {"type": "image", "source": {"type": "url", "url": "https://example.invalid/a.png"}},
            {"type": "text", "text": "what are these"},
        ]}],
    },
    "tool_choice auto, one call at a time": {
        **_CLAUDE, "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}},
    "tool_choice any": {**_CLAUDE, "tool_choice": {"type": "any"}},
    "tool_choice none": {**_CLAUDE, "tool_choice": {"type": "none"}},
    "a named tool": {**_CLAUDE, "tool_choice": {"type": "tool", "name": "Bash"}},
    "thinking disabled": {**_CLAUDE, "thinking": {"type": "disabled"}},
    **{
        f"output_config.effort {effort}": {**_CLAUDE, "output_config": {"effort": effort}}
        for effort in ("low", "medium", "high", "max")
    },
}  # fmt: skip

_CHAT_TOOLS = [
    {"type": "function",
     "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}}},
]  # fmt: skip
CHATS: dict[str, dict[str, Any]] = {
    "plain": {"model": "m",
              "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]},
    "streamed without the usage chunk (the router asks for it)": {
        "model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
    "streamed, usage asked": {"model": "m", "stream": True, "stream_options": {"include_usage": True},
                              "messages": [{"role": "user", "content": "hi"}]},
    "tools, a call and its result": {
        "model": "m", "tools": _CHAT_TOOLS, "tool_choice": "auto", "max_tokens": 50,
        "messages": [
            {"role": "user", "content": "call f"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
        ]},
    "an image": {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}]},
    "a json_schema response format": {
        "model": "m", "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "a", "schema": {"type": "object"}}}},
}  # fmt: skip


# --- the bodies, as the router sends them ------------------------------------------------------


def _responses_body(catalog: Catalog, model: RequestModel, request: Mapping[str, Any]) -> dict[str, Any]:
    parsed = responses.parse_request(copy.deepcopy(dict(request)))
    history = [{"role": "user", "content": "an earlier turn"}, {"role": "assistant", "content": "ok"}]
    chat = responses.chat_after(parsed, history)
    call = parse_call(Api.CHAT, json.dumps(chat).encode())
    shape = release_shaper(catalog, DEFAULT_IMAGES, responses.asked_effort(parsed.body))
    # What ``gateway.responses.create_response`` sends: the chat call, shaped per model.
    return _sent(replace(call, shape=shape), model)


def _sent(call: ApiCall, model: RequestModel) -> dict[str, Any]:
    body = json.loads(call.upstream_body(_model_name(model), force_usage=True))
    assert isinstance(body, dict)
    return body


def _messages_body(catalog: Catalog, model: RequestModel, request: Mapping[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(dict(request))
    chat = anthropic.to_chat(body)
    shape = release_shaper(catalog, DEFAULT_IMAGES, anthropic.asked_effort(body))
    # What ``messages._ChatTranslation.body`` sends: the shaped chat, the model named.
    return {**shape(_model_name(model), chat), "model": _model_name(model)}


def _chat_body(model: RequestModel, request: Mapping[str, Any]) -> dict[str, Any]:
    return _sent(parse_call(Api.CHAT, json.dumps(request).encode()), model)


def _cases() -> Iterator[Any]:
    for model in CHAT_MODELS:
        for api, table in (("responses", RESPONSES), ("messages", MESSAGES), ("chat", CHATS)):
            for name in table:
                yield pytest.param(model, api, name, id=f"{label(model)}: {api}: {name}")


@pytest.mark.parametrize(("model", "api", "case"), list(_cases()))
def test_every_translated_body_is_one_the_release_takes_whole(
    catalog: Catalog, model: RequestModel, api: str, case: str
) -> None:
    if api == "responses":
        body = _responses_body(catalog, model, RESPONSES[case])
    elif api == "messages":
        body = _messages_body(catalog, model, MESSAGES[case])
    else:
        body = _chat_body(model, CHATS[case])
    assert problems(model, body) == [], json.dumps(body)[:2000]


def _model(engine: Engine, release: str) -> RequestModel:
    return request_models(engine)[release][RequestApi.CHAT]


_HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("engine", "release", "body", "expected"),
    [
        # The developer role: SGLang 0.5.3's message models have no such role.
        (Engine.SGLANG, "0.5.3", {"messages": [{"role": "developer", "content": "r"}, *_HI]},
         "refused: messages.0"),
        (Engine.VLLM, "0.11.0", {"messages": _HI, "reasoning_effort": "xhigh"}, "refused: reasoning_effort"),
        (Engine.SGLANG, "0.5.3", {"messages": _HI, "reasoning_effort": "none"}, "refused: reasoning_effort"),
        (Engine.VLLM, "0.34.0", {"messages": _HI, "reasoning_effort": "ultra"}, "refused: reasoning_effort"),
        # SGLang 0.5.23's field validator (JSON schema reads a boolean as no number).
        (Engine.SGLANG, "0.5.23", {"messages": _HI, "reasoning_effort": True}, "must not be a boolean"),
        # SGLang 0.5.3 drops what it does not declare, at the top and inside a message.
        (Engine.SGLANG, "0.5.3", {"messages": _HI, "parallel_tool_calls": False}, "dropped: <body>"),
        (Engine.SGLANG, "0.5.23", {"messages": [{"role": "user", "content": "hi", "x": 1}]},
         "dropped: messages.0"),
        (Engine.VLLM, "0.34.0", {"messages": _HI, "stream_options": {"include_usage": True}},
         "stream=True"),
        (Engine.VLLM, "0.11.0", {"messages": _HI, "tool_choice": "auto"}, "`tools` must be set"),
        (Engine.VLLM, "0.34.0", {"messages": _HI, "tools": _CHAT_TOOLS,
                                 "tool_choice": {"type": "function", "function": {"name": "g"}}},
         "does not match"),
        (Engine.SGLANG, "0.5.23", {"messages": _HI, "tool_choice": "required"}, "Tools cannot be empty"),
        (Engine.SGLANG, "0.5.23", {"messages": _HI, "tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "objekt"}}}]}, "invalid 'parameters' schema"),
        (Engine.VLLM, "0.34.0", {"messages": _HI, "response_format": {"type": "json_schema"}}, "json_schema"),
    ],
)  # fmt: skip
def test_the_checks_refuse_what_each_release_refuses(
    engine: Engine, release: str, body: dict[str, Any], expected: str
) -> None:
    found = problems(_model(engine, release), {"model": "m", **body})
    assert any(expected in problem for problem in found), found


@pytest.mark.parametrize("release", ["0.11.0", "0.34.0"])
def test_vllm_assumes_auto_with_tools_and_refuses_it_without_the_tool_call_flags(release: str) -> None:
    """vLLM makes ``tool_choice`` auto when tools come without one (``check_tool_usage``)
    and answers auto 400 unless started with --enable-auto-tool-choice and a parser: the
    flags every chat profile renders (``tool_calling.tool_call_args``)."""
    body = {"model": "m", "messages": _HI, "tools": _CHAT_TOOLS}
    model = _model(Engine.VLLM, release)
    assert validator_problems(model, body) == []
    refused = validator_problems(model, body, ServerFlags(tool_calling=False))
    assert [problem.param for problem in refused] == ["tool_choice"]
    assert "--enable-auto-tool-choice" in refused[0].message


def test_the_messages_models_drop_what_they_do_not_declare() -> None:
    for engine, release in ((Engine.VLLM, "0.34.0"), (Engine.SGLANG, "0.5.23")):
        schema = dropping_schema(request_models(engine)[release][RequestApi.MESSAGES].schema)
        assert schema["additionalProperties"] is False


@pytest.mark.parametrize(
    ("asked", "old", "new"),
    [
        # vLLM 0.11.0 and SGLang 0.5.3 take low, medium and high; 0.34.0 and 0.5.23 every word.
        ("none", "low", "none"),
        ("minimal", "low", "minimal"),
        ("low", "low", "low"),
        ("medium", "medium", "medium"),
        ("high", "high", "high"),
        ("xhigh", "high", "xhigh"),
    ],
)
def test_a_responses_effort_reaches_each_release_as_the_nearest_word_it_takes(
    catalog: Catalog, asked: str, old: str, new: str
) -> None:
    request = {**_CODEX, "reasoning": {"effort": asked}}
    sent = {
        label(model): _responses_body(catalog, model, request)["reasoning_effort"] for model in CHAT_MODELS
    }
    assert sent == {"vllm-0.11.0": old, "vllm-0.34.0": new, "sglang-0.5.3": old, "sglang-0.5.23": new}


@pytest.mark.parametrize(("asked", "old", "new"), [("low", "low", "low"), ("max", "high", "max")])
def test_a_messages_effort_reaches_each_release_as_the_nearest_word_it_takes(
    catalog: Catalog, asked: str, old: str, new: str
) -> None:
    request = {**_CLAUDE, "output_config": {"effort": asked}}
    sent = {
        label(model): _messages_body(catalog, model, request)["reasoning_effort"] for model in CHAT_MODELS
    }
    assert sent == {"vllm-0.11.0": old, "vllm-0.34.0": new, "sglang-0.5.3": old, "sglang-0.5.23": new}


def test_parallel_tool_calls_reaches_the_releases_that_have_it_only(catalog: Catalog) -> None:
    request = {**_CLAUDE, "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}
    sent = {
        label(model): _messages_body(catalog, model, request).get("parallel_tool_calls")
        for model in CHAT_MODELS
    }
    assert sent == {"vllm-0.11.0": False, "vllm-0.34.0": False, "sglang-0.5.3": None, "sglang-0.5.23": False}


def test_the_effort_table_is_what_each_vendored_release_declares() -> None:
    """``engine_chat_fields.CHAT_FIELDS`` against the vendored schemas: every word on the
    scale a release's ``reasoning_effort`` enum holds, and whether it declares
    ``parallel_tool_calls`` (or, keeping undeclared fields, takes it)."""
    for engine in (Engine.VLLM, Engine.SGLANG):
        for release, models in request_models(engine).items():
            chat = models[RequestApi.CHAT]
            words: set[str] = set()
            for branch in chat.schema["properties"]["reasoning_effort"]["anyOf"]:
                words.update(branch.get("enum", ()))
            facts = engine_chat_fields.CHAT_FIELDS[engine][release]
            assert facts.efforts == words & set(engine_chat_fields.SCALE), (engine, release)
            assert facts.parallel_tool_calls == ("parallel_tool_calls" in chat.declared), (engine, release)
    assert (
        frozenset.intersection(
            *(facts.efforts for rows in engine_chat_fields.CHAT_FIELDS.values() for facts in rows.values())
        )
        == engine_chat_fields.SAFE_EFFORTS
    )


@pytest.mark.parametrize(
    ("engine", "release", "expected"),
    [
        (Engine.VLLM, Release((0, 34, 0, 0)), ("0.34.0",)),
        (Engine.VLLM, Release((0, 20, 1, 0)), ("0.11.0", "0.34.0")),  # between: both must take it
        (Engine.VLLM, Release((0, 40, 0, 0)), ("0.34.0",)),  # newer: the newest
        (Engine.VLLM, Release((0, 10, 2, 0)), ()),  # older than every vendored release
        (Engine.SGLANG, Release((0, 5, 10, 0)), ("0.5.3", "0.5.23")),
    ],
)
def test_a_release_stands_for_the_vendored_ones_around_it(
    engine: Engine, release: Release, expected: tuple[str, ...]
) -> None:
    assert releases_for(engine, release) == expected


@pytest.mark.parametrize(
    ("engine", "release", "efforts", "parallel"),
    [
        (Engine.VLLM, Release((0, 20, 0, 0)), engine_chat_fields.SAFE_EFFORTS, True),
        (Engine.SGLANG, Release((0, 5, 10, 0)), engine_chat_fields.SAFE_EFFORTS, False),
        (Engine.SGLANG, Release((0, 6, 0, 0)), frozenset(engine_chat_fields.SCALE), True),
        (Engine.VLLM, None, engine_chat_fields.SAFE_EFFORTS, False),  # a digest: unknown
        (Engine.LLAMACPP, Release((6795,)), engine_chat_fields.SAFE_EFFORTS, False),  # not read
    ],
)
def test_the_fields_of_a_release_not_in_the_table(
    engine: Engine, release: Release | None, efforts: frozenset[str], parallel: bool
) -> None:
    facts = engine_chat_fields.fields_of(engine, release)
    assert (facts.efforts, facts.parallel_tool_calls) == (efforts, parallel)


def test_a_model_of_two_releases_gets_what_both_take() -> None:
    text = """
models:
  m:
    roles: [chat]
    profiles:
      - {engine: vllm, source: org/m, tool_call_parser: hermes}
      - {engine: sglang, source: org/m, image: 'lmsysorg/sglang:v0.5.3-cu129', tool_call_parser: qwen25}
"""
    result = load_catalog(text, filename="c.yaml", policy=read_security_policy())
    assert result.catalog is not None, result.diagnostics
    shape = release_shaper(result.catalog, DEFAULT_IMAGES, "xhigh")
    chat = {"messages": _HI, "reasoning_effort": "high", "parallel_tool_calls": True}
    # The first profile runs the default image (vLLM 0.34.0), the second SGLang 0.5.3.
    assert shape("m", chat) == {"messages": _HI, "reasoning_effort": "high"}
    alone = release_shaper(result.catalog, {**DEFAULT_IMAGES}, "xhigh")
    assert alone("unknown-model", chat) == chat


@pytest.mark.parametrize("model", supported(RequestApi.MESSAGES), ids=label)
@pytest.mark.parametrize("case", list(MESSAGES))
def test_a_native_messages_body_is_one_the_native_releases_take(model: RequestModel, case: str) -> None:
    """What the router's native path (``messages.native``: today the sim's) would pass on
    to vLLM 0.34.0's or SGLang 0.5.23's own /v1/messages: the client's body, the model
    named. Neither release refuses any; both drop what the translation reads and keeps
    to itself (cache breakpoints, citations, deferred loading, context edits, the
    service tier), one reason the router translates for them (gateway/DESIGN.md)."""
    call = parse_call(Api.MESSAGES, json.dumps(MESSAGES[case]).encode())
    body = _sent(call, model)
    found = problems(model, body)
    assert [problem for problem in found if problem.startswith("refused")] == []
    # What they drop is exactly those fields: without them, nothing is lost.
    kept = _without(body, _KEPT_BY_THE_ROUTER)
    assert problems(model, kept) == []
    assert bool(found) == (kept != body)


# Fields the translation reads and passes on to no engine (anthropic.py says why).
_KEPT_BY_THE_ROUTER = frozenset(
    {"cache_control", "citations", "defer_loading", "context_management", "service_tier"}
)


def _without(value: Any, names: frozenset[str]) -> Any:
    if isinstance(value, dict):
        return {key: _without(item, names) for key, item in value.items() if key not in names}
    if isinstance(value, list):
        return [_without(item, names) for item in value]
    return value
