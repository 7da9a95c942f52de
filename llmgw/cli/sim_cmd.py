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
        description="Run a simulated OpenAI-compatible LLM engine. Every flag can also be set "
        "through its LLMGW_SIM_* environment variable; flags win.",
    )
    add_sim_arguments(parser)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from llmgw.sim.server import run_from_namespace

    namespace = argparse.Namespace(**{k: v for k, v in vars(args).items() if k not in ("command", "handler")})
    return run_from_namespace(namespace, os.environ, sys.argv[2:])
