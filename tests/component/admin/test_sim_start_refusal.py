"""The last door of the engine policy: a real sim process refuses a start its job should
never have had (a job edited by hand in Nomad), exits 1 and names why."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from llmgw.sim.settings import ExitCode

# What the renderer gives a sim (port 0: the start is refused before anything binds).
ARGV = ["--host", "127.0.0.1", "--port", "0", "--served-model-name", "chat", "--load-time", "0"]


async def start_sim(extra: list[str], env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmgw.sim",
        *ARGV,
        *extra,
        env={**os.environ, **env},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:  # it started serving: the refusal failed
            process.kill()
            await process.wait()
    assert process.returncode is not None
    assert b"listening" not in out
    return process.returncode, err.decode()


@pytest.mark.parametrize(
    ("extra", "env", "named"),
    [
        # PYTHONWARNINGS reaches the sim through the job's env; the shipped policy refuses it.
        ([], {"PYTHONWARNINGS": "ignore"}, "environment variable PYTHONWARNINGS is refused"),
        # The sim's parser reads --log as --log-level; the policy reads it as its denied
        # --log-file, as the catalog check does for engine: sim.
        (["--log", "INFO"], {}, "argument --log is refused"),
    ],
)
async def test_a_refused_start_exits_1_naming_it(extra: list[str], env: dict[str, str], named: str) -> None:
    code, err = await start_sim(extra, env)
    assert code == ExitCode.REFUSED, err
    assert "start refused by the engine security policy" in err
    assert named in err


async def test_a_flag_the_sims_parser_does_not_know_is_a_usage_error() -> None:
    """--log-file itself (denied for engine: sim) never gets past the sim's parser."""
    code, err = await start_sim(["--log-file", "/tmp/x"], {})
    assert code == ExitCode.USAGE
    assert "--log-file" in err
