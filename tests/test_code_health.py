"""The checks that hold the architecture: layering contract, strict types, lint.

They run as tests so the README's one test command checks everything CI does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_import_contract_keeps_the_core_pure_and_layers_apart() -> None:
    result = run(str(BIN / "lint-imports"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_import_contract_refuses_product_code_that_imports_the_tests_fakes(tmp_path: Path) -> None:
    # The contract as pyproject.toml states it, checked on a package whose one module imports
    # the fakes: lint-imports must refuse it (so the contract above is in force, not vacuous).
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if "tests" in c.get("forbidden_modules", ())]
    assert contract["type"] == "forbidden" and contract["source_modules"] == ["llmgw"]
    package = tmp_path / "llmgw"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "wiring.py").write_text("from tests.support.control import FakeNomad\n")
    lines = [
        "[tool.importlinter]",
        'root_package = "llmgw"',
        "include_external_packages = true",
        "[[tool.importlinter.contracts]]",
        *(f"{key} = {json.dumps(value)}" for key, value in contract.items()),
    ]
    (tmp_path / "pyproject.toml").write_text("\n".join(lines) + "\n")
    result = subprocess.run(
        [str(BIN / "lint-imports"), "pyproject.toml", "--no-cache"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0, result.stdout
    assert "1 broken" in result.stdout and "llmgw.wiring -> tests (l.1)" in result.stdout, result.stdout


def test_mypy_strict_on_the_package() -> None:
    result = run(str(BIN / "mypy"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_lint() -> None:
    result = run(str(BIN / "ruff"), "check", "llmgw", "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr
