"""The engine side's HTTP/1.1: a small keep-alive client on an asyncio ``Protocol``.

Owns: the pool of connections to engines (per address, the most recently used one
first, idle ones closed after ``idle_timeout``, an optional cap on connections in
use), writing a request in one send, parsing an answer's head, decoding its body
(``Content-Length``, ``chunked``, or until the engine closes), read backpressure
(the socket is not read while more than ``HIGH_WATER`` decoded bytes wait for the
reader), and telling apart the ways an attempt fails: no connection could be made
(``ConnectFailed``), the connection ended before an answer head (``ConnectionLost``:
typically a pooled keep-alive connection the engine had just closed), an answer
that is not HTTP (``MalformedAnswer``), a body that broke off (``BodyBroken``).

Why not aiohttp's client: on this project's 2-core machines one aiohttp client
request cost about 425 µs of CPU, most of it generic machinery a router talking to
its own engines does not use (cookies, redirects, auth, proxies, URL objects,
payload registries, per-request timeout objects, a task per connection). The
router sends one kind of request (a POST of bytes it already has) to engines it
found by address; this is that and nothing else.

Must not: know about routing, retries or first-byte and idle timeouts (the caller
bounds those with its own timers; the pool bounds only connecting), look into
bodies, or follow redirects.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from llmgw.core.addresses import authority

# Decoded body bytes waiting for the reader above which the socket is not read
# (the engine's writes then block: backpressure reaches the engine).
HIGH_WATER = 256 * 1024
# An answer head larger than this is not an engine's (they send a few hundred bytes).
MAX_HEAD_BYTES = 64 * 1024
# Request starts (request line and Host) kept; cleared whole past this (engines x paths).
_CACHED_STARTS = 4096
# A chunk-size line or trailer line longer than this is not HTTP.
MAX_LINE_BYTES = 4096

_HEAD_END = b"\r\n\r\n"
_CRLF = b"\r\n"
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")
_DIGITS = re.compile(r"[0-9]{1,18}")
_STATUS_LINE = re.compile(r"HTTP/1\.([01]) ([0-9]{3})(?: ([^\r\n]*))?")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_FIELD_LINES = re.compile(r"(?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[^\r\n]*\r\n)*")
_FIELD = re.compile(r"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([^\r\n]*?)[ \t]*\r\n")
# What no header value or request target may hold (a line break would start a new line).
FIELD_VALUE_BAD = re.compile(r"[\r\n\x00]")


class TransportError(Exception):
    """An attempt failed; the subclass says how far it got."""


class ConnectFailed(TransportError):
    """No connection could be made (refused, unreachable, timed out)."""


class ConnectionLost(TransportError):
    """The connection ended after the request was written and before an answer head."""

    def __init__(self, detail: str, *, reused: bool) -> None:
        super().__init__(detail)
        self.reused = reused  # it came from the pool (a keep-alive the engine may have closed)


class MalformedAnswer(TransportError):
    """What came back is not an HTTP/1.x answer head."""


class BodyBroken(TransportError):
    """The answer's head arrived, then its body broke off or was malformed."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    """The pool's own timers. Only connecting is bounded here; the first byte and the
    gaps between chunks are the caller's (``RouterSettings``)."""

    connect: float
    # None, on purpose: a long generation that keeps making progress must never be
    # cut by a total (aiohttp's client default was 300 s).
    total: None = None


class EnginePool:
    """Keep-alive connections to engines, by (host, port)."""

    def __init__(
        self, *, connect_timeout: float, idle_timeout: float, limit: int = 0, high_water: int = HIGH_WATER
    ) -> None:
        self.timeout = Timeouts(connect=connect_timeout)
        self._idle_timeout = idle_timeout
        self._limit = limit  # connections in use at once, 0: no cap
        self._high_water = high_water
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._all: set[_Connection] = set()
        self._in_use = 0
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._starts: dict[
            tuple[tuple[str, int], str], str
        ] = {}  # request line and Host, per engine and path
        self._names: set[str] = set()  # header names already checked
        self._closed = False

    # --- the one request --------------------------------------------------------------------------

    async def post(
        self,
        host: str,
        port: int,
        target: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        *,
        on_head: Callable[[EngineResponse], None] | None = None,
    ) -> EngineResponse:
        """POST ``body`` to ``target`` and return once the answer's head arrived (any
        status). Raises ``ConnectFailed``, ``ConnectionLost`` or ``MalformedAnswer``. A
        cancellation while waiting closes the connection (the engine sees the client go).

        ``on_head`` is called with the answer from the connection's callback, as soon as
        its head and the body bytes that came with it are in: before this returns, with
        no task woken in between. It must not raise, read the body or end the answer."""
        if self._closed:
            raise ConnectFailed("the engine pool is closed")
        key = (host, port)
        head = self._request_head(key, target, headers, len(body))
        await self._take_slot()
        try:
            connection = self._pooled(key)
            reused = connection is not None
            if connection is None:
                connection = await self._connect(key)
            response = await connection.exchange(head, body, reused=reused, on_head=on_head)
        except BaseException:
            self._give_slot()
            raise
        return response

    def _request_head(
        self, key: tuple[str, int], target: str, headers: Sequence[tuple[str, str]], size: int
    ) -> bytes:
        start = self._starts.get((key, target))
        if start is None:
            if FIELD_VALUE_BAD.search(target) or " " in target:
                raise ValueError(f"request target {target!r} is not sendable")
            host, port = key
            if FIELD_VALUE_BAD.search(host) or " " in host or "/" in host:
                # An address from a service registration, not llmgw's: it must not write the head.
                raise ConnectFailed(f"engine address {host[:80]!r} is not a host")
            if len(self._starts) >= _CACHED_STARTS:
                self._starts.clear()
            start = f"POST {target} HTTP/1.1\r\nHost: {authority(host, port)}\r\n"
            self._starts[(key, target)] = start
        fields = start + f"Content-Length: {size}\r\n"
        for name, value in headers:
            if name not in self._names:
                if not _TOKEN.fullmatch(name):
                    raise ValueError(f"header name {name!r} is not sendable")
                self._names.add(name)  # names are the caller's constants: checked once
            if "\r" in value or "\n" in value or "\x00" in value:
                raise ValueError(f"header {name!r} has a value that is not sendable")
            fields += f"{name}: {value}\r\n"
        return (fields + "\r\n").encode("latin-1")

    # --- connections ------------------------------------------------------------------------------

    def _pooled(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()  # the most recently used: the least likely to be closed
            connection.leave_pool()
            if connection.usable():
                return connection
            connection.close()
        return None

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        host, port = key
        try:
            async with asyncio.timeout(self.timeout.connect):
                _, connection = await loop.create_connection(lambda: _Connection(self, key), host, port)
        except TimeoutError:
            raise ConnectFailed(f"no connection to {host}:{port} within {self.timeout.connect:g} s") from None
        except OSError as exc:
            raise ConnectFailed(str(exc) or type(exc).__name__) from None
        if self._closed:
            connection.close()
            raise ConnectFailed("the engine pool is closed")
        return connection

    def _register(self, connection: _Connection) -> None:
        self._all.add(connection)

    def _forget(self, connection: _Connection) -> None:
        self._all.discard(connection)
        idle = self._idle.get(connection.key)
        if idle is not None and connection in idle:
            idle.remove(connection)

    def _put_back(self, connection: _Connection) -> None:
        """A connection whose answer was read whole, ready for the next request."""
        self._give_slot()
        if self._closed or not connection.usable():
            connection.close()
            return
        self._idle.setdefault(connection.key, []).append(connection)
        connection.enter_pool(self._idle_timeout)

    def _dropped(self) -> None:
        """A connection in use was closed by its user."""
        self._give_slot()

    def stale(self, host: str, port: int) -> None:
        """An engine closed a pooled connection under a request: its other idle ones
        (same engine, same age) are likely closed too; a retry should connect anew."""
        for connection in self._idle.pop((host, port), []):
            connection.leave_pool()
            connection.close()

    # --- the optional cap -------------------------------------------------------------------------

    async def _take_slot(self) -> None:
        if self._limit and self._in_use >= self._limit:
            waiter = asyncio.get_running_loop().create_future()
            self._slot_waiters.append(waiter)
            try:
                await waiter  # the releaser counted this slot for us
                return
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._give_slot()  # handed over just as we were cancelled: pass it on
                else:
                    self._slot_waiters.remove(waiter)
                raise
        self._in_use += 1

    def _give_slot(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the waiter, in_use unchanged
                return
        self._in_use -= 1

    @property
    def in_use(self) -> int:
        return self._in_use

    def idle_count(self, host: str, port: int) -> int:
        return len(self._idle.get((host, port), ()))

    async def close(self) -> None:
        """Close every connection, idle or in use; later requests fail with ``ConnectFailed``."""
        self._closed = True
        for connection in list(self._all):
            connection.close()
        self._idle.clear()
        # Let the transports run their connection_lost callbacks.
        await asyncio.sleep(0)


# Where a connection is in its exchange.
_READY = 0  # connected, no request (in the pool or being taken)
_HEAD = 1  # request written, answer head awaited
_BODY = 2  # head parsed, body being received
_DONE = 3  # body complete, not yet handed back
_BROKEN = 4  # must not be reused

# How a body is framed.
_LENGTH = 0
_CHUNKED = 1
_UNTIL_CLOSE = 2
_NONE = 3

# Chunked decoding states.
_SIZE = 0
_DATA = 1
_DATA_END = 2
_TRAILER = 3


class _Connection(asyncio.Protocol):
    """One TCP connection to an engine and the exchange on it."""

    def __init__(self, pool: EnginePool, key: tuple[str, int]) -> None:
        self._pool = pool
        self.key = key
        self._transport: asyncio.Transport | None = None
        self._state = _READY
        self._lost = False
        self._reused = False
        self._head = bytearray()
        self._head_waiter: asyncio.Future[EngineResponse] | None = None
        self._on_head: Callable[[EngineResponse], None] | None = None
        self._response: EngineResponse | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._in_pool = False
        self._idle_since = 0.0
        self._reading_paused = False
        self.high_water = pool._high_water

    # --- asyncio.Protocol ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, whatever the loop: uvloop's are not asyncio.Transport subclasses.
        self._transport = cast(asyncio.Transport, transport)
        self._pool._register(self)

    def data_received(self, data: bytes) -> None:
        state = self._state
        if state == _BODY:
            response = self._response
            assert response is not None
            response._feed(data)
            return
        if state == _HEAD:
            self._head_data(data)
            return
        # Bytes nobody asked for (on an idle connection, or after a complete body):
        # the connection's framing can no longer be trusted.
        self._state = _BROKEN
        self.close()

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._pool._forget(self)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        waiter = self._head_waiter
        if waiter is not None and not waiter.done():
            detail = f"the engine closed the connection before answering ({exc or 'EOF'})"
            waiter.set_exception(ConnectionLost(detail, reused=self._reused))
        response = self._response
        if response is not None and self._state == _BODY:
            response._lost(exc)

    # --- one exchange -----------------------------------------------------------------------------

    async def exchange(
        self,
        head: bytes,
        body: bytes,
        *,
        reused: bool,
        on_head: Callable[[EngineResponse], None] | None = None,
    ) -> EngineResponse:
        transport = self._transport
        assert transport is not None and self._state == _READY
        self._reused = reused
        self._on_head = on_head
        self._state = _HEAD
        self._head.clear()
        waiter: asyncio.Future[EngineResponse] = asyncio.get_running_loop().create_future()
        self._head_waiter = waiter
        # One send for head and body (small bodies): no extra packet, no extra syscall.
        transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            transport.write(body)
        try:
            return await waiter
        except BaseException:
            self._head_waiter = None
            self._state = _BROKEN
            self.close()
            raise
        finally:
            self._head_waiter = None
            self._on_head = None

    def _head_data(self, data: bytes) -> None:
        buffer = self._head
        if buffer:
            buffer += data
            data = bytes(buffer)
            buffer.clear()
        # A loop over an offset, not recursion and slicing: an engine may send any
        # number of interim 1xx answers in one read.
        start = 0
        while True:
            end = data.find(_HEAD_END, start)
            if end < 0:
                if len(data) - start > MAX_HEAD_BYTES:
                    self._fail_head(MalformedAnswer(f"an answer head over {MAX_HEAD_BYTES} bytes"))
                else:
                    buffer += data[start:] if start else data
                return
            try:
                response = _parse_head(self, data[start:end])
            except MalformedAnswer as exc:
                self._fail_head(exc)
                return
            start = end + 4
            if response is not None:
                break
            # An interim 1xx answer: the real head follows.
        rest = data[start:]
        self._response = response
        self._state = _DONE if response._complete else _BODY
        waiter = self._head_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(response)
        if rest:
            if self._state == _BODY:
                response._feed(rest)
            else:
                self._state = _BROKEN  # bytes after a body-less answer
        on_head, self._on_head = self._on_head, None
        if on_head is not None and self._state != _BROKEN:
            on_head(response)

    def _fail_head(self, exc: TransportError) -> None:
        self._state = _BROKEN
        waiter = self._head_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.close()

    # --- called by the response -------------------------------------------------------------------

    def body_complete(self) -> None:
        if self._state == _BODY:
            self._state = _DONE

    def body_broken(self) -> None:
        self._state = _BROKEN

    def pause_reading(self) -> None:
        if not self._reading_paused and self._transport is not None and not self._lost:
            self._reading_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and self._transport is not None and not self._lost:
            self._reading_paused = False
            self._transport.resume_reading()

    def finish(self, response: EngineResponse, *, keep: bool) -> None:
        """The response's user is done with it: pool the connection or close it."""
        if self._response is not response:
            return
        self._response = None
        reusable = (
            keep
            and self._state == _DONE
            and response._keep_alive
            and not self._lost
            and not self._reading_paused
            and self._transport is not None
            and self._transport.get_write_buffer_size() == 0  # the whole request went out
        )
        if reusable:
            self._state = _READY
            self._pool._put_back(self)
        else:
            self._state = _BROKEN
            self.close()
            self._pool._dropped()

    # --- pooling ----------------------------------------------------------------------------------

    def usable(self) -> bool:
        return (
            self._state == _READY
            and not self._lost
            and self._transport is not None
            and not self._transport.is_closing()
        )

    def enter_pool(self, idle_timeout: float) -> None:
        # One lazy timer per connection: taking a connection does not cancel it and
        # putting it back re-arms it only when none is pending (a timer-heap push and
        # a cancel per request cost more than the rest of the pooling together).
        loop = asyncio.get_running_loop()
        self._in_pool = True
        self._idle_since = loop.time()
        if self._idle_timer is None:
            self._idle_timer = loop.call_at(self._idle_since + idle_timeout, self._check_idle, idle_timeout)

    def leave_pool(self) -> None:
        self._in_pool = False

    def _check_idle(self, idle_timeout: float) -> None:
        self._idle_timer = None
        if not self._in_pool:
            return  # in use: putting it back arms the timer again
        due = self._idle_since + idle_timeout
        loop = asyncio.get_running_loop()
        if loop.time() >= due:
            self.close()
        else:
            self._idle_timer = loop.call_at(due, self._check_idle, idle_timeout)

    def close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()


def _parse_head(connection: _Connection, head: bytes) -> EngineResponse | None:
    """The answer for a head (without its blank line), or None for an interim 1xx."""
    status_line, _, fields = head.decode("latin-1").partition("\r\n")
    match = _STATUS_LINE.fullmatch(status_line)
    if match is None:
        raise MalformedAnswer(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    minor, status_text, reason = match.groups()
    status = int(status_text)
    if status < 100:
        raise MalformedAnswer(f"status {status} is not HTTP")
    headers: dict[str, str] = {}
    if fields:
        fields += "\r\n"
        # Every line a field (a token, a colon, a value): whitespace before the colon
        # and obsolete line folding are refused. Two regex passes in C instead of a
        # Python loop of string calls per line.
        if not _FIELD_LINES.fullmatch(fields):
            bad = next(
                (line for line in fields.split("\r\n") if not _FIELD_LINES.fullmatch(line + "\r\n")), ""
            )
            raise MalformedAnswer(f"a malformed header line: {bad[:80]!r}")
        pairs = _FIELD.findall(fields)
        headers = {name.lower(): value for name, value in pairs}
        if len(headers) < len(pairs):  # a repeated field: its values joined, in order
            headers = {}
            for name, value in pairs:
                name = name.lower()
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
    if 100 <= status < 200:
        if status == 101:
            raise MalformedAnswer("the engine switched protocols, which was not asked for")
        return None
    connection_field = headers.get("connection")
    keep_alive = minor == "1" and (connection_field is None or "close" not in connection_field.lower())
    framing = _NONE
    length = 0
    encoding = headers.get("transfer-encoding")
    content_length = headers.get("content-length")
    if status == 204 or status == 304:
        pass
    elif encoding is not None:
        if encoding.rpartition(",")[2].strip().lower() == "chunked":
            framing = _CHUNKED
        else:
            framing = _UNTIL_CLOSE
            keep_alive = False
        if content_length is not None:  # both: a smuggling shape; trust neither for reuse
            keep_alive = False
    elif content_length is not None:
        if "," in content_length:  # a repeated field: fine only if every copy agrees
            values = {v.strip() for v in content_length.split(",")}
            content_length = values.pop() if len(values) == 1 else ""
        if not _DIGITS.fullmatch(content_length):
            raise MalformedAnswer(f"a malformed Content-Length: {headers['content-length']!r}")
        length = int(content_length)
        framing = _LENGTH if length else _NONE
    else:
        framing = _UNTIL_CLOSE
        keep_alive = False
    return EngineResponse(connection, status, reason or "", headers, framing, length, keep_alive)


class EngineResponse:
    """An answer whose head arrived; its body is read with ``read``. The user ends it
    with ``release`` (body read whole: the connection goes back to the pool) or
    ``close`` (the connection is closed: the engine sees the client go)."""

    def __init__(
        self,
        connection: _Connection,
        status: int,
        reason: str,
        headers: dict[str, str],
        framing: int,
        length: int,
        keep_alive: bool,
    ) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers  # names lower-cased; repeated fields joined with ", "
        self.content_length = length if framing in (_LENGTH, _NONE) else None
        self._connection: _Connection | None = connection
        self._framing = framing
        self._remaining = length  # Content-Length left, or the current chunk's bytes left
        self._keep_alive = keep_alive
        self._parts: list[bytes] = []
        self._buffered = 0
        self._complete = framing == _NONE
        self._error: BodyBroken | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._chunk_state = _SIZE
        self._pending = b""  # a partial chunk-size or trailer line
        self._high_water = connection.high_water
        self._sink: Callable[[bytes], None] | None = None
        self._on_end: Callable[[bytes, BodyBroken | None], None] | None = None
        self._on_ready: Callable[[EngineResponse], None] | None = None

    # --- the reader's side ------------------------------------------------------------------------

    def ready(self) -> bool:
        """``read`` would return at once."""
        return bool(self._parts) or self._complete or self._error is not None

    def peek(self) -> bytes:
        """The body bytes received and not read yet, left in place for ``read``."""
        parts = self._parts
        if len(parts) > 1:
            parts[:] = [b"".join(parts)]
        return parts[0] if parts else b""

    def peek_whole(self) -> bytes | None:
        """The body not read yet, when all of it has arrived, left in place (``read``
        or ``whole_now`` still return it). Else None."""
        return self.peek() if self._complete else None

    def whole_now(self) -> bytes | None:
        """The body not read yet, when all of it has arrived (most answers come whole
        with their head): no read, no wait. Else None."""
        whole = self.peek_whole()
        if whole is not None:
            self._parts.clear()
            self._buffered = 0
        return whole

    def call_when_ready(self, hook: Callable[[EngineResponse], None]) -> None:
        """Calls ``hook(self)`` once, from the connection's callback, when ``read`` would
        return at once (body bytes, the end, or a failure): at once if it already would.
        Like ``EnginePool.post``'s ``on_head``, it must not raise or read."""
        if self.ready():
            hook(self)
        else:
            self._on_ready = hook

    def at_eof(self) -> bool:
        """The whole body was received and read."""
        return self._complete and not self._parts

    async def read(self) -> bytes:
        """The body bytes received since the last read (at least one), or b"" at the end.
        Raises ``BodyBroken`` when the body broke off."""
        while not self._parts and not self._complete and self._error is None:
            # Woken by any bytes, framing included: wait again until there is body data.
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None
        parts = self._parts
        if parts:
            data = parts[0] if len(parts) == 1 else b"".join(parts)
            parts.clear()
            if self._buffered >= self._high_water and self._connection is not None:
                self._connection.resume_reading()
            self._buffered = 0
            return data
        if self._error is not None:
            raise self._error
        return b""

    def relay(
        self, sink: Callable[[bytes], None], on_end: Callable[[bytes, BodyBroken | None], None]
    ) -> None:
        """From now on hand the body to ``sink`` as it arrives, from the connection's
        callback (no task wakes up per chunk), instead of keeping it for ``read``;
        what was kept goes first. ``on_end(last, error)`` is called once at the end,
        with the bytes that came together with the end (so they can go out with it),
        and ``error`` when the body broke off. The sink must not close the response;
        it may ``pause_reading`` it (its consumer is slow) and ``resume_reading`` later."""
        self._sink = sink
        self._on_end = on_end
        if self._parts or self._complete or self._error is not None:
            self._deliver()

    def pause_reading(self) -> None:
        """Stop reading the engine's socket (the engine's writes then block)."""
        if self._connection is not None:
            self._connection.pause_reading()

    def resume_reading(self) -> None:
        if self._connection is not None:
            self._connection.resume_reading()

    def release(self) -> None:
        """Done, body read whole: keep the connection for the next request (or close it
        when it cannot be reused). Idempotent, and a no-op after ``close``."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.finish(self, keep=self._complete and not self._parts)

    def close(self) -> None:
        """Done, whatever is left: close the connection. Idempotent."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.finish(self, keep=False)
            if not self._complete and self._error is None:
                self._error = BodyBroken("the answer was closed before its end")
                self._wake()

    # --- the connection's side --------------------------------------------------------------------

    def _wake(self) -> None:
        if self._sink is not None:
            self._deliver()
            return
        on_ready = self._on_ready
        if on_ready is not None and self.ready():
            self._on_ready = None
            on_ready(self)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _deliver(self) -> None:
        parts = self._parts
        data = b"" if not parts else parts[0] if len(parts) == 1 else b"".join(parts)
        parts.clear()
        self._buffered = 0
        if self._complete or self._error is not None:
            on_end, self._on_end = self._on_end, None
            self._sink = None
            if on_end is not None:
                on_end(data, None if self._complete else self._error)
        elif data:
            assert self._sink is not None
            self._sink(data)

    def _push(self, data: bytes) -> None:
        self._parts.append(data)
        self._buffered += len(data)
        if self._buffered >= self._high_water and self._sink is None and self._connection is not None:
            self._connection.pause_reading()

    def _finish_body(self) -> None:
        self._complete = True
        if self._connection is not None:
            self._connection.body_complete()

    def _break(self, detail: str) -> None:
        if self._error is None and not self._complete:
            self._error = BodyBroken(detail)
        if self._connection is not None:
            self._connection.body_broken()
            self._connection.close()
        self._wake()

    def _lost(self, exc: Exception | None) -> None:
        if self._complete:
            return
        if self._framing == _UNTIL_CLOSE and exc is None:
            self._finish_body()
            self._wake()
            return
        self._break(f"the engine closed the connection mid-answer ({exc or 'EOF'})")

    def _feed(self, data: bytes) -> None:
        if self._complete or self._error is not None:
            self._break("bytes after the end of the answer")
            return
        framing = self._framing
        if framing == _CHUNKED:
            self._feed_chunked(data)
        elif framing == _LENGTH:
            size = len(data)
            if size <= self._remaining:
                self._push(data)
                self._remaining -= size
            else:
                self._push(data[: self._remaining])
                self._remaining = 0
                self._keep_alive = False  # bytes past the announced length: framing is off
            if self._remaining == 0:
                self._finish_body()
        else:  # until close
            self._push(data)
        self._wake()

    def _feed_chunked(self, data: bytes) -> None:
        if self._pending:
            data = self._pending + data
            self._pending = b""
        parts = self._parts
        received = 0
        pos = 0
        size = len(data)
        try:
            while pos < size:
                state = self._chunk_state
                if state == _SIZE:
                    end = data.find(_CRLF, pos)
                    if end < 0:
                        self._keep_partial_line(data, pos)
                        return
                    digits = data[pos:end]
                    if b";" in digits:  # chunk extensions: ignored
                        digits = digits.partition(b";")[0]
                    digits = digits.strip(b" \t")
                    if not _HEX.fullmatch(digits):
                        self._break(f"a malformed chunk size: {data[pos:end][:40]!r}")
                        return
                    chunk = int(digits, 16)
                    pos = end + 2
                    if not chunk:
                        self._chunk_state = _TRAILER
                        continue
                    stop = pos + chunk
                    if stop + 2 <= size:  # the whole chunk and its CRLF are here: the usual case
                        if data[stop : stop + 2] != _CRLF:
                            self._break("a chunk did not end with CRLF")
                            return
                        parts.append(data[pos:stop])
                        received += chunk
                        pos = stop + 2
                        continue
                    self._remaining = chunk
                    self._chunk_state = _DATA
                elif state == _DATA:
                    take = min(self._remaining, size - pos)
                    parts.append(data if take == size else data[pos : pos + take])  # == size: no copy
                    received += take
                    pos += take
                    self._remaining -= take
                    if self._remaining == 0:
                        self._chunk_state = _DATA_END
                elif state == _DATA_END:
                    if size - pos < 2:
                        self._pending = data[pos:]
                        return
                    if data[pos : pos + 2] != _CRLF:
                        self._break("a chunk did not end with CRLF")
                        return
                    pos += 2
                    self._chunk_state = _SIZE
                else:  # a trailer line, or the blank line that ends the body
                    end = data.find(_CRLF, pos)
                    if end < 0:
                        self._keep_partial_line(data, pos)
                        return
                    blank = end == pos
                    pos = end + 2
                    if blank:
                        self._finish_body()
                        if pos < size:
                            self._keep_alive = False
                        return
        finally:
            if received:
                self._buffered += received
                if self._buffered >= self._high_water and self._sink is None and self._connection is not None:
                    self._connection.pause_reading()

    def _keep_partial_line(self, data: bytes, pos: int) -> None:
        if len(data) - pos > MAX_LINE_BYTES:
            self._break("a chunk-size or trailer line is too long")
        else:
            self._pending = data[pos:]
