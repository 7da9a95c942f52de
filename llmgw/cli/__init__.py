"""The `llmgw` command line: one subcommand module per noun, wired here.

Each command module exposes ``register(subparsers)``, which adds its parser and
sets ``handler`` (a callable taking the parsed namespace and returning the exit
code). Exit codes follow the compiler convention: 0 success, 1 the input was
rejected (invalid catalog, failed check), 2 usage error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Protocol

from llmgw import __version__

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_USAGE = 2
# The other side (Nomad, Consul, the admin API, a mirror) cannot be reached or answer now.
EXIT_UNREACHABLE = 3

Handler = Callable[[argparse.Namespace], int]

# Command modules, imported lazily so `llmgw catalog check` does not pay for
# aiohttp and the stand-ins at start-up.
COMMAND_MODULES: tuple[str, ...] = (
    "llmgw.cli.catalog_cmd",
    "llmgw.cli.render_cmd",
    "llmgw.cli.sim_cmd",
    "llmgw.cli.dev_cmd",
    "llmgw.cli.serve_cmd",
    "llmgw.cli.ctl_cmd",
    "llmgw.cli.mirror_cmd",
    "llmgw.cli.status_cmd",
    "llmgw.cli.rendezvous_cmd",
)


class CommandModule(Protocol):
    def register(self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None: ...


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmgw",
        description="Serve many LLMs on a Nomad + Consul GPU cluster: a catalog of models (YAML), "
        "the control plane that keeps one Nomad job per replica, and an OpenAI-compatible router.",
        epilog="Nomad and Consul are found as their CLIs find them (NOMAD_ADDR, NOMAD_TOKEN, "
        "NOMAD_NAMESPACE, NOMAD_REGION, NOMAD_CACERT...; CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, "
        "CONSUL_CACERT...); llmgw's own settings are LLMGW_* variables or flags (a flag wins). "
        "Exit codes: 0 done, 1 rejected (invalid catalog, refused change, failed check), 2 usage, "
        "3 Consul, the admin API or a mirror cannot be reached. Try `llmgw dev` for everything on "
        "this machine, and `llmgw COMMAND --help`.",
    )
    parser.add_argument("--version", action="version", version=f"llmgw {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        module: CommandModule = importlib.import_module(name)
        module.register(subparsers)
    _remember_parsers(parser)
    return parser


def _remember_parsers(parser: argparse.ArgumentParser) -> None:
    """Each (sub)parser puts itself in the namespace: the deepest one parsed is the one used.

    argparse hands the arguments a subcommand does not know back to the top-level
    parser, whose error would print ``llmgw``'s usage instead of the subcommand's.
    """
    parser.set_defaults(usage_parser=parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _remember_parsers(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # The command's own usage and error, as if it had parsed them itself (exits 2).
        target: argparse.ArgumentParser = getattr(args, "usage_parser", parser)
        target.error(f"unrecognized arguments: {' '.join(unknown)}")
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader left (`llmgw status | head`): not an error of ours. Point stdout
        # at /dev/null so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
