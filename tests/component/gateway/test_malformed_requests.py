"""Requests aiohttp's parser refuses: answered 400, and logged without their bytes (a
client's key and prompt are among them) in one line per interval however many come.

aiohttp words a parser error with the bytes it stopped in, and logs it with a
traceback (``web_protocol.RequestHandler.handle_error``): with bare-LF line endings
that was the whole request, ``Authorization`` and body included."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from llmgw.gateway.keys import new_api_key

from .conftest import Cluster, StartRouter

PROMPT = "the vault combination is 31-41-59"


def _key(cluster: Cluster) -> str:
    issued = new_api_key("team", now=cluster.clock.now)
    cluster.keys.publish({issued.record.key_id: issued.record})
    return issued.key


def _request(key: str, *, newline: str = "\r\n", key_suffix: str = "") -> bytes:
    body = json.dumps({"model": "sim-chat", "messages": [{"role": "user", "content": PROMPT}]})
    head = (
        "POST /v1/chat/completions HTTP/1.1",
        "Host: 127.0.0.1",
        f"Authorization: Bearer {key}{key_suffix}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    )
    return (newline.join(head) + newline + newline + body).encode()


async def send_raw(port: int, raw: bytes) -> bytes:
    """The whole answer (aiohttp closes the connection after a parser error's 400)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10.0)
    finally:
        writer.close()


MALFORMED = {
    # llhttp finds no CRLF to cut the error's excerpt at: the whole buffer was in it.
    "bare LF line endings": lambda key: _request(key, newline="\n"),
    # The excerpt is the offending line: the Authorization header itself.
    "a control character in the key's header": lambda key: _request(key, key_suffix="\x01"),
    # LineTooLong quotes the line's first 100 bytes: the key.
    "a header line over aiohttp's limit": lambda key: _request(key, key_suffix=" " + "x" * 9000),
}


@pytest.mark.parametrize("kind", list(MALFORMED))
async def test_a_malformed_request_is_logged_without_its_key_or_body(
    cluster: Cluster, start_router: StartRouter, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    key = _key(cluster)
    router = await start_router(with_keys=True)
    with caplog.at_level(logging.DEBUG):
        answer = await send_raw(router.port, MALFORMED[kind](key))
    assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), answer[:200]
    secret = key.split(".", 1)[1]
    assert secret not in caplog.text and PROMPT not in caplog.text
    lines = [r for r in caplog.records if "malformed request" in r.getMessage()]
    assert [r.name for r in lines] == ["llmgw.gateway.http"]
    assert lines[0].getMessage().startswith("refused a malformed request from 127.0.0.1: ")
    assert lines[0].levelno == logging.WARNING and lines[0].exc_info is None


async def test_the_request_line_is_named_when_it_parsed(
    cluster: Cluster, start_router: StartRouter, caplog: pytest.LogCaptureFixture
) -> None:
    router = await start_router(with_keys=True)
    with caplog.at_level(logging.WARNING, logger="llmgw.gateway.http"):
        await send_raw(router.port, _request(_key(cluster), newline="\n"))
    assert caplog.records[0].getMessage() == (
        "refused a malformed request from 127.0.0.1: POST /v1/chat/completions: "
        "Expected CRLF after version (BadStatusLine) (its bytes are not logged)"
    )


async def test_a_flood_of_malformed_requests_is_one_log_line(
    cluster: Cluster, start_router: StartRouter, caplog: pytest.LogCaptureFixture
) -> None:
    # No key needed: the parser refuses before anyone looks at Authorization.
    router = await start_router(with_keys=True)
    raw = _request("sk-llmgw-nobody.made-up", newline="\n")
    with caplog.at_level(logging.DEBUG):
        answers = await asyncio.gather(*(send_raw(router.port, raw) for _ in range(40)))
    assert all(b" 400 " in a.split(b"\r\n", 1)[0] for a in answers)
    assert len([r for r in caplog.records if "malformed request" in r.getMessage()]) == 1
    assert not [r for r in caplog.records if r.name.startswith("aiohttp")]
