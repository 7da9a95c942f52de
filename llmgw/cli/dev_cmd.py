"""``llmgw dev``: the whole of llmgw on one machine, on stand-ins for Nomad and Consul.

``llmgw dev`` starts the stand-ins (4 nodes x 8 simulated GPUs unless told
otherwise), applies the catalog, and runs the same control plane and router
``llmgw serve`` runs, against them. Ctrl-C stops everything and leaves no
process behind. The fault subcommands act on a running ``llmgw dev`` through
the stand-ins' dev-only endpoints (found through ``.llmgw-dev/dev.json``, with
the tokens beside it).

This module only parses; ``dev_run`` runs (imported when used, so other
commands do not pay for the stand-ins at start-up).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from llmgw.cli.event_loop import add_event_loop_argument
from llmgw.flags import LOG_LEVEL, flag_type

DEFAULT_STATE_DIR = Path(".llmgw-dev")
EXIT_NOT_RUNNING = 3
# A fault request the stand-ins have not answered in this long: they are hung, exit 3.
# They answer in well under a second; failing a node waits for its SIGKILLed processes
# (up to the stand-in's kill grace, 5 s by default) before it answers.
FAULT_TIMEOUT = 30.0


def _fault_exits(refused: str) -> str:
    """The exit codes of a fault subcommand; ``refused`` says what the stand-ins refuse."""
    return (
        f"Exit 0 done, 1 refused ({refused}), 2 usage, 3 no llmgw dev answers (no dev.json in "
        f"--state-dir, or the stand-ins it names do not answer, in {FAULT_TIMEOUT:g}s)."
    )


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
        description="Start Nomad and Consul stand-ins that run real processes on simulated GPU nodes, "
        "and llmgw's control plane, admin API and router on top (the same code `llmgw serve` runs), "
        "serving the catalog. It prints the router's URL, the chat page, the admin API and the "
        "export lines for NOMAD_ADDR, NOMAD_TOKEN, CONSUL_HTTP_ADDR and CONSUL_HTTP_TOKEN: the "
        "stand-ins run with ACLs on and answer only requests with their token (kept in --state-dir, "
        "readable by you only, while llmgw dev runs), so the nomad and consul CLIs and llmgw status "
        "work. Simulated (sim) profiles run, and llama.cpp profiles run a local llama-server "
        "($LLMGW_LLAMA_SERVER, else llama-server on PATH) on the CPU; other engines' images are "
        "not pulled. The router listens "
        "on loopback without API keys (with --api-keys, only with keys from llmgw ctl keys create); "
        "LLMGW_ROUTER_* tune it as for serve. Ctrl-C stops everything "
        "and leaves no process behind. With a FAULT subcommand, act on the llmgw dev already running "
        "from this folder instead (exit 3 when none is). Exit 0 stopped, 1 an invalid catalog, 2 usage.",
    )
    parser.add_argument("--catalog", type=Path, help="catalog to serve (default: the example catalog)")
    parser.add_argument("--port", type=int, default=8080, help="router port (default 8080)")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=8082,
        help="the control plane's /metrics and /health (default 8082)",
    )
    parser.add_argument("--admin-port", type=int, default=8081, help="admin API port (default 8081)")
    parser.add_argument(
        "--nodes", type=int, default=4, help="simulated nodes (default 4: one spare for fail-node)"
    )
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs per node (default 8)")
    parser.add_argument(
        "--gpu-model",
        default="NVIDIA H100 80GB HBM3",
        help="GPU name the simulated nodes report, as NVML names cards (default 'NVIDIA H100 80GB HBM3')",
    )
    parser.add_argument(
        "--cluster",
        type=Path,
        help="YAML describing the nodes, instead of --nodes/--gpus/--gpu-model "
        "(StandInConfig's fields: llmgw/devcluster/DESIGN.md)",
    )
    parser.add_argument(
        "--artifact",
        action="append",
        metavar="URL=FILE",
        help="serve this catalog source URL from a local file (the nodes download nothing in dev): "
        "a llama.cpp profile's GGUF on your disk; repeatable",
    )
    parser.add_argument(
        "--api-keys",
        action="store_true",
        help="the router requires API keys, as llmgw serve's does: issue them with "
        "llmgw ctl --admin-url ADMIN keys create NAME (default: no keys, loopback only)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help="where allocations, logs, dev.json and the stand-ins' tokens live (default .llmgw-dev)",
    )
    add_event_loop_argument(parser)
    parser.add_argument(
        "--log-level",
        type=flag_type(LOG_LEVEL),
        help="DEBUG, INFO, WARNING or ERROR (default $LLMGW_LOG_LEVEL or WARNING)",
    )
    parser.set_defaults(handler=_run_dev)

    commands = parser.add_subparsers(
        dest="dev_command",
        metavar="FAULT",
        help="optional: act on the llmgw dev already running instead of starting one",
    )
    fail = commands.add_parser(
        "fail-node",
        help="kill a node's processes and stop its heartbeat",
        description="Kill every process of a node and stop its heartbeat, as a dead machine would: "
        "Nomad marks it down, its replicas are rebuilt elsewhere. " + _fault_exits("no such node"),
    )
    fail.add_argument("node", help="node name (gpu-1, gpu-2, ...) or id prefix")
    fail.set_defaults(handler=_fault, fault="fail-node")
    restore = commands.add_parser(
        "restore-node",
        help="bring a failed node back, empty",
        description="Bring a failed node back with no allocations. " + _fault_exits("no such node"),
    )
    restore.add_argument("node", help="node name (gpu-1, gpu-2, ...) or id prefix")
    restore.set_defaults(handler=_fault, fault="restore-node")
    crash = commands.add_parser(
        "crash",
        help="SIGKILL one task of an allocation",
        description="SIGKILL one task of an allocation; Nomad's restart policy then applies. "
        "ALLOC is an allocation id or its prefix (`llmgw status` shows them, 8 characters), a "
        "replica or a model as `llmgw status` names them; one that runs several allocations (a "
        "multi-node replica, a model with replicas) is refused with their ids. "
        + _fault_exits("no allocation, or several, match ALLOC; no such task"),
    )
    crash.add_argument(
        "alloc", metavar="ALLOC", help="allocation id or prefix, replica, or model (as `llmgw status` shows)"
    )
    crash.add_argument("--task", default="engine", help="the task to kill (default engine)")
    crash.set_defaults(handler=_fault, fault="crash")
    outage = commands.add_parser(
        "consul-outage",
        help="make Consul stop answering for SECONDS",
        description="Make the Consul stand-in stop answering for SECONDS; the router keeps routing "
        "on its last view. " + _fault_exits("a duration the Consul stand-in refuses"),
    )
    outage.add_argument("seconds", type=float, help="how long the outage lasts")
    outage.add_argument(
        "--mode",
        choices=("hang", "refuse"),
        default="hang",
        help="hang: accept and never answer; refuse: refuse connections (default hang)",
    )
    outage.set_defaults(handler=_fault, fault="consul-outage")
    slow = commands.add_parser(
        "slow-checks",
        help="delay a node's health checks by SECONDS (0 clears)",
        description="Delay the health checks of a node's services by SECONDS; past the 3 s check "
        "timeout of llmgw dev they turn critical and routers stop sending there. 0 clears it. "
        + _fault_exits("no such node, or a delay the Consul stand-in refuses"),
    )
    slow.add_argument("node", help="node name (gpu-1, gpu-2, ...)")
    slow.add_argument("seconds", type=float, help="added to every check of the node (0 clears)")
    slow.set_defaults(handler=_fault, fault="slow-checks")
    for sub in (fail, restore, crash, outage, slow):
        sub.add_argument(
            "--state-dir",
            type=Path,
            default=DEFAULT_STATE_DIR,
            help="the running llmgw dev's --state-dir, holding dev.json and the tokens (default .llmgw-dev)",
        )
    # argparse shows a subcommand as required in the usage line; FAULT is not.
    parser.usage = (
        parser.format_usage().removeprefix("usage: ").rstrip().replace(" FAULT ...", " [FAULT ...]")
    )
