"""A simulated generation streamed as server-sent events, for every API the sim
serves (chat and completions in ``app``, ``messages_api``, ``responses_api``): each
gives the bytes of its stream's start, of each piece and of its end.

Owns: the order of a stream's life (a running slot, the prompt counted, the start,
each piece at the token rate, the end, the completion counted) and a client that
leaves midway (the engine counts the cancellation; nothing more is written).

Must not: know any API's events (its callers build them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import aclosing, suppress
from typing import TYPE_CHECKING

from aiohttp import web

from llmgw.sim.prefix_cache import Prefill

if TYPE_CHECKING:
    from llmgw.sim.app import SimState

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


async def stream_pieces(
    request: web.Request,
    state: SimState,
    prompt_tokens: int,
    pieces: Iterable[str],
    *,
    piece: Callable[[str, int], Sequence[bytes]],
    end: Callable[[int], Sequence[bytes]],
    start: Sequence[bytes] = (),
    prefill: tuple[str, Prefill] | None = None,
) -> web.StreamResponse:
    """``pieces`` streamed: ``start``'s writes once the sequence runs, ``piece(text,
    index)``'s for each piece, ``end(sent)``'s after the last (``sent`` pieces)."""
    engine = state.engine
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    try:
        async with engine.sequence():
            engine.count_tokens(prompt=prompt_tokens)
            delay = state.faults.first_token_delay
            if prefill is not None:  # the prompt and its record: prefilled past its cached prefix
                engine.prefill(*prefill)
                delay += prefill[1].seconds
            for data in start:
                await response.write(data)
            sent = 0
            tokens = engine.decode(pieces, delay, state.faults.wait_while_hung)
            async with aclosing(tokens):
                async for text in tokens:
                    for data in piece(text, sent):
                        await response.write(data)
                    sent += 1
            for data in end(sent):
                await response.write(data)
    except ConnectionResetError:
        return response  # the client left; the engine counted the cancellation
    engine.count_completion()
    with suppress(ConnectionResetError):  # everything was sent; a client gone now lost nothing
        await response.write_eof()
    return response
