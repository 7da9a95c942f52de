"""The dev cluster (what `llmgw dev` runs) answers only requests carrying its ACL tokens.

Each test replays one attack that got through when the stand-ins took no token, from
a local process that knows the addresses but not the tokens, and shows it refused
with the answer real Nomad or Consul gives; then does the same thing with the token,
as a user's script given the printed exports would, to show it is the token, not
the request, that decides.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import consul
import consul.aio
import consul.exceptions
import nomad
import nomad.api.exceptions
import pytest

from llmgw.core.conventions import ENGINE_SERVICE, KV_KEYS_PREFIX, META_JOB, META_MODEL
from llmgw.core.records import secret_sha256
from llmgw.devcluster.cluster import DevCluster, DevClusterConfig
from llmgw.devcluster.consul import ConsulSettings

from .conftest import call, fast_config, wait_for


@pytest.fixture
async def dev(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[DevCluster]:
    for name in ("NOMAD_ADDR", "NOMAD_TOKEN", "CONSUL_HTTP_ADDR", "CONSUL_HTTP_TOKEN"):
        monkeypatch.delenv(name, raising=False)  # py-consul prefers CONSUL_HTTP_TOKEN to its argument
    config = DevClusterConfig(nomad=fast_config(tmp_path / "nomad"), consul=ConsulSettings.for_tests())
    async with DevCluster(config) as cluster:
        yield cluster


def python_nomad(dev: DevCluster, token: str | None) -> nomad.Nomad:
    return nomad.Nomad(address=dev.nomad_addr, token=token, timeout=10)


def py_consul(url: str, token: str | None) -> consul.aio.Consul:
    address = urlsplit(url)
    return consul.aio.Consul(host=address.hostname, port=address.port, token=token)


def shell_job(marker: Path) -> dict[str, Any]:
    """A batch job whose raw_exec task runs ``/bin/sh -c id`` and keeps what it printed."""
    task = {
        "Name": "t",
        "Driver": "raw_exec",
        "Config": {"command": "/bin/sh", "args": ["-c", f"id > {marker}"]},
    }
    return {"Job": {"ID": "owned", "Type": "batch", "TaskGroups": [{"Name": "g", "Tasks": [task]}]}}


async def test_a_raw_exec_job_is_refused_without_the_nomad_token(dev: DevCluster, tmp_path: Path) -> None:
    marker = tmp_path / "id.txt"
    attempts = [
        ({}, {}, "Permission denied"),
        ({"X-Nomad-Token": "guess"}, {}, "ACL token not found"),
        ({"Authorization": "Bearer guess"}, {}, "ACL token not found"),
        (
            {"X-Nomad-Token": dev.consul_token},
            {},
            "ACL token not found",
        ),  # the tokens are not interchangeable
        # Nomad reads no ?token= (Consul does): the right token there is no token at all.
        ({}, {"token": dev.nomad_token}, "Permission denied"),
    ]
    async with aiohttp.ClientSession() as http:
        for headers, params, answer in attempts:
            async with http.put(
                f"{dev.nomad_addr}/v1/jobs", json=shell_job(marker), headers=headers, params=params
            ) as resp:
                assert (resp.status, await resp.text()) == (403, answer), headers or params
        # The fault endpoints kill processes: they are behind the token too.
        async with http.post(f"{dev.nomad_addr}/_dev/node/node-0/fail") as resp:
            assert (resp.status, await resp.text()) == (403, "Permission denied")

    authed = python_nomad(dev, dev.nomad_token)
    assert await call(authed.jobs.get_jobs) == []
    assert {n["Status"] for n in await call(authed.nodes.get_nodes)} == {"ready"}
    assert not marker.exists()

    # The same job with the token runs: the refusal above was the token's doing.
    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {dev.nomad_token}"}
        async with http.put(f"{dev.nomad_addr}/v1/jobs", json=shell_job(marker), headers=headers) as resp:
            assert resp.status == 200, await resp.text()
    assert (await wait_for(lambda: marker.exists() and marker.read_text(), "the task's output")).startswith(
        "uid="
    )


async def test_an_engine_service_cannot_be_registered_without_the_consul_token(dev: DevCluster) -> None:
    """Registered under the engine service name with llmgw's meta and a passing check, the
    service would have been sent the next user's prompt."""
    agent = dev.consul.agent_url("node-0")  # a node's own agent, where Nomad registers engines
    meta = {META_MODEL: "sim-chat", META_JOB: "llmgw-sim-chat-x"}
    for url, token in ((agent, None), (dev.consul_addr, None), (agent, "guess")):
        anonymous = py_consul(url, token)
        try:
            with pytest.raises(consul.exceptions.ACLPermissionDenied) as refused:
                await anonymous.agent.service.register(
                    ENGINE_SERVICE,
                    service_id="evil",
                    address="127.0.0.1",
                    port=9,
                    meta=meta,
                    check=consul.Check.ttl("1h"),
                )
            assert ("ACL not found" if token else "Permission denied") in str(refused.value)
            # Nor can it read who serves what: the anonymous token reads lists as empty
            # (filtered), an unknown one is refused.
            if token is None:
                assert (await anonymous.health.service(ENGINE_SERVICE))[1] == []
            else:
                with pytest.raises(consul.exceptions.ACLPermissionDenied, match="ACL not found"):
                    await anonymous.health.service(ENGINE_SERVICE)
        finally:
            await anonymous.close()

    authed = py_consul(dev.consul_addr, dev.consul_token)
    try:
        assert (await authed.health.service(ENGINE_SERVICE))[1] == []
        assert await authed.agent.service.register("legit", service_id="legit", port=1) is True
        assert [s["Service"]["ID"] for s in (await authed.health.service("legit"))[1]] == ["legit"]
    finally:
        await authed.close()


async def test_an_api_key_cannot_be_planted_without_the_consul_token(dev: DevCluster) -> None:
    """A record under llmgw/keys/ holding the hash of a made-up key would make a keyed
    router on this Consul accept that key for every model."""
    record = {"key_id": "planted", "name": "x", "secret_sha256": secret_sha256("sk-llmgw-made-up")}
    path = f"{KV_KEYS_PREFIX}planted"
    async with aiohttp.ClientSession() as http:
        for headers in ({}, {"X-Consul-Token": "guess"}, {"X-Consul-Token": dev.nomad_token}):
            async with http.put(
                f"{dev.consul_addr}/v1/kv/{path}", data=json.dumps(record), headers=headers
            ) as resp:
                assert resp.status == 403
                assert (await resp.text()).startswith("ACL not found" if headers else "Permission denied")
        # The fault endpoints stop Consul: they are behind the token too.
        async with http.put(f"{dev.consul_addr}/_dev/outage", params={"mode": "hang"}) as resp:
            assert resp.status == 403

    authed = py_consul(dev.consul_addr, dev.consul_token)
    try:
        _, planted = await authed.kv.get(KV_KEYS_PREFIX, recurse=True)
        assert planted is None, "nothing was written under llmgw/keys/"
        assert await authed.kv.put("llmgw/probe", "v") is True
    finally:
        await authed.close()
    # The token may come as ?token= too, as Consul reads it.
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{dev.consul_addr}/v1/kv/llmgw/probe", params={"token": dev.consul_token}) as resp,
    ):
        assert resp.status == 200


async def test_python_nomad_and_py_consul_work_with_the_tokens_and_are_refused_without(
    dev: DevCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's script after the printed exports: both clients read their variables."""
    monkeypatch.setenv("NOMAD_ADDR", dev.nomad_addr)
    monkeypatch.setenv("CONSUL_HTTP_ADDR", dev.consul_addr.split("://", 1)[1])
    anonymous_nomad, anonymous_consul = nomad.Nomad(timeout=10), consul.Consul()
    monkeypatch.setenv("NOMAD_TOKEN", "guess")
    guessing_nomad = nomad.Nomad(timeout=10)
    monkeypatch.setenv("NOMAD_TOKEN", dev.nomad_token)
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", dev.consul_token)
    user_nomad, user_consul = nomad.Nomad(timeout=10), consul.Consul()

    assert len(await call(user_nomad.nodes.get_nodes)) == 3
    assert await call(user_nomad.jobs.get_jobs) == []
    assert await asyncio.to_thread(user_consul.kv.put, "scratch/probe", "x") is True
    _, entry = await asyncio.to_thread(user_consul.kv.get, "scratch/probe")
    assert entry is not None and entry["Value"] == b"x"

    for refused in (anonymous_nomad.jobs.get_jobs, guessing_nomad.nodes.get_nodes):
        with pytest.raises(nomad.api.exceptions.URLNotAuthorizedNomadException):
            await call(refused)
    assert await call(anonymous_nomad.status.leader.get_leader)  # real Nomad asks no token here
    with pytest.raises(consul.exceptions.ACLPermissionDenied):
        await asyncio.to_thread(anonymous_consul.kv.get, "scratch/probe")
    with pytest.raises(consul.exceptions.ACLPermissionDenied):
        await asyncio.to_thread(anonymous_consul.kv.put, "scratch/probe", "y")


@pytest.mark.parametrize("stand_in", ["nomad", "consul"])
async def test_a_malformed_request_does_not_log_the_token_it_carried(
    dev: DevCluster, caplog: pytest.LogCaptureFixture, stand_in: str
) -> None:
    """aiohttp quotes a request it cannot parse in its error log; the token was in it."""
    address, header, token = {
        "nomad": (dev.nomad_addr, "X-Nomad-Token", dev.nomad_token),
        "consul": (dev.consul_addr, "X-Consul-Token", dev.consul_token),
    }[stand_in]
    target = urlsplit(address)
    assert target.hostname is not None and target.port is not None
    # Bare-LF line endings: llhttp finds no CRLF to cut its excerpt at, so it held everything.
    raw = f"GET /v1/jobs HTTP/1.1\nHost: 127.0.0.1\n{header}: {token}\n\n".encode()
    with caplog.at_level(logging.DEBUG):
        reader, writer = await asyncio.open_connection(target.hostname, target.port)
        try:
            writer.write(raw)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 10.0)
        finally:
            writer.close()
    assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), answer[:200]
    assert token not in caplog.text
    assert any("malformed request" in r.getMessage() for r in caplog.records)
