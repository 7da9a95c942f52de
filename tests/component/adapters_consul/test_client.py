"""The Consul client honours ConsulConnection: the ACL token (sent as X-Consul-Token,
never shown), CONSUL_HTTP_TOKEN_FILE, the namespace, TLS with a private CA, a
client certificate and a server name; and its errors say what to do."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from aiohttp import web

from llmgw.adapters.consul import (
    ConsulClient,
    ConsulNamespaceUnsupported,
    ConsulRejected,
    ConsulUnavailable,
    WatchSettings,
    watch_endpoints,
)
from llmgw.devcluster.consul import ConsulSettings, ConsulStandIn
from llmgw.settings import SettingsError

if TYPE_CHECKING:
    from conftest import Engines, Eventually

TOKEN = "5e3c7a1b-token-that-must-never-be-printed"


# ------------------------------------------------------------------ ACL token


@pytest.fixture
def consul_settings() -> ConsulSettings:
    return ConsulSettings.for_tests(acl_token=TOKEN)


async def test_the_token_from_the_environment_is_sent_and_never_shown(
    standin: ConsulStandIn, connector: Callable[..., ConsulClient], tmp_path: Path
) -> None:
    async with connector(standin.url) as anonymous:
        with pytest.raises(ConsulRejected) as refused:
            await anonymous.kv_put("llmgw/x", b"1")
        assert refused.value.status == 403 and "CONSUL_HTTP_TOKEN" in str(refused.value)

    async with connector(standin.url, CONSUL_HTTP_TOKEN="wrong-" + TOKEN) as wrong:
        with pytest.raises(ConsulRejected) as refused:
            await wrong.kv_put("llmgw/x", b"1")
        assert "ACL not found" in str(refused.value) and TOKEN not in str(refused.value)

    async with connector(standin.url, CONSUL_HTTP_TOKEN=TOKEN) as right:
        assert await right.kv_put("llmgw/x", b"1") is True
        assert TOKEN not in repr(right)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    async with connector(standin.url, CONSUL_HTTP_TOKEN_FILE=str(token_file)) as from_file:
        entry, _ = await from_file.kv_get("llmgw/x")
        assert entry is not None and entry.value == b"1"


async def test_a_watch_without_read_rights_warns_that_acls_hide_endpoints(
    standin: ConsulStandIn,
    connector: Callable[..., ConsulClient],
    engines: Engines,
    fast_watch: WatchSettings,
    eventually: Eventually,
    caplog: pytest.LogCaptureFixture,
) -> None:
    engines.token = TOKEN
    await engines.register("e1")
    async with connector(standin.url) as anonymous, watch_endpoints(anonymous, fast_watch) as watch:
        snapshot = await watch.wait_ready()
        assert snapshot.endpoints == ()
    assert "hid some llmgw-engine instances from this token" in caplog.text
    async with (
        connector(standin.url, CONSUL_HTTP_TOKEN=TOKEN) as right,
        watch_endpoints(right, fast_watch) as watch,
    ):
        await eventually(lambda: watch.latest is not None and len(watch.latest.endpoints) == 1)
    assert TOKEN not in caplog.text


# ------------------------------------------------------------------ a recording fake


@dataclass
class Recorder:
    requests: list[web.Request] = field(default_factory=list)
    answers: list[web.Response] = field(default_factory=list)


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[Recorder, str]]:
    rec = Recorder()

    async def handle(request: web.Request) -> web.StreamResponse:
        rec.requests.append(request)
        if rec.answers:
            return rec.answers.pop(0)
        return web.json_response([], headers={"X-Consul-Index": "7"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield rec, f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def test_token_travels_in_the_header_only_and_the_namespace_as_ns(
    recorder: tuple[Recorder, str], connector: Callable[..., ConsulClient]
) -> None:
    rec, url = recorder
    async with connector(url, CONSUL_HTTP_TOKEN=TOKEN, CONSUL_NAMESPACE="team-a") as client:
        await client.kv_list("llmgw/demand/", index=3, wait=0.1)
    request = rec.requests[0]
    assert request.headers["X-Consul-Token"] == TOKEN
    assert TOKEN not in str(request.rel_url)
    assert request.path == "/v1/kv/llmgw/demand/"
    assert dict(request.query) == {"recurse": "", "index": "3", "wait": "100ms", "ns": "team-a"}


async def test_keys_are_escaped_and_kept_inside_the_kv_path(
    recorder: tuple[Recorder, str], connector: Callable[..., ConsulClient]
) -> None:
    rec, url = recorder
    async with connector(url) as client:
        await client.kv_get("llmgw/keys/a b?c#d")
    assert rec.requests[0].raw_path == "/v1/kv/llmgw/keys/a%20b%3Fc%23d"


async def test_errors_say_whether_to_retry_and_bad_answers_are_protocol_errors(
    recorder: tuple[Recorder, str], connector: Callable[..., ConsulClient]
) -> None:
    rec, url = recorder
    rec.answers = [
        web.Response(status=500, text="No cluster leader"),
        web.Response(status=400, text="Invalid wait time"),
        web.Response(status=200, text="<html>a proxy's page</html>"),
    ]
    async with connector(url) as client:
        with pytest.raises(ConsulUnavailable, match="500 No cluster leader") as e1:
            await client.kv_get("k")
        assert e1.value.temporary
        with pytest.raises(ConsulRejected, match="400 Invalid wait time") as e2:
            await client.kv_get("k")
        assert not e2.value.temporary
        with pytest.raises(Exception, match="not JSON"):
            await client.kv_get("k")


async def test_refused_connections_are_temporary(connector: Callable[..., ConsulClient]) -> None:
    async with connector("http://127.0.0.1:1") as client:
        with pytest.raises(ConsulUnavailable, match="Consul GET /v1/kv/k"):
            await client.kv_get("k")


async def test_a_connect_timeout_is_reported_as_one_not_as_a_silent_consul(
    standin: ConsulStandIn, connector: Callable[..., ConsulClient]
) -> None:
    """aiohttp times the connect on the event loop: when the loop is blocked for longer than
    the connect timeout while a connection opens, the request fails although Consul accepted
    the connection. The error names the connect timeout and its possible causes; it used to
    say "no answer within <request timeout>", a timeout that had not run out."""
    async with connector(standin.url) as client:
        connect_timeout = client.settings.connect_timeout
        assert connect_timeout < client.settings.request_timeout
        reading = asyncio.ensure_future(client.kv_get("k"))
        await asyncio.sleep(0)  # the request is under way: its connection is opening
        # The behaviour under test: this process's event loop blocked past the connect timeout.
        time.sleep(connect_timeout * 1.5)
        with pytest.raises(ConsulUnavailable) as failed:
            await reading
    assert str(failed.value) == (
        f"Consul GET /v1/kv/k: no connection to {standin.url} within {connect_timeout:g}s "
        "(Consul is down or unreachable, or this process's event loop was blocked that long)"
    )
    assert failed.value.temporary


# ------------------------------------------------------------------ TLS


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A private CA, a server certificate for consul.test only, and a client certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=test CA",
        cwd=d,
    )
    for name, ext in (
        ("server", "subjectAltName=DNS:consul.test"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d,
        )  # fmt: skip
    return Pki(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key")


@pytest.fixture
async def tls_server(pki: Pki) -> AsyncIterator[tuple[str, list[bool]]]:
    """An HTTPS 'Consul' for consul.test that demands a client certificate from the CA."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca))
    context.load_cert_chain(str(pki.server_cert), str(pki.server_key))
    context.verify_mode = ssl.CERT_REQUIRED
    seen: list[bool] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(
            request.transport is not None and request.transport.get_extra_info("peercert") is not None
        )
        return web.json_response(True)

    app = web.Application()
    app.router.add_put("/v1/kv/{key:.*}", handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    yield f"https://127.0.0.1:{runner.addresses[0][1]}", seen
    await runner.cleanup()


async def test_tls_with_ca_client_certificate_and_server_name(
    pki: Pki, tls_server: tuple[str, list[bool]], connector: Callable[..., ConsulClient]
) -> None:
    url, seen = tls_server
    full = {
        "CONSUL_CACERT": str(pki.ca),
        "CONSUL_CLIENT_CERT": str(pki.client_cert),
        "CONSUL_CLIENT_KEY": str(pki.client_key),
        "CONSUL_TLS_SERVER_NAME": "consul.test",
    }
    async with connector(url, **full) as client:
        assert await client.kv_put("k", b"v") is True
    assert seen == [True]

    # Without the server name, 127.0.0.1 does not match the certificate: refused, and said why.
    without_name = {k: v for k, v in full.items() if k != "CONSUL_TLS_SERVER_NAME"}
    async with connector(url, **without_name) as client:
        with pytest.raises(ConsulRejected, match="CONSUL_TLS_SERVER_NAME"):
            await client.kv_put("k", b"v")

    # Without the CA the server is not trusted.
    without_ca = {k: v for k, v in full.items() if k != "CONSUL_CACERT"}
    async with connector(url, **without_ca) as client:
        with pytest.raises(ConsulRejected, match="CONSUL_CACERT"):
            await client.kv_put("k", b"v")

    # Verification off (CONSUL_HTTP_SSL_VERIFY=false): no CA needed, the client cert still goes.
    unverified = {**without_ca, "CONSUL_HTTP_SSL_VERIFY": "false"}
    async with connector(url, **unverified) as client:
        assert await client.kv_put("k", b"v") is True

    # Without a client certificate the server hangs up: temporary from here, like any drop.
    no_client_cert = {k: v for k, v in full.items() if not k.startswith("CONSUL_CLIENT_")}
    async with connector(url, **no_client_cert) as client:
        with pytest.raises((ConsulUnavailable, ConsulRejected)):
            await client.kv_put("k", b"v")


async def test_unreadable_tls_files_are_named_at_start(
    pki: Pki, tmp_path: Path, connector: Callable[..., ConsulClient]
) -> None:
    missing = connector("https://127.0.0.1:1", CONSUL_CACERT=str(tmp_path / "nope.pem"))
    with pytest.raises(SettingsError, match="CONSUL_CACERT="):
        await missing.start()
    not_a_key = connector(
        "https://127.0.0.1:1", CONSUL_CLIENT_CERT=str(pki.client_cert), CONSUL_CLIENT_KEY=str(pki.ca)
    )
    with pytest.raises(SettingsError, match="CONSUL_CLIENT_CERT="):
        await not_a_key.start()


async def test_closing_twice_and_using_after_close(connector: Callable[..., ConsulClient]) -> None:
    client = connector("http://127.0.0.1:1")
    await client.start()
    await client.close()
    await client.close()
    with pytest.raises(RuntimeError, match="before start"):
        await client.kv_get("k")


async def test_a_namespace_on_consul_ce_is_one_clear_error_at_start(
    connector: Callable[..., ConsulClient],
) -> None:
    """Consul CE refuses every request naming a namespace (agent/http_ce.go); the stand-in
    answers as CE does, and the client says which setting to change instead of quoting a 400."""
    async with ConsulStandIn(ConsulSettings.for_tests()) as ce:
        async with connector(ce.url, CONSUL_NAMESPACE="team-a") as client:
            with pytest.raises(ConsulNamespaceUnsupported) as refused:
                await client.check_namespace()
            message = str(refused.value)
            assert "CONSUL_NAMESPACE='team-a'" in message and "Unset CONSUL_NAMESPACE" in message
            assert "Consul CE" in message and refused.value.status == 400
            with pytest.raises(ConsulNamespaceUnsupported):
                await client.kv_get("llmgw/status")
        async with connector(ce.url) as without:
            await without.check_namespace()
            assert await without.kv_put("llmgw/x", b"1") is True
    enterprise = ConsulStandIn(ConsulSettings.for_tests(enterprise=True))
    async with enterprise, connector(enterprise.url, CONSUL_NAMESPACE="team-a") as client:
        await client.check_namespace()
        assert await client.kv_put("llmgw/x", b"1") is True
