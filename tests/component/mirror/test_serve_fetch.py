"""The mirror server and the node-side `llmgw mirror fetch`: complete versions only, every byte verified."""

from __future__ import annotations

import hashlib
import json
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.error import HTTPError

from aiohttp import web

from llmgw.core.mirror import check_reference, parse_ref
from llmgw.mirror.indexing import load_index
from llmgw.mirror.server import create_app
from llmgw.mirror.store import DirectoryStore
from tests.support.waiting import eventually_sync

if TYPE_CHECKING:
    from conftest import Harness, Result, ServerThread

REPO = "org/llama"
SHARD = "model-00002-of-00003.safetensors"


def mirrored(harness: Harness) -> tuple[DirectoryStore, list[tuple[str, dict[str, str]]], ServerThread]:
    """A complete llama@v1 in the store, and a mirror server over it that records requests."""
    harness.hub.repos[REPO] = harness.safetensors_repo()
    assert harness.add("llama@v1", REPO).code == 0
    store = DirectoryStore(harness.store)
    seen: list[tuple[str, dict[str, str]]] = []

    @web.middleware
    async def record(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        seen.append((request.path, dict(request.headers)))
        return await handler(request)

    app = create_app(store)
    app.middlewares.append(record)
    return store, seen, harness.start(app)


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def test_server_gives_manifest_and_files_of_complete_versions_only(harness: Harness) -> None:
    _, _, server = mirrored(harness)
    status, body, _ = get(f"{server.url}/models/llama/v1/manifest.json")
    assert status == 200
    manifest = json.loads(body)
    assert [f["path"] for f in manifest["files"]] == harness.ENGINE_FILES

    shard = harness.hub.repos[REPO][SHARD].data
    status, body, headers = get(f"{server.url}/models/llama/v1/files/{SHARD}", {"Range": "bytes=100-"})
    assert status == 206 and body == shard[100:]
    assert headers["Content-Range"] == f"bytes 100-{len(shard) - 1}/{len(shard)}"

    # Take a shard away: the version is incomplete at once, and nothing of it is served.
    (harness.store / "llama/v1/files" / SHARD).unlink()
    status, body, _ = get(f"{server.url}/models/llama/v1/manifest.json")
    assert status == 404
    assert (
        json.loads(body)["error"]["message"] == "mirror:llama@v1 is not complete: 7 of 8 files (incomplete)"
    )
    assert get(f"{server.url}/models/llama/v1/files/config.json")[0] == 404
    assert get(f"{server.url}/models/llama/v2/manifest.json")[0] == 404
    assert get(f"{server.url}/models/llama/v1/files/..%2F..%2Fplan.json")[0] == 404

    index = load_index(server.url)
    assert check_reference(parse_ref("llama@v1"), index) == "mirror:llama@v1 is not complete: 7 of 8 files"
    assert check_reference(parse_ref("llama@v9"), index) is not None


def test_a_downloading_version_has_no_manifest(harness: Harness) -> None:
    store, _, server = mirrored(harness)
    ref = parse_ref("llama@v1")
    with store.locked(ref):  # what a running `mirror add` holds
        assert get(f"{server.url}/models/llama/v1/manifest.json")[0] == 404
        assert "still downloading" in (check_reference(ref, load_index(server.url)) or "")
        listed = harness.run("mirror", "list", "--mirror", server.url)
        assert "downloading" in listed.out
    assert get(f"{server.url}/models/llama/v1/manifest.json")[0] == 200


def fetch(harness: Harness, server: ServerThread, dest: Path, *extra: str) -> Result:
    return harness.run(
        "mirror",
        "fetch",
        "--mirror",
        server.url,
        "--ref",
        "llama@v1",
        "--dest",
        str(dest),
        "--progress",
        "plain",
        *extra,
    )


def test_fetch_verifies_every_file_and_is_idempotent(harness: Harness) -> None:
    _, seen, server = mirrored(harness)
    dest = harness.tmp / "node" / "llama" / "v1"
    first = fetch(harness, server, dest)
    assert first.code == 0, first.err
    assert "mirror:llama@v1 ready in" in first.out
    for path, f in harness.hub.repos[REPO].items():
        if path in harness.ENGINE_FILES:
            assert (dest / path).read_bytes() == f.data
    assert not list(dest.glob("*.part"))

    files_before = len([p for p, _ in seen if "/files/" in p])
    second = fetch(harness, server, dest)
    assert second.code == 0
    assert second.out.count("kept ") == 8
    assert len([p for p, _ in seen if "/files/" in p]) == files_before  # nothing fetched again

    trusted = fetch(harness, server, dest, "--trust-stamps")
    assert trusted.code == 0 and trusted.out.count("kept ") == 8


def test_fetch_resumes_a_partial_file_with_a_range_request(harness: Harness) -> None:
    _, seen, server = mirrored(harness)
    dest = harness.tmp / "node"
    dest.mkdir()
    data = harness.hub.repos[REPO][SHARD].data
    (dest / (SHARD + ".part")).write_bytes(data[:12_345])
    result = fetch(harness, server, dest)
    assert result.code == 0, result.err
    ranges = [h.get("Range") for p, h in seen if p.endswith(SHARD)]
    assert ranges == ["bytes=12345-"]
    assert (dest / SHARD).read_bytes() == data
    assert f"fetched  {SHARD}" in result.out and "resumed at 12345 bytes" in result.out


def test_fetch_deletes_a_tampered_file_and_exits_non_zero_naming_it(harness: Harness) -> None:
    _, _, server = mirrored(harness)
    stored = harness.store / "llama/v1/files" / SHARD
    data = stored.read_bytes()
    stored.write_bytes(bytes([data[0] ^ 1]) + data[1:])  # same size: only the hash can tell
    dest = harness.tmp / "node"
    result = fetch(harness, server, dest)
    assert result.code == 1
    assert f"llmgw mirror fetch: {SHARD}: sha256 mismatch" in result.err
    assert "NOT ready" in result.err
    assert not (dest / SHARD).exists()
    assert not (dest / (SHARD + ".part")).exists()
    assert (dest / "config.json").exists()  # the good files stay for the next try
    assert not (dest / ".llmgw-manifest.json").exists()


def test_fetch_replaces_a_local_copy_that_no_longer_matches(harness: Harness) -> None:
    _, _, server = mirrored(harness)
    dest = harness.tmp / "node"
    assert fetch(harness, server, dest).code == 0
    local = dest / SHARD
    data = local.read_bytes()
    local.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    result = fetch(harness, server, dest)
    assert result.code == 0, result.err
    assert f"replaced {SHARD}" in result.out
    assert hashlib.sha256(local.read_bytes()).hexdigest() == harness.hub.repos[REPO][SHARD].sha256


def test_fetch_of_an_incomplete_or_unknown_version_fails(harness: Harness) -> None:
    _, _, server = mirrored(harness)
    (harness.store / "llama/v1/files" / SHARD).unlink()
    result = fetch(harness, server, harness.tmp / "node")
    assert result.code == 1
    assert "mirror:llama@v1 is not available" in result.err and "7 of 8 files" in result.err
    bad_ref = harness.run("mirror", "fetch", "--mirror", server.url, "--ref", "../x@v1", "--dest", "d")
    assert bad_ref.code == 2


def test_gc_keeps_what_is_referenced_and_honours_dry_run(harness: Harness) -> None:
    harness.hub.repos[REPO] = harness.safetensors_repo(shards=1, shard_size=100)
    for version in ("v1", "v2", "v3"):
        assert harness.add(f"llama@{version}", REPO).code == 0
    store = DirectoryStore(harness.store)
    args = ("mirror", "gc", "--store", str(harness.store))

    dry = harness.run(*args, "--keep", "llama@v1", "--dry-run")
    assert dry.code == 0
    assert "would delete llama@v2" in dry.out and "would delete llama@v3" in dry.out
    assert [str(r) for r in store.refs()] == ["llama@v1", "llama@v2", "llama@v3"]

    with store.locked(parse_ref("llama@v3")):  # downloading: never deleted
        real = harness.run(*args, "--keep", "mirror:llama@v1", "--keep", "gone@v1")
    assert real.code == 0
    assert "deleted llama@v2" in real.out and "kept    llama@v3 (downloading)" in real.out
    assert "gone@v1 is kept but the mirror does not have it" in real.err
    assert [str(r) for r in store.refs()] == ["llama@v1", "llama@v3"]

    assert harness.run(*args).code == 2  # nothing kept would mean delete everything: refused


CATALOG = """
models:
  llama:
    profiles:
      - engine: vllm
        source: mirror:llama@v2
        tp: 1
        gpu: {memory_gb: 24}
"""


def test_gc_keeps_the_versions_a_catalog_references(harness: Harness) -> None:
    harness.hub.repos[REPO] = harness.safetensors_repo(shards=1, shard_size=100)
    for version in ("v1", "v2"):
        assert harness.add(f"llama@{version}", REPO).code == 0
    catalog = harness.tmp / "catalog.yaml"
    catalog.write_text(CATALOG)
    policy = Path(__file__).parents[2] / "fixtures" / "test-policy.yaml"
    gc = ("mirror", "gc", "--store", str(harness.store), "--catalog", str(catalog), "--policy", str(policy))
    result = harness.run(*gc, "--json")
    assert result.code == 0, result.err
    decisions = {v["ref"]: v["delete"] for v in json.loads(result.out)["versions"]}
    assert decisions == {"llama@v1": True, "llama@v2": False}
    assert [str(r) for r in DirectoryStore(harness.store).refs()] == ["llama@v2"]

    catalog.write_text("models: [not, a, mapping]\n")
    invalid = harness.run(*gc)
    assert invalid.code == 1 and "nothing was deleted" in invalid.err
    assert [str(r) for r in DirectoryStore(harness.store).refs()] == ["llama@v2"]


def test_mirror_serve_runs_as_a_process(harness: Harness) -> None:
    import socket
    import subprocess
    import sys

    harness.hub.repos[REPO] = harness.safetensors_repo(shards=1, shard_size=100)
    assert harness.add("llama@v1", REPO).code == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmgw",
            "mirror",
            "serve",
            "--store",
            str(harness.store),
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
            return get(f"{url}/healthz")[0] == 200

        eventually_sync(up, 20, "mirror serve answering /healthz")
        index = load_index(url)
        assert [(str(v.ref), v.state.value) for v in index.versions] == [("llama@v1", "complete")]
        dest = harness.tmp / "node"
        result = harness.run("mirror", "fetch", "--mirror", url, "--ref", "llama@v1", "--dest", str(dest))
        assert result.code == 0, result.err
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


def test_fetch_names_the_gguf_llama_cpp_loads_and_refuses_a_version_of_two_models(harness: Harness) -> None:
    """A split GGUF is loaded by its first part (llama.cpp finds the siblings from its name);
    a version holding two GGUF models fails the fetch, naming them, before the engine starts."""
    File = harness.File
    harness.hub.repos["org/qwen-gguf"] = {
        **{f"qwen-q8_0-{i:05d}-of-00003.gguf": File(b"GGUF" + bytes([i]) * 4000) for i in (1, 2, 3)},
        "qwen-q4_k_m.gguf": File(b"GGUF" + b"q4" * 3000),
        "mmproj-qwen-f16.gguf": File(b"GGUF" + b"mm" * 1000),
    }
    assert harness.add("qwen@split", "org/qwen-gguf", "--file", "qwen-q8_0-00002-of-00003.gguf").code == 0
    assert harness.add("qwen@two", "org/qwen-gguf", "--file", "qwen-q*.gguf").code == 0
    server = harness.start(create_app(DirectoryStore(harness.store)))

    def fetch_gguf(ref: str) -> tuple[Result, Path, Path]:
        dest, path_file = harness.tmp / "node" / ref, harness.tmp / f"{ref}.path"
        result = harness.run(
            "mirror", "fetch", "--mirror", server.url, "--ref", ref, "--dest", str(dest),
            "--progress", "none", "--gguf-path-file", str(path_file),
        )  # fmt: skip
        return result, dest, path_file

    split, dest, path_file = fetch_gguf("qwen@split")
    assert split.code == 0, split.err
    assert path_file.read_text() == f"{dest / 'qwen-q8_0-00001-of-00003.gguf'}\n"

    two, _, path_file = fetch_gguf("qwen@two")
    assert two.code == 1
    assert "holds 2 GGUF models" in two.err and "qwen-q4_k_m.gguf" in two.err
    assert not path_file.exists()
