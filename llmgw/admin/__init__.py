"""The admin API: change the catalog, API keys and models safely, from CI and from a terminal.

Public face (see DESIGN.md beside this file):

- ``AdminSettings`` / ``check_settings`` / ``add_admin_arguments``: how the listener runs.
- ``AdminDeps`` and the Protocols in ``llmgw.admin.ports``: what it is built with.
- ``create_admin_app(settings, deps) -> web.Application``: the app, for a runner of your own.
- ``start_admin(settings, deps) -> AdminListener`` (``.url``, ``.stop()``): the app on its
  own listener, with TLS when configured; refuses settings ``check_settings`` refuses.
- ``preview(text, ...)``: a catalog text validated and compared with the applied one.

Names are imported on first use: ``llmgw ctl`` reads the settings' defaults, and every
``llmgw`` command builds its parser, without paying for aiohttp and the renderer.

Must not: be imported by ``llmgw.core``, or import the router, the stand-ins or the sim.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmgw.admin.app import create_admin_app
    from llmgw.admin.listening import AdminListener, start_admin, tls_context
    from llmgw.admin.ports import AdminDeps, CommandReceipt, ModelCommands
    from llmgw.admin.previewing import Preview, RenderedSpecHashes, preview
    from llmgw.admin.settings import (
        DEFAULT_PORT,
        DEFAULT_URL,
        AdminSettings,
        AdminSettingsError,
        add_admin_arguments,
        check_settings,
    )

_WHERE = {
    "create_admin_app": "llmgw.admin.app",
    "AdminListener": "llmgw.admin.listening",
    "start_admin": "llmgw.admin.listening",
    "tls_context": "llmgw.admin.listening",
    "AdminDeps": "llmgw.admin.ports",
    "CommandReceipt": "llmgw.admin.ports",
    "ModelCommands": "llmgw.admin.ports",
    "Preview": "llmgw.admin.previewing",
    "RenderedSpecHashes": "llmgw.admin.previewing",
    "preview": "llmgw.admin.previewing",
    "DEFAULT_PORT": "llmgw.admin.settings",
    "DEFAULT_URL": "llmgw.admin.settings",
    "AdminSettings": "llmgw.admin.settings",
    "AdminSettingsError": "llmgw.admin.settings",
    "add_admin_arguments": "llmgw.admin.settings",
    "check_settings": "llmgw.admin.settings",
}

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_URL",
    "AdminDeps",
    "AdminListener",
    "AdminSettings",
    "AdminSettingsError",
    "CommandReceipt",
    "ModelCommands",
    "Preview",
    "RenderedSpecHashes",
    "add_admin_arguments",
    "check_settings",
    "create_admin_app",
    "preview",
    "start_admin",
    "tls_context",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'llmgw.admin' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
