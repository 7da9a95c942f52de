"""The simulator's ``POST /v1/responses``: OpenAI's Responses API in vLLM's shapes.

Owns the Responses request's way through the simulator: it is checked and read as
``llmgw.core.responses`` reads it (the subset llmgw carries, a 400 naming anything
else), generated as a chat completion is (the same Greek words, token rate, faults
and counters), and answered as a Response object or as the Responses stream events
in the order vLLM 0.11's ``serving_responses.py`` sends them (``StreamTranslation``).

As vLLM does without ``VLLM_ENABLE_RESPONSES_API_STORE`` (its default), it stores
nothing: ``store`` is accepted and ignored, and a ``previous_response_id`` is
answered 404 ``Response with id '…' not found.``. The router never sends either:
it keeps the conversation itself and sends every turn in ``input``.

Must not: hold state between requests beyond the engine's counters.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web

from llmgw.core import responses
from llmgw.core.responses import ResponsesInvalid
from llmgw.sim import openai_api, streaming
from llmgw.sim.openai_api import ApiError, GenerationRequest
from llmgw.sim.settings import SimSettings

if TYPE_CHECKING:
    from llmgw.sim.app import SimState

Admit = Callable[[web.Request], Awaitable[tuple["SimState", dict[str, Any]]]]
Pieces = Callable[[SimSettings, GenerationRequest], Iterator[str]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def handler(admit: Admit, pieces: Pieces) -> Handler:
    """The route's handler, with the app's own admission (faults, body, model,
    readiness) and words."""

    async def create_response(request: web.Request) -> web.StreamResponse:
        state, body = await admit(request)
        try:
            parsed = responses.parse_request(body)
        except ResponsesInvalid as exc:
            raise ApiError(400, exc.message, param=exc.param, code=exc.code) from None
        if parsed.previous_response_id is not None:
            # vLLM's answer when its store is off (or the id is not in its memory).
            raise ApiError(
                404, f"Response with id '{parsed.previous_response_id[:100]}' not found.", param="response_id"
            )
        chat = responses.to_chat_body(body, (), parsed.model)
        generation = openai_api.parse_chat(chat, state.limits).answered(*state.answer_lengths)
        failure = state.faults.draw_failure()
        if failure is not None:
            raise failure
        response_id, created = _new_id("resp"), int(time.time())
        if generation.stream:
            return await _stream(request, state, pieces, generation, body, response_id, created)
        said = await state.generate(generation.prompt_tokens, pieces(state.settings, generation))
        identity = openai_api.ResponseIdentity(response_id, created, parsed.model, state.fingerprint)
        answer = openai_api.completion_body(
            generation, identity, "".join(said), len(said), generation.finish_reason
        )
        return web.json_response(
            responses.from_chat_answer(body, answer, response_id, parsed.model, created, _new_id)
        )

    return create_response


async def _stream(
    request: web.Request,
    state: SimState,
    pieces: Pieces,
    generation: GenerationRequest,
    body: dict[str, Any],
    response_id: str,
    created: int,
) -> web.StreamResponse:
    """Responses stream events, one ``response.output_text.delta`` per token."""
    identity = openai_api.ResponseIdentity(response_id, created, generation.model, state.fingerprint)
    translation = responses.StreamTranslation(body, response_id, generation.model, created, _new_id)

    def piece(text: str, index: int) -> list[bytes]:
        return [translation.feed(openai_api.sse_event(openai_api.chunk(generation, identity, text)))]

    def end(sent: int) -> list[bytes]:
        last = openai_api.chunk(generation, identity, None, generation.finish_reason)
        usage = openai_api.usage_chunk(generation, identity, sent)
        chat = openai_api.sse_event(last) + openai_api.sse_event(usage) + openai_api.SSE_DONE
        return [translation.feed(chat)]

    return await streaming.stream_pieces(
        request,
        state,
        generation.prompt_tokens,
        pieces(state.settings, generation),
        start=[translation.start()],
        piece=piece,
        end=end,
    )
