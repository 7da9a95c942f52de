"""The files llmgw ships beside its code: templates, policies, the example catalog, the ACL policies.

In a source checkout they are the top-level folders operators review
(``templates/``, ``policies/``, ``examples/``); in an installed wheel they are
packaged under ``llmgw/_bundled/``. This module finds either and reads the
security policy; nothing else in llmgw guesses these paths.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml

from llmgw.core.catalog.security import SecurityPolicy, parse_policy

_PACKAGE_DIR = Path(__file__).resolve().parent


def bundled_path(name: str) -> Path:
    """``templates``, ``policies`` or ``examples``: the installed copy, else the checkout's."""
    installed = _PACKAGE_DIR / "_bundled" / name
    if installed.is_dir():
        return installed
    return _PACKAGE_DIR.parent / name


def acl_policy_dir() -> Path:
    """``ops/acl/``: the Nomad and Consul ACL policies llmgw's components run with."""
    installed = _PACKAGE_DIR / "_bundled" / "acl"
    if installed.is_dir():
        return installed
    return _PACKAGE_DIR.parent / "ops" / "acl"


def default_policy_path() -> Path:
    return bundled_path("policies") / "engine-security.yaml"


def read_security_policy(path: Path | None = None) -> SecurityPolicy:
    """Read and validate a policy file (the bundled one by default)."""
    chosen = path or default_policy_path()
    return _read_policy_cached(chosen.resolve())


@cache
def _read_policy_cached(path: Path) -> SecurityPolicy:
    with path.open(encoding="utf-8") as handle:
        return parse_policy(yaml.safe_load(handle))
