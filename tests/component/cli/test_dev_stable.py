"""What `llmgw dev` keeps across restarts of one state folder: tokens, ports, the engines' key secret."""

from __future__ import annotations

import asyncio
import json
import socket
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from llmgw.adapters.consul import ApiKeyStore, ConsulClient
from llmgw.adapters.consul.settings import ClientSettings
from llmgw.cancellation import cancel_and_wait
from llmgw.cli.dev_stable import (
    API_KEYS_FILE,
    STABLE_FILE,
    keep_api_keys,
    load_stable,
    restore_api_keys,
    save_stable,
)
from llmgw.devcluster.consul import ConsulSettings, ConsulStandIn
from llmgw.settings import ConsulConnection
from tests.support.waiting import eventually


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_restart_gets_the_same_tokens_ports_and_secret_from_a_file_only_this_user_reads(
    tmp_path: Path,
) -> None:
    first = load_stable(tmp_path)
    assert first.nomad_port == first.consul_port == 0 and first.nomad_token != first.consul_token
    ports = replace(first, nomad_port=free_port(), consul_port=free_port())
    save_stable(tmp_path, ports)
    assert stat.S_IMODE((tmp_path / STABLE_FILE).stat().st_mode) == 0o600
    assert load_stable(tmp_path) == ports
    assert load_stable(tmp_path / "other") != ports  # another folder: drawn afresh


def test_a_port_taken_since_gets_a_new_one_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = int(holder.getsockname()[1])
        stable = replace(load_stable(tmp_path), nomad_port=taken, consul_port=free_port())
        save_stable(tmp_path, stable)
        again = load_stable(tmp_path)
    assert again.nomad_port == 0 and again.consul_port == stable.consul_port
    assert again.nomad_token == stable.nomad_token
    assert f"Nomad's port {taken} of the last run is taken now; it gets a new one" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["", "{", "[]", '{"nomad_token": 1}'])
def test_an_unreadable_file_is_drawn_afresh(tmp_path: Path, text: str) -> None:
    (tmp_path / STABLE_FILE).write_text(text)
    assert load_stable(tmp_path).nomad_port == 0


async def test_api_keys_are_kept_in_the_folder_and_put_back_into_a_new_consul(tmp_path: Path) -> None:
    async with ConsulStandIn(ConsulSettings.for_tests()) as first, _client(first.url) as consul:
        issued = await ApiKeyStore(consul).create("team", requests_per_minute=5)
        keeper = asyncio.create_task(keep_api_keys(consul, tmp_path))
        try:
            await eventually(lambda: (tmp_path / API_KEYS_FILE).exists(), what="the keys written")
        finally:
            await cancel_and_wait(keeper)
    assert stat.S_IMODE((tmp_path / API_KEYS_FILE).stat().st_mode) == 0o600
    assert issued.secret not in (tmp_path / API_KEYS_FILE).read_text()  # digests only
    async with ConsulStandIn(ConsulSettings.for_tests()) as second, _client(second.url) as consul:
        assert await restore_api_keys(consul, tmp_path) == 1
        assert await ApiKeyStore(consul).list() == {issued.record.key_id: issued.record}


async def test_a_kept_file_naming_another_prefix_puts_nothing_there(tmp_path: Path) -> None:
    (tmp_path / API_KEYS_FILE).write_text(
        json.dumps({"llmgw/catalog/current": "x", "llmgw/keys/../catalog/current": "x", "other": "x"})
    )
    async with ConsulStandIn(ConsulSettings.for_tests()) as standin, _client(standin.url) as consul:
        assert await restore_api_keys(consul, tmp_path) == 0
        entries, _ = await consul.kv_list("")
        assert entries == []


def _client(url: str) -> ConsulClient:
    return ConsulClient(
        ConsulConnection.from_env({"CONSUL_HTTP_ADDR": url}),
        ClientSettings(request_timeout=2.0, blocking_slack=0.5),
    )
