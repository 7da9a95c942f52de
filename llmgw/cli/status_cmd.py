"""``llmgw status``: per model, desired and actual replicas, where each runs, health, draining, and why.

Reads the status the control plane's leader publishes to Consul KV (``llmgw/status``),
so it works from any machine that can reach Consul, with no admin API and no Nomad
access. Connection from the consul CLI's variables (``CONSUL_HTTP_ADDR``,
``CONSUL_HTTP_TOKEN``, TLS...). A human table by default; ``--json`` prints the
document as the leader published it (``--model`` keeps only that model's entry);
``--watch`` reprints it every ``--interval`` seconds until Ctrl-C.

Exit codes: 0 shown; 1 rejected (no such model, Consul refused the token, an
unreadable document); 2 usage (bad flags or Consul settings); 3 nothing to show now:
Consul cannot be reached, or no leader has published a status yet.

Must not: compute anything about the cluster (the leader did, and says so in the
document), or import aiohttp before the command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from llmgw.cli import EXIT_OK, EXIT_REJECTED, EXIT_USAGE
from llmgw.cli.output import output_width, print_json, print_status

if TYPE_CHECKING:
    from llmgw.adapters.consul import ConsulClient
    from llmgw.settings import ConsulConnection

EXIT_UNAVAILABLE = 3
# Seconds between refreshes of --watch: the leader republishes on every change, so a
# couple of seconds shows a change about as soon as it happens without loading Consul.
DEFAULT_WATCH_INTERVAL = 2.0
# ANSI: cursor home, clear the screen (what `watch` does between refreshes).
_CLEAR = "\x1b[H\x1b[2J"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "status",
        help="models, replicas, where they run, health, and why something is not placed",
        description="Show the status the control plane's leader published to Consul "
        "(CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN and the consul CLI's TLS variables say where). "
        "Exit codes: 0 shown, 1 rejected (unknown model, refused token, unreadable status), "
        "2 usage, 3 Consul unreachable or no status published yet.",
    )
    parser.add_argument("--json", action="store_true", help="the status document as published, for scripts")
    parser.add_argument("--model", metavar="MODEL", help="only this model")
    parser.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_WATCH_INTERVAL,
        metavar="SECONDS",
        help=f"seconds between refreshes with --watch (default {DEFAULT_WATCH_INTERVAL:g})",
    )
    parser.set_defaults(handler=_status)


class Unavailable(Exception):
    """Nothing to show now: Consul cannot be reached, or no status was published (exit 3)."""


class Rejected(Exception):
    """The request cannot succeed as asked (exit 1)."""


def _status(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        print("llmgw status: --interval must be more than 0", file=sys.stderr)
        return EXIT_USAGE
    from llmgw.settings import ConsulConnection, SettingsError

    try:
        connection = ConsulConnection.from_env(os.environ)
    except SettingsError as exc:
        print(f"llmgw status: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return asyncio.run(_run(args, connection))
    except KeyboardInterrupt:
        return EXIT_OK if args.watch else 130


async def _run(args: argparse.Namespace, connection: ConsulConnection) -> int:
    from llmgw.adapters.consul import ConsulClient
    from llmgw.settings import SettingsError

    client = ConsulClient(connection)
    try:
        await client.start()
    except SettingsError as exc:  # unreadable TLS files, named by their variable
        print(f"llmgw status: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.watch:
            return await _watch(args, client)
        return _show(args, await _read(client), sys.stdout)
    except Unavailable as exc:
        print(f"llmgw status: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except Rejected as exc:
        print(f"llmgw status: {exc}", file=sys.stderr)
        return EXIT_REJECTED
    finally:
        await client.close()


async def _watch(args: argparse.Namespace, client: ConsulClient) -> int:
    """Reprint until interrupted; a failed read is shown and retried, never the end of the watch."""
    on_terminal = sys.stdout.isatty()
    while True:
        if on_terminal and not args.json:
            sys.stdout.write(_CLEAR)
        try:
            code = _show(args, await _read(client), sys.stdout)
        except (Unavailable, Rejected) as exc:
            print(f"llmgw status: {exc} (retrying every {args.interval:g}s)", file=sys.stderr)
            code = EXIT_UNAVAILABLE
        if code == EXIT_REJECTED and args.model:
            return code  # an unknown model will not appear by waiting
        sys.stdout.flush()
        await asyncio.sleep(args.interval)


async def _read(client: ConsulClient) -> dict[str, Any]:
    """The published document (a JSON object: the store checks that before it hands it out)."""
    from llmgw.adapters.consul import (
        ConsulError,
        ConsulRejected,
        CorruptRecord,
        StatusPublisher,
    )
    from llmgw.core.conventions import KV_STATUS

    where = client.connection.url
    try:
        document = await StatusPublisher(client).read()
    except CorruptRecord as exc:
        raise Rejected(f"the status in Consul KV {KV_STATUS!r} is unreadable: {exc}") from None
    except ConsulRejected as exc:
        hint = " (set CONSUL_HTTP_TOKEN to a token that may read it)" if exc.status in (401, 403) else ""
        raise Rejected(f"Consul at {where} refused to read {KV_STATUS!r}: {exc}{hint}") from None
    except ConsulError as exc:
        raise Unavailable(f"cannot reach Consul at {where}: {exc} (CONSUL_HTTP_ADDR says where)") from None
    if document is None:
        raise Unavailable(
            f"no status has been published yet: no control plane has been leader against Consul at "
            f"{where} (is `llmgw serve` running with the control-plane role? Consul KV {KV_STATUS!r} "
            "is empty)"
        )
    doc: dict[str, Any] = json.loads(document.text)
    return doc


def _show(args: argparse.Namespace, doc: dict[str, Any], out: TextIO) -> int:
    from llmgw.core.planning.status import StatusDecodeError, from_json

    if args.model is not None:
        models = doc.get("models")
        entries = [m for m in models if isinstance(m, Mapping)] if isinstance(models, list) else []
        chosen = [m for m in entries if m.get("model") == args.model]
        if not chosen:
            names = ", ".join(sorted(str(m.get("model")) for m in entries)) or "none"
            print(f"llmgw status: no model {args.model!r} in the status (models: {names})", file=sys.stderr)
            return EXIT_REJECTED
        doc = {**doc, "models": chosen}
    if args.json:
        print_json(doc, out)
        return EXIT_OK
    try:
        report = from_json(json.dumps(doc))
    except StatusDecodeError as exc:
        print(
            f"llmgw status: the status has a shape this llmgw does not know ({exc}); as published:",
            file=sys.stderr,
        )
        print_json(doc, out)
        return EXIT_OK
    print_status(report, now=time.time(), out=out, width=output_width(out))
    return EXIT_OK
