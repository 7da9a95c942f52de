"""Running the admin API on its own listener, with TLS when configured.

Owns: ``start_admin(settings, deps) -> AdminListener`` (refuses settings that
``check_settings`` refuses, logs its warnings, opens the TLS files, binds) and
``tls_context(settings)``. The control plane starts it from a ``cleanup_ctx`` and stops
it with ``AdminListener.stop()``; tests start it on port 0.

Must not: decide what the settings allow (``check_settings`` does) or serve anything
but the app ``create_admin_app`` builds.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass

from aiohttp import web

from llmgw.admin.app import create_admin_app
from llmgw.admin.ports import AdminDeps
from llmgw.admin.settings import AdminSettings, AdminSettingsError, check_settings
from llmgw.core.addresses import url_of
from llmgw.http_server import NO_DECOMPRESSION, bound_port, listener_log

log = logging.getLogger("llmgw.admin")


def tls_context(settings: AdminSettings) -> ssl.SSLContext | None:
    """The server TLS context of ``--admin-tls-cert``/``--admin-tls-key`` (None without TLS)."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(settings.tls_cert, settings.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise AdminSettingsError(
            f"cannot use --admin-tls-cert {settings.tls_cert} / --admin-tls-key {settings.tls_key}: {exc}"
        ) from None
    return context


@dataclass
class AdminListener:
    runner: web.AppRunner
    host: str
    port: int
    tls: bool

    @property
    def url(self) -> str:
        return url_of("https" if self.tls else "http", self.host, self.port)

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_admin(settings: AdminSettings, deps: AdminDeps) -> AdminListener:
    """Listen, or raise AdminSettingsError saying why these settings must not."""
    check = check_settings(settings)
    if check.problems:
        raise AdminSettingsError("the admin API will not start: " + "; ".join(check.problems))
    for warning in check.warnings:
        log.warning("%s", warning)
    context = tls_context(settings)
    runner = web.AppRunner(
        create_admin_app(settings, deps),
        access_log=None,
        # Malformed requests are logged without their bytes (the token is among them).
        logger=listener_log("llmgw.admin.http"),
        keepalive_timeout=settings.keepalive_timeout,
        shutdown_timeout=settings.shutdown_timeout,
        **NO_DECOMPRESSION,  # bodies never inflated: a compressed one is refused (read_body)
    )
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, ssl_context=context)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise AdminSettingsError(
            f"the admin API cannot listen on {settings.host}:{settings.port}: {exc}"
        ) from None
    listener = AdminListener(runner, settings.host, bound_port(runner, settings.port), context is not None)
    log.info(
        "admin API listening on %s (token %s)", listener.url, "required" if settings.token else "NOT set"
    )
    return listener
