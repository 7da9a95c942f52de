"""The lock files operators install with --require-hashes cover what pyproject.toml asks for."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REFRESH = (
    "refresh with: uv pip compile pyproject.toml --generate-hashes --python-version 3.11 --universal "
    "--no-header -o requirements.lock (and --extra dev --extra s3 -o requirements-dev.lock)"
)


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-").replace(".", "-")


def _pinned(lock: Path) -> dict[str, str]:
    pins = {}
    for line in lock.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)", line)
        if match:
            pins[_name(match.group(1))] = match.group(2)
    return pins


def test_every_dependency_is_pinned_with_hashes() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = _pinned(REPO / "requirements.lock")
    dev = _pinned(REPO / "requirements-dev.lock")
    missing = [d for d in project["dependencies"] if _name(d) not in runtime]
    missing_dev = [
        d for d in project["optional-dependencies"]["dev"] + project["dependencies"] if _name(d) not in dev
    ]
    assert not missing and not missing_dev, f"{missing} {missing_dev}; {REFRESH}"
    for lock in ("requirements.lock", "requirements-dev.lock"):
        lines = (REPO / lock).read_text().splitlines()
        unhashed = [
            line
            for line, following in zip(lines, [*lines[1:], ""], strict=True)
            if re.match(r"^[A-Za-z0-9_.\-]+==", line) and not following.strip().startswith("--hash=sha256:")
        ]
        assert not unhashed, f"{lock}: {unhashed} have no hashes; {REFRESH}"
