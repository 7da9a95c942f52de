"""A mirror store in an S3-compatible bucket (moto's S3 server on loopback): list, serve, fetch, check.

Versions are made the real way (``mirror add`` into a directory store from the fake Hub)
and copied into the bucket object by object, as ``aws s3 sync`` would, lock and all.
Then the bucket is read as a store: its index equals the directory's, the mirror server
streams its files (whole and by range) to ``mirror fetch``, which verifies every byte;
an object missing or changed in the bucket is caught by the same rules as on disk.
"""

from __future__ import annotations

import hashlib
import json
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.error import HTTPError

import pytest

boto3 = pytest.importorskip("boto3", reason="the S3 store needs boto3 (pip install boto3)")
moto_server = pytest.importorskip("moto.server", reason="these tests need moto's S3 server (moto[server])")

from llmgw.core.mirror import VersionState, parse_ref  # noqa: E402
from llmgw.mirror.s3store import S3Location, S3Store  # noqa: E402
from llmgw.mirror.server import create_app  # noqa: E402
from llmgw.mirror.store import DirectoryStore  # noqa: E402

if TYPE_CHECKING:
    from conftest import Harness, Result
    from mypy_boto3_s3 import S3Client

REPO = "org/llama"
BUCKET = "models"
PREFIX = "mirror/prod"
SHARD = "model-00002-of-00003.safetensors"
POLICY = Path(__file__).resolve().parents[2] / "fixtures" / "test-policy.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Client]:
    """moto's S3 server on loopback, and the AWS variables boto3 (and so llmgw) reads pointing at it."""
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for name, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    try:
        yield client
    finally:
        server.stop()


def sync_up(client: S3Client, store: Path) -> None:
    """What ``aws s3 sync STORE s3://models/mirror/prod`` does: every file, as an object."""
    for path in sorted(p for p in store.rglob("*") if p.is_file()):
        client.upload_file(str(path), BUCKET, f"{PREFIX}/{path.relative_to(store).as_posix()}")


def mirrored(harness: Harness, client: S3Client) -> S3Store:
    harness.hub.repos[REPO] = harness.safetensors_repo()
    assert harness.add("llama@v1", REPO).code == 0
    assert harness.add("llama@v2", REPO).code == 0
    sync_up(client, harness.store)
    return S3Store(S3Location.parse(f"s3://{BUCKET}/{PREFIX}"), client)


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def fetch(harness: Harness, url: str, dest: Path, ref: str = "llama@v1") -> Result:
    return harness.run(
        "mirror", "fetch", "--mirror", url, "--ref", ref, "--dest", str(dest), "--progress", "plain"
    )


def test_the_bucket_lists_as_the_directory_it_was_copied_from(harness: Harness, s3: S3Client) -> None:
    store = mirrored(harness, s3)
    assert store.index() == DirectoryStore(harness.store).index()
    listed = harness.run("mirror", "list", "--store", f"s3://{BUCKET}/{PREFIX}", "--json")
    assert listed.code == 0, listed.err
    on_disk = harness.run("mirror", "list", "--store", str(harness.store), "--json")
    assert json.loads(listed.out) == json.loads(on_disk.out)
    assert [v["state"] for v in json.loads(listed.out)["versions"]] == ["complete", "complete"]


def test_a_served_bucket_is_fetched_and_verified_whole_and_by_range(harness: Harness, s3: S3Client) -> None:
    server = harness.start(create_app(mirrored(harness, s3)))
    data = (harness.store / "llama/v1/files" / SHARD).read_bytes()
    url = f"{server.url}/models/llama/v1/files/{SHARD}"

    status, body, headers = get(url)
    assert status == 200 and body == data
    assert headers["X-Llmgw-Sha256"] == hashlib.sha256(data).hexdigest()
    status, body, headers = get(url, {"Range": "bytes=100-"})
    assert status == 206 and body == data[100:]
    assert headers["Content-Range"] == f"bytes 100-{len(data) - 1}/{len(data)}"
    assert get(url, {"Range": "bytes=10-19"})[1] == data[10:20]
    assert get(url, {"Range": "bytes=-5"})[1] == data[-5:]
    status, _, headers = get(url, {"Range": f"bytes={len(data)}-"})
    assert status == 416 and headers["Content-Range"] == f"bytes */{len(data)}"

    dest = harness.tmp / "node"
    dest.mkdir()
    (dest / (SHARD + ".part")).write_bytes(data[:12345])  # a fetch killed part-way
    result = fetch(harness, server.url, dest)
    assert result.code == 0, result.err
    assert "resumed at 12345 bytes" in result.out
    for path in harness.ENGINE_FILES:
        assert (dest / path).read_bytes() == (harness.store / "llama/v1/files" / path).read_bytes()


def test_an_object_missing_or_changed_in_the_bucket_is_caught(harness: Harness, s3: S3Client) -> None:
    store = mirrored(harness, s3)
    s3.delete_object(Bucket=BUCKET, Key=f"{PREFIX}/llama/v2/files/{SHARD}")
    status = store.status(parse_ref("llama@v2"))
    assert status is not None and status.state is VersionState.INCOMPLETE
    assert status.summary == "7 of 8 files"
    server = harness.start(create_app(store))
    missing = fetch(harness, server.url, harness.tmp / "v2", "llama@v2")
    assert missing.code == 1 and "is not complete: 7 of 8 files" in missing.err

    catalog = harness.tmp / "catalog.yaml"
    catalog.write_text(
        "models:\n  m:\n    profiles:\n      - engine: vllm\n        source: mirror:llama@v2\n"
        "        tp: 1\n        gpu: {memory_gb: 24}\n"
    )
    checked = harness.run(
        "catalog", "check", str(catalog), "--policy", str(POLICY), "--mirror", f"s3://{BUCKET}/{PREFIX}"
    )
    assert checked.code == 1
    errors = [line for line in checked.out.splitlines() if ": note: " not in line]
    assert errors[0].startswith(f"{catalog}:5:17: error: ")
    assert "mirror:llama@v2 is not complete: 7 of 8 files" in checked.out

    data = (harness.store / "llama/v1/files" / SHARD).read_bytes()
    tampered = bytes([data[0] ^ 1]) + data[1:]  # same size: only the hash can tell
    s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/llama/v1/files/{SHARD}", Body=tampered)
    dest = harness.tmp / "v1"
    bad = fetch(harness, server.url, dest)
    assert bad.code == 1
    assert f"{SHARD}: sha256 mismatch" in bad.err
    assert not (dest / SHARD).exists()


def test_writers_refuse_a_bucket_and_say_how_to_fill_one(harness: Harness, s3: S3Client) -> None:
    added = harness.run("mirror", "add", "llama@v1", REPO, "--store", f"s3://{BUCKET}/{PREFIX}")
    assert added.code == 1
    assert "aws s3 sync STORE s3://BUCKET/PREFIX" in added.err
    assert "llmgw mirror serve --store s3://BUCKET/PREFIX" in added.err


def test_an_unreachable_bucket_is_an_error_naming_it(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    listed = harness.run("mirror", "list", "--store", f"s3://{BUCKET}/{PREFIX}")
    assert listed.code == 1
    assert f"s3://{BUCKET}/{PREFIX}: listing mirror/prod/" in listed.err
    assert S3Location.parse("s3://b") == S3Location("b", "")
    with pytest.raises(Exception, match="s3://BUCKET/PREFIX"):
        S3Location.parse("s3:///x")
