"""The third attack pass (issue #28): new inputs at the surfaces the second pass's fixes
closed (the door's type checks, the stored conversations' ids, token holds, count_tokens,
compressed bodies): each must be a 4xx in its API's shape, never a 500, and the router
serves the next request."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from .conftest import Cluster, StartRouter

_ID = "resp_" + "0" * 48
_HI = [{"role": "user", "content": "hi"}]

_ATTACKS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/responses", {"input": "hi", "store": "yes"}),
    ("/v1/responses", {"input": "hi", "store": None}),
    ("/v1/responses", {"input": "hi", "previous_response_id": 123}),
    ("/v1/responses", {"input": "hi", "previous_response_id": [_ID]}),
    ("/v1/responses", {"input": "hi", "previous_response_id": _ID.upper()}),
    ("/v1/responses", {"input": "hi", "previous_response_id": _ID + "\n"}),
    ("/v1/responses", {"input": "hi", "previous_response_id": "../../keys/k-1"}),
    ("/v1/responses", {"input": "hi", "previous_response_id": "resp_" + "0" * 47 + "/"}),
    ("/v1/responses", {"input": "hi", "metadata": {"a": []}}),
    ("/v1/responses", {"input": "hi", "text": {"format": {"type": "json_schema", "schema": []}}}),
    ("/v1/responses", {"input": "hi", "tools": [{"type": "function", "name": []}]}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 10**30}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": -1}),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_text", "text": []}]}]}),
    ("/v1/chat/completions", {"messages": _HI, "max_tokens": 10**30}),
    ("/v1/chat/completions", {"messages": _HI, "max_tokens": -5}),
    ("/v1/chat/completions", {"messages": _HI, "max_completion_tokens": []}),
    (
        "/v1/chat/completions",
        {"messages": _HI, "response_format": {"type": []}},
    ),
    ("/v1/chat/completions", {"messages": _HI, "stream_options": []}),
    ("/v1/chat/completions", {"messages": _HI, "n": 10**9}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": {}}]}]}),
    ("/v1/messages", {"max_tokens": 10**30, "messages": _HI}),
    (
        "/v1/messages",
        {"max_tokens": 10, "thinking": {"type": []}, "messages": _HI},
    ),
    ("/v1/messages", {"max_tokens": 10, "tool_choice": [], "messages": _HI}),
    ("/v1/messages", {"max_tokens": 10, "system": [{"type": "text", "text": []}], "messages": []}),
    (
        "/v1/messages/count_tokens",
        {"messages": [{"role": "user", "content": [{"type": "image", "source": []}]}]},
    ),
    ("/v1/messages/count_tokens", {"messages": [{"role": [], "content": "hi"}]}),
    ("/v1/messages/count_tokens", {"messages": "hi"}),
]


@pytest.mark.parametrize(("path", "body"), _ATTACKS, ids=[f"{p} {json.dumps(b)[:60]}" for p, b in _ATTACKS])
async def test_a_new_wrong_body_is_a_4xx_and_the_router_serves_on(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, path: str, body: dict[str, Any]
) -> None:
    await cluster.add_sim("sim-chat")
    router = await start_router()
    async with http.post(router.url + path, json={"model": "sim-chat", **body}) as reply:
        text = await reply.text()
        assert reply.status < 500, text
        if reply.status >= 400:
            error = json.loads(text)["error"]
            assert isinstance(error["message"], str) and error["message"]
    async with http.get(router.url + "/health") as health:
        assert health.status == 200
