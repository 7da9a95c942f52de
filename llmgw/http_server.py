"""What llmgw's HTTP listeners share: the router, the admin API, the control plane's metrics.

Owns:

- ``ConnectionLog``: the logger aiohttp's connection handler is given
  (``AppRunner(logger=...)``, the ``logger`` of ``web_protocol.RequestHandler``).
  aiohttp (3.14.5, as pinned in requirements.lock) logs a request it cannot parse with
  ``logger.exception("Error handling request from %s", peer, exc_info=exc)``
  (``RequestHandler.handle_error``), and the parser's exception holds the bytes it
  stopped in: the offending line, or, when the request has bare-LF line endings and
  llhttp finds no CRLF to cut at, the whole buffer, ``Authorization`` and body
  included (``parser_error_from_errno`` in ``aiohttp/_http_parser.pyx``). Here such a
  request becomes one line without its bytes (peer, method and path when the request
  line parsed, llhttp's reason, the exception's class), at most one line per
  ``interval``; the next line counts those left out (as the kernel's printk rate
  limit does), so a client cannot flood the log. Everything else aiohttp logs passes
  through unchanged.
- ``bound_port``: the port a listener got (asked for port 0), from aiohttp's public
  ``BaseRunner.addresses``.
- ``read_body``: a request's body, bounded in size and in time (``BodyTimeout``), for
  the router's requests and the admin API's alike; each answers the timeout in its
  own error envelope (408). A body with a ``Content-Encoding`` other than
  ``identity`` is refused before a byte of it is read (``BodyEncodingRefused``, 415):
  the OpenAI and Anthropic SDKs send plain JSON, and an inflated body is bounded by
  nothing its wire size says (a 300 kB gzip bomb inflates to 300 MB). The listeners
  run with aiohttp's ``auto_decompress`` off (``NO_DECOMPRESSION``), so the parser
  never inflates a body either: the size limit is on the bytes that arrive.

Must not: answer requests, or choose the limits (each program's settings do).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http import HttpProcessingError

# At most one line about malformed requests per this many seconds and listener: enough to
# see that they come and from where, too few for a flood to fill a disk.
MALFORMED_LOG_INTERVAL = 10.0

# aiohttp's C parser words its errors "<llhttp's reason>:\n\n  b'<bytes>'\n  ^" (a request
# line's errors with a "Bad status line:\n  " before); llhttp's reasons are its own fixed
# strings. Anything not in this shape is named by its exception class only.
_LLHTTP_MESSAGE = re.compile(
    r"^(?:Bad status line:\n  )?(?P<reason>[A-Za-z][A-Za-z0-9 ,'./_-]{0,79}):\n\n  b['\"](?P<data>[^\n]*)"
)
# The start of a request line in those bytes as repr() shows them (an escape starts with
# a backslash, so a path stops at the first byte that is not printable ASCII): the path
# without its query, which may carry a credential.
_REQUEST_LINE = re.compile(r"^(?P<method>[A-Z]{1,20}) (?P<path>/[^\s\\'\"?#]{0,100})")
# aiohttp's own words for TLS sent to a plain-HTTP port (no client bytes in them).
_FIXED_MESSAGES = frozenset({"Received HTTPS traffic on an HTTP port"})


def malformed_request_summary(exc: HttpProcessingError) -> str:
    """What a malformed request's exception may say in a log: llhttp's reason, the
    method and path when the request line parsed, the class; never the request's bytes."""
    kind = type(exc).__name__
    message = exc.message if isinstance(exc.message, str) else ""
    if message in _FIXED_MESSAGES:
        return f"{message} ({kind})"
    shaped = _LLHTTP_MESSAGE.match(message)
    if shaped is None:
        return kind
    summary = f"{shaped['reason']} ({kind})"
    line = _REQUEST_LINE.match(shaped["data"])
    if line is not None:
        summary = f"{line['method']} {line['path']}: {summary}"
    return summary


class ConnectionLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server logger for one listener: malformed requests without their bytes
    and rate limited, the rest as aiohttp words it (see the module's docstring)."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval: float = MALFORMED_LOG_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(logger)
        self._interval = interval
        self._clock = clock
        self._last_line_at: float | None = None
        self._left_out = 0

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            self._malformed(min(level, logging.WARNING), exc, args)
        else:
            super().log(level, msg, *args, **kwargs)

    def _malformed(self, level: int, exc: HttpProcessingError, args: tuple[object, ...]) -> None:
        if not self.isEnabledFor(level):
            return
        now = self._clock()
        last = self._last_line_at
        if last is not None and last <= now < last + self._interval:
            self._left_out += 1
            return
        left_out, self._left_out = self._left_out, 0
        self._last_line_at = now
        # handle_error's one argument is the peer (the transport's, not a header).
        peer = str(args[0])[:64] if args else "an unknown peer"
        note = ""
        if left_out and last is not None:
            note = f"; {left_out} more in the {now - last:.0f} s before, not logged one by one"
        self.logger.log(
            level,
            "refused a malformed request from %s: %s (its bytes are not logged)%s",
            peer,
            malformed_request_summary(exc),
            note,
        )


def listener_log(name: str) -> ConnectionLog:
    """The ``logger`` runner option of a listener logging under ``name``."""
    return ConnectionLog(logging.getLogger(name))


def bound_port(runner: web.BaseRunner, asked: int) -> int:
    """The TCP port ``runner``'s first site listens on: ``asked``, or the one the
    kernel chose when ``asked`` was 0."""
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:  # IPv4 (host, port), IPv6 4-tuples
            return int(address[1])
    return asked


# --- bodies ---------------------------------------------------------------------------------------


class BodyTimeout(Exception):
    """The request's body did not arrive whole within the time allowed."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"the request body did not arrive within {timeout:g} s")
        self.timeout = timeout


class BodyEncodingRefused(Exception):
    """The request's body is compressed (or encoded some other way): not accepted."""

    def __init__(self, encoding: str) -> None:
        super().__init__(
            f"a request body with Content-Encoding {encoding[:40]!r} is not accepted: send it "
            "uncompressed (Content-Encoding identity, or none)"
        )
        self.encoding = encoding


# aiohttp's runner option: the HTTP parser hands the handler the body's bytes as they
# arrived, never inflated (``HttpPayloadParser``'s ``DeflateBuffer`` is not used).
NO_DECOMPRESSION: dict[str, Any] = {"auto_decompress": False}


def _is_identity(encoding: str) -> bool:
    return all(part.strip().lower() in ("", "identity") for part in encoding.split(","))


async def read_body(request: web.Request, *, max_bytes: int, within: float) -> bytes:
    """The whole body, at most ``max_bytes`` (413 as aiohttp words it), within ``within``
    seconds from now (``BodyTimeout``): a client sending a byte at a time holds a
    connection and a handler for no longer than that. A body with a ``Content-Encoding``
    other than ``identity`` is ``BodyEncodingRefused`` before any of it is read."""
    encodings = request.headers.getall("Content-Encoding", [])
    refused = next((e for e in encodings if not _is_identity(e)), None)
    if refused is not None:
        raise BodyEncodingRefused(refused)
    content = request.content
    if content.is_eof():
        # The whole body came with the head: take it as it is (request.read() would
        # copy it chunk by chunk), with the size limit request.read() enforces.
        body = content.read_nowait()
        if len(body) > max_bytes:
            raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=len(body))
        return body
    try:
        async with asyncio.timeout(within):
            return await request.read()
    except TimeoutError:
        raise BodyTimeout(within) from None
