"""The checks that hold the architecture: layering contract, strict types, lint.

They run as tests so the README's one test command checks everything CI does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_import_contract_keeps_the_core_pure_and_layers_apart() -> None:
    result = run(str(BIN / "lint-imports"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_on_the_package() -> None:
    result = run(str(BIN / "mypy"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_lint() -> None:
    result = run(str(BIN / "ruff"), "check", "llmgw", "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr
