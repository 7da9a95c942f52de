"""`llmgw mirror add` against a fake Hub: selection, resume, verification, refusals, token hygiene."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from llmgw.core.mirror import HubRepo, check_reference, parse_ref
from llmgw.mirror.adding import AddRequest, add_version
from llmgw.mirror.progress import SilentProgress
from llmgw.mirror.settings import MirrorSettings
from llmgw.mirror.store import DirectoryStore

if TYPE_CHECKING:
    from conftest import Harness

REPO = "org/llama"


def manifest_of(harness: Harness, ref: str = "llama/v1") -> dict[str, object]:
    return json.loads((harness.store / ref / "manifest.json").read_text())


def test_add_mirrors_what_an_engine_needs_and_publishes_a_verified_manifest(harness: Harness) -> None:
    repo = harness.hub.repos[REPO] = harness.safetensors_repo()
    result = harness.add("llama@v1", REPO)
    assert result.code == 0, result.err
    assert "mirror:llama@v1 complete: 8 files" in result.out
    manifest = manifest_of(harness)
    files = manifest["files"]
    assert isinstance(files, list)
    assert [f["path"] for f in files] == harness.ENGINE_FILES
    for f in files:
        assert f["sha256"] == hashlib.sha256(repo[f["path"]].data).hexdigest()
        assert f["size"] == len(repo[f["path"]].data)
        on_disk = harness.store / "llama/v1/files" / f["path"]
        assert hashlib.sha256(on_disk.read_bytes()).hexdigest() == f["sha256"]
    assert manifest["source"] == REPO
    assert manifest["revision"] == harness.COMMIT
    # Never the whole repository: the README, .gitattributes and original/ were not even requested.
    fetched = {s.path.rsplit("/resolve/", 1)[1] for s in harness.hub.seen if "/resolve/" in s.path}
    assert not any(p.endswith(("README.md", ".gitattributes", "consolidated.00.pth")) for p in fetched)
    # The tree was listed page by page at the resolved commit, on the configured endpoint.
    trees = [s.path for s in harness.hub.seen if "/tree/" in s.path]
    assert len(trees) > 1 and all(harness.COMMIT in p for p in trees)

    listed = harness.run("mirror", "list", "--store", str(harness.store), "--json")
    assert json.loads(listed.out)["versions"][0]["state"] == "complete"

    again = harness.add("llama@v1", REPO)
    assert again.code == 0
    assert "(0 downloaded, 8 already verified)" in again.out


def test_version_defaults_to_the_resolved_commit(harness: Harness) -> None:
    harness.hub.repos[REPO] = harness.safetensors_repo()
    result = harness.add("llama", REPO)
    assert result.code == 0, result.err
    assert f"mirror:llama@{harness.COMMIT[:12]} complete" in result.out


def test_a_dropped_connection_is_resumed_with_a_range_request(harness: Harness) -> None:
    repo = harness.hub.repos[REPO] = harness.safetensors_repo()
    shard = "model-00002-of-00003.safetensors"
    repo[shard].drop_after = 10_000
    repo[shard].drops = 1
    result = harness.add("llama@v1", REPO)
    assert result.code == 0, result.err
    requests = harness.hub.file_requests(shard)
    assert len(requests) == 2
    assert "Range" not in requests[0].headers
    assert requests[1].headers["Range"].startswith("bytes=")
    assert int(requests[1].headers["Range"].removeprefix("bytes=").rstrip("-")) > 0
    entry = next(f for f in manifest_of(harness)["files"] if f["path"] == shard)  # type: ignore[union-attr]
    assert entry["sha256"] == repo[shard].sha256


def test_an_interrupted_add_leaves_no_manifest_and_the_next_run_resumes(harness: Harness) -> None:
    repo = harness.hub.repos[REPO] = harness.safetensors_repo()
    shard = "model-00003-of-00003.safetensors"
    repo[shard].drop_after = 15_000
    repo[shard].drops = 1
    store = DirectoryStore(harness.store)
    settings = dataclasses.replace(
        MirrorSettings.from_env(os.environ), retries=0, backoff_initial=0.0
    )  # the first run gives up at the drop, as a killed run would
    request = AddRequest(name="llama", version="v1", sources=(HubRepo(REPO),))
    outcome = asyncio.run(add_version(store, request, settings, SilentProgress(), None))
    assert not outcome.complete
    assert [f.label for f in outcome.failures] == [shard]
    assert not (harness.store / "llama/v1/manifest.json").exists()
    assert (harness.store / "llama/v1/files" / (shard + ".part")).stat().st_size == 15_000
    message = check_reference(parse_ref("llama@v1"), store.index())
    assert message == "mirror:llama@v1 is not complete: 7 of 8 files"

    result = harness.add("llama@v1", REPO)
    assert result.code == 0, result.err
    last = harness.hub.file_requests(shard)[-1]
    assert last.headers["Range"] == "bytes=15000-"
    assert check_reference(parse_ref("llama@v1"), store.index()) is None
    assert not (harness.store / "llama/v1/files" / (shard + ".part")).exists()


def test_a_corrupt_file_is_caught_deleted_and_the_version_stays_incomplete(harness: Harness) -> None:
    repo = harness.hub.repos[REPO] = harness.safetensors_repo()
    shard = "model-00001-of-00003.safetensors"
    repo[shard].wrong_bytes = True
    result = harness.add("llama@v1", REPO)
    assert result.code == 1
    assert f"{shard}: sha256 mismatch (expected {repo[shard].sha256}" in result.err
    assert "the file was deleted" in result.err
    files = harness.store / "llama/v1/files"
    assert not (files / shard).exists()
    assert not (files / (shard + ".part")).exists()
    assert not (harness.store / "llama/v1/manifest.json").exists()
    assert "is not complete: 7 of 8 files" in result.err
    index = DirectoryStore(harness.store).index()
    assert check_reference(parse_ref("llama@v1"), index) == "mirror:llama@v1 is not complete: 7 of 8 files"


def test_a_truncated_file_is_not_accepted(harness: Harness) -> None:
    repo = harness.hub.repos[REPO] = harness.safetensors_repo()
    shard = "model-00002-of-00003.safetensors"
    repo[shard].truncate_to = 5_000
    result = harness.add("llama@v1", REPO)
    assert result.code == 1
    assert shard in result.err and "5000" in result.err
    assert not (harness.store / "llama/v1/files" / shard).exists()
    assert not (harness.store / "llama/v1/manifest.json").exists()


def test_a_repository_page_url_is_refused_with_the_repo_id(harness: Harness) -> None:
    for url in (
        "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct",
        "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/tree/main",
        f"{harness.hub_server.url}/meta-llama/Llama-3.1-8B-Instruct",
    ):
        result = harness.add("llama@v1", url)
        assert result.code == 2
        assert "repository page" in result.err
        assert "write the repository id meta-llama/Llama-3.1-8B-Instruct" in result.err
    assert harness.hub.seen == []
    assert not harness.store.exists()


def test_a_bad_version_name_is_refused_before_any_request(harness: Harness) -> None:
    result = harness.add("llama@../../etc", REPO)
    assert result.code == 2 and "invalid mirror version" in result.err
    assert harness.hub.seen == []


def test_a_gguf_is_taken_with_file(harness: Harness) -> None:
    File = harness.File
    harness.hub.repos["org/llama-gguf"] = {
        "llama-Q4_K_M.gguf": File(b"GGUF" + b"q4" * 5000),
        "llama-Q8_0.gguf": File(b"GGUF" + b"q8" * 9000),
        "README.md": File(b"readme", lfs=False),
    }
    ambiguous = harness.add("llama-gguf@v1", "org/llama-gguf")
    assert ambiguous.code == 1
    assert "pick one with --file NAME.gguf" in ambiguous.err
    result = harness.add("llama-gguf@v1", "org/llama-gguf", "--file", "*Q4_K_M.gguf")
    assert result.code == 0, result.err
    files = manifest_of(harness, "llama-gguf/v1")["files"]
    assert [f["path"] for f in files] == ["llama-Q4_K_M.gguf"]  # type: ignore[union-attr]


def test_file_urls_are_mirrored_and_verified_when_pinned(harness: Harness) -> None:
    from aiohttp import web

    data = b"GGUF" + os.urandom(20_000)

    async def serve_file(request: web.Request) -> web.Response:
        return web.Response(body=data)

    app = web.Application()
    app.router.add_get("/files/tiny.gguf", serve_file)
    other = harness.start(app)
    url = f"{other.url}/files/tiny.gguf?sig=abc#sha256={hashlib.sha256(data).hexdigest()}"
    result = harness.add("tiny@v1", url)
    assert result.code == 0, result.err
    manifest = manifest_of(harness, "tiny/v1")
    assert manifest["source"] == f"{other.url}/files/tiny.gguf"  # no query string in a manifest
    assert manifest["files"] == [
        {"path": "tiny.gguf", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    ]

    wrong = f"{other.url}/files/tiny.gguf#sha256={'0' * 64}"
    refused = harness.add("tiny@v2", wrong)
    assert refused.code == 1 and "tiny.gguf: sha256 mismatch" in refused.err


def test_a_version_never_changes_when_the_branch_moves(harness: Harness) -> None:
    harness.hub.repos[REPO] = harness.safetensors_repo()
    assert harness.add("llama@v1", REPO).code == 0
    harness.hub.commit = "f" * 40  # main moved on
    moved = harness.add("llama@v1", REPO)
    assert moved.code == 1
    assert f"finish it with --revision {harness.COMMIT}" in moved.err
    pinned = harness.add("llama@v1", REPO, "--revision", harness.COMMIT)
    assert pinned.code == 0, pinned.err
    assert "(0 downloaded, 8 already verified)" in pinned.out
    other = harness.add("llama@v1", "http://127.0.0.1:9/x.gguf")
    assert other.code == 1 and "versions never change" in other.err


def test_concurrency_limit_is_respected(harness: Harness) -> None:
    harness.hub.repos[REPO] = harness.safetensors_repo(shards=6, shard_size=2_000)
    harness.hub.delay = 0.05
    result = harness.add("llama@v1", REPO, "--concurrency", "2", "--limit-rate", "100M")
    assert result.code == 0, result.err
    assert harness.hub.max_in_flight == 2


def test_the_token_is_used_but_never_printed_or_stored(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "hf_SeCrEtToKeN0123456789abcdefghij"
    harness.hub.token = secret
    repo = harness.hub.repos[REPO] = harness.safetensors_repo()
    repo["model-00001-of-00003.safetensors"].wrong_bytes = True  # a failing download prints errors

    monkeypatch.delenv("HF_TOKEN", raising=False)
    refused = harness.add("llama@v1", REPO)
    assert refused.code == 1 and "set HF_TOKEN" in refused.err

    monkeypatch.setenv("HF_TOKEN", secret)
    failed = harness.add("llama@v1", REPO)
    assert failed.code == 1
    assert "sha256 mismatch" in failed.err
    assert all(s.headers.get("Authorization") == f"Bearer {secret}" for s in harness.hub.seen[-3:])
    listed = harness.run("mirror", "list", "--store", str(harness.store))
    for text in (refused.out, refused.err, failed.out, failed.err, listed.out, listed.err):
        assert secret not in text
    for path in harness.store.rglob("*"):
        if path.is_file() and not path.name.endswith(".safetensors"):
            assert secret.encode() not in path.read_bytes(), path

    # The token file is read too, and a URL on another origin never receives the token.
    monkeypatch.delenv("HF_TOKEN")
    token_file = Path(os.environ["HF_HOME"]) / "token"
    token_file.parent.mkdir(parents=True)
    token_file.write_text(secret + "\n")
    repo["model-00001-of-00003.safetensors"].wrong_bytes = False
    assert harness.add("llama@v1", REPO).code == 0

    from aiohttp import web

    seen: list[str | None] = []

    async def serve_file(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.Response(body=b"GGUF-data")

    app = web.Application()
    app.router.add_get("/x.gguf", serve_file)
    other = harness.start(app)
    assert harness.add("x@v1", f"{other.url}/x.gguf").code == 0
    assert seen == [None]
