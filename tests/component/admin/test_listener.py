"""The admin listener: what it refuses to start with, and TLS with a certificate of its own."""

from __future__ import annotations

import asyncio
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
