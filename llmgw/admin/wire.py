"""The admin API's JSON: request bodies read strictly, records written without secrets.

Owns: ``read_object`` (a request body as a JSON object with only known keys), the typed
readers of its fields, and the JSON of what the API answers with: a catalog version
(``version_dict``), an API key without its digest (``key_dict``), diagnostics in the
shape of ``llmgw catalog check --format json`` (``diagnostics_list``), and an ETag.

Must not: decide anything (the handlers do) or touch the stores.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from llmgw.admin import errors
from llmgw.admin.context import SETTINGS
from llmgw.core.diagnostics import Diagnostic
from llmgw.core.json_values import MAX_JSON_DEPTH, nested_deeper_than, utf8_encodable
from llmgw.core.records import ApiKeyRecord, CatalogVersion
from llmgw.http_server import BodyEncodingRefused, BodyTimeout, read_body

MAX_NAME_CHARS = 200
MAX_MODEL_CHARS = 1024
MAX_MODELS_PER_KEY = 10_000
MAX_FILENAME_CHARS = 512


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


async def read_object(request: web.Request, allowed: frozenset[str]) -> dict[str, Any]:
    """The body as a JSON object holding only ``allowed`` keys; an empty body is ``{}``.
    Raises 400 naming what is wrong, 408 when it does not arrive within
    ``body_read_timeout`` (413 comes from the size limit)."""
    settings = request.app[SETTINGS]
    try:
        raw = await read_body(request, max_bytes=settings.max_body_bytes, within=settings.body_read_timeout)
    except BodyEncodingRefused as exc:
        raise errors.AdminError(415, str(exc), errors.INVALID, "unsupported_content_encoding") from None
    except BodyTimeout as exc:
        raise errors.AdminError(
            408,
            f"{exc}; send the whole body at once (--admin-body-read-timeout)",
            errors.INVALID,
            "request_timeout",
        ) from None
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError:
        raise errors.bad_request("the body is not UTF-8", "invalid_json") from None
    except RecursionError:
        raise errors.bad_request("the body's JSON is nested too deeply", "invalid_json") from None
    except ValueError as exc:
        raise errors.bad_request(f"the body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(data, dict):
        raise errors.bad_request("the body must be a JSON object", "invalid_json")
    # The router's door checks (``llmgw.gateway.calls.json_object``), before any reader
    # walks the body or a store writes it as UTF-8.
    if nested_deeper_than(data, MAX_JSON_DEPTH):
        raise errors.bad_request(
            f"the body's JSON is nested more than {MAX_JSON_DEPTH} levels", "invalid_json"
        )
    if not utf8_encodable(data):
        raise errors.bad_request(
            "the body holds a lone UTF-16 surrogate (such as \\ud800), which is not text", "invalid_json"
        )
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise errors.bad_request(
            f"unknown field(s) {', '.join(unknown)}; this endpoint takes: {', '.join(sorted(allowed))}",
            "unknown_field",
        )
    return data


def text_field(data: dict[str, Any], key: str, *, max_chars: int, required: bool = True) -> str | None:
    value = data.get(key)
    if value is None:
        if required:
            raise errors.bad_request(f"the body needs {key!r}", "missing_field")
        return None
    if not isinstance(value, str):
        raise errors.bad_request(f"{key!r} must be a string", "invalid_field")
    if len(value) > max_chars:
        raise errors.bad_request(f"{key!r} is longer than {max_chars} characters", "invalid_field")
    return value


def limit_field(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if type(value) is not int or not 1 <= value <= 2**53 - 1:
        raise errors.bad_request(f"{key!r} must be a whole number of at least 1, or null", "invalid_field")
    return value


def models_field(data: dict[str, Any], key: str) -> tuple[str, ...] | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not value or len(value) > MAX_MODELS_PER_KEY:
        raise errors.bad_request(
            f"{key!r} must be a non-empty list of model names, or null for every model", "invalid_field"
        )
    if not all(isinstance(m, str) and 0 < len(m) <= MAX_MODEL_CHARS for m in value):
        raise errors.bad_request(f"every entry of {key!r} must be a model name", "invalid_field")
    return tuple(dict.fromkeys(value))


def etag(sha256: str) -> str:
    return f'"{sha256}"'


def version_dict(version: CatalogVersion, *, with_text: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "version": version.version,
        "sha256": version.sha256,
        "applied_by": version.applied_by,
        "applied_at": version.applied_at,
    }
    if with_text:
        out["text"] = version.text
    return out


def key_dict(record: ApiKeyRecord) -> dict[str, Any]:
    """An API key as shown to operators: never its digest (nor, of course, its secret)."""
    return {
        "id": record.key_id,
        "name": record.name,
        "models": None if record.models is None else list(record.models),
        "requests_per_minute": record.requests_per_minute,
        "tokens_per_minute": record.tokens_per_minute,
        "token_budget": record.token_budget,
        "budget_period": record.budget_period or None,
        "created_at": record.created_at,
        "revoked_at": record.revoked_at,
        "revoked": record.revoked,
    }


def diagnostics_list(diagnostics: Iterable[Diagnostic]) -> list[dict[str, str | int]]:
    return [d.as_dict() for d in diagnostics]


def json_response(body: object, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8"),
        content_type="application/json",
        headers=headers,
    )
