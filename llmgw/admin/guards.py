"""What stands between a request and a handler: the error envelope, browser safety, the token.

The admin listener has no login page and no cookies, and is usually on loopback; the
danger is a web page in an operator's browser on the same machine (or one that can reach
the listener) sending requests to it. Browsers let any page *send* some requests to any
address without asking: a GET, and a POST whose body is a form or ``text/plain``. Every
other request needs a CORS preflight, which this API never approves. So, in order:

- ``answer_errors`` (outermost): every refusal and failure becomes
  ``{"error": {"message", "type", "code"}}``; tracebacks go to the log, never to the
  client. Adds ``no-store`` and ``nosniff`` to every answer.
- ``refuse_browsers``:
  1. ``Host`` must be an IP address, ``localhost`` or a configured name (421
     otherwise): a DNS rebinding page reaches 127.0.0.1 under its own name, which it
     cannot make an IP address.
  2. A request a browser marks as from another site is refused (403): an ``Origin``
     other than this listener's own, or ``Sec-Fetch-Site: cross-site | same-site``
     (another port of the same host is "same-site").
  3. Every method but GET and HEAD needs ``Content-Type: application/json`` (415), even
     a DELETE without a body: that is the one type a page cannot send without a
     preflight. GET and HEAD change nothing here.
- ``require_token``: ``Authorization: Bearer <LLMGW_ADMIN_TOKEN>``, compared in constant
  time (401 otherwise). It also records who the request says it is from
  (``X-Llmgw-Actor``: logged and kept in the audit trail, never used to decide access).

Decisions use the request line and headers as received, never a URL rebuilt from them,
and the scheme comes from the listener's own settings (TLS or not), not from headers.

Must not: read bodies, or answer CORS preflights (there is no cross-origin use).
"""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import Awaitable, Callable

from aiohttp import web

from llmgw.admin import errors
from llmgw.admin.context import ACTOR, SETTINGS
from llmgw.admin.errors import AdminError
from llmgw.admin.settings import AdminSettings
from llmgw.core.addresses import is_allowed_host

log = logging.getLogger("llmgw.admin")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ACTOR_HEADER = "X-Llmgw-Actor"
SAFE_METHODS = frozenset({"GET", "HEAD"})
# Sec-Fetch-Site values of requests that did not come from another site's page.
_OWN_SITE = frozenset({"same-origin", "none"})
_ACTOR = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:/+-]{0,63}$")
_PORT = re.compile(r"^[0-9]{1,5}$")

SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
}


@web.middleware
async def answer_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except AdminError as exc:
        response = exc.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = errors.from_http_exception(exc).response()
    except Exception:
        log.exception("admin request failed method=%s path=%s", request.method, request.path)
        response = AdminError(
            500, "the admin API failed; see its log", errors.SERVER, "internal_error"
        ).response()
    if not response.prepared:
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
    return response


# --- browser safety ---------------------------------------------------------------------------


def split_host(header: str) -> tuple[str, str | None] | None:
    """``Host`` as (host, port or None); None when it is not a well-formed host[:port]."""
    if header.startswith("["):
        end = header.find("]")
        if end < 0:
            return None
        host, rest = header[1:end], header[end + 1 :]
        if rest and not (rest.startswith(":") and _PORT.match(rest[1:])):
            return None
        return host, rest[1:] or None
    host, sep, port = header.partition(":")
    if sep and not _PORT.match(port):
        return None
    return host, port or None


def host_refusal(header: str | None, allowed_hosts: tuple[str, ...]) -> str | None:
    """Why this Host is not one the admin API answers to, or None."""
    if not header:
        return "the request has no Host header"
    parts = split_host(header)
    if parts is None:
        return "the Host header is malformed"
    host = parts[0]
    if is_allowed_host(host, allowed_hosts):
        return None
    return (
        f"the admin API answers only to an IP address or localhost in Host, not {host!r} "
        "(add the name with --admin-allowed-hosts if it is yours)"
    )


def _normal_origin(scheme: str, host_header: str) -> str | None:
    parts = split_host(host_header.lower())
    if parts is None:
        return None
    host, port = parts
    default = "443" if scheme == "https" else "80"
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}" + (f":{port}" if port and port != default else "")


def cross_site_refusal(origin: str | None, fetch_site: str | None, own_origin: str | None) -> str | None:
    """Why a browser page on another site sent this, or None."""
    if fetch_site is not None and fetch_site.lower() not in _OWN_SITE:
        return f"the browser marked this request as {fetch_site} (Sec-Fetch-Site)"
    if origin is not None:
        parts = origin.lower().split("://", 1)
        normal = _normal_origin(parts[0], parts[1]) if len(parts) == 2 else None
        if normal is None or normal != own_origin:
            return f"the request comes from a page at {origin[:100]!r}, not from this admin API"
    return None


def is_json_content_type(request: web.Request) -> bool:
    if request.content_type != "application/json":
        return False
    charset = request.charset
    return charset is None or charset.lower() in ("utf-8", "utf8")


@web.middleware
async def refuse_browsers(request: web.Request, handler: Handler) -> web.StreamResponse:
    settings: AdminSettings = request.app[SETTINGS]
    host_header = request.headers.get("Host")
    why = host_refusal(host_header, settings.allowed_hosts)
    if why is not None:
        _refused(request, why)
        raise AdminError(421, why, errors.PERMISSION, "host_not_allowed")
    scheme = "https" if settings.tls else "http"
    own_origin = _normal_origin(scheme, host_header or "")
    why = cross_site_refusal(request.headers.get("Origin"), request.headers.get("Sec-Fetch-Site"), own_origin)
    if why is not None:
        _refused(request, why)
        raise AdminError(
            403,
            f"{why}; the admin API takes no requests from web pages (use llmgw ctl or curl)",
            errors.PERMISSION,
            "cross_site_request",
        )
    if request.method not in SAFE_METHODS and not is_json_content_type(request):
        shown = request.headers.get("Content-Type", "none")[:100]
        _refused(request, f"content type {shown}")
        raise AdminError(
            415,
            f"every {request.method} to the admin API must say Content-Type: application/json "
            f"(got {shown}); a bodiless request too",
            errors.INVALID,
            "json_required",
        )
    return await handler(request)


def _refused(request: web.Request, why: str) -> None:
    log.warning(
        "admin request refused method=%s path=%s peer=%s: %s",
        request.method,
        request.path,
        request.remote,
        why,
    )


# --- the token ----------------------------------------------------------------------------------


def token_matches(header: str | None, token: str) -> bool:
    if not header:
        return False
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode("utf-8"), token.encode("utf-8"))


def actor_of(request: web.Request, settings: AdminSettings) -> str:
    """Who the audit trail names: the claimed actor, and the credential that was shown.

    ``ci via admin-token`` when the listener has a token (named by ``credential_name``),
    ``ci (no token)`` when it has none: the name is then only a claim.
    """
    claimed = request.headers.get(ACTOR_HEADER)
    if claimed is None:
        claimed = "unnamed"
    elif not _ACTOR.match(claimed):
        raise errors.bad_request(
            f"{ACTOR_HEADER} must be 1 to 64 letters, digits or ._@:/+- (it names who asks, e.g. ci or ctl)",
            "bad_actor",
        )
    if settings.token is None:
        return f"{claimed} (no token)"
    return f"{claimed} via {settings.credential_name}"


@web.middleware
async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
    settings: AdminSettings = request.app[SETTINGS]
    if settings.token is not None and not token_matches(request.headers.get("Authorization"), settings.token):
        given = "Authorization" in request.headers
        _refused(request, "wrong token" if given else "no token")
        raise AdminError(
            401,
            "the admin API needs Authorization: Bearer <token> (the value of LLMGW_ADMIN_TOKEN)"
            if not given
            else "the admin token is not the one this listener expects",
            errors.AUTHENTICATION,
            "invalid_token" if given else "missing_token",
            headers={"WWW-Authenticate": 'Bearer realm="llmgw-admin"'},
        )
    request[ACTOR] = actor_of(request, settings)
    return await handler(request)
