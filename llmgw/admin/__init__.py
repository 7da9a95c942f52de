"""The admin API: change the catalog, API keys and models safely, from CI and from a terminal.

Public face (see DESIGN.md beside this file):

- ``AdminSettings`` / ``check_settings`` / ``add_admin_arguments``: how the listener runs.
- ``AdminDeps`` and the Protocols in ``llmgw.admin.ports``: what it is built with.
- ``preview(text, ...)``: a catalog text validated and compared with the applied one.

Must not: be imported by ``llmgw.core``, or import the router, the stand-ins or the sim.
"""

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

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_URL",
    "AdminDeps",
    "AdminSettings",
    "AdminSettingsError",
    "CommandReceipt",
    "ModelCommands",
    "Preview",
    "RenderedSpecHashes",
    "add_admin_arguments",
    "check_settings",
    "preview",
]
