"""The admin API's aiohttp application: the one wiring point of settings, stores and guards.

Owns: ``create_admin_app(settings, deps)``. The middlewares run outermost first: the
error envelope, browser safety (Host, cross-site, JSON content type), then the token;
so a hostile page gets the same refusal whether or not it could guess the token.

Must not: listen (``llmgw.admin.listening`` does, or the control plane on its own
runner), or check whether the settings may run (``check_settings``; the listener
refuses to start on its problems).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from llmgw.admin.context import DEPS, PREVIEWS, SETTINGS
from llmgw.admin.guards import answer_errors, refuse_browsers, require_token
from llmgw.admin.handlers import add_routes
from llmgw.admin.ports import AdminDeps
from llmgw.admin.settings import AdminSettings


def create_admin_app(settings: AdminSettings, deps: AdminDeps) -> web.Application:
    app = web.Application(
        middlewares=[answer_errors, refuse_browsers, require_token],
        client_max_size=settings.max_body_bytes,
    )
    app[SETTINGS] = settings
    app[DEPS] = deps
    app[PREVIEWS] = asyncio.Semaphore(settings.preview_concurrency)
    add_routes(app)
    return app
