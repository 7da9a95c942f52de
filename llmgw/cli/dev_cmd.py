"""``llmgw dev``: the whole of llmgw on one machine, on stand-ins for Nomad and Consul.

``llmgw dev`` starts the stand-ins (3 nodes x 8 simulated GPUs unless told
otherwise), applies the catalog, and runs the same control plane and router
``llmgw serve`` runs, against them. Ctrl-C stops everything and leaves no
process behind. The fault subcommands act on a running ``llmgw dev`` through
the stand-ins' dev-only endpoints (found through ``.llmgw-dev/dev.json``).

This module only parses; ``dev_run`` runs (imported when used, so other
commands do not pay for the stand-ins at start-up).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

DEFAULT_STATE_DIR = Path(".llmgw-dev")
EXIT_NOT_RUNNING = 3


def _run_dev(args: argparse.Namespace) -> int:
    from llmgw.cli.dev_run import run_dev

    return run_dev(args)


def _fault(args: argparse.Namespace) -> int:
    from llmgw.cli.dev_run import run_fault

    return run_fault(args)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "dev",
        help="run llmgw on this machine on Nomad and Consul stand-ins (no GPU needed)",
        description="Start Nomad and Consul stand-ins that run real processes, llmgw's control plane and "
        "router on top, serving the catalog. Ctrl-C stops everything.",
    )
    parser.add_argument("--catalog", type=Path, help="catalog to serve (default: the example catalog)")
    parser.add_argument("--port", type=int, default=8080, help="router port (default 8080)")
    parser.add_argument("--admin-port", type=int, default=8081, help="admin API port (default 8081)")
    parser.add_argument("--nodes", type=int, default=3, help="simulated nodes (default 3)")
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs per node (default 8)")
    parser.add_argument("--gpu-model", default="H100")
    parser.add_argument(
        "--cluster", type=Path, help="YAML describing the nodes (see llmgw/devcluster/DESIGN.md)"
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help="where allocations, logs and dev.json live (default .llmgw-dev)",
    )
    parser.add_argument("--log-level", default=os.environ.get("LLMGW_LOG_LEVEL", "WARNING"))
    parser.set_defaults(handler=_run_dev)

    commands = parser.add_subparsers(dest="dev_command", metavar="FAULT")
    fail = commands.add_parser("fail-node", help="kill a node's processes and stop its heartbeat")
    fail.add_argument("node")
    fail.set_defaults(handler=_fault, fault="fail-node")
    restore = commands.add_parser("restore-node", help="bring a failed node back, empty")
    restore.add_argument("node")
    restore.set_defaults(handler=_fault, fault="restore-node")
    crash = commands.add_parser("crash", help="SIGKILL one task of an allocation")
    crash.add_argument("alloc", help="allocation id (or a unique prefix)")
    crash.add_argument("--task", default="engine")
    crash.set_defaults(handler=_fault, fault="crash")
    outage = commands.add_parser("consul-outage", help="make Consul stop answering for SECONDS")
    outage.add_argument("seconds", type=float)
    outage.add_argument("--mode", choices=("hang", "refuse"), default="hang")
    outage.set_defaults(handler=_fault, fault="consul-outage")
    slow = commands.add_parser("slow-checks", help="delay a node's health checks by SECONDS (0 clears)")
    slow.add_argument("node")
    slow.add_argument("seconds", type=float)
    slow.set_defaults(handler=_fault, fault="slow-checks")
    for sub in (fail, restore, crash, outage, slow):
        sub.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
