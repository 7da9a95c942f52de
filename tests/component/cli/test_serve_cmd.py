"""`llmgw serve` refuses settings it cannot run with before it starts anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def serve(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LLMGW_", "NOMAD_", "CONSUL_"))}
    return subprocess.run(
        [sys.executable, "-m", "llmgw", "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**clean, **env},
    )


def test_an_admin_api_beyond_loopback_without_a_token_is_refused_up_front() -> None:
    result = serve("--admin-host", "0.0.0.0")
    assert result.returncode == 2
    assert "the admin API will not start" in result.stderr and "LLMGW_ADMIN_TOKEN" in result.stderr
    assert "Traceback" not in result.stderr


def test_unusable_connection_settings_name_their_variable() -> None:
    result = serve(NOMAD_ADDR="ftp://nomad:4646")
    assert result.returncode == 2 and "NOMAD_ADDR" in result.stderr and "Traceback" not in result.stderr
    result = serve(LLMGW_ALLOWED_IMAGES="not a ref")
    assert result.returncode == 2 and "LLMGW_ALLOWED_IMAGES" in result.stderr
