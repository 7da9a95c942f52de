"""The HTTP handlers: thin. Parse into an ``ApiCall``, resolve the model the key may
use, admit it (rate limit, model gate), screen it (guard), hand it to the
dispatcher. Plus the model list, health, metrics and the chat page.

Must not: retry, choose endpoints, or build error bodies by hand (``errors`` and
``routing`` own them); anything that applies to every request is a middleware.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path

from aiohttp import web

from llmgw.core import routing
from llmgw.core.catalog import Catalog, GuardErrorPolicy, Model
from llmgw.core.records import ApiKeyRecord, UnavailableModel
from llmgw.core.routing import Api, Refusal
from llmgw.gateway.calls import ApiCall, parse_call
from llmgw.gateway.catalogs import CatalogRoute
from llmgw.gateway.context import API_KEY, CONTEXT, REQUEST_ID, SERVED, STARTED, RouterContext
from llmgw.gateway.dispatch import Served, Translation
from llmgw.gateway.errors import ApiError, body_encoding_refused, budget_not_kept
from llmgw.gateway.guard import policies_for
from llmgw.gateway.settings import RouterSettings
from llmgw.gateway.shared_limits import Hold
from llmgw.http_server import BodyEncodingRefused, BodyTimeout, read_body

STATIC_DIR = Path(__file__).resolve().parent / "static"
# Per model of a chain: how to ask its engine a request of an API it does not serve.
Translate = tuple[tuple[str, ...], Callable[[str], Translation | None] | None]
OWNED_BY_REAL = "llmgw"
OWNED_BY_SIM = "llmgw-sim"


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, Api.CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, Api.COMPLETIONS)


async def embeddings(request: web.Request) -> web.StreamResponse:
    return await _generate(request, Api.EMBEDDINGS)


async def _generate(request: web.Request, api: Api) -> web.StreamResponse:
    context = request.app[CONTEXT]
    return await serve_call(request, parse_call(api, await _read_body(request, context.settings)))


async def serve_call(
    request: web.Request,
    call: ApiCall,
    *,
    translate: Callable[[Catalog, tuple[str, ...]], Translate] | None = None,
    hold_tokens: int | None = None,
    screen: bool = True,
) -> web.StreamResponse:
    """A parsed call, resolved, admitted, screened and dispatched. ``translate`` gives
    the chain to walk (the route's, or the part of it that can answer) and the
    per-model translation, or raises the 400 for a field it cannot carry; ``hold_tokens``, the tokens
    to hold from a key's budget instead of the call's estimate; ``screen`` False for
    a call that generates nothing (a token count)."""
    context = request.app[CONTEXT]
    catalog = catalog_of(context)
    route = resolved_route(request, call.model, call.api)
    model = route.model
    served = request[SERVED]
    walk = tool_calling_chain(catalog, call.model, route, call.body)
    chain, per_model = translate(catalog, walk) if translate is not None else (walk, None)
    key = request.get(API_KEY)
    if key is not None:
        context.limiter.enter(key)  # the key's requests in progress: 429 past its limit
    try:
        if (
            hold_tokens is None
            and key is not None
            and (key.tokens_per_minute is not None or key.token_budget is not None)
        ):
            # Only a token limit or budget holds tokens: no estimate for a request that holds none.
            hold_tokens = call.tokens_to_hold(context.settings.hold_for_unbounded_answer)
        hold = await hold_for(request, hold_tokens or 0, unbounded=bool(hold_tokens) and call.unbounded)
        request_id = request[REQUEST_ID]
        gates = context.gates
        try:
            if not gates.enter_now(model):
                await gates.enter(model)
            try:
                if route.guarded and screen:
                    call = await context.guard.screen(call, chain, catalog, request_id)
                return await context.dispatcher.serve(
                    request,
                    call,
                    chain,
                    catalog,
                    served,
                    request_id,
                    started=request[STARTED],
                    on_usage=hold.settle if hold is not None else None,
                    translate=per_model,
                )
            finally:
                gates.release(model)
        finally:
            close_hold(request, hold, served)
    finally:
        if key is not None:
            context.limiter.leave(key)


def resolved_route(request: web.Request, name: str, api: Api) -> CatalogRoute:
    """The route of the model ``name`` under ``api`` for the request's key, noted in its
    ``Served``; or the refusal: not found for a model the key may not use (as for one
    that does not exist), 400 for one that does not serve ``api``."""
    context = request.app[CONTEXT]
    key = request.get(API_KEY)
    route = context.catalogs.route(name, api, key.models if key is not None else None)
    if route is None:
        raise ApiError(routing.model_not_found(name))
    request[SERVED].resolved = route.model  # from here on, a refusal counts under the model
    if not route.serves_api:
        raise ApiError(routing.refusal_for(routing.Unserved.WRONG_API, name, retry_after=0, api=api))
    return route


def tool_calling_chain(
    catalog: Catalog, requested: str, route: CatalogRoute, body: Mapping[str, object]
) -> tuple[str, ...]:
    """The chain a request walks, or the 400 of a model that cannot call tools for one that
    needs them (``routing.tools_refusal``, on the client's body, in the client's API)."""
    refused = routing.tools_refusal(catalog, requested, route.chain, body)
    if refused is not None:
        raise ApiError(refused)
    return routing.tool_calling_chain(catalog, route.chain, body)


async def hold_for(request: web.Request, tokens: int, *, unbounded: bool = False) -> Hold | None:
    """The tokens held from the request's key, or its 429; ``unbounded``: an answer
    nothing bounds, which holds all the key has left. None: nothing to settle (no key,
    or a key without a token limit on a router that limits alone)."""
    key = request.get(API_KEY)
    if key is None:
        return None
    context = request.app[CONTEXT]
    if context.shared_limits is not None:
        return await context.shared_limits.admit(key, tokens, unbounded=unbounded)
    if key.token_budget is not None:
        raise budget_not_kept()
    return context.limiter.admit(key, asyncio.get_running_loop().time(), tokens, unbounded=unbounded)


def close_hold(request: web.Request, hold: Hold | None, served: Served) -> None:
    """A hold the answer's usage did not settle. An engine that began a 200 answer was
    generating (the client may have left mid-stream): it pays what was held. Otherwise
    (queue, guard, no replica, an engine's error) it pays nothing. With shared limits,
    the request's usage is counted for its key."""
    if hold is not None and hold.open:
        if served.engine_status == 200:
            hold.keep()
        else:
            hold.release()
    shared = request.app[CONTEXT].shared_limits
    key = request.get(API_KEY)
    if shared is not None and key is not None and served.engine_status:
        shared.count_usage(key, served.model, served.usage)


async def _read_body(request: web.Request, settings: RouterSettings) -> bytes:
    try:
        return await read_body(request, max_bytes=settings.max_body_bytes, within=settings.body_read_timeout)
    except BodyEncodingRefused as exc:
        raise ApiError(body_encoding_refused(exc.encoding)) from None
    except BodyTimeout:
        raise ApiError(
            Refusal(
                408, "The request body was not received in time.", "invalid_request_error", "request_timeout"
            )
        ) from None


read_request_body = _read_body  # for the handlers of other modules (``messages``, ``responses``)


def catalog_of(context: RouterContext) -> Catalog:
    """The router's catalog, or the 503 to answer before it has one."""
    catalog = context.catalogs.catalog
    if catalog is None:
        raise ApiError(
            Refusal(
                503,
                "The router has not received its catalog yet; retry shortly.",
                "server_error",
                "catalog_unavailable",
                retry_after=5,
            )
        )
    return catalog


# --- the model list ---------------------------------------------------------------------------------


def _visible(key: ApiKeyRecord | None, name: str, model: str) -> bool:
    return key is None or key.models is None or name in key.models or model in key.models


def _guard_object(
    context: RouterContext,
    catalog: Catalog,
    model_name: str,
    unavailable: Mapping[str, UnavailableModel],
    key: ApiKeyRecord | None,
) -> dict[str, object] | None:
    """The guard policies that screen requests for ``model_name`` (those of any model of
    its fallback chain, as the guard applies them), and whether each judge answers now.
    ``available`` is false when a request would get 503 ``guard_unavailable``: a judge
    whose own chain neither serves nor loads on demand, under ``on_error: block``. A
    judge the key may not use is not named (``model`` null): which model screens is
    the operator's to know, and a key scoped to the guarded model is told only
    whether its requests can be screened now."""
    model = catalog.models[model_name]
    api = next((a for a in (Api.CHAT, Api.COMPLETIONS) if routing.serves_api(model, a)), None)
    if api is None:
        return None  # embeddings are not screened
    policies = policies_for(catalog, routing.fallback_chain(catalog, model_name, api))
    if not policies:
        return None
    judges: list[dict[str, object]] = []
    available = True
    for policy_name, policy in policies:
        judge = catalog.resolve(policy.judge)
        if judge is None:  # the catalog's rules refuse it; the guard blocks as for a judge that is down
            judge_answers, state = False, None
        else:
            chain = routing.fallback_chain(catalog, judge, Api.CHAT)
            states = {m: context.book.state(m, catalog.models[m], unavailable) for m in chain}
            judge_answers, state = routing.answers(routing.plan_route(chain, states)), states[judge]
        available = available and (judge_answers or policy.on_error is GuardErrorPolicy.ALLOW)
        judges.append(
            {
                "policy": policy_name,
                "model": (judge or policy.judge)
                if _visible(key, policy.judge, judge or policy.judge)
                else None,
                "state": None if state is None else str(state),
                "on_error": str(policy.on_error),
            }
        )
    return {"available": available, "judges": judges}


def _model_object(
    request: web.Request, catalog: Catalog, name: str, model_name: str, model: Model
) -> dict[str, object]:
    context = request.app[CONTEXT]
    unavailable = context.book.unavailable()
    state = context.book.state(model_name, model, unavailable)
    why = unavailable.get(model_name) if state is routing.ModelState.UNAVAILABLE else None
    return {
        "id": name,
        "object": "model",
        "created": context.catalogs.loaded_at,
        "owned_by": OWNED_BY_SIM if model.is_simulated else OWNED_BY_REAL,
        # Extra facts for the chat page; OpenAI clients ignore unknown fields.
        "llmgw": {
            "model": model_name,
            "alias_of": model_name if name != model_name else None,
            "simulated": model.is_simulated,
            "roles": [str(role) for role in model.roles],
            "state": str(state),
            # Why the control plane cannot serve it now (state "unavailable"), else null.
            "unavailable": None
            if why is None
            else {"why": str(why.why), "reason": why.reason, "since": why.since, "until": why.until},
            "description": model.description,
            # The guard that screens its requests and whether its judges answer now, else null.
            "guard": _guard_object(context, catalog, model_name, unavailable, request.get(API_KEY)),
        },
    }


async def list_models(request: web.Request) -> web.StreamResponse:
    catalog = catalog_of(request.app[CONTEXT])
    key = request.get(API_KEY)
    entries: list[tuple[tuple[bool, bool, int], dict[str, object]]] = []
    for position, (name, model) in enumerate(catalog.models.items()):
        if _visible(key, name, name):
            entries.append(
                ((model.is_simulated, False, position), _model_object(request, catalog, name, name, model))
            )
    for position, (alias, target) in enumerate(catalog.aliases.items()):
        aliased = catalog.models.get(target)
        if aliased is not None and _visible(key, alias, target):
            entries.append(
                (
                    (aliased.is_simulated, True, position),
                    _model_object(request, catalog, alias, target, aliased),
                )
            )
    entries.sort(key=lambda entry: entry[0])  # real models first, simulated ones last
    return web.json_response({"object": "list", "data": [obj for _, obj in entries]})


async def get_model(request: web.Request) -> web.StreamResponse:
    catalog = catalog_of(request.app[CONTEXT])
    name = request.match_info["model"]
    key = request.get(API_KEY)
    model_name = routing.resolve(catalog, name, key.models if key is not None else None)
    if model_name is None:
        raise ApiError(routing.model_not_found(name))
    return web.json_response(_model_object(request, catalog, name, model_name, catalog.models[model_name]))


# --- operations -------------------------------------------------------------------------------------


async def health(request: web.Request) -> web.StreamResponse:
    """200 while the router serves, even on a stale endpoint set (it says so)."""
    context = request.app[CONTEXT]
    now = asyncio.get_running_loop().time()
    watches = {}
    for label, watched in context.watches():
        watches[label] = {
            "healthy": watched.healthy,
            "age_seconds": None
            if watched.last_success_at is None
            else round(now - watched.last_success_at, 3),
            "last_error": watched.last_error,
        }
    endpoints = context.book.endpoints()
    body: dict[str, object] = {
        "status": "ok",
        "catalog_version": context.catalogs.version,
        "endpoints": len(endpoints),
        "usable_endpoints": sum(context.book.usable_count(m) for m in {e.model for e in endpoints}),
        "consul": watches,
    }
    nomad = context.deps.allocations
    if nomad is not None:
        body["nomad"] = {
            "healthy": nomad.healthy,
            "age_seconds": None
            if nomad.last_success_at is None or nomad.healthy
            else round(now - nomad.last_success_at, 3),
            "last_error": nomad.last_error,
        }
    return web.json_response(body)


async def metrics(request: web.Request) -> web.StreamResponse:
    body = request.app[CONTEXT].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


# The chat page's headers, on the page and every file it loads. It holds an API key and
# writes model output into itself (as text): no other site may frame it (clickjacking a
# key form), no script but its own module may run in it (script-src 'self', no inline,
# no eval), it connects only to this router, and no file of it is read as another type.
PAGE_HEADERS = {
    "Content-Security-Policy": "; ".join(
        (
            "default-src 'self'",
            "script-src 'self'",
            "style-src 'self'",
            "img-src 'self' data: blob:",  # the images a user attaches, shown before sending
            "connect-src 'self'",
            "object-src 'none'",
            "base-uri 'none'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        )
    ),
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate CSP 2
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# What /static/ serves: the page's own files, nothing else in the directory.
STATIC_FILES = {"chat.js": "text/javascript", "chat.css": "text/css"}


async def index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers={**PAGE_HEADERS, "Cache-Control": "no-cache"})


async def static_file(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    kind = STATIC_FILES.get(name)
    if kind is None:
        raise web.HTTPNotFound()
    return web.FileResponse(STATIC_DIR / name, headers={**PAGE_HEADERS, "Content-Type": kind})


# Browsers ask for /favicon.ico on their own; the file never changes between releases.
FAVICON_CACHE = "public, max-age=604800"


async def favicon(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(
        STATIC_DIR / "favicon.ico",
        headers={**PAGE_HEADERS, "Content-Type": "image/x-icon", "Cache-Control": FAVICON_CACHE},
    )
