"""`llmgw dev` stopped and started again in the same folder: what the user set up once
(the exports' tokens and addresses, an API key from the admin API) still works."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.waiting import eventually_sync

from .conftest import start_dev

pytestmark = pytest.mark.e2e

CATALOG = """
models:
  sim-chat:
    roles: [chat]
    profiles: [{engine: sim, simulate_gpus: false}]
    scaling: {min: 0, max: 0}
"""


def _models_status(port: int, key: str) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {key}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_a_restart_keeps_the_exports_and_the_api_keys(tmp_path: Path) -> None:
    (tmp_path / "catalog.yaml").write_text(CATALOG)
    args = ("--catalog", str(tmp_path / "catalog.yaml"), "--api-keys")
    first = start_dev(tmp_path, *args)
    try:
        key = first.create_key("team")
        # The router follows the keys in Consul: it takes a new one a moment later.
        eventually_sync(lambda: _models_status(first.port, key) == 200, 30, "the router taking the key")
        token = (first.state_dir / "nomad.token").read_text()
        addresses = (first.state["nomad_addr"], first.state["consul_addr"])
    finally:
        assert first.interrupt() == 0
    second = start_dev(tmp_path, *args)
    try:
        assert (second.state_dir / "nomad.token").read_text() == token
        assert (second.state["nomad_addr"], second.state["consul_addr"]) == addresses
        # The same key, not issued again.
        eventually_sync(lambda: _models_status(second.port, key) == 200, 30, "the kept key served")
        assert _models_status(second.port, key[:-2] + "xx") == 401
        kept = json.loads((second.state_dir / "api-keys.json").read_text())
        assert key not in json.dumps(kept)  # the key's digest is kept, never its secret
    finally:
        assert second.interrupt() == 0
