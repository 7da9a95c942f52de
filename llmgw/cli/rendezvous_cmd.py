"""``llmgw rendezvous wait``: the prestart step that holds a rank until its replica's peers are known.

Nomad renders the peers' addresses from Consul into a file (a ``template``
block, re-rendered as Consul changes); this waits until the file has the
expected number of lines, so the engine starts with every address it needs.
It runs on GPU nodes inside jobs llmgw renders; it reads one file and nothing else.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from llmgw.cli import EXIT_OK, EXIT_REJECTED

POLL_INTERVAL_S = 0.5  # how often the file is reread; Nomad rewrites it within a second of a change


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "rendezvous",
        help="(inside jobs) wait for a replica's ranks",
        description="Run by the jobs llmgw renders, on GPU nodes: a multi-node replica's prestart "
        "task waits here until its peers' addresses are known. Not for use by hand.",
    )
    commands = parser.add_subparsers(dest="rendezvous_command", metavar="SUBCOMMAND", required=True)
    wait = commands.add_parser(
        "wait",
        help="wait until FILE has at least LINES non-empty lines",
        description="Wait until FILE (rendered by a Nomad template from Consul's llmgw-rank "
        "service) has at least LINES non-empty lines. Exit 0 when it has, 1 when --timeout passes.",
    )
    wait.add_argument("--file", type=Path, required=True, help="the file the job's template renders")
    wait.add_argument("--lines", type=int, default=1, help="addresses to wait for (default 1)")
    wait.add_argument(
        "--timeout", type=float, default=900.0, help="seconds before giving up with exit 1 (default 900)"
    )
    wait.set_defaults(handler=_wait)


def count_lines(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    except (OSError, UnicodeDecodeError):
        return 0


def _wait(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    while True:
        found = count_lines(args.file)
        if found >= args.lines:
            print(f"llmgw rendezvous: {args.file} has {found} of {args.lines} address(es)", file=sys.stderr)
            return EXIT_OK
        if time.monotonic() >= deadline:
            print(
                f"llmgw rendezvous: {args.file} has {found} of {args.lines} address(es) "
                f"after {args.timeout:g}s; the replica did not assemble",
                file=sys.stderr,
            )
            return EXIT_REJECTED
        time.sleep(POLL_INTERVAL_S)
