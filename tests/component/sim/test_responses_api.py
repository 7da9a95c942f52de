"""The simulator's ``/v1/responses`` in vLLM's shapes, read by the official client."""

from __future__ import annotations

import aiohttp
import openai
import pytest

from llmgw.sim import vocabulary
from tests.support.sim import TEST_MODEL, fast_settings

from .conftest import ClientFor, StartServer


async def test_a_response_whole_and_streamed(
    start_server: StartServer, client_for: ClientFor, http: aiohttp.ClientSession
) -> None:
    server = await start_server(fast_settings(served_model_name=TEST_MODEL))
    client = client_for(server)
    reply = await client.responses.create(
        model=TEST_MODEL, instructions="be kind", input="say something nice", max_output_tokens=6
    )
    assert reply.id.startswith("resp_") and reply.object == "response" and reply.model == TEST_MODEL
    assert len(reply.output_text.split()) == 6
    assert reply.status == "incomplete" and reply.usage is not None and reply.usage.output_tokens == 6
    # The prompt is the instructions and the input, as the chat template would read them.
    assert reply.usage.input_tokens == 5  # "be kind" and "say something nice"

    stream = await client.responses.create(
        model=TEST_MODEL, input="say something nice", max_output_tokens=3, stream=True
    )
    events = [event async for event in stream]
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert all(word in vocabulary.GREEK for word in final.output_text.split())
    assert final.usage is not None and final.usage.output_tokens == 3
    async with http.get(str(server.make_url("/sim/stats"))) as response:
        stats = await response.json()
    assert stats["requests_total"] == 2


async def test_what_vllm_refuses_without_its_store(start_server: StartServer, client_for: ClientFor) -> None:
    client = client_for(await start_server(fast_settings(served_model_name=TEST_MODEL)))
    with pytest.raises(openai.NotFoundError) as caught:
        await client.responses.create(model=TEST_MODEL, input="hi", previous_response_id="resp_abc")
    assert "Response with id 'resp_abc' not found." in caught.value.message
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model=TEST_MODEL, input="hi", tools=[{"type": "web_search"}])
    assert refused.value.body["param"] == "tools[0].type"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(model="another-model", input="hi")
