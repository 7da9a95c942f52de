"""`llmgw sim`: run the simulated engine (the same flags as `python -m llmgw.sim`).

Owns only the wiring from the `llmgw` command line to `llmgw.sim.server`;
the server is imported when the command runs, so other commands do not pay
for aiohttp.
"""

from __future__ import annotations

import argparse
import os
import sys

from llmgw.sim.settings import add_sim_arguments


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "sim",
        help="run a simulated OpenAI-compatible engine (vLLM-like, no GPU)",
        description="Run a simulated OpenAI-compatible LLM engine: vLLM's endpoints, /health and "
        "/metrics, Greek words at a set token rate, deterministic embeddings, and faults on demand. "
        "llmgw renders it for a catalog profile with engine: sim; run it by hand to try a client. "
        "Every flag can also be set through its LLMGW_SIM_* environment variable; flags win. It "
        "prints 'llmgw-sim listening host=H port=P' on stdout. Exit 0 stopped by SIGINT/SIGTERM, "
        "1 refused to start (engine security policy, rendezvous, port), 2 usage, 3 crash fault, "
        "4 a peer rank was lost, 5 the replica's ranks did not join in time.",
    )
    add_sim_arguments(parser)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from llmgw.sim.server import run_from_namespace

    namespace = argparse.Namespace(
        **{k: v for k, v in vars(args).items() if k not in ("command", "handler", "usage_parser")}
    )
    return run_from_namespace(namespace, os.environ, sys.argv[2:])
