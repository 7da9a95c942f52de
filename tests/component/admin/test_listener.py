"""The admin listener: what it refuses to start with, and TLS with a certificate of its own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import pytest

from llmgw.admin import AdminListener, AdminSettingsError
from llmgw.cli import main

if TYPE_CHECKING:
    from conftest import Client, StartAdmin, Stores, Texts


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        # Refused before anything binds, so no test listens beyond loopback.
        ({"host": "0.0.0.0", "token": None}, "set LLMGW_ADMIN_TOKEN"),
        ({"host": "0.0.0.0"}, "--admin-insecure-plaintext-beyond-loopback"),
        ({"host": "10.255.255.1", "token": "short"}, "at least 32 characters"),
        (
            {"tls_cert": "/nonexistent/cert.pem", "tls_key": "/nonexistent/key.pem"},
            "cannot use --admin-tls-cert",
        ),
    ],
)
async def test_unsafe_or_broken_settings_refuse_to_start(
    start: StartAdmin, stores: Stores, overrides: dict[str, object], words: str
) -> None:
    with pytest.raises(AdminSettingsError, match=words.replace("-", r"\-")):
        await start(stores, **overrides)


async def test_loopback_without_a_token_starts_with_a_warning(
    start: StartAdmin, stores: Stores, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="llmgw.admin"):
        await start(stores, token=None)
    assert any("has no token" in r.getMessage() for r in caplog.records)


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (openssl's command line; skipped without it)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=llmgw-admin-test",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    return cert, key


async def test_tls_serves_only_what_verifies_and_ctl_connects_with_its_ca(
    start: StartAdmin,
    stores: Stores,
    certificate: tuple[Path, Path],
    client_for: Callable[[AdminListener], Client],
    texts: Texts,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cert, key = certificate
    listener = await start(stores, tls_cert=str(cert), tls_key=str(key))
    assert listener.url.startswith("https://127.0.0.1:")

    # Without the CA the certificate does not verify: nothing is sent in clear.
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.get(listener.url + "/admin/v1/keys")
        # Plain HTTP to the TLS port gets no admin answer.
        with pytest.raises(aiohttp.ClientError):
            await session.get(listener.url.replace("https://", "http://") + "/admin/v1/keys")

    monkeypatch.setenv("LLMGW_ADMIN_URL", listener.url)
    monkeypatch.setenv("LLMGW_ADMIN_TOKEN", texts.token)
    code = await asyncio.to_thread(main, ["ctl", "keys", "create", "over-tls", "--cacert", str(cert)])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("sk-llmgw-")
    unverified = await asyncio.to_thread(main, ["ctl", "keys", "list"])
    assert unverified == 3
    assert "certificate" in capsys.readouterr().err.lower()

    context = ssl.create_default_context(cafile=str(cert))
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            listener.url + "/admin/v1/keys",
            headers={"Authorization": f"Bearer {texts.token}"},
            ssl=context,
        ) as resp,
    ):
        assert resp.status == 200
        assert [k["name"] for k in (await resp.json())["keys"]] == ["over-tls"]


# --- what every llmgw listener shares with the router (llmgw/http_server.py) ------------------------


async def _trickle(port: int, head: bytes, interval: float) -> tuple[bytes, float]:
    """Send ``head`` and then a body a byte at a time; the answer's head and its delay."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = loop.time()

    async def drip() -> None:
        with contextlib.suppress(ConnectionError):
            for _ in range(1000):
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(interval)  # the drip is the point: a body a byte at a time

    writer.write(head)
    dripping = asyncio.create_task(drip())
    try:
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
        return answer, loop.time() - started
    finally:
        dripping.cancel()
        writer.close()


async def test_a_body_sent_a_byte_at_a_time_is_refused_after_the_body_read_timeout(
    start: StartAdmin, stores: Stores, texts: Texts
) -> None:
    listener = await start(stores, body_read_timeout=0.5)
    head = (
        f"POST /admin/v1/catalog/diff HTTP/1.1\r\nHost: 127.0.0.1:{listener.port}\r\n"
        f"Authorization: Bearer {texts.token}\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n"
    ).encode()
    answer, after = await _trickle(listener.port, head, interval=0.05)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert 0.5 <= after < 5.0


async def test_a_malformed_request_is_logged_without_the_token(
    start: StartAdmin, stores: Stores, texts: Texts, caplog: pytest.LogCaptureFixture
) -> None:
    listener = await start(stores)
    body = json.dumps({"catalog": texts.good})
    raw = (
        f"PUT /admin/v1/catalog HTTP/1.1\nHost: 127.0.0.1\nAuthorization: Bearer {texts.token}\n"
        f"Content-Type: application/json\nContent-Length: {len(body)}\n\n{body}"
    ).encode()  # bare LF line endings: aiohttp's parser quoted the whole request
    with caplog.at_level(logging.DEBUG):
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(raw)
        answer = await asyncio.wait_for(reader.read(), 10.0)
        writer.close()
    assert b" 400 " in answer.split(b"\r\n", 1)[0]
    assert texts.token not in caplog.text and "the chat model" not in caplog.text
    assert [r.getMessage() for r in caplog.records if r.name == "llmgw.admin.http"] == [
        "refused a malformed request from 127.0.0.1: PUT /admin/v1/catalog: "
        "Expected CRLF after version (BadStatusLine) (its bytes are not logged)"
    ]
