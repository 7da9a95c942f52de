"""`llmgw dev`'s stand-ins answer only its tokens, and the printed exports hand them to the user.

A user's shell runs the banner's `export` lines and then their own tools: a python-nomad
and py-consul script and `llmgw status` work; the same without the token lines is refused.
"""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.waiting import eventually_sync

from .conftest import REPO, RunningDev, start_dev

pytestmark = pytest.mark.e2e

CATALOG = """
models:
  sim-chat:
    roles: [chat]
    profiles: [{engine: sim, simulate_gpus: false}]
    scaling: {min: 0, max: 0}
"""

# What a user's script does with the clients as they come: each reads its variables.
USER_SCRIPT = """
import consul, consul.exceptions, nomad, nomad.api.exceptions
try:
    print("nomad nodes:", len(nomad.Nomad(timeout=10).nodes.get_nodes()))
except nomad.api.exceptions.URLNotAuthorizedNomadException:
    print("nomad refused")
try:
    print("consul write:", consul.Consul().kv.put("scratch/probe", "x"))
except consul.exceptions.ACLPermissionDenied:
    print("consul refused")
"""


def in_a_shell(exports: list[str], *command: str) -> subprocess.CompletedProcess[str]:
    """``command`` run by sh after ``exports``, in an environment without NOMAD_* or CONSUL_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOMAD_", "CONSUL_"))}
    script = "\n".join([*exports, "exec " + shlex.join(command)])
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60, cwd=REPO)


def test_the_printed_exports_carry_the_tokens_the_stand_ins_require(
    tmp_path: Path, dev_runner: list[RunningDev]
) -> None:
    (tmp_path / "catalog.yaml").write_text(CATALOG)
    dev = start_dev(tmp_path, "--catalog", str(tmp_path / "catalog.yaml"), "--nodes", "2", "--gpus", "1")
    dev_runner.append(dev)
    exports = [line.strip() for line in dev.banner.splitlines() if line.strip().startswith("export ")]
    assert [line.split("=", 1)[0] for line in exports] == [
        "export NOMAD_ADDR",
        "export NOMAD_TOKEN",
        "export CONSUL_HTTP_ADDR",
        "export CONSUL_HTTP_TOKEN",
    ]
    tokens = [dev.state_dir / "nomad.token", dev.state_dir / "consul.token"]
    for path in tokens:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, f"{path} is readable by others"
        assert path.read_text() not in dev.banner, "the secret itself is never printed"

    user = in_a_shell(exports, sys.executable, "-c", USER_SCRIPT)
    assert user.stdout.split("\n")[:2] == ["nomad nodes: 2", "consul write: True"], user.stderr

    # The control plane publishes its first status shortly after it starts.
    def published() -> subprocess.CompletedProcess[str] | None:
        status = in_a_shell(exports, sys.executable, "-m", "llmgw", "status")
        if status.returncode == 0:
            return status
        assert "no status has been published yet" in status.stderr, status.stderr
        return None

    status = eventually_sync(published, 60, "a first status published", every=0.5)
    assert "sim-chat" in status.stdout

    without_tokens = [line for line in exports if "_TOKEN=" not in line]
    anonymous = in_a_shell(without_tokens, sys.executable, "-c", USER_SCRIPT)
    assert anonymous.stdout.split("\n")[:2] == ["nomad refused", "consul refused"], anonymous.stderr
    status = in_a_shell(without_tokens, sys.executable, "-m", "llmgw", "status")
    assert status.returncode != 0 and "CONSUL_HTTP_TOKEN" in status.stderr

    assert dev.interrupt() == 0
    assert not any(path.exists() for path in tokens), "the tokens go when llmgw dev stops"
