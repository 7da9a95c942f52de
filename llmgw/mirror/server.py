"""The mirror's HTTP server: the index, manifests of complete versions, and their files with range requests.

Routes::

    GET /v1/mirror/index                       every version and its state (JSON, MirrorIndex.to_json)
    GET /models/{name}/{version}/manifest.json the manifest, only while the version is complete; 404 otherwise
    GET /models/{name}/{version}/files/{path}  a file of a complete version (Range supported, so nodes resume)
    GET /healthz                               200 "ok"

Owns routing and the shape of answers; completeness comes from the store and the
core rule, asked on every request (a version deleted or still downloading is
never served). Errors are JSON ``{"error": {"message", "type"}}``. Must not
download or change the store.
"""

from __future__ import annotations

import json

from aiohttp import web

from llmgw.core.mirror import (
    ManifestError,
    MirrorRef,
    MirrorRefError,
    check_name,
    check_rel_path,
    check_version,
)
from llmgw.mirror.store import MirrorStore

STORE_KEY = web.AppKey("mirror_store", MirrorStore)


def _error(status: int, message: str, kind: str) -> web.Response:
    body = json.dumps({"error": {"message": message, "type": kind}})
    return web.Response(status=status, text=body, content_type="application/json")


def _ref(request: web.Request) -> MirrorRef:
    return MirrorRef(check_name(request.match_info["name"]), check_version(request.match_info["version"]))


async def _index(request: web.Request) -> web.Response:
    store = request.app[STORE_KEY]
    return web.Response(text=store.index().to_json(), content_type="application/json")


async def _manifest(request: web.Request) -> web.StreamResponse:
    store = request.app[STORE_KEY]
    try:
        ref = _ref(request)
    except MirrorRefError as exc:
        return _error(404, str(exc), "not_found")
    manifest = store.complete_manifest(ref)
    if manifest is None:
        status = store.status(ref)
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
    manifest = store.complete_manifest(ref)
    if manifest is None:
        return _error(404, f"{ref.source} is not complete or unknown", "incomplete")
    entry = manifest.file(path)
    if entry is None:
        return _error(404, f"{ref.source} has no file {path}", "not_found")
    # FileResponse answers Range / If-Range itself, which is what lets a node resume.
    return web.FileResponse(store.local_path(ref, path), headers={"X-Llmgw-Sha256": entry.sha256})


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
