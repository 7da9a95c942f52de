"""The sim's Messages API, as the official ``anthropic`` client sees it (vLLM's shapes)."""

from __future__ import annotations

from typing import Any

import aiohttp
import anthropic
import pytest
from aiohttp.test_utils import TestServer

from llmgw.sim import vocabulary
from tests.support.sim import TEST_MODEL, fast_settings

from .conftest import StartServer

USER = [{"role": "user", "content": "say something nice"}]


def _client(server: TestServer) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=str(server.make_url("")).rstrip("/"), api_key="sk-sim", max_retries=0
    )


async def test_a_message_and_its_stream_say_greek_up_to_max_tokens(start_server: StartServer) -> None:
    async with _client(await start_server()) as client:
        message = await client.messages.create(
            model=TEST_MODEL, max_tokens=4, messages=USER, system="be kind"
        )
        assert message.id.startswith("msg_") and message.model == TEST_MODEL
        text = message.content[0].text  # type: ignore[union-attr]
        assert len(text.split()) == 4 and all(word in vocabulary.GREEK for word in text.split())
        assert message.stop_reason == "max_tokens"
        assert (message.usage.input_tokens, message.usage.output_tokens) == (5, 4)
        types = []
        async with client.messages.stream(model=TEST_MODEL, max_tokens=3, messages=USER) as stream:
            async for event in stream:
                types.append(event.type)
            final = await stream.get_final_message()
        assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
        assert types.count("content_block_delta") == 3
        assert (final.usage.input_tokens, final.usage.output_tokens) == (3, 3)
        counted = await client.messages.count_tokens(model=TEST_MODEL, messages=USER, system="be kind")
        assert counted.input_tokens == 5


async def test_errors_are_in_anthropics_shape(start_server: StartServer, http: aiohttp.ClientSession) -> None:
    server = await start_server()
    async with _client(server) as client:
        with pytest.raises(anthropic.NotFoundError) as caught:
            await client.messages.create(model="other", max_tokens=4, messages=USER)
        assert caught.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    async with http.post(
        server.make_url("/v1/messages"), json={"model": TEST_MODEL, "messages": USER}
    ) as response:
        assert response.status == 400
        assert await response.json() == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
        }


async def test_a_system_message_among_the_messages_is_read_as_claude_code_sends_it(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    server = await start_server()
    environment = {"role": "system", "content": [{"type": "text", "text": "be kind"}]}
    async with http.post(
        server.make_url("/v1/messages"),
        json={"model": TEST_MODEL, "max_tokens": 2, "messages": [*USER, environment]},
    ) as response:
        assert response.status == 200
        assert (await response.json())["usage"] == {"input_tokens": 5, "output_tokens": 2}
    async with http.post(
        server.make_url("/v1/messages"),
        json={"model": TEST_MODEL, "max_tokens": 2, "messages": [*USER, {"role": "tool", "content": "x"}]},
    ) as response:
        assert response.status == 400


async def test_answer_tokens_ends_a_message_with_end_turn(start_server: StartServer) -> None:
    async with _client(await start_server(fast_settings(answer_tokens=3))) as client:
        message = await client.messages.create(model=TEST_MODEL, max_tokens=4000, messages=USER)
        assert message.stop_reason == "end_turn" and message.usage.output_tokens == 3
        async with client.messages.stream(model=TEST_MODEL, max_tokens=4000, messages=USER) as stream:
            final = await stream.get_final_message()
        assert final.stop_reason == "end_turn" and final.usage.output_tokens == 3


async def test_tokenize_counts_a_chat_as_vllm_does(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    server = await start_server(fast_settings(max_model_len=512))
    async with http.post(
        server.make_url("/tokenize"), json={"model": TEST_MODEL, "messages": USER}
    ) as response:
        body = await response.json()
    assert body["count"] == 3 and body["max_model_len"] == 512 and len(body["tokens"]) == 3


_BASH: Any = {
    "name": "Bash",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}


async def test_tool_calls_answer_a_turn_that_offers_the_tool_with_a_tool_use_block(
    start_server: StartServer,
) -> None:
    settings = fast_settings(answer_tokens=3, tool_calls=(("Bash", '{"command": "echo hi there"}'),))
    async with _client(await start_server(settings)) as client:
        message = await client.messages.create(
            model=TEST_MODEL, max_tokens=4000, messages=USER, tools=[_BASH]
        )
        assert message.stop_reason == "tool_use" and message.usage.output_tokens == 4
        [block] = message.content
        assert block.type == "tool_use" and block.id.startswith("chatcmpl-tool-")
        assert (block.name, block.input) == ("Bash", {"command": "echo hi there"})
        async with client.messages.stream(
            model=TEST_MODEL, max_tokens=4000, messages=USER, tools=[_BASH]
        ) as stream:
            final = await stream.get_final_message()
        # The SDK joins the input_json_deltas into the block's input.
        assert final.stop_reason == "tool_use" and final.usage.output_tokens == 4
        assert [(b.type, getattr(b, "input", None)) for b in final.content] == [
            ("tool_use", {"command": "echo hi there"})
        ]

        result: Any = [
            *USER,
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": block.id, "name": "Bash", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "hi there"}],
            },
        ]
        for messages, tool_choice in ((result, {"type": "auto"}), (USER, {"type": "none"})):
            answer = await client.messages.create(
                model=TEST_MODEL, max_tokens=4000, messages=messages, tools=[_BASH], tool_choice=tool_choice
            )
            assert answer.stop_reason == "end_turn" and [b.type for b in answer.content] == ["text"]


async def test_reasoning_is_a_thinking_block_whole_and_streamed(start_server: StartServer) -> None:
    # --reasoning-tokens through Messages as vLLM's converter answers it: a thinking block
    # (with a signature) before the text, not the reasoning run into the text.
    async with _client(await start_server(fast_settings(reasoning_tokens=3))) as client:
        message = await client.messages.create(model=TEST_MODEL, max_tokens=5, messages=USER)
        assert [block.type for block in message.content] == ["thinking", "text"]
        thinking, text = message.content
        assert len(thinking.thinking.split()) == 3 and thinking.signature  # type: ignore[union-attr]
        assert len(text.text.split()) == 2  # type: ignore[union-attr]
        assert message.usage.output_tokens == 5

        async with client.messages.stream(model=TEST_MODEL, max_tokens=5, messages=USER) as stream:
            deltas = [event.delta.type async for event in stream if event.type == "content_block_delta"]
            final = await stream.get_final_message()
        assert deltas == ["thinking_delta"] * 3 + ["signature_delta"] + ["text_delta"] * 2
        assert [block.type for block in final.content] == ["thinking", "text"]
        assert final.content[0].thinking == thinking.thinking  # type: ignore[union-attr]
        assert final.content[1].text == text.text  # type: ignore[union-attr]

        # A budget the reasoning takes whole: the thinking block alone, closed and signed.
        async with client.messages.stream(model=TEST_MODEL, max_tokens=2, messages=USER) as stream:
            short = await stream.get_final_message()
        assert [block.type for block in short.content] == ["thinking"]
        assert short.content[0].signature  # type: ignore[union-attr]
