"""HTTP to the engines: one connection pool, one attempt at a time, and the pump
that moves a streamed answer to the client chunk by chunk.

Owns: the engine pool (``transport.EnginePool``: no connection cap by default,
the per-model gates limit concurrency), the classification of a failed attempt
into a ``routing.Failure``, the reading of an answer's first chunk or whole body
under the first-byte timeout, and the ``pump`` loop with its two idle timeouts
(upstream silent, client not reading).

The pump does not parse events: it passes chunks through as they come (``write``
waits when the client's socket buffer is full, which is the backpressure), and
keeps the last few KiB to find the ``usage`` event at the end. Only when the
router asked for usage on the client's behalf does it look into chunks, with a
substring test, to take that one event out again.

Must not: choose endpoints, retry (the dispatcher decides, from ``routing``), or
build client-facing errors beyond the in-stream error event.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from dataclasses import dataclass
from enum import StrEnum

from aiohttp import web

from llmgw.core.records import Endpoint
from llmgw.core.routing import Failure
from llmgw.gateway.settings import RouterSettings
from llmgw.gateway.transport import (
    BodyBroken,
    ConnectFailed,
    ConnectionLost,
    EnginePool,
    EngineResponse,
    MalformedAnswer,
)

# Bytes of the end of a stream kept to find its usage event (about 300 bytes).
TAIL_BYTES = 4096
_USAGE_OBJECT = (b'"usage":{', b'"usage": {')
_JSON = "application/json"


class AttemptFailed(Exception):
    def __init__(self, failure: Failure, detail: str) -> None:
        super().__init__(f"{failure}: {detail}")
        self.failure = failure
        self.detail = detail


class UpstreamBroken(Exception):
    """The engine failed after it had started answering; not retryable."""


class Upstream:
    def __init__(self, settings: RouterSettings) -> None:
        self._settings = settings
        self._session: EnginePool | None = None

    async def start(self) -> None:
        s = self._settings
        self._session = EnginePool(
            connect_timeout=s.upstream_connect_timeout,
            idle_timeout=s.upstream_pool_idle,
            limit=s.upstream_connection_limit,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(self, endpoint: Endpoint, path: str, body: bytes, request_id: str) -> EngineResponse:
        """POST ``body`` and return once the response head arrived (any status)."""
        assert self._session is not None, "Upstream.start() was not awaited"
        headers = (("Content-Type", _JSON), ("x-request-id", request_id))
        try:
            return await self._session.post(endpoint.address, endpoint.port, path, headers, body)
        except ConnectFailed as exc:
            raise AttemptFailed(Failure.CONNECT, str(exc)) from None
        except ConnectionLost as exc:
            # The connection broke before any answer: a pooled keep-alive connection
            # the engine had closed, or an engine that died on accept. Its other idle
            # connections are as old: the retry connects anew.
            if exc.reused:
                self._session.stale(endpoint.address, endpoint.port)
            raise AttemptFailed(Failure.STALE_CONNECTION, str(exc)) from None
        except MalformedAnswer as exc:  # an answer that is not HTTP
            raise AttemptFailed(Failure.UNAVAILABLE, f"malformed answer: {exc}") from None

    async def read_body(self, response: EngineResponse) -> bytes:
        """The whole body of a non-streamed answer, bounded in size and idle time; the
        connection then goes back to the pool (a later ``close`` does nothing)."""
        limit = self._settings.max_response_bytes
        if response.content_length is not None and response.content_length > limit:
            raise UpstreamBroken(f"answer of {response.content_length} bytes is over the {limit} allowed")
        parts: list[bytes] = []
        size = 0
        try:
            while True:
                if response.ready():  # most answers arrive with their head: no timer needed
                    chunk = await response.read()
                else:
                    async with asyncio.timeout(self._settings.upstream_idle_timeout):
                        chunk = await response.read()
                if not chunk:
                    break
                size += len(chunk)
                if size > limit:
                    raise UpstreamBroken(f"answer over the {limit} bytes allowed")
                parts.append(chunk)
        except TimeoutError:
            raise UpstreamBroken("the engine went silent in the middle of its answer") from None
        except BodyBroken as exc:
            raise UpstreamBroken(f"the answer broke off: {exc}") from None
        response.release()  # read whole: the connection serves the next request
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def first_chunk(self, response: EngineResponse) -> bytes:
        """The first chunk of a streamed answer; failures here are still retryable."""
        try:
            chunk = await response.read()
        except BodyBroken as exc:
            raise AttemptFailed(Failure.UNAVAILABLE, f"stream broke before its first chunk: {exc}") from None
        if not chunk:
            raise AttemptFailed(Failure.UNAVAILABLE, "stream ended before its first chunk")
        return chunk


class PumpEnd(StrEnum):
    COMPLETE = "complete"
    UPSTREAM_BROKEN = "upstream-broken"
    UPSTREAM_IDLE = "upstream-idle"
    CLIENT_GONE = "client-gone"
    CLIENT_STALLED = "client-stalled"


@dataclass
class StreamResult:
    end: PumpEnd
    usage: dict[str, object] | None
    detail: str = ""


class _UsageStripper:
    """Takes the usage event out of a stream whose client did not ask for it."""

    def __init__(self) -> None:
        self.usage: dict[str, object] | None = None

    def filter(self, chunk: bytes) -> bytes:
        if not any(marker in chunk for marker in _USAGE_OBJECT):
            return chunk
        kept: list[bytes] = []
        for event in chunk.split(b"\n\n"):
            if event.startswith(b"data: {") and any(marker in event for marker in _USAGE_OBJECT):
                usage = _usage_of_event(event)
                if usage is not None:
                    self.usage = usage
                    continue
            kept.append(event)
        return b"\n\n".join(kept)


class _Watchdog:
    """The two idle timeouts of one stream, as one timer re-armed lazily.

    Progress costs a float store (``deadline``); the timer wakes at the earlier of
    the deadline and the shorter timeout from now, and then either re-arms or
    cancels the pump. A per-chunk ``asyncio.timeout().reschedule`` would cancel and
    push a timer-heap entry twice per chunk instead.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[object], deadline: float, shortest: float
    ) -> None:
        self._loop = loop
        self._task = task
        # Any deadline set later is at least `shortest` after it is set, so a timer
        # that never sleeps longer than `shortest` never wakes after a deadline.
        self._shortest = shortest
        self.deadline = deadline
        self.reading = False
        self.fired: PumpEnd | None = None
        self._cancelling = task.cancelling()
        self._handle = loop.call_at(min(deadline, loop.time() + shortest), self._check)

    def _check(self) -> None:
        now = self._loop.time()
        if now < self.deadline:
            self._handle = self._loop.call_at(min(self.deadline, now + self._shortest), self._check)
            return
        self.fired = PumpEnd.UPSTREAM_IDLE if self.reading else PumpEnd.CLIENT_STALLED
        self._task.cancel()

    def timed_out(self) -> bool:
        """In an ``except CancelledError``: was it this watchdog (and only it)?"""
        return self.fired is not None and self._task.uncancel() <= self._cancelling

    def close(self) -> None:
        self._handle.cancel()


async def pump(
    response: EngineResponse,
    client: web.StreamResponse,
    first: bytes,
    settings: RouterSettings,
    *,
    strip_usage: bool,
) -> StreamResult:
    """Copy the engine's stream to the client until it ends (the client's stream is
    then ended too), either side fails, or one of the idle timeouts fires. Never
    raises for those: the caller reports them."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    read_idle = settings.upstream_idle_timeout
    write_idle = settings.client_write_timeout
    stripper = _UsageStripper() if strip_usage else None
    tail: deque[bytes] = deque()
    tail_size = 0
    chunk = first
    watchdog = _Watchdog(loop, task, loop.time() + write_idle, min(read_idle, write_idle))
    try:
        while True:
            if stripper is not None:
                chunk = stripper.filter(chunk)
            else:
                tail.append(chunk)
                tail_size += len(chunk)
                while tail_size - len(tail[0]) >= TAIL_BYTES:
                    tail_size -= len(tail.popleft())
            last = response.at_eof()
            watchdog.reading = False
            watchdog.deadline = loop.time() + write_idle
            try:
                if last:  # the end is known: the data and the end of the stream in one send
                    await client.write_eof(chunk)
                    break
                await client.write(chunk)
            except (ConnectionError, RuntimeError) as exc:
                # aiohttp raises ClientConnectionResetError (a ConnectionResetError) on a
                # closed transport, RuntimeError if the connection is already gone.
                return StreamResult(PumpEnd.CLIENT_GONE, None, str(exc))
            watchdog.reading = True
            watchdog.deadline = loop.time() + read_idle
            try:
                chunk = await response.read()
            except BodyBroken as exc:
                return StreamResult(PumpEnd.UPSTREAM_BROKEN, None, str(exc) or type(exc).__name__)
            if not chunk:
                try:
                    await client.write_eof()
                except (ConnectionError, RuntimeError) as exc:
                    return StreamResult(PumpEnd.CLIENT_GONE, None, str(exc))
                break
    except asyncio.CancelledError:
        if watchdog.fired is not None and watchdog.timed_out():
            return StreamResult(watchdog.fired, None, "idle timeout")
        raise
    finally:
        watchdog.close()
    usage = stripper.usage if stripper is not None else usage_of_stream_tail(b"".join(tail))
    return StreamResult(PumpEnd.COMPLETE, usage)


def _usage_of_event(event: bytes) -> dict[str, object] | None:
    try:
        data = json.loads(event[len(b"data: ") :])
    except ValueError:
        return None
    usage = data.get("usage") if isinstance(data, dict) else None
    return usage if isinstance(usage, dict) else None


def usage_of_stream_tail(tail: bytes) -> dict[str, object] | None:
    """The usage of the last event that reports one (a stream asked with include_usage)."""
    if not any(marker in tail for marker in _USAGE_OBJECT):
        return None
    for line in reversed(tail.split(b"\n")):
        if line.startswith(b"data: {") and any(marker in line for marker in _USAGE_OBJECT):
            usage = _usage_of_event(line)
            if usage is not None:
                return usage
    return None


def usage_of_body(body: bytes) -> dict[str, object] | None:
    """The top-level ``usage`` of a JSON answer, without parsing all of it (embeddings
    answers are megabytes). Inside JSON strings quotes are escaped, so the last
    ``"usage"`` is a key, and engines write the top-level one after the choices."""
    at = body.rfind(b'"usage"')
    if at < 0:
        return None
    colon = body.find(b":", at + 7)
    if colon < 0:
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(body[colon + 1 :].decode("utf-8").lstrip())
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def token_counts(usage: dict[str, object] | None) -> tuple[int, int]:
    """(prompt, completion) tokens of a usage object; zeros where absent or malformed."""
    if usage is None:
        return 0, 0
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    return (
        prompt if isinstance(prompt, int) and not isinstance(prompt, bool) and prompt > 0 else 0,
        completion
        if isinstance(completion, int) and not isinstance(completion, bool) and completion > 0
        else 0,
    )
