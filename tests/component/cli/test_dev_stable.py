"""What `llmgw dev` keeps across restarts of one state folder: tokens, ports, the engines' key secret."""

from __future__ import annotations

import socket
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from llmgw.cli.dev_stable import STABLE_FILE, load_stable, save_stable


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
