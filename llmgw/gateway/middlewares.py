"""Cross-cutting work around every handler: request id, error envelope, metrics, auth.

Owns ``observe``, the one middleware (one, not a chain of them: every request
runs it, and each extra layer is code a cold request has to touch):

- it gives the request its id and arrival time, turns every ``ApiError``,
  aiohttp HTTP exception (unknown URL, wrong method, body too large) and
  unexpected exception into OpenAI's error shape (never a traceback to the
  client; the traceback goes to the log), and counts the request: under the
  model that answered, else the model it resolved to (``Served``), else ``""``;
  a refusal of the router's own also by its error code
  (``metrics.rejection_reason``);
- before the handler it calls ``authenticate``: ``Authorization: Bearer`` (or
  Anthropic's ``x-api-key``; both only with the same key) for
  everything but the public paths (the chat page, its static files,
  ``/health``, ``/metrics``). The decision uses the request line's path
  (``request.path``), which is also what the router matches; never a URL
  rebuilt from the Host header. Without keys (``--no-auth``, loopback only, as
  ``llmgw dev`` runs) nothing else stops a web page in the operator's browser,
  so then every path (``/metrics`` and ``/health`` name every model and
  replica) refuses a ``Host`` that is not an IP address, ``localhost`` or a name
  in ``--allowed-hosts``: a DNS-rebinding page reaches 127.0.0.1 under its own
  name, and a browser that sends no ``Sec-Fetch-*`` looks like any other client.
  The API also refuses a browser's request that it marks as another site's
  (``Origin``, ``Sec-Fetch-Site``: a form or ``text/plain`` POST needs no
  preflight).

Must not: route, or read bodies.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable

from aiohttp import web

from llmgw.core.addresses import host_of_header, is_allowed_host
from llmgw.core.routing import Api, Refusal
from llmgw.core.tracing import SpanFacts, operation_of
from llmgw.gateway import errors, keys
from llmgw.gateway.aiohttp_private import SentDirectly
from llmgw.gateway.context import API_KEY, CONTEXT, REQUEST_ID, SERVED, STARTED
from llmgw.gateway.dispatch import Served
from llmgw.gateway.errors import ApiError, response_for
from llmgw.gateway.messages import is_messages_path
from llmgw.gateway.metrics import RouterMetrics, rejection_reason
from llmgw.gateway.tracing import NO_TRACE

log = logging.getLogger("llmgw.gateway")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

PUBLIC_PATHS = frozenset({"/", "/health", "/metrics", "/favicon.ico"})
PUBLIC_PREFIX = "/static/"
# The status logged and counted for a client that left before its answer (nginx's).
CLIENT_CLOSED = 499


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIX)


@web.middleware
async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    context = request.app[CONTEXT]
    loop = asyncio.get_running_loop()
    started = loop.time()
    request_id = secrets.token_hex(8)
    served = Served()
    request[REQUEST_ID] = request_id
    request[STARTED] = started
    request[SERVED] = served
    status = 500
    refusal: Refusal | None = None  # the router's own error answer, if it gave one
    # Anthropic's Messages paths answer errors in Anthropic's shape.
    api = Api.MESSAGES if is_messages_path(request.path) else None
    operation = operation_of(request.path)
    trace = NO_TRACE if operation is None else context.deps.tracing.begin(request.headers)
    served.trace_headers = trace.headers
    try:
        authenticate(request, context.keys, context.settings.allowed_hosts)
        response = await handler(request)
        status = response.status
        return response
    except ApiError as exc:
        if served.sent:
            status = served.engine_status
            return _already_answered(served, request_id, exc)
        refusal = exc.refusal
        status = refusal.status
        return response_for(refusal, request_id, api=api)
    except web.HTTPException as exc:
        if exc.status < 400:
            status = exc.status
            raise
        refusal = _refusal_of_http(exc, request)
        status = refusal.status
        return response_for(refusal, request_id, api=api)
    except (asyncio.CancelledError, ConnectionError):
        status = CLIENT_CLOSED
        raise
    except Exception as exc:
        if served.sent:
            status = served.engine_status
            return _already_answered(served, request_id, exc)
        log.exception("request failed request_id=%s path=%s", request_id, request.path)
        refusal = errors.internal_error()
        return response_for(refusal, request_id, api=api)
    finally:
        if request.path.startswith("/v1/"):
            # aiohttp sends the answer when this returns: the counting runs right after
            # (the next loop step), not while the client waits.
            loop.call_soon(_count, context.metrics, served, status, refusal, started, loop)
        if trace is not NO_TRACE and operation is not None:
            loop.call_soon(trace.end, _span_facts(operation, served, status))


def _span_facts(operation: str, served: Served, status: int) -> SpanFacts:
    return SpanFacts(
        operation=operation,
        requested=served.resolved,
        answered=served.model,
        status=status,
        stream=served.stream,
        usage=served.usage,
        time_to_first_token=served.time_to_first_token,
    )


def _already_answered(served: Served, request_id: str, exc: Exception) -> web.StreamResponse:
    """A failure after the answer (or a stream's head) went to the client from the
    engine's callback: no second answer may follow it, so the connection closes."""
    log.error("request failed after its answer was sent request_id=%s", request_id, exc_info=exc)
    return SentDirectly(served.engine_status)  # left unended: aiohttp closes the connection


def _count(
    metrics: RouterMetrics,
    served: Served,
    status: int,
    refusal: Refusal | None,
    started: float,
    loop: asyncio.AbstractEventLoop,
) -> None:
    # Only catalog names or "": never the client's string (``resolved`` is set from the
    # catalog), so no client can add a series.
    model = served.model or served.resolved
    metrics.counter(metrics.requests, model, str(status)).inc()
    if served.model:
        metrics.histogram(metrics.latency, served.model).observe(loop.time() - started)
    refusal = refusal or served.refusal  # the latter ended a stream whose 200 head had gone
    if refusal is not None:
        metrics.counter(metrics.rejections, model, rejection_reason(refusal.code)).inc()


def _refusal_of_http(exc: web.HTTPException, request: web.Request) -> Refusal:
    if exc.status == 404:
        return errors.not_found_url(request.method, request.path)
    if exc.status == 405:
        return errors.method_not_allowed(request.method, request.path)
    if exc.status == 413:
        return errors.body_too_large(request.app[CONTEXT].settings.max_body_bytes)
    kind = "server_error" if exc.status >= 500 else "invalid_request_error"
    return Refusal(exc.status, exc.reason, kind, None, retryable=exc.status >= 500)


def authenticate(request: web.Request, ring: keys.KeyRing | None, allowed_hosts: tuple[str, ...]) -> None:
    """Sets the request's ``API_KEY``, or raises the refusal (see the module's docstring).
    ``ring`` is None when the router serves without keys; ``allowed_hosts`` are the
    names besides IP addresses and ``localhost`` it then answers to."""
    if ring is not None:
        if not is_public(request.path):
            request[API_KEY] = keys.authenticate_headers(
                request.headers.get("Authorization"),
                request.headers.get("x-api-key"),
                ring,
                anthropic=is_messages_path(request.path),
            )
        return
    host = request.headers.get("Host")
    why = host_refusal(host, allowed_hosts)
    if why is None and not is_public(request.path):
        why = browser_refusal(host, request.headers.get("Origin"), request.headers.get("Sec-Fetch-Site"))
    if why is not None:
        log.warning("request refused path=%s peer=%s: %s", request.path, request.remote, why)
        raise errors.cross_site_request(why)


def host_refusal(host: str | None, allowed_hosts: tuple[str, ...]) -> str | None:
    """Why a router without keys must not answer a request with this ``Host``, or None.
    No ``Host`` at all is no browser's (an HTTP/1.0 client's)."""
    if host is None:
        return None
    name = host_of_header(host)
    if name is not None and is_allowed_host(name, allowed_hosts):
        return None
    return (
        f"the Host {host[:100]!r} is not an IP address, localhost or a name in --allowed-hosts "
        "(a DNS-rebinding page sends its own name; add the name with --allowed-hosts if it is yours)"
    )


def browser_refusal(host: str | None, origin: str | None, fetch_site: str | None) -> str | None:
    """Why a browser's request to a router without keys comes from another site's page, or
    None (browsers send ``Sec-Fetch-Site``, and ``Origin`` on every POST)."""
    if fetch_site is not None and fetch_site.lower() not in ("same-origin", "none"):
        return f"the browser marked this request as {fetch_site[:40]!r} (Sec-Fetch-Site)"
    if origin is not None and origin.lower().partition("://")[2] != (host or "").lower():
        return f"the request comes from a page at {origin[:100]!r}"
    return None
