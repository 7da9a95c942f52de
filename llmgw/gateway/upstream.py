"""HTTP to the engines: one connection pool, one attempt at a time, and the pump
that moves a streamed answer to the client.

Owns: the engine pool (``transport.EnginePool``: no connection cap by default,
the per-model gates limit concurrency), the classification of a failed attempt
into a ``routing.Failure``, the reading of an answer's first chunk or whole body
under the first-byte timeout, and ``pump`` with its two idle timeouts (upstream
silent, client not reading).

The pump sends the first chunk through aiohttp (the response head goes with it),
then relays: each chunk the engine sends is written to the client's socket from
the engine connection's callback (``_Relay``), with no task woken per chunk. It
does not parse events: it passes chunks through as they come, stops reading the
engine while the client's socket buffer is full (backpressure), and keeps the
last few KiB to find the ``usage`` event at the end. Only when the router asked
for usage on the client's behalf does it look into chunks, with a substring
test, to take that one event out again.

Must not: choose endpoints, retry (the dispatcher decides, from ``routing``), or
build client-facing errors beyond the in-stream error event.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from aiohttp import web

from llmgw.core import anthropic
from llmgw.core.engine_keys import EngineKeys
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
# Unsent bytes to a client above which the engine's socket is no longer read (as
# aiohttp's own write drains past 64 KiB), and below which it is read again.
CLIENT_HIGH_WATER = 64 * 1024
CLIENT_LOW_WATER = 16 * 1024
# How often a paused stream looks whether its client has taken its bytes.
DRAIN_POLL = 0.005
_USAGE_OBJECT = (b'"usage":{', b'"usage": {')
_JSON = "application/json"
UNAUTHORIZED = 401
# Replicas whose engine-key field is kept at once: far more than a cluster runs.
_CACHED_KEY_FIELDS = 4096


def http_chunk(data: bytes) -> bytes:
    """``data`` as one chunk of an HTTP/1.1 chunked body (not empty: that is the end)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class AttemptFailed(Exception):
    def __init__(self, failure: Failure, detail: str) -> None:
        super().__init__(f"{failure}: {detail}")
        self.failure = failure
        self.detail = detail


class UpstreamBroken(Exception):
    """The engine failed after it had started answering; not retryable."""


class Upstream:
    def __init__(self, settings: RouterSettings, engine_keys: EngineKeys | None = None) -> None:
        self._settings = settings
        self._engine_keys = engine_keys
        # Each replica's Authorization field, worked out once: an HMAC per attempt costs
        # as much as the rest of the request's head. Emptied when full (replicas come and go).
        self._key_fields: dict[str, tuple[str, str]] = {}
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

    async def send(
        self,
        endpoint: Endpoint,
        path: str,
        body: bytes,
        request_id: str,
        *,
        on_head: Callable[[EngineResponse], None] | None = None,
        trace: tuple[tuple[str, str], ...] = (),
    ) -> EngineResponse:
        """POST ``body`` and return once the response head arrived (any status);
        ``on_head`` as ``EnginePool.post``'s; ``trace``, the request's checked trace context
        headers (``gateway/tracing.py``)."""
        assert self._session is not None, "Upstream.start() was not awaited"
        headers: tuple[tuple[str, str], ...] = (("Content-Type", _JSON), ("x-request-id", request_id), *trace)
        if self._engine_keys is not None:
            # The replica's own key (its job id is the endpoint's replica): an engine port
            # reached any other way answers 401.
            key_field = self._key_fields.get(endpoint.replica)
            if key_field is None:
                if len(self._key_fields) >= _CACHED_KEY_FIELDS:
                    self._key_fields.clear()
                key_field = ("Authorization", f"Bearer {self._engine_keys.for_replica(endpoint.replica)}")
                self._key_fields[endpoint.replica] = key_field
            headers = (*headers, key_field)
        hook = on_head
        if on_head is not None:
            given = on_head

            def hook(response: EngineResponse) -> None:
                if response.status != UNAUTHORIZED:  # never relayed: see below
                    given(response)

        try:
            response = await self._session.post(
                endpoint.address, endpoint.port, path, headers, body, on_head=hook
            )
        except ConnectFailed as exc:
            raise AttemptFailed(Failure.CONNECT, str(exc)) from None
        except ConnectionLost as exc:
            # The connection broke before any answer. A pooled keep-alive connection the
            # engine had closed: its other idle connections are as old, so the retry
            # connects anew. A new connection: the engine took it and dropped it,
            # an engine failure like a 503 (retried elsewhere).
            if exc.reused:
                self._session.stale(endpoint.address, endpoint.port)
                raise AttemptFailed(Failure.STALE_CONNECTION, str(exc)) from None
            raise AttemptFailed(Failure.UNAVAILABLE, f"the engine dropped a new connection: {exc}") from None
        except MalformedAnswer as exc:  # an answer that is not HTTP
            raise AttemptFailed(Failure.UNAVAILABLE, f"malformed answer: {exc}") from None
        if response.status == UNAUTHORIZED:
            # The router authenticates clients itself and never forwards their credentials,
            # so an engine's 401 is about the router's engine key: the endpoint is unusable
            # to this router (retried elsewhere), never the client's error.
            response.close()
            raise AttemptFailed(
                Failure.UNAVAILABLE,
                f"the engine of {endpoint.replica} refused the router's engine key (401): set the same "
                "LLMGW_ENGINE_KEY_SECRET on every router and control plane",
            )
        return response

    async def read_body(self, response: EngineResponse) -> bytes:
        """The whole body of a non-streamed answer, bounded in size and idle time; the
        connection then goes back to the pool (a later ``close`` does nothing)."""
        limit = self._settings.max_response_bytes
        if response.content_length is not None and response.content_length > limit:
            raise UpstreamBroken(f"answer of {response.content_length} bytes is over the {limit} allowed")
        whole = response.whole_now()
        if whole is not None:
            if len(whole) > limit:
                raise UpstreamBroken(f"answer over the {limit} bytes allowed")
            response.release()
            return whole
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


class ClientStalled(Exception):
    """A client took none of a write for ``client_write_timeout`` seconds."""


async def write_within(client: web.StreamResponse, data: bytes, settings: RouterSettings) -> None:
    """``data`` to the client through aiohttp under the one write rule every stream
    keeps (``pump``'s watchdog keeps it for the relay): a client that takes none of it
    for ``client_write_timeout`` seconds raises ``ClientStalled``. aiohttp's ``write``
    waits for the client's socket to drain past 64 KiB unsent, with no limit of its own:
    a client that stops reading would otherwise hold the handler, its model slot and
    the engine's stream until it closed."""
    try:
        async with asyncio.timeout(settings.client_write_timeout):
            await client.write(data)
    except TimeoutError:
        raise ClientStalled(f"the client took nothing for {settings.client_write_timeout:g} s") from None


@dataclass
class StreamResult:
    end: PumpEnd
    usage: dict[str, object] | None
    detail: str = ""


class StreamRewrite(Protocol):
    """A stream rewritten on its way to the client (another API's events made of the
    engine's): fed the engine's bytes as they come, it returns what the client gets;
    ``usage`` is what it read of the engine's usage."""

    usage: dict[str, object] | None

    def feed(self, data: bytes) -> bytes: ...


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


class _Relay:
    """The stream after its first chunk: the engine's bytes go to the client's socket
    from the engine connection's callback, as they are decoded. Per chunk that is
    one loop callback instead of two (the callback, then a task step through the
    handler's chain of awaits): about 20 us less CPU per chunk on a 2-core VM, and
    the loop free sooner for the next request's first byte.

    It writes to the client's transport itself, with the response's framing
    (HTTP/1.1 chunked, or raw for HTTP/1.0), after aiohttp sent the head with the
    first chunk; aiohttp writes the end (``write_eof``). Backpressure: over
    ``CLIENT_HIGH_WATER`` unsent bytes the engine's socket is not read, until the
    client's buffer is down to ``CLIENT_LOW_WATER`` (polled, since aiohttp keeps the
    drain signal to itself); the watchdog bounds that wait."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        transport: asyncio.Transport,
        chunked: bool,
        keep: Callable[[bytes], bytes],
        response: EngineResponse,
        watchdog: _Watchdog,
        settings: RouterSettings,
    ) -> None:
        self._loop = loop
        self._transport = transport
        self._chunked = chunked
        self._keep = keep
        self._response = response
        self._watchdog = watchdog
        self._read_idle = settings.upstream_idle_timeout
        self._write_idle = settings.client_write_timeout
        self._poll: asyncio.TimerHandle | None = None
        self._closed = False
        # (how it ended, the last bytes to send with the end, a detail)
        self.done: asyncio.Future[tuple[PumpEnd, bytes, str]] = loop.create_future()

    def feed(self, data: bytes) -> None:
        if self.done.done() or self._closed:
            return
        data = self._keep(data)
        if data:  # an empty chunk would read as the end of the stream
            transport = self._transport
            if transport.is_closing():
                self._end(PumpEnd.CLIENT_GONE, b"", "the client closed its connection")
                return
            transport.write(http_chunk(data) if self._chunked else data)
            if self._poll is not None:
                return  # already waiting for the client (bytes that were in flight)
            if transport.get_write_buffer_size() > CLIENT_HIGH_WATER:
                self._response.pause_reading()
                self._watchdog.reading = False
                self._watchdog.deadline = self._loop.time() + self._write_idle
                self._poll = self._loop.call_later(DRAIN_POLL, self._drained)
                return
        if self._poll is None:
            self._watchdog.deadline = self._loop.time() + self._read_idle

    def end(self, last: bytes, error: BodyBroken | None) -> None:
        if self._closed:
            return
        if error is not None:
            if last:
                self.feed(last)  # what arrived before the break still reaches the client
            self._end(PumpEnd.UPSTREAM_BROKEN, b"", str(error))
        else:
            self._end(PumpEnd.COMPLETE, self._keep(last) if last else b"", "")

    def _drained(self) -> None:
        self._poll = None
        if self.done.done() or self._closed:
            return
        if self._transport.is_closing():
            self._end(PumpEnd.CLIENT_GONE, b"", "the client closed its connection")
        elif self._transport.get_write_buffer_size() > CLIENT_LOW_WATER:
            self._poll = self._loop.call_later(DRAIN_POLL, self._drained)
        else:
            self._watchdog.reading = True
            self._watchdog.deadline = self._loop.time() + self._read_idle
            self._response.resume_reading()

    def _end(self, end: PumpEnd, last: bytes, detail: str) -> None:
        if not self.done.done():
            self.done.set_result((end, last, detail))

    def close(self) -> None:
        """The pump is over (whatever ended it): nothing more goes to the client from here."""
        self._closed = True
        if self._poll is not None:
            self._poll.cancel()
            self._poll = None


async def pump(
    response: EngineResponse,
    client: web.StreamResponse,
    transport: asyncio.Transport | None,
    first: bytes,
    settings: RouterSettings,
    *,
    strip_usage: bool,
    first_sent: bool = False,
    rewrite: StreamRewrite | None = None,
) -> StreamResult:
    """Copy the engine's stream to the client until it ends (the client's stream is
    then ended too), either side fails, or one of the idle timeouts fires. Never
    raises for those: the caller reports them. ``client`` is prepared and not
    compressed; ``transport`` is its request's (None: the client already left).
    ``first_sent``: ``first`` went to the client already, with the head. ``rewrite``
    turns the engine's bytes into the client's (its usage is the stream's)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    stripper = _UsageStripper() if strip_usage else None
    tail: deque[bytes] = deque()
    tail_size = 0

    def keep(chunk: bytes) -> bytes:
        nonlocal tail_size
        if rewrite is not None:
            return rewrite.feed(chunk)
        if stripper is not None:
            return stripper.filter(chunk)
        tail.append(chunk)
        tail_size += len(chunk)
        while tail_size - len(tail[0]) >= TAIL_BYTES:
            tail_size -= len(tail.popleft())
        return chunk

    watchdog = _Watchdog(
        loop,
        task,
        loop.time() + settings.client_write_timeout,
        min(settings.upstream_idle_timeout, settings.client_write_timeout),
    )
    relay: _Relay | None = None
    try:
        chunk = keep(first)
        try:
            if response.at_eof():  # the end is known: the data and the end of the stream in one send
                await client.write_eof(b"" if first_sent else chunk)
                return StreamResult(PumpEnd.COMPLETE, _usage(stripper, tail, rewrite))
            if not first_sent:
                await client.write(chunk)  # through aiohttp: the head goes out with it
        except (ConnectionError, RuntimeError) as exc:
            # aiohttp raises ClientConnectionResetError (a ConnectionResetError) on a
            # closed transport, RuntimeError if the connection is already gone.
            return StreamResult(PumpEnd.CLIENT_GONE, None, str(exc))
        if transport is None or transport.is_closing():
            return StreamResult(PumpEnd.CLIENT_GONE, None, "the client closed its connection")
        chunked = client.headers.get("Transfer-Encoding", "").lower() == "chunked"
        relay = _Relay(loop, transport, chunked, keep, response, watchdog, settings)
        watchdog.reading = True
        watchdog.deadline = loop.time() + settings.upstream_idle_timeout
        response.relay(relay.feed, relay.end)
        end, last, detail = await relay.done
        if end is not PumpEnd.COMPLETE:
            return StreamResult(end, None, detail)
        watchdog.reading = False
        watchdog.deadline = loop.time() + settings.client_write_timeout
        try:
            await client.write_eof(last)
        except (ConnectionError, RuntimeError) as exc:
            return StreamResult(PumpEnd.CLIENT_GONE, None, str(exc))
    except asyncio.CancelledError:
        if watchdog.fired is not None and watchdog.timed_out():
            return StreamResult(watchdog.fired, None, "idle timeout")
        raise
    finally:
        watchdog.close()
        if relay is not None:
            relay.close()
    return StreamResult(PumpEnd.COMPLETE, _usage(stripper, tail, rewrite))


def _usage(
    stripper: _UsageStripper | None, tail: deque[bytes], rewrite: StreamRewrite | None = None
) -> dict[str, object] | None:
    if rewrite is not None:
        return rewrite.usage
    return stripper.usage if stripper is not None else usage_of_stream_tail(b"".join(tail))


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
    if prompt is None and completion is None:  # the Messages API's names
        return anthropic.token_counts(usage)
    return (
        prompt if isinstance(prompt, int) and not isinstance(prompt, bool) and prompt > 0 else 0,
        completion
        if isinstance(completion, int) and not isinstance(completion, bool) and completion > 0
        else 0,
    )
