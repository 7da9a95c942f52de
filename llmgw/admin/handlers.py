"""The admin endpoints: each reads its request, asks a store or the preview, answers JSON.

Owns: the routes under ``/admin/v1/`` and, for the catalog, the apply protocol: the
``If-Match`` / ``If-None-Match`` preconditions on the current catalog's sha256 (its ETag),
validation through ``load_catalog`` with the control plane's security policy and the
cluster's allowlists (``AdminDeps.allowlists``), and the
compare-and-set of ``CatalogStore.apply`` on the version the diff was computed against,
so the diff an apply returns is exactly what it replaced and two pipelines cannot
overwrite each other blindly.

Must not: hold state between requests (the stores do), or decide about replicas (the
control plane does, from the applied catalog and the model commands).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable
from typing import Any, TypeVar

from aiohttp import web

from llmgw.adapters.consul import ApiKeyConflict, ApiKeyNotFound, CatalogConflict, ConsulError, CorruptRecord
from llmgw.adapters.redis.limits import LimitStoreUnreachable
from llmgw.admin import errors
from llmgw.admin.context import ACTOR, DEPS, PREVIEWS, SETTINGS
from llmgw.admin.errors import AdminError
from llmgw.admin.previewing import Preview, preview
from llmgw.admin.wire import (
    MAX_FILENAME_CHARS,
    MAX_NAME_CHARS,
    diagnostics_list,
    etag,
    json_response,
    key_dict,
    limit_field,
    models_field,
    read_object,
    text_field,
    version_dict,
)
from llmgw.core.budgets import budget_decision, budget_fields, budget_window
from llmgw.core.catalog_diff import diff_to_dict
from llmgw.core.diagnostics import Severity
from llmgw.core.records import MAX_CATALOG_CHARS, CatalogVersion, catalog_sha256

log = logging.getLogger("llmgw.admin")

T = TypeVar("T")
PREFIX = "/admin/v1"
DEFAULT_FILENAME = "<catalog>"
MAX_HISTORY = 1000
_ETAG = re.compile(r'\s*(W/)?"([^"\x00-\x1f]*)"\s*(?:,|$)')
_LIMIT = re.compile(r"^[0-9]{1,6}$")
_CATALOG_FIELDS = frozenset({"catalog", "filename"})
_BUDGET_FIELDS = frozenset({"token_budget", "budget_period"})
_KEY_FIELDS = frozenset(
    {"name", "models", "requests_per_minute", "tokens_per_minute", "token_budget", "budget_period"}
)


def add_routes(app: web.Application) -> None:
    app.router.add_get(f"{PREFIX}/status", get_status)
    app.router.add_get(f"{PREFIX}/catalog", get_catalog)
    app.router.add_put(f"{PREFIX}/catalog", put_catalog)
    app.router.add_post(f"{PREFIX}/catalog/diff", post_diff)
    app.router.add_get(f"{PREFIX}/catalog/history", get_history)
    app.router.add_post(f"{PREFIX}/keys", post_key)
    app.router.add_get(f"{PREFIX}/keys", get_keys)
    app.router.add_delete(f"{PREFIX}/keys/{{key_id}}", delete_key)
    app.router.add_get(f"{PREFIX}/keys/{{key_id}}/usage", get_key_usage)
    app.router.add_put(f"{PREFIX}/keys/{{key_id}}/budget", put_key_budget)
    # Model names may hold slashes (org/name): the name is everything between the prefix and the verb.
    app.router.add_post(f"{PREFIX}/models/{{model:.+}}/drain", post_drain)
    app.router.add_post(f"{PREFIX}/models/{{model:.+}}/restart", post_restart)


async def _consul(call: Awaitable[T]) -> T:
    """A store call, its Consul failures in the admin API's words."""
    try:
        return await call
    except CorruptRecord as exc:
        raise AdminError(
            502, f"Consul KV holds a record llmgw cannot read: {exc}", errors.SERVER, "corrupt_record"
        ) from None
    except ApiKeyConflict as exc:
        raise AdminError(409, str(exc), errors.CONFLICT, "key_conflict") from None
    except ConsulError as exc:
        if exc.temporary:
            raise errors.unavailable(
                f"Consul cannot be reached now ({exc}); try again", "consul_unavailable"
            ) from None
        raise AdminError(
            502, f"Consul refused the request: {exc}", errors.SERVER, "consul_rejected"
        ) from None


# --- status ---------------------------------------------------------------------------------------


async def get_status(request: web.Request) -> web.Response:
    document = await _consul(request.app[DEPS].status.read())
    if document is None:
        raise errors.unavailable(
            "no status has been published: no control plane leader has finished a pass yet", "no_status"
        )
    return web.Response(
        body=document.text.encode("utf-8"),
        content_type="application/json",
        headers={"X-Llmgw-Status-Index": str(document.modify_index)},
    )


# --- the catalog ----------------------------------------------------------------------------------


async def get_catalog(request: web.Request) -> web.Response:
    current = await _consul(request.app[DEPS].catalogs.current())
    if current is None:
        raise errors.not_found("no catalog has been applied yet", "no_catalog")
    return json_response(version_dict(current, with_text=True), headers={"ETag": etag(current.sha256)})


async def get_history(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    raw = request.query.get("limit")
    limit = settings.history_limit
    if raw is not None:
        if not _LIMIT.match(raw) or not 1 <= int(raw) <= MAX_HISTORY:
            raise errors.bad_request(f"limit must be a whole number from 1 to {MAX_HISTORY}", "invalid_limit")
        limit = int(raw)
    versions = await _consul(request.app[DEPS].catalogs.history(limit))
    return json_response({"versions": [version_dict(v) for v in versions]})


async def post_diff(request: web.Request) -> web.Response:
    text, filename = await _catalog_body(request)
    current = await _consul(request.app[DEPS].catalogs.current())
    result = await _preview(request, text, filename, current)
    return json_response(_preview_body(result, text))


async def put_catalog(request: web.Request) -> web.Response:
    deps = request.app[DEPS]
    settings = request.app[SETTINGS]
    text, filename = await _catalog_body(request)
    if_match = parse_etags(request.headers.get("If-Match"), "If-Match")
    if_none_match = parse_etags(request.headers.get("If-None-Match"), "If-None-Match")
    guarded = if_match is not None or if_none_match is not None
    actor = request[ACTOR]
    # With a precondition the caller said what it replaces: losing a race is its 412.
    # Without one it asked to replace whatever is there, so a lost race is tried again.
    for _ in range(1 if guarded else settings.apply_attempts):
        current = await _consul(deps.catalogs.current())
        check_preconditions(current, if_match, if_none_match)
        result = await _preview(request, text, filename, current)
        body = _preview_body(result, text)
        if current is not None and current.sha256 == catalog_sha256(text):
            return json_response(
                {**body, "applied": False, "version": current.version}, headers={"ETag": etag(current.sha256)}
            )
        new = CatalogVersion.of((current.version if current else 0) + 1, text, actor, deps.wall_clock())
        try:
            await _consul(deps.catalogs.apply(new, current.version if current else None))
        except CatalogConflict:
            if guarded:
                latest = await _consul(deps.catalogs.current())
                raise _stale(latest) from None
            continue
        except ValueError as exc:  # too large for Consul's KV, as the store measures it
            raise AdminError(422, str(exc), errors.INVALID, "not_storable") from None
        counts = (
            ", ".join(f"{n} {effect}" for effect, n in sorted(result.diff.counts().items()))
            if result.diff
            else ""
        )
        log.info(
            "catalog version %d applied by %s sha256=%s (%s)",
            new.version,
            actor,
            new.sha256,
            counts or "no model changes",
        )
        return json_response(
            {**body, "applied": True, **version_dict(new)}, headers={"ETag": etag(new.sha256)}
        )
    raise AdminError(
        409,
        f"other applies kept winning ({settings.apply_attempts} tries); look at the history and apply again",
        errors.CONFLICT,
        "apply_conflict",
    )


async def _catalog_body(request: web.Request) -> tuple[str, str]:
    data = await read_object(request, _CATALOG_FIELDS)
    text = text_field(data, "catalog", max_chars=MAX_CATALOG_CHARS) or ""
    filename = text_field(data, "filename", max_chars=MAX_FILENAME_CHARS, required=False) or DEFAULT_FILENAME
    if any(ord(ch) < 32 for ch in filename):
        raise errors.bad_request("filename must not hold control characters", "invalid_field")
    return text, filename


async def _preview(request: web.Request, text: str, filename: str, current: CatalogVersion | None) -> Preview:
    deps = request.app[DEPS]
    # Parsing and rendering take CPU time: on a thread, a few at a time, so the event
    # loop (shared with the control plane) keeps turning.
    async with request.app[PREVIEWS]:
        result = await asyncio.to_thread(
            preview,
            text,
            filename=filename,
            base=current,
            policy=deps.policy,
            renderer=deps.renderer,
            allowlists=deps.allowlists,
        )
    if not result.ok:
        errors_found = [d for d in result.loaded.diagnostics if d.severity is Severity.ERROR]
        raise AdminError(
            422,
            f"the catalog has {len(errors_found)} error(s); see diagnostics",
            errors.INVALID,
            "invalid_catalog",
            extra={"diagnostics": diagnostics_list(result.loaded.diagnostics)},
        )
    return result


def _preview_body(result: Preview, text: str) -> dict[str, Any]:
    return {
        "valid": True,
        "base": None if result.base is None else version_dict(result.base),
        "sha256": catalog_sha256(text),
        "diff": diff_to_dict(result.diff) if result.diff is not None else None,
        "diagnostics": diagnostics_list(result.loaded.diagnostics),
        "notes": list(result.notes),
    }


def parse_etags(header: str | None, name: str) -> list[str] | None:
    """The entity tags of an If-Match / If-None-Match header (``["*"]`` for ``*``), or None if
    absent. Weak tags are kept with their ``W/`` so they never match (RFC 9110 13.1.1)."""
    if header is None:
        return None
    if header.strip() == "*":
        return ["*"]
    if not header.strip():
        raise errors.bad_request(
            f"{name} is empty; leave it out or give an entity tag", "invalid_precondition"
        )
    tags: list[str] = []
    position = 0
    while position < len(header):
        match = _ETAG.match(header, position)
        if match is None or match.end() == position:
            raise errors.bad_request(
                f'{name} must be "*" or quoted entity tags such as "<sha256>" '
                "(the ETag of GET /admin/v1/catalog)",
                "invalid_precondition",
            )
        tags.append(("W/" if match.group(1) else "") + match.group(2))
        position = match.end()
    return tags


def check_preconditions(
    current: CatalogVersion | None, if_match: list[str] | None, if_none_match: list[str] | None
) -> None:
    """412 unless the current catalog is the one the caller says it replaces."""
    if if_match is not None and (current is None or ("*" not in if_match and current.sha256 not in if_match)):
        raise _stale(current)
    if (
        if_none_match is not None
        and current is not None
        and ("*" in if_none_match or current.sha256 in if_none_match)
    ):
        raise _stale(current)


def _stale(current: CatalogVersion | None) -> AdminError:
    if current is None:
        message = "no catalog is applied, but the request expects one (If-Match)"
        headers: dict[str, str] = {}
    else:
        message = (
            f"the applied catalog is version {current.version} (sha256 {current.sha256[:12]}, applied by "
            f"{current.applied_by}), not the one this request expects; review the diff and apply again"
        )
        headers = {"ETag": etag(current.sha256)}
    return AdminError(412, message, errors.CONFLICT, "stale_catalog", headers=headers)


# --- API keys --------------------------------------------------------------------------------------


async def post_key(request: web.Request) -> web.Response:
    data = await read_object(request, _KEY_FIELDS)
    name = text_field(data, "name", max_chars=MAX_NAME_CHARS) or ""
    if not name.strip() or any(ord(ch) < 32 for ch in name):
        raise errors.bad_request("name must be a readable label of who uses the key", "invalid_field")
    try:
        token_budget, budget_period = budget_fields(data.get("token_budget"), data.get("budget_period"))
    except ValueError as exc:
        raise errors.bad_request(str(exc), "invalid_field") from None
    if token_budget is not None and request.app[DEPS].usage is None:
        raise _budget_not_enforced()
    issued = await _consul(
        request.app[DEPS].keys.create(
            name,
            models=models_field(data, "models"),
            requests_per_minute=limit_field(data, "requests_per_minute"),
            tokens_per_minute=limit_field(data, "tokens_per_minute"),
            token_budget=token_budget,
            budget_period=budget_period or None,
        )
    )
    log.info("API key %s (%s) created by %s", issued.record.key_id, name, request[ACTOR])
    return json_response(
        {
            "key": key_dict(issued.record),
            "secret": issued.secret,
            "note": "the secret is shown once; llmgw keeps only its SHA-256",
        },
        status=201,
    )


async def get_keys(request: web.Request) -> web.Response:
    records = await _consul(request.app[DEPS].keys.list())
    ordered = sorted(records.values(), key=lambda r: (r.created_at, r.key_id))
    return json_response({"keys": [key_dict(r) for r in ordered]})


async def delete_key(request: web.Request) -> web.Response:
    key_id = request.match_info["key_id"]
    try:
        record = await _consul(request.app[DEPS].keys.revoke(key_id))
    except ApiKeyNotFound:
        raise errors.not_found(f"no API key {key_id!r}", "no_key") from None
    except ValueError as exc:  # not a well-formed key id
        raise errors.bad_request(str(exc), "invalid_key_id") from None
    log.info("API key %s revoked by %s", key_id, request[ACTOR])
    return json_response({"key": key_dict(record)})


async def put_key_budget(request: web.Request) -> web.Response:
    """Set, change or (``token_budget`` null) remove a key's token budget."""
    data = await read_object(request, _BUDGET_FIELDS)
    if "token_budget" not in data:
        raise errors.bad_request("token_budget is required (null removes the budget)", "invalid_field")
    key_id = request.match_info["key_id"]
    try:
        token_budget, budget_period = budget_fields(data.get("token_budget"), data.get("budget_period"))
    except ValueError as exc:
        raise errors.bad_request(str(exc), "invalid_field") from None
    if token_budget is not None and request.app[DEPS].usage is None:
        raise _budget_not_enforced()
    try:
        # No period given: the key keeps its own (the store reads it).
        period = budget_period if data.get("budget_period") is not None else None
        record = await _consul(request.app[DEPS].keys.set_budget(key_id, token_budget, period))
    except ApiKeyNotFound:
        raise errors.not_found(f"no API key {key_id!r}", "no_key") from None
    except ValueError as exc:  # not a well-formed key id
        raise errors.bad_request(str(exc), "invalid_key_id") from None
    log.info(
        "API key %s's token budget set to %s (%s) by %s",
        key_id,
        record.token_budget,
        record.budget_period or "none",
        request[ACTOR],
    )
    return json_response({"key": key_dict(record)})


def _budget_not_enforced() -> AdminError:
    return errors.bad_request(
        "token budgets are kept only by routers sharing a Redis (LLMGW_ROUTER_LIMITS_REDIS_URL); "
        "set it on the routers and on the control plane",
        "budget_not_enforced",
    )


async def get_key_usage(request: web.Request) -> web.Response:
    """A key's usage per model, as the routers counted it in the Redis they share."""
    key_id = request.match_info["key_id"]
    deps = request.app[DEPS]
    records = await _consul(deps.keys.list())
    if key_id not in records:
        raise errors.not_found(f"no API key {key_id!r}", "no_key")
    if deps.usage is None:
        raise AdminError(
            501,
            "usage is counted only by routers sharing a Redis (LLMGW_ROUTER_LIMITS_REDIS_URL); "
            "set it on the routers and on the control plane",
            errors.SERVER,
            "usage_not_counted",
        )
    record = records[key_id]
    period = record.budget
    now = deps.wall_clock()
    window = None if period is None else budget_window(period, record.created_at, now)
    try:
        usage = await deps.usage.usage(key_id)
        used = None if window is None else await deps.usage.budget_used(key_id, window.start)
    except LimitStoreUnreachable as exc:
        raise errors.unavailable(
            f"the usage store cannot be reached now ({exc}); try again", "usage_unavailable"
        ) from None
    budget: dict[str, object] | None = None
    if window is not None and record.token_budget is not None and used is not None:
        budget = {
            "tokens": record.token_budget,
            "period": str(period),
            "period_start": window.start,
            "resets_at": window.end,
            "used": used,
            "left": budget_decision(record.token_budget, used, 0).left,
        }
    return json_response(
        {
            "key": key_dict(record),
            "usage": [
                {
                    "model": u.model,
                    "requests": u.requests,
                    "input_tokens": u.input_tokens,
                    "output_tokens": u.output_tokens,
                    "cached_tokens": u.cached_tokens,
                }
                for u in usage
            ],
            "budget": budget,
        }
    )


# --- models ----------------------------------------------------------------------------------------


async def post_drain(request: web.Request) -> web.Response:
    return await _model_command(request, "drain")


async def post_restart(request: web.Request) -> web.Response:
    return await _model_command(request, "restart")


async def _model_command(request: web.Request, command: str) -> web.Response:
    await read_object(request, frozenset())
    model = request.match_info["model"]
    commands = request.app[DEPS].models
    if commands is None:
        raise AdminError(
            501,
            "this admin listener has no control plane behind it to carry out model commands",
            errors.SERVER,
            "no_control_plane",
        )
    actor = request[ACTOR]
    try:
        if command == "drain":
            receipt = await _consul(commands.drain(model, actor=actor))
        else:
            receipt = await _consul(commands.restart(model, actor=actor))
    except LookupError as exc:
        raise errors.not_found(str(exc) or f"no model {model!r}", "no_model") from None
    log.info("model %r: %s asked by %s: %s", model, command, actor, receipt.message)
    return json_response(
        {"model": model, "command": command, "message": receipt.message, "replicas": list(receipt.replicas)},
        status=202,
    )
