"""A model that cannot call tools answers a request that needs them with a 400 naming the
model, in the shape of the client's API (chat completions and Responses: OpenAI's;
Messages: Anthropic's), before any engine sees it: the engine would answer 400 (vLLM
without a parser), 500 (llama-server without jinja) or the model's tool markup as text
(SGLang). Each test tries a way around it; a request that needs no tools still passes."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from .conftest import Cluster, StartRouter

CATALOG = """
models:
  no-parser:          # SGLang, a source of no known family: no tool-call parser
    roles: [chat]
    profiles: [{engine: sglang, source: org/m}]
    scaling: {min: 1, max: 1}
  declared-none:      # said so in the catalog
    roles: [chat]
    profiles: [{engine: sim, tool_call_parser: none}]
    scaling: {min: 1, max: 1}
  qwen:               # the Qwen2.5 family's default parser
    roles: [chat]
    profiles: [{engine: sglang, source: Qwen/Qwen2.5-7B-Instruct}]
    scaling: {min: 1, max: 1}
fallbacks:
  qwen: [no-parser]
"""
FUNCTION = {
    "type": "function",
    "function": {"name": "Bash", "parameters": {"type": "object", "properties": {}}},
}
USER = [{"role": "user", "content": "hello there"}]


@pytest.fixture
async def router_url(cluster: Cluster, start_router: StartRouter) -> str:
    cluster.set_catalog(CATALOG)
    for model in ("no-parser", "declared-none", "qwen"):
        await cluster.add_sim(model)
    return (await start_router()).url


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with http.post(url, json=body) as answer:
        return answer.status, await answer.json(content_type=None)


@pytest.mark.parametrize("model", ["no-parser", "declared-none"])
@pytest.mark.parametrize(
    "extra",
    [
        {"tools": [FUNCTION]},
        {"tools": [FUNCTION], "tool_choice": "none"},  # offered all the same: the template renders them
        {"tool_choice": "required"},  # forces a call without offering one
        {"tool_choice": {"type": "function", "function": {"name": "Bash"}}},
    ],
)
async def test_chat_completions_with_tools_get_openais_400_naming_the_model(
    router_url: str, http: aiohttp.ClientSession, model: str, extra: dict[str, Any]
) -> None:
    status, body = await _post(
        http,
        router_url + "/v1/chat/completions",
        {"model": model, "messages": USER, "max_tokens": 2, **extra},
    )
    assert status == 400, body
    error = body["error"]
    assert f"The model `{model}` cannot call tools" in error["message"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "tools_not_supported",
        "tools",
    )


async def test_responses_function_tools_get_openais_400_naming_the_model(
    router_url: str, http: aiohttp.ClientSession
) -> None:
    tool = {"type": "function", "name": "Bash", "parameters": {"type": "object", "properties": {}}}
    status, body = await _post(
        http, router_url + "/v1/responses", {"model": "no-parser", "input": "hello there", "tools": [tool]}
    )
    assert status == 400, body
    assert "The model `no-parser` cannot call tools" in body["error"]["message"]
    assert body["error"]["code"] == "tools_not_supported"


@pytest.mark.parametrize(
    "extra",
    [{"tools": [{"name": "Bash", "input_schema": {"type": "object"}}]}, {"tool_choice": {"type": "any"}}],
)
async def test_messages_tools_get_anthropics_400_naming_the_model(
    router_url: str, http: aiohttp.ClientSession, extra: dict[str, Any]
) -> None:
    status, body = await _post(
        http, router_url + "/v1/messages", {"model": "no-parser", "max_tokens": 2, "messages": USER, **extra}
    )
    assert status == 400, body
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "The model `no-parser` cannot call tools" in body["error"]["message"]


@pytest.mark.parametrize(
    "extra", [{}, {"tools": []}, {"tool_choice": "none"}, {"tools": [], "tool_choice": "auto"}]
)
async def test_a_request_that_needs_no_tools_is_answered(
    router_url: str, http: aiohttp.ClientSession, extra: dict[str, Any]
) -> None:
    # tools: [] offers none (llama-server and vLLM read it as no tools), so it is a plain chat.
    status, body = await _post(
        http,
        router_url + "/v1/chat/completions",
        {"model": "no-parser", "messages": USER, "max_tokens": 2, **extra},
    )
    assert status == 200, body
    assert body["choices"][0]["message"]["content"]


async def test_a_model_with_a_parser_answers_tools(router_url: str, http: aiohttp.ClientSession) -> None:
    chat = {"model": "qwen", "messages": USER, "max_tokens": 2, "tools": [FUNCTION]}
    status, body = await _post(http, router_url + "/v1/chat/completions", chat)
    assert status == 200, body


async def test_a_fallback_that_cannot_call_tools_is_not_tried_for_a_request_with_tools(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    # qwen has no replica: a plain request falls back to no-parser; one with tools does not
    # (no-parser's engine would answer it with the model's tool markup as text).
    cluster.set_catalog(CATALOG)
    await cluster.add_sim("no-parser")
    url = (await start_router()).url + "/v1/chat/completions"
    plain = {"model": "qwen", "messages": USER, "max_tokens": 2}
    status, body = await _post(http, url, plain)
    assert (status, body.get("model")) == (200, "no-parser"), body
    status, body = await _post(http, url, {**plain, "tools": [FUNCTION]})
    assert status == 503, body
    assert "qwen" in body["error"]["message"]
