"""A fake Hugging Face Hub and a server-in-a-thread, for the mirror's component tests.

The fake imitates the Hub's endpoints the mirror uses (revision, paginated
recursive tree with LFS sha256, resolve with Range) and can misbehave per file:
drop the connection mid-file, serve wrong bytes, or serve a truncated file.
It records every request (path and headers) so tests can assert on them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import stamina
from aiohttp import web

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class FakeFile:
    data: bytes
    lfs: bool = True
    wrong_bytes: bool = False  # serve different bytes of the same size
    truncate_to: int | None = None  # always serve only this many bytes (and say so in Content-Length)
    drop_after: int | None = None  # close the connection after this many bytes ...
    drops: int = 0  # ... on this many requests

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class FakeHub:
    repos: dict[str, dict[str, FakeFile]] = field(default_factory=dict)
    token: str | None = None  # when set, every request must carry it
    commit: str = COMMIT  # what branch names resolve to; a 40-hex revision resolves to itself
    page_size: int = 4
    delay: float = 0.0  # seconds each file response waits before its body (to overlap downloads)
    busy_answers: int = 0  # answer this many revision requests with 503 (the Hub overloaded)
    seen: list[Seen] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    def file_requests(self, path: str) -> list[Seen]:
        return [s for s in self.seen if "/resolve/" in s.path and s.path.endswith("/" + path)]

    def _check_auth(self, request: web.Request) -> None:
        self.seen.append(Seen(request.method, request.path_qs, dict(request.headers)))
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            raise web.HTTPUnauthorized(
                text='{"error": "Invalid credentials"}', content_type="application/json"
            )

    def _repo(self, request: web.Request) -> dict[str, FakeFile]:
        repo = f"{request.match_info['org']}/{request.match_info['name']}"
        if repo not in self.repos:
            raise web.HTTPNotFound(text='{"error": "Repository not found"}', content_type="application/json")
        return self.repos[repo]

    async def revision(self, request: web.Request) -> web.Response:
        self._check_auth(request)
        self._repo(request)
        if self.busy_answers > 0:
            self.busy_answers -= 1
            raise web.HTTPServiceUnavailable(text='{"error": "overloaded"}', content_type="application/json")
        rev = request.match_info["rev"]
        sha = rev if len(rev) == 40 and all(c in "0123456789abcdef" for c in rev) else self.commit
        return web.json_response({"id": request.match_info["org"], "sha": sha, "siblings": []})

    async def tree(self, request: web.Request) -> web.Response:
        self._check_auth(request)
        files = self._repo(request)
        entries: list[dict[str, object]] = []
        dirs = sorted({p.rsplit("/", 1)[0] for p in files if "/" in p})
        for d in dirs:
            entries.append({"type": "directory", "oid": "d" * 40, "size": 0, "path": d})
        for path, f in sorted(files.items()):
            entry: dict[str, object] = {"type": "file", "oid": "e" * 40, "size": len(f.data), "path": path}
            if f.lfs:
                entry["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": 134}
            entries.append(entry)
        start = int(request.query.get("cursor", "0"))
        page = entries[start : start + self.page_size]
        headers = {}
        if start + self.page_size < len(entries):
            nxt = request.url.update_query(cursor=str(start + self.page_size))
            # The real Hub's links name huggingface.co; the client must stay on its endpoint.
            public = nxt.with_scheme("https").with_host("huggingface.co").with_port(None)
            headers["Link"] = f'<{public}>; rel="next"'
        return web.json_response(page, headers=headers)

    async def resolve(self, request: web.Request) -> web.StreamResponse:
        self._check_auth(request)
        files = self._repo(request)
        path = request.match_info["path"]
        if path not in files:
            raise web.HTTPNotFound(text="Entry not found")
        f = files[path]
        body = bytes(b ^ 0xFF for b in f.data) if f.wrong_bytes else f.data
        if f.truncate_to is not None:
            body = body[: f.truncate_to]
        start = 0
        range_header = request.headers.get("Range")
        if range_header:
            start = int(range_header.removeprefix("bytes=").split("-")[0])
            if start >= len(body):
                return web.Response(status=416, headers={"Content-Range": f"bytes */{len(body)}"})
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)  # a slow hub is what the test asks for
            resp = web.StreamResponse(status=206 if range_header else 200)
            resp.content_length = len(body) - start
            if range_header:
                resp.headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
            resp.headers["X-Repo-Commit"] = COMMIT
            await resp.prepare(request)
            if f.drops > 0 and f.drop_after is not None:
                f.drops -= 1
                await resp.write(body[start : start + f.drop_after])
                assert request.transport is not None
                request.transport.close()
                return resp
            await resp.write(body[start:])
            await resp.write_eof()
            return resp
        finally:
            self.in_flight -= 1

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/models/{org}/{name}/revision/{rev}", self.revision)
        app.router.add_get("/api/models/{org}/{name}/tree/{rev}", self.tree)
        app.router.add_get("/{org}/{name}/resolve/{rev}/{path:.+}", self.resolve)
        return app


class ServerThread:
    """An aiohttp app on 127.0.0.1 in its own thread and loop, so sync tests can call the CLI."""

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(app, handle_signals=False)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)

    async def _start(self) -> None:
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


def safetensors_repo(shards: int = 3, shard_size: int = 40_000) -> dict[str, FakeFile]:
    """A llama-like repository: shards + index + config/tokenizer, plus files an engine does not need."""
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    files = {name: FakeFile(bytes([i + 1]) * shard_size + name.encode()) for i, name in enumerate(names)}
    weight_map = {f"layer.{i}.weight": name for i, name in enumerate(names)}
    files["model.safetensors.index.json"] = FakeFile(
        json.dumps({"metadata": {"total_size": 1}, "weight_map": weight_map}).encode(), lfs=False
    )
    files["config.json"] = FakeFile(b'{"architectures": ["LlamaForCausalLM"]}', lfs=False)
    files["generation_config.json"] = FakeFile(b'{"temperature": 0.6}', lfs=False)
    files["tokenizer.json"] = FakeFile(b'{"model": {"type": "BPE"}}' * 100, lfs=True)
    files["tokenizer_config.json"] = FakeFile(b'{"chat_template": "..."}', lfs=False)
    files["README.md"] = FakeFile(b"# readme", lfs=False)
    files[".gitattributes"] = FakeFile(b"*.safetensors filter=lfs", lfs=False)
    files["original/consolidated.00.pth"] = FakeFile(b"pickle" * 1000)
    return files


ENGINE_FILES = [
    "config.json",
    "generation_config.json",
    "model-00001-of-00003.safetensors",
    "model-00002-of-00003.safetensors",
    "model-00003-of-00003.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
]


@dataclass
class Result:
    code: int
    out: str
    err: str


class Harness:
    """What a test needs: a fake hub (started), a store directory, servers, and the CLI."""

    File = FakeFile
    ENGINE_FILES = ENGINE_FILES
    COMMIT = COMMIT

    def __init__(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self.tmp = tmp_path
        self.store = tmp_path / "store"
        self._capsys = capsys
        self._servers: list[ServerThread] = []
        self.hub = FakeHub()
        self.hub_server = self.start(self.hub.app())
        # The mirror's own endpoint setting, and no token from the developer's machine.
        monkeypatch.setenv("LLMGW_MIRROR_HF_ENDPOINT", self.hub_server.url)
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "LLMGW_MIRROR_STORE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        # Retries back off for hundredths of a second in a mirror started as a process;
        # in this one, stamina's testing mode (below) skips the waits altogether.
        monkeypatch.setenv("LLMGW_MIRROR_BACKOFF_INITIAL", "0.01")
        monkeypatch.setenv("LLMGW_MIRROR_BACKOFF_MAX", "0.05")

    @staticmethod
    def safetensors_repo(shards: int = 3, shard_size: int = 40_000) -> dict[str, FakeFile]:
        return safetensors_repo(shards, shard_size)

    def start(self, app: web.Application) -> ServerThread:
        server = ServerThread(app)
        server.start()
        self._servers.append(server)
        return server

    def stop_all(self) -> None:
        for server in reversed(self._servers):
            server.stop()
        self._servers.clear()

    def run(self, *argv: str) -> Result:
        from llmgw.cli import main

        self._capsys.readouterr()
        code = main(list(argv))
        captured = self._capsys.readouterr()
        return Result(code, captured.out, captured.err)

    def add(self, *argv: str) -> Result:
        return self.run("mirror", "add", *argv, "--store", str(self.store), "--progress", "plain")


@pytest.fixture
def harness(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Harness]:
    h = Harness(tmp_path, capsys, monkeypatch)
    try:
        yield h
    finally:
        h.stop_all()


@pytest.fixture(autouse=True)
def retries_do_not_wait() -> Iterator[None]:
    """The mirror's HTTP retries (stamina's) run without their backoff, each still counted:
    ``cap=True`` keeps the tries the settings allow instead of stamina's testing default of one."""
    with stamina.set_testing(True, attempts=1000, cap=True):
        yield
