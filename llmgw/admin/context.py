"""The typed keys the admin app keeps its settings, dependencies and per-request values under.

Owns: the ``web.AppKey`` and ``web.RequestKey`` names (no module singletons: everything a
handler needs hangs off its app or its request).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from llmgw.admin.ports import AdminDeps
from llmgw.admin.settings import AdminSettings

SETTINGS = web.AppKey("llmgw_admin_settings", AdminSettings)
DEPS = web.AppKey("llmgw_admin_deps", AdminDeps)
# Previews parse and render on worker threads; this bounds how many at once, so a burst
# of diffs cannot starve the control plane that shares the process.
PREVIEWS = web.AppKey("llmgw_admin_previews", asyncio.Semaphore)
# Who the request says it comes from (X-Llmgw-Actor) and the credential it proved.
ACTOR = web.RequestKey("llmgw_admin_actor", str)
