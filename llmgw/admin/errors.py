"""The admin API's errors: raised anywhere under a handler, answered as JSON by one middleware.

Owns: ``AdminError`` (status, message, type, code, and optional extra top-level keys such
as a catalog's ``diagnostics``), the body shape ``{"error": {"message", "type", "code"}}``
(the router's shape, so one client can read both), and the constructors for the
refusals every endpoint shares.

Must not: log (the error middleware decides what to log) or know about Consul.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

# The error types, as OpenAI names them where it has a name.
INVALID = "invalid_request_error"
AUTHENTICATION = "authentication_error"
PERMISSION = "permission_error"
NOT_FOUND = "not_found_error"
CONFLICT = "conflict_error"
UNAVAILABLE = "unavailable_error"
SERVER = "server_error"


class AdminError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str,
        code: str,
        *,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "code": self.code}, **self.extra}

    def response(self) -> web.Response:
        return web.Response(
            status=self.status,
            body=json.dumps(self.body(), ensure_ascii=False).encode("utf-8"),
            content_type="application/json",
            headers=self.headers,
        )


def bad_request(message: str, code: str = "bad_request") -> AdminError:
    return AdminError(400, message, INVALID, code)


def not_found(message: str, code: str = "not_found") -> AdminError:
    return AdminError(404, message, NOT_FOUND, code)


def unavailable(message: str, code: str = "unavailable", *, retry_after: int = 5) -> AdminError:
    return AdminError(503, message, UNAVAILABLE, code, headers={"Retry-After": str(retry_after)})


# Statuses aiohttp raises itself (unknown path, wrong method, body too large), in our words.
_HTTP_WORDS = {
    404: ("no such admin endpoint; the API is under /admin/v1/", NOT_FOUND, "unknown_endpoint"),
    405: ("this endpoint does not take that method", INVALID, "method_not_allowed"),
    413: ("the request body is too large", INVALID, "body_too_large"),
}


def from_http_exception(exc: web.HTTPException) -> AdminError:
    message, type_, code = _HTTP_WORDS.get(
        exc.status, (exc.reason or "request refused", INVALID if exc.status < 500 else SERVER, "http_error")
    )
    headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
    return AdminError(exc.status, message, type_, code, headers=headers)
