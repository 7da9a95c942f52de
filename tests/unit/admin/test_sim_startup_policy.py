"""The sim's start refusal: the engine policy's last door, judged on argv and environment."""

from __future__ import annotations

import fnmatch

import pytest

from llmgw.core.catalog import SecurityPolicy
from llmgw.core.catalog.security import PROCESS_ALTERING_ENV
from llmgw.sim.settings import SimSettings
from llmgw.sim.startup_policy import REFUSED_ENV, TOLERATED_ENV, refusals

# What the renderer puts on a sim's command line (llmgw's owned flags included).
RENDERED_ARGV = [
    "--host", "10.0.0.5", "--port", "23456", "--model", "org/model", "--served-model-name", "chat",
    "--rank", "0", "--world-size", "2", "--token-rate", "50.0", "--load-time", "2.0",
]  # fmt: skip
WORKER_ARGV = ["--host", "10.0.0.6", "--port", "23457", "--head-file", "local/llmgw-head", "--rank", "1"]
# What a Nomad task's environment legitimately holds.
NODE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/root",
    "NOMAD_ALLOC_DIR": "/var/nomad/alloc/x/alloc",
    "NOMAD_PORT_http": "23456",
    "NOMAD_ADDR_http": "10.0.0.5:23456",
    "NVIDIA_VISIBLE_DEVICES": "GPU-1,GPU-2",
    "LLMGW_SIM_HEAD_FILE": "local/llmgw-head",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def test_what_llmgw_renders_starts(shipped_policy: SecurityPolicy) -> None:
    assert refusals(SimSettings(), RENDERED_ARGV, NODE_ENV, shipped_policy) == ()
    assert refusals(SimSettings(), WORKER_ARGV, NODE_ENV, shipped_policy) == ()


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--log-file", "/tmp/x"], "argument --log-file is refused: writes a file on the node"),
        (["--log-file=/etc/cron.d/x"], "argument --log-file=/etc/cron.d/x is refused"),
        # The sim's parser reads --log as --log-level, but every door judges a flag the same
        # way, so what the catalog check refuses the start refuses too.
        (["--log", "DEBUG"], "the engine's parser reads it as --log-file"),
    ],
)
def test_a_denied_flag_added_by_hand_is_refused(
    extra: list[str], named: str, shipped_policy: SecurityPolicy
) -> None:
    reasons = refusals(SimSettings(), [*RENDERED_ARGV, *extra], NODE_ENV, shipped_policy)
    assert len(reasons) == 1
    assert named in reasons[0]


def test_values_are_not_judged_as_flags(shipped_policy: SecurityPolicy) -> None:
    argv = ["--served-model-name", "@org/model", "--model", "@weights"]
    assert refusals(SimSettings(), argv, NODE_ENV, shipped_policy) == ()


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("PYTHONWARNINGS", "warning filters import modules"),
        ("PYTHONPATH", "changes which Python code the engine imports"),
        ("PYTHONHOME", "Python interpreter control"),
        ("PYTHONBREAKPOINT", "Python interpreter control"),
        ("LD_PRELOAD", "loads a shared library into every process"),
        ("LD_AUDIT", "dynamic loader control"),
        ("BROWSER", "names a program"),
        ("OPENSSL_CONF", "can load engines"),
        ("GLIBC_TUNABLES", "CVE-2023-4911"),
        ("NODE_OPTIONS", "injects options"),
    ],
)
def test_environment_that_changes_what_runs_is_refused(
    name: str, words: str, shipped_policy: SecurityPolicy
) -> None:
    reasons = refusals(SimSettings(), RENDERED_ARGV, {**NODE_ENV, name: "x"}, shipped_policy)
    assert len(reasons) == 1, reasons
    assert reasons[0].startswith(f"environment variable {name} is refused: ")
    assert words in reasons[0]


def test_every_reason_is_given_at_once(shipped_policy: SecurityPolicy) -> None:
    reasons = refusals(
        SimSettings(),
        [*RENDERED_ARGV, "--log-file", "x"],
        {**NODE_ENV, "LD_PRELOAD": "/x.so", "PYTHONSTARTUP": "/x.py"},
        shipped_policy,
    )
    assert len(reasons) == 3


def test_the_list_covers_what_the_renderer_refuses() -> None:
    """The renderer never writes these into a job; the sim refuses them all but PATH."""
    assert set(PROCESS_ALTERING_ENV) - {"PATH"} <= set(REFUSED_ENV)
    for tolerated in TOLERATED_ENV:  # tolerated names are exceptions inside the refused families
        assert any(fnmatch.fnmatchcase(tolerated, p) for p in REFUSED_ENV)


def test_the_shipped_policy_is_the_default() -> None:
    assert refusals(SimSettings(), RENDERED_ARGV, NODE_ENV) == ()
    assert refusals(SimSettings(), RENDERED_ARGV, {"PYTHONWARNINGS": "error"}) != ()
