"""``llmgw catalog check --mirror``: a mirror: source passes only when its version is complete.

Versions are made the real way (``mirror add`` from the fake Hub) and then broken the
ways the world breaks them: a shard deleted, a download in progress, a version never
added. The check reads the mirror's index from its store directory or from a running
mirror server, and reports each problem at the source's own line, compiler-style.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from llmgw.core.mirror import parse_ref
from llmgw.mirror.server import create_app
from llmgw.mirror.store import DirectoryStore
from tests.support.mirror import put_version

if TYPE_CHECKING:
    from conftest import Harness

REPO = "org/llama"
ROOT = Path(__file__).resolve().parents[3]
POLICY = ROOT / "tests" / "fixtures" / "test-policy.yaml"
COMPILER_STYLE = re.compile(
    r"^(?P<file>[^:]+):(?P<line>\d+):(?P<col>\d+): (?P<sev>error|warning): (?P<rest>.+)$"
)

CATALOG = """\
models:
  chat:
    profiles:
      - engine: vllm
        source: mirror:llama@v1
        tp: 1
        gpu: {memory_gb: 24}
  chat2:
    profiles:
      - engine: vllm
        source: mirror:llama@v2
        tp: 1
        gpu: {memory_gb: 24}
  coder:
    profiles:
      - engine: vllm
        source: mirror:qwen@v1
        tp: 1
        gpu: {memory_gb: 24}
  other:
    profiles:
      - engine: vllm
        source: mirror:mistral@v1
        tp: 1
        gpu: {memory_gb: 24}
"""


def versions(harness: Harness) -> Path:
    """llama@v1 complete, llama@v2 missing a shard, qwen@v1 still downloading; a catalog using them."""
    harness.hub.repos[REPO] = harness.safetensors_repo(shards=2, shard_size=1000)
    for version in ("v1", "v2"):
        assert harness.add(f"llama@{version}", REPO).code == 0
    (harness.store / "llama/v2/files/model-00002-of-00002.safetensors").unlink()
    put_version(DirectoryStore(harness.store), "qwen@v1", {"a.gguf": b"x" * 10, "b.gguf": b"y" * 10})
    catalog = harness.tmp / "catalog.yaml"
    catalog.write_text(CATALOG)
    return catalog


def check(harness: Harness, catalog: Path, *extra: str) -> tuple[int, list[str], str]:
    result = harness.run("catalog", "check", str(catalog), "--policy", str(POLICY), *extra)
    # The mirror's checks are errors; the notes beside them (each profile's tool-call parser)
    # are catalog check's own, tested in tests/component/cli.
    lines = [line for line in result.out.splitlines() if ": note: " not in line]
    return result.code, lines, result.err


def line_of(source: str) -> str:
    return str(CATALOG.splitlines().index(f"        source: {source}") + 1)


EXPECTED = [
    (
        line_of("mirror:llama@v2"),
        "models.chat2.profiles[0].source",
        "mirror:llama@v2 is not complete: 6 of 7 files",
    ),
    (
        line_of("mirror:qwen@v1"),
        "models.coder.profiles[0].source",
        "mirror:qwen@v1 is not complete: still downloading, 2 of 2 files",
    ),
    (
        line_of("mirror:mistral@v1"),
        "models.other.profiles[0].source",
        "mirror:mistral@v1: unknown mirror version; the mirror has no model named 'mistral'",
    ),
]


def parsed(lines: list[str], catalog: Path) -> list[tuple[str, str, str]]:
    out = []
    for line in lines:
        match = COMPILER_STYLE.match(line)
        assert match, line
        assert match["file"] == str(catalog) and match["sev"] == "error" and match["col"] == "17"
        path, _, message = match["rest"].partition(": ")
        out.append((match["line"], path, message))
    return out


def test_against_the_store_directory_each_unusable_version_is_an_error_at_its_line(harness: Harness) -> None:
    catalog = versions(harness)
    store = DirectoryStore(harness.store)
    with store.locked(parse_ref("qwen@v1")):  # a `mirror add` holds it: downloading
        code, lines, err = check(harness, catalog, "--mirror", str(harness.store))
    assert code == 1
    assert parsed(lines, catalog) == EXPECTED
    assert "3 error(s), 0 warning(s)" in err


def test_against_a_running_mirror_and_from_the_environment(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = versions(harness)
    server = harness.start(create_app(DirectoryStore(harness.store)))
    with DirectoryStore(harness.store).locked(parse_ref("qwen@v1")):
        code, lines, _ = check(harness, catalog, "--mirror", server.url)
        assert code == 1 and parsed(lines, catalog) == EXPECTED
        monkeypatch.setenv("LLMGW_MIRROR_URL", server.url)
        code, lines, _ = check(harness, catalog, "--format", "json")
    assert code == 1
    as_json = json.loads("\n".join(lines))
    errors = [d for d in as_json if d["severity"] == "error"]
    assert [(str(d["line"]), d["path"], d["message"]) for d in errors] == EXPECTED

    # Once every version is complete, the catalog is valid.
    assert harness.add("llama@v2", REPO).code == 0  # resumes: fetches the missing shard
    catalog.write_text(CATALOG.split("  coder:")[0])
    code, lines, err = check(harness, catalog)
    assert code == 0, [*lines, err]
    assert lines == []


def test_without_a_mirror_only_the_form_is_checked(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("LLMGW_MIRROR_URL", raising=False)
    catalog = harness.tmp / "catalog.yaml"
    catalog.write_text(CATALOG)
    code, lines, _ = check(harness, catalog)
    assert code == 0 and lines == []
    catalog.write_text(CATALOG.replace("mirror:mistral@v1", "mirror:mistral"))
    code, lines, _ = check(harness, catalog)
    assert code == 1 and "a mirror source is written mirror:NAME@VERSION" in lines[0]
    with pytest.raises(SystemExit):
        harness.run("catalog", "check", "--help")
    assert "only checked for their form" in " ".join(capsys.readouterr().out.split())


def test_a_mirror_that_cannot_be_read_exits_3_and_a_missing_directory_2(harness: Harness) -> None:
    catalog = harness.tmp / "catalog.yaml"
    catalog.write_text(CATALOG)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, lines, err = check(harness, catalog, "--mirror", f"http://127.0.0.1:{port}")
    assert code == 3 and lines == []
    assert "cannot read the mirror's index" in err and "unreachable" in err
    code, _, err = check(harness, catalog, "--mirror", str(harness.tmp / "no-such-store"))
    assert code == 2 and "not a directory" in err
    # A catalog without mirror sources never asks the mirror.
    catalog.write_text("models:\n  m:\n    profiles: [{engine: sim}]\n")
    code, _, _ = check(harness, catalog, "--mirror", f"http://127.0.0.1:{port}")
    assert code == 0


def test_ci_runs_it_as_a_process(harness: Harness) -> None:
    versions(harness)
    server = harness.start(create_app(DirectoryStore(harness.store)))
    result = subprocess.run(
        [sys.executable, "-m", "llmgw", "catalog", "check", "catalog.yaml", "--policy", str(POLICY)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=harness.tmp,
        env={"PATH": "/usr/bin:/bin", "LLMGW_MIRROR_URL": server.url},
    )
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stdout.splitlines() if ": note: " not in line]
    # qwen@v1 is complete here (no add holds it).
    assert [line.split(":")[1] for line in lines] == [
        line_of("mirror:llama@v2"),
        line_of("mirror:mistral@v1"),
    ]
    assert lines[0].startswith(
        f"catalog.yaml:{line_of('mirror:llama@v2')}:17: error: models.chat2.profiles[0]"
    )
