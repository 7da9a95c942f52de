"""Every use the router makes of aiohttp's private parts, in one place.

Verified on aiohttp 3.14.4 and 3.14.5 (``web_response.py``, ``web_protocol.py``,
``http_writer.py``, ``helpers.py``: the same in both), and
``tests/component/gateway/test_aiohttp_private.py`` fails on an aiohttp that moves
any of it. ``pyproject.toml`` allows only ``>=3.14.4,<3.15``: 3.14.0 passes that test
too, but before 3.14.4 aiohttp arms no keep-alive timer when a connection opens
(``RequestHandler.connection_made``), so a request head that never ends is never
closed (``test_slowloris_connections_are_closed`` fails), a defence the router's
``runner_options`` relies on. To widen the range: read those files of the new
release for each touch below, run the gateway tests on it, then widen the pin.

aiohttp has no public way to send a response's head with its first chunk, nor to
say "this answer went to the socket another way": the router writes answers from
the engine connection's callbacks (``dispatch._DirectAnswer``), and aiohttp's
``RequestHandler.finish_response`` then calls ``prepare`` and ``write_eof`` on
whatever the handler returned and keeps the connection open if ``keep_alive`` is
true. The touches, each for one reason:

- ``StreamResponse._send_headers_immediately`` (a class attribute, True by default;
  aiohttp's own ``Response`` sets it False): False makes ``prepare`` keep the head in
  the ``StreamWriter`` until the first ``write``, which sends both in one
  ``transport.write``. ``HeadWithFirstWrite`` is a stream response made so, saving
  the client a packet and a wake-up per stream.
- ``StreamResponse._eof_sent``: ``prepare`` and ``write_eof`` return at once when it
  is true, writing nothing; ``SentDirectly`` sets it once its answer is whole on the
  socket, so aiohttp adds nothing after it.
- ``StreamResponse._keep_alive``: what the public ``keep_alive`` reads, and what
  ``finish_response`` keeps the connection open by. aiohttp sets it from the request
  in ``prepare`` (``_prepare_headers``), which never runs for ``SentDirectly``; left
  None it would close every kept-alive connection. (Setting it False goes through
  the public ``force_close``.)
- ``StreamResponse._body_length``: what the public ``body_length`` reads, which the
  access log's ``%b`` prints; aiohttp sets it in ``write_eof`` from its writer's count.
- ``aiohttp.helpers.rfc822_formatted_time`` (``http_date`` here): the ``Date`` value
  aiohttp puts in its own heads, cached per second, so a head ``_DirectAnswer``
  writes says the same as one aiohttp writes.

Also relied on, through public calls: ``StreamResponse.write`` writes to the
transport before it returns (aiohttp buffers nothing), so ``upstream.pump``'s relay
may write further chunks straight to the transport and ``write_eof`` then ends the
same chunked body.

Must not: decide when an answer may go around aiohttp (``dispatch`` does).
"""

from __future__ import annotations

import asyncio
from typing import Self

from aiohttp import web
from aiohttp.helpers import rfc822_formatted_time as http_date

from llmgw.gateway.upstream import http_chunk

__all__ = ["HeadWithFirstWrite", "SentDirectly", "http_date"]


class HeadWithFirstWrite(web.StreamResponse):
    """A stream whose head goes out with its first chunk, in one send, as aiohttp's
    ``Response`` does: the first chunk is always at hand when the head is ready."""

    _send_headers_immediately = False


class SentDirectly(web.StreamResponse):
    """An answer whose head went to the client's transport without aiohttp
    (``dispatch._DirectAnswer``), and what the handler returns for it.

    - A whole answer, all on the socket already: ``SentDirectly(status).ended(length)``;
      aiohttp writes nothing and keeps the connection for the client's next request.
    - A stream whose head and first chunk went: ``SentDirectly(200, client)``;
      ``write`` and ``write_eof`` send HTTP/1.1 chunks straight to ``client``, as the
      relay writes its own.
    - Left unended when aiohttp finishes it (the client went, or the handler failed
      after the head went): aiohttp's ``prepare`` call marks it ended with its
      connection closing, since the client has no whole answer and no second answer
      may follow on that connection."""

    def __init__(self, status: int, client: asyncio.Transport | None = None) -> None:
        # The relay frames its chunks by this header (``upstream.pump``): a stream's
        # head, as ``_DirectAnswer`` wrote it, says chunked.
        chunked = {"Transfer-Encoding": "chunked"} if client is not None else None
        super().__init__(status=status, headers=chunked)
        self._client = client
        self._keep_alive = True
        self._body_length = 0

    def ended(self, length: int) -> Self:
        """Marked whole: ``length`` bytes of body went."""
        self._eof_sent = True
        self._body_length = length
        return self

    async def prepare(self, request: web.BaseRequest) -> None:
        if not self._eof_sent:  # aiohttp ends a response the handler left unended
            self._eof_sent = True
            self.force_close()

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._eof_sent:
            raise RuntimeError("Cannot call write() after write_eof()")
        if data:
            self._write(http_chunk(bytes(data)))

    async def write_eof(self, data: bytes | bytearray | memoryview = b"") -> None:
        if self._eof_sent:
            return
        self._eof_sent = True
        self._write((http_chunk(bytes(data)) if data else b"") + b"0\r\n\r\n")

    def _write(self, frame: bytes) -> None:
        client = self._client
        if client is None or client.is_closing():
            self.force_close()
            raise ConnectionResetError("the client closed its connection")
        client.write(frame)
        self._body_length += len(frame)
