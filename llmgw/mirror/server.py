"""The mirror's HTTP server: the index, manifests of complete versions, and their files with range requests.

Routes::

    GET /v1/mirror/index                       every version and its state (JSON, MirrorIndex.to_json)
    GET /models/{name}/{version}/manifest.json the manifest, only while the version is complete; 404 otherwise
    GET /models/{name}/{version}/files/{path}  a file of a complete version (Range supported, so nodes resume)
    GET /healthz                               200 "ok"

Owns routing and the shape of answers; completeness comes from the store and the
core rule, asked on every request (a version deleted or still downloading is
never served). Store calls block on a disk or a bucket, so they run in worker
threads. A directory store's files are sent as files (sendfile, Range and If-Range
by aiohttp); a bucket's are streamed by range (``Range: bytes=N-``, ``N-M``, ``-N``).
Errors are JSON ``{"error": {"message", "type"}}``. Must not download or change the
store.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from llmgw.core.mirror import (
    ManifestError,
    ManifestFile,
    MirrorRef,
    MirrorRefError,
    check_name,
    check_rel_path,
    check_version,
)
from llmgw.mirror.errors import MirrorError
from llmgw.mirror.store import MirrorStore, RangeReader

STORE_KEY = web.AppKey("mirror_store", MirrorStore)


def _error(status: int, message: str, kind: str) -> web.Response:
    body = json.dumps({"error": {"message": message, "type": kind}})
    return web.Response(status=status, text=body, content_type="application/json")


def _ref(request: web.Request) -> MirrorRef:
    return MirrorRef(check_name(request.match_info["name"]), check_version(request.match_info["version"]))


async def _index(request: web.Request) -> web.Response:
    store = request.app[STORE_KEY]
    index = await asyncio.to_thread(store.index)
    return web.Response(text=index.to_json(), content_type="application/json")


async def _manifest(request: web.Request) -> web.StreamResponse:
    store = request.app[STORE_KEY]
    try:
        ref = _ref(request)
    except MirrorRefError as exc:
        return _error(404, str(exc), "not_found")
    manifest = await asyncio.to_thread(store.complete_manifest, ref)
    if manifest is None:
        status = await asyncio.to_thread(store.status, ref)
        if status is None:
            return _error(404, f"{ref.source}: unknown mirror version", "not_found")
        return _error(
            404, f"{ref.source} is not complete: {status.summary} ({status.state.value})", "incomplete"
        )
    return web.Response(text=manifest.to_json(), content_type="application/json")


async def _file(request: web.Request) -> web.StreamResponse:
    store = request.app[STORE_KEY]
    try:
        ref = _ref(request)
        path = check_rel_path(request.match_info["path"])
    except (MirrorRefError, ManifestError) as exc:
        return _error(404, str(exc), "not_found")
    manifest = await asyncio.to_thread(store.complete_manifest, ref)
    if manifest is None:
        return _error(404, f"{ref.source} is not complete or unknown", "incomplete")
    entry = manifest.file(path)
    if entry is None:
        return _error(404, f"{ref.source} has no file {path}", "not_found")
    local = store.local_path(ref, path)
    if local is not None:
        # FileResponse answers Range / If-Range itself, which is what lets a node resume.
        return web.FileResponse(local, headers={"X-Llmgw-Sha256": entry.sha256})
    if not isinstance(store, RangeReader):
        return _error(500, f"the store {store.describe()} can serve no file", "server_error")
    return await _stream(request, store, ref, entry)


async def _stream(
    request: web.Request, store: RangeReader, ref: MirrorRef, entry: ManifestFile
) -> web.StreamResponse:
    """A file of a remote store, whole or the one byte range asked for."""
    size = entry.size
    try:
        wanted = request.http_range
    except ValueError:
        wanted = slice(None, None)  # a Range header aiohttp cannot read is ignored, as RFC 9110 allows
    ranged = "Range" in request.headers and (wanted.start is not None or wanted.stop is not None)
    start, stop = 0, size
    if ranged:
        if wanted.start is not None and wanted.start < 0:  # "bytes=-N": the last N bytes
            start = max(0, size + wanted.start)
        else:
            start = wanted.start or 0
            stop = min(size, wanted.stop) if wanted.stop is not None else size
        if start >= size or start >= stop:
            return web.Response(status=416, headers={"Content-Range": f"bytes */{size}"})
    response = web.StreamResponse(status=206 if ranged else 200)
    response.content_type = "application/octet-stream"
    response.content_length = stop - start
    response.headers["Accept-Ranges"] = "bytes"
    response.headers["X-Llmgw-Sha256"] = entry.sha256
    if ranged:
        response.headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
    chunks = store.read_range(ref, entry.path, start, stop)
    try:
        first = await asyncio.to_thread(next, chunks, b"")
    except MirrorError as exc:  # nothing sent yet: an honest error
        return _error(502, str(exc), "store_unavailable")
    await response.prepare(request)
    chunk = first
    while chunk:
        await response.write(chunk)
        try:
            chunk = await asyncio.to_thread(next, chunks, b"")
        except MirrorError:
            # Headers are sent: cut the connection, so the node sees a short body and resumes.
            if request.transport is not None:
                request.transport.close()
            return response
    await response.write_eof()
    return response


async def _healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def create_app(store: MirrorStore) -> web.Application:
    app = web.Application()
    app[STORE_KEY] = store
    app.router.add_get("/v1/mirror/index", _index)
    app.router.add_get("/models/{name}/{version}/manifest.json", _manifest)
    app.router.add_get("/models/{name}/{version}/files/{path:.+}", _file)
    app.router.add_get("/healthz", _healthz)
    return app
