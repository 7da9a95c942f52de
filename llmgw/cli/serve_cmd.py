"""``llmgw serve``: the control plane and the router against a real Nomad and Consul.

Connections come from NOMAD_* and CONSUL_HTTP_* as the CLIs read them; the
router's settings from its flags or LLMGW_ROUTER_*; the admin API's from
--admin-* or LLMGW_ADMIN_*; rendering from LLMGW_*. This module only parses;
``serve_run`` runs.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from llmgw.admin.settings import add_admin_arguments
from llmgw.gateway.settings import add_router_arguments

ROLES = ("all", "control-plane", "router")


def _serve(args: argparse.Namespace) -> int:
    from llmgw.cli.serve_run import run_serve

    return run_serve(args)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the control plane and/or the router against Nomad and Consul (NOMAD_ADDR, ...)"
    )
    parser.add_argument("--role", choices=ROLES, default=ROLES[0])
    parser.add_argument(
        "--catalog", type=Path, help="apply this catalog at start if it differs from Consul's"
    )
    parser.add_argument("--policy", type=Path, help="engine security policy (default: the bundled one)")
    parser.add_argument("--log-level", default=os.environ.get("LLMGW_LOG_LEVEL", "INFO"))
    add_router_arguments(parser.add_argument_group("router"))  # type: ignore[arg-type]
    add_admin_arguments(parser.add_argument_group("admin API (with the control plane)"))  # type: ignore[arg-type]
    parser.set_defaults(handler=_serve)
