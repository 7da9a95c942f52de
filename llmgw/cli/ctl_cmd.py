"""``llmgw ctl``: change and inspect a running llmgw through its admin API, from CI or a terminal.

Owns: the ``ctl`` subcommands (status [--model], diff, apply, catalog get|history, keys
create|list|revoke|budget|usage, drain, restart), their human tables and ``--json`` output, the
apply protocol seen from the client (diff, confirm on a terminal or ``--yes``, then
PUT with ``If-Match`` on the catalog the diff was computed against, so what was
confirmed is what is replaced), and the exit codes:

- 0 done; 1 rejected (an invalid catalog, with exactly the lines ``llmgw catalog
  check`` prints; 412 stale; any other 4xx); 2 usage (bad flags, unreadable file, no
  terminal to confirm on); 3 the admin API cannot be reached or cannot do it now (5xx).

Where: ``--admin-url`` or ``LLMGW_ADMIN_URL`` (default ``http://127.0.0.1:8081``); the
token from ``LLMGW_ADMIN_TOKEN``. Every request says ``Content-Type: application/json``.

Must not: validate catalogs itself (the admin API does, with the control plane's
policy), or import aiohttp before a ctl command runs (every ``llmgw`` command imports
this module to build its parser).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote, urlsplit

from llmgw import __version__
from llmgw.admin.settings import DEFAULT_URL, TOKEN_ENV, URL_ENV
from llmgw.cli import EXIT_OK, EXIT_REJECTED, EXIT_USAGE
from llmgw.cli.output import UnknownModel
from llmgw.cli.output import format_when as _when
from llmgw.cli.output import print_json as _print_json
from llmgw.cli.output import print_table as _table
from llmgw.core.addresses import is_loopback
from llmgw.core.catalog_diff import CatalogDiff, DiffDecodeError, diff_from_dict
from llmgw.core.diagnostics import printable
from llmgw.flags import ACTOR, ADMIN_TOKEN, ADMIN_URL

EXIT_UNREACHABLE = 3
ACTOR_ENV = ACTOR.name
ACTOR_HEADER = "X-Llmgw-Actor"
# A request that gets no answer in this long counts as unreachable (an apply renders
# every changed profile, which takes a second or two for a large catalog).
DEFAULT_TIMEOUT = 60.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # Options of every request; ``common`` adds --actor, for the commands that change something.
    reading = argparse.ArgumentParser(add_help=False)
    reading.add_argument(
        "--admin-url",
        default=argparse.SUPPRESS,
        help=f"the admin API (default ${URL_ENV} or {DEFAULT_URL}); the token is read from ${TOKEN_ENV}",
    )
    reading.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="JSON for scripts")
    reading.add_argument(
        "--cacert", default=argparse.SUPPRESS, help="PEM CA file to verify the admin API's TLS certificate"
    )
    reading.add_argument(
        "--timeout",
        type=float,
        default=argparse.SUPPRESS,
        help=f"seconds per request (default {DEFAULT_TIMEOUT:g})",
    )
    common = argparse.ArgumentParser(add_help=False, parents=[reading])
    common.add_argument(
        "--actor",
        default=argparse.SUPPRESS,
        help=f"who you are in the catalog's audit trail, e.g. ci (default ${ACTOR_ENV} or ctl)",
    )

    parser = subparsers.add_parser(
        "ctl",
        parents=[common],
        help="change and inspect a running llmgw through its admin API",
        description="Talk to the control plane's admin API (`llmgw serve` runs it beside the control "
        "plane, on 127.0.0.1:8081 by default). The token, when the API has one, is read from "
        f"${TOKEN_ENV} only (never a flag: ps would show it). Exit codes: 0 done, 1 rejected "
        "(invalid catalog, stale, refused), 2 usage, 3 the admin API cannot be reached or cannot do "
        "it now.",
    )
    commands = parser.add_subparsers(dest="ctl_command", metavar="SUBCOMMAND", required=True)

    def leaf(
        name: str,
        help_text: str,
        handler: Callable[[argparse.Namespace], int],
        options: argparse.ArgumentParser = common,
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[options], help=help_text, description=_sentence(help_text))
        sub.set_defaults(handler=handler)
        return sub

    status = leaf(
        "status",
        "models, replicas, health, and why something is not placed (the leader's status, as llmgw status "
        "shows it from Consul)",
        _status,
        reading,
    )
    status.add_argument("--model", metavar="MODEL", help="only this model (exit 1 when the status has none)")
    diff = leaf("diff", "what applying FILE would start, stop, roll (nothing changes)", _diff, reading)
    diff.add_argument("file", metavar="FILE", help="catalog YAML (- for standard input)")
    apply = leaf("apply", "validate FILE, show what it does, confirm, and apply it atomically", _apply)
    apply.add_argument("file", metavar="FILE", help="catalog YAML (- for standard input)")
    apply.add_argument("--yes", action="store_true", help="apply without asking (CI)")
    apply.add_argument(
        "--if-match",
        metavar="SHA256",
        help="apply only if the current catalog has this sha256 (default: the one the diff was against)",
    )

    catalog = commands.add_parser(
        "catalog",
        help="the applied catalog and its history",
        description="Read the catalog applied in Consul (get) and who applied which version (history).",
    )
    catalog_commands = catalog.add_subparsers(dest="catalog_command", metavar="SUBCOMMAND", required=True)
    get = catalog_commands.add_parser(
        "get",
        parents=[reading],
        help="print the applied catalog's YAML (its version goes to stderr)",
        description="Print the applied catalog's YAML on stdout; its version, sha256 and who applied it "
        "go to stderr (all of it as JSON with --json).",
    )
    get.set_defaults(handler=_catalog_get)
    history = catalog_commands.add_parser(
        "history",
        parents=[reading],
        help="who applied which version, when, with what hash",
        description="Who applied which catalog version, when, with what sha256, newest first.",
    )
    history.add_argument("--limit", type=int, default=None, help="versions to show (newest first)")
    history.set_defaults(handler=_catalog_history)

    keys = commands.add_parser(
        "keys",
        help="API keys of the router",
        description="Issue, list and revoke the API keys routers accept (Authorization: Bearer KEY). "
        "Only a key's SHA-256 is stored: its secret is shown once, when it is created.",
    )
    key_commands = keys.add_subparsers(dest="keys_command", metavar="SUBCOMMAND", required=True)
    create = key_commands.add_parser(
        "create",
        parents=[common],
        help="issue a key; its secret is printed once, on stdout",
        description="Issue an API key for the routers. Its secret (sk-llmgw-...) is printed once, on "
        "stdout; only its SHA-256 is stored, so a lost secret cannot be shown again: revoke it and "
        "create another.",
    )
    create.add_argument("name", help="who uses the key (a label)")
    create.add_argument(
        "--model",
        action="append",
        dest="models",
        help="a model or alias it may use (repeatable; default all); one the applied catalog does not "
        "have is warned about, not refused (a key can be issued before its model is added)",
    )
    create.add_argument(
        "--requests-per-minute",
        type=int,
        help="request limit (per router, unless the routers share a Redis; default: unlimited)",
    )
    create.add_argument(
        "--tokens-per-minute",
        type=int,
        help="prompt + completion token limit (per router, unless the routers share a Redis; "
        "default: unlimited)",
    )
    create.add_argument(
        "--token-budget",
        type=int,
        help="prompt + completion tokens the key may use per --budget-period, across every router "
        "(needs the routers' shared Redis; past it, 429 insufficient_quota until the period resets; "
        "default: no budget)",
    )
    create.add_argument(
        "--budget-period",
        help="when the budget resets: daily, weekly (Mondays), monthly (the 1st), all at 00:00 UTC; "
        "a whole number of days or hours from the key's creation (30d, 12h); or lifetime (never). "
        "Default: monthly",
    )
    create.set_defaults(handler=_keys_create)
    listing = key_commands.add_parser(
        "list",
        parents=[reading],
        help="every key, revoked ones too",
        description="Every API key with its models and limits, revoked ones too (never a secret).",
    )
    listing.set_defaults(handler=_keys_list)
    revoke = key_commands.add_parser(
        "revoke",
        parents=[common],
        help="revoke a key by id",
        description="Revoke an API key: routers refuse it as soon as they see the change in Consul.",
    )
    revoke.add_argument("key_id", metavar="ID", help="the key's id (k-..., as keys list shows it)")
    revoke.set_defaults(handler=_keys_revoke)
    budget = key_commands.add_parser(
        "budget",
        parents=[common],
        help="set, change or remove a key's token budget",
        description="Set, change or remove an API key's token budget (prompt + completion tokens per "
        "period, across every router). The period's usage so far stays counted: a larger budget leaves "
        "the key more this period; a new period kind starts a new period now.",
    )
    budget.add_argument("key_id", metavar="ID", help="the key's id (k-..., as keys list shows it)")
    amount = budget.add_mutually_exclusive_group(required=True)
    amount.add_argument("--token-budget", type=int, help="tokens per period")
    amount.add_argument("--none", action="store_true", help="remove the key's budget")
    budget.add_argument(
        "--budget-period",
        help="as keys create takes it (default: the key's period, monthly for a key that had no budget)",
    )
    budget.set_defaults(handler=_keys_budget)
    usage = key_commands.add_parser(
        "usage",
        parents=[reading],
        help="a key's requests and tokens per model",
        description="A key's requests and input, output and cached tokens per model, as the routers "
        "counted them in the Redis they share (LLMGW_ROUTER_LIMITS_REDIS_URL), and its token budget's "
        "current period: used, left and when it resets. Kept across router restarts, and across "
        "Redis's when its AOF is on.",
    )
    usage.add_argument("key_id", metavar="ID", help="the key's id (k-..., as keys list shows it)")
    usage.set_defaults(handler=_keys_usage)

    drain = leaf(
        "drain",
        "stop sending requests to MODEL's replicas and stop them; it stays at 0 replicas until a "
        "restart or a catalog change to the model",
        _drain,
    )
    drain.add_argument("model", metavar="MODEL", help="a model name of the applied catalog")
    restart = leaf("restart", "replace MODEL's replicas one at a time (and end a drain)", _restart)
    restart.add_argument("model", metavar="MODEL", help="a model name of the applied catalog")


def _sentence(text: str) -> str:
    """A subcommand's one-line help as the first sentence of its --help."""
    return text[:1].upper() + text[1:] + "."


# --- talking to the admin API ----------------------------------------------------------------------


class Unreachable(Exception):
    """No answer from the admin API (exit 3)."""


class UsageError(Exception):
    """The command line cannot work as given (exit 2)."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def error(self) -> str:
        error = self.body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        return f"HTTP {self.status}"

    @property
    def error_type(self) -> str | None:
        error = self.body.get("error")
        kind = error.get("type") if isinstance(error, dict) else None
        return kind if isinstance(kind, str) else None

    @property
    def error_code(self) -> str | None:
        error = self.body.get("error")
        code = error.get("code") if isinstance(error, dict) else None
        return code if isinstance(code, str) else None


@dataclass(frozen=True, slots=True)
class Connection:
    url: str
    token: str | None = field(repr=False)  # a traceback or a debug print must not show it
    actor: str
    timeout: float
    cacert: str | None
    as_json: bool

    @classmethod
    def of(cls, args: argparse.Namespace, environ: dict[str, str]) -> Connection:
        url = (getattr(args, "admin_url", None) or ADMIN_URL.read(environ) or DEFAULT_URL).rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise UsageError(f"--admin-url {url!r} must look like http://HOST:PORT or https://HOST:PORT")
        timeout = getattr(args, "timeout", DEFAULT_TIMEOUT)
        if timeout <= 0:
            raise UsageError("--timeout must be more than 0")
        token = ADMIN_TOKEN.raw(environ) or None
        if token and parts.scheme == "http" and not is_loopback(parts.hostname):
            print(
                f"llmgw ctl: warning: sending {TOKEN_ENV} in clear text to {parts.hostname}; use https",
                file=sys.stderr,
            )
        return cls(
            url=url,
            token=token,
            actor=getattr(args, "actor", None) or ACTOR.read(environ) or "ctl",
            timeout=timeout,
            cacert=getattr(args, "cacert", None),
            as_json=bool(getattr(args, "json", False)),
        )

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        return asyncio.run(self._request(method, path, body, headers or {}))

    async def _request(
        self, method: str, path: str, body: dict[str, Any] | None, extra: dict[str, str]
    ) -> Answer:
        import ssl

        import aiohttp

        headers = {
            # Always JSON: the admin API refuses any change without it (browser safety).
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": f"llmgw-ctl/{__version__}",
            ACTOR_HEADER: self.actor,
            **extra,
        }
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        context: ssl.SSLContext | bool = True
        if self.cacert is not None:
            try:
                context = ssl.create_default_context(cafile=self.cacert)
            except (OSError, ssl.SSLError) as exc:
                raise UsageError(f"--cacert {self.cacert}: {exc}") from None
        data = json.dumps(body).encode("utf-8") if body is not None else b""
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout)) as session,
                session.request(method, self.url + path, data=data, headers=headers, ssl=context) as resp,
            ):
                raw = await resp.read()
                answer_headers = {k: v for k, v in resp.headers.items()}
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unreachable(
                f"cannot reach the admin API at {self.url}: {exc or type(exc).__name__}"
            ) from None
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            raise Unreachable(
                f"{self.url} answered HTTP {status} with something other than JSON; is it llmgw's admin API?"
            ) from None
        if not isinstance(parsed, dict):
            raise Unreachable(f"{self.url} answered HTTP {status} with JSON that is not an object")
        return Answer(status, parsed, answer_headers)


def _run(args: argparse.Namespace, body: Callable[[Connection], int]) -> int:
    try:
        connection = Connection.of(args, dict(os.environ))
        return body(connection)
    except UsageError as exc:
        print(f"llmgw ctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Unreachable as exc:
        print(f"llmgw ctl: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE


# The ``type`` of every 404 the admin API answers (``llmgw.admin.errors.NOT_FOUND``; that
# module imports aiohttp, which ctl loads only when a command runs).
ADMIN_NOT_FOUND_TYPE = "not_found_error"
NOT_ADMIN_API_HINT = (
    " (is this llmgw's admin API? the router listens on 8080, the admin API on 8081 by default: "
    f"see --admin-url and ${URL_ENV})"
)


def _request_and_print(
    args: argparse.Namespace,
    method: str,
    path: str,
    print_text: Callable[[dict[str, Any]], None],
    *,
    payload: dict[str, Any] | None = None,
) -> int:
    """One request to the admin API and its answer on stdout: the JSON as answered with
    --json, else as ``print_text`` writes it; a refusal is said on stderr. The exit code."""

    def body(connection: Connection) -> int:
        answer = connection.request(method, path, payload)
        if not answer.ok:
            return _refused(answer)
        if connection.as_json:
            _print_json(answer.body)
        else:
            print_text(answer.body)
        return EXIT_OK

    return _run(args, body)


def _refused(answer: Answer) -> int:
    """Say why the admin API said no; the exit code for it."""
    hint = ""
    if answer.status == 401:
        hint = f" (set {TOKEN_ENV} to the admin API's token)"
    elif answer.error_code == "stale_catalog":
        hint = " (run llmgw ctl diff again to see what changed)"
    elif answer.status == 404 and answer.error_type != ADMIN_NOT_FOUND_TYPE:
        hint = NOT_ADMIN_API_HINT  # e.g. the router's "Invalid URL": --admin-url names another server
    print(f"llmgw ctl: {answer.error}{hint}", file=sys.stderr)
    return EXIT_UNREACHABLE if answer.status >= 500 else EXIT_REJECTED


# --- status ----------------------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    def body(connection: Connection) -> int:
        answer = connection.request("GET", "/admin/v1/status")
        if not answer.ok:
            return _refused(answer)
        document = answer.body
        if args.model is not None:
            from llmgw.cli.output import only_model

            chosen = only_model(document, args.model)
            if isinstance(chosen, UnknownModel):
                print(f"llmgw ctl: {chosen}", file=sys.stderr)
                return EXIT_REJECTED
            document = chosen
        if connection.as_json:
            _print_json(document)
            return EXIT_OK
        _print_status(document)
        return EXIT_OK

    return _run(args, body)


def _print_status(raw: dict[str, Any]) -> None:
    import time

    from llmgw.cli.output import output_width, print_status
    from llmgw.core.planning.status import StatusDecodeError, from_json

    try:
        report = from_json(json.dumps(raw))
    except StatusDecodeError as exc:
        print(
            f"llmgw ctl: the status has a shape this llmgw does not know ({exc}); as published:",
            file=sys.stderr,
        )
        _print_json(raw)
        return
    print_status(report, now=time.time(), width=output_width(sys.stdout))


# --- the catalog -----------------------------------------------------------------------------------


def _read_catalog(name: str) -> tuple[str, str]:
    """(filename as ``llmgw catalog check`` names it, text)."""
    if name == "-":
        return "<stdin>", sys.stdin.read()
    try:
        return name, Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {name}: {getattr(exc, 'strerror', None) or exc}") from None


def _print_diagnostics(diagnostics: object, out: TextIO) -> None:
    """The lines ``llmgw catalog check`` prints, from the same fields (its --format json shape)."""
    if not isinstance(diagnostics, list):
        return
    errors = warnings = 0
    for d in diagnostics:
        if not isinstance(d, dict):
            continue
        where = f"{d.get('file')}:{d.get('line')}:{d.get('column')}"
        path = f"{d.get('path')}: " if d.get("path") else ""
        # The fields carry catalog text exactly (JSON): escaped here as Diagnostic.format does.
        print(printable(f"{where}: {d.get('severity')}: {path}{d.get('message')}"), file=out)
        if d.get("severity") == "error":
            errors += 1
        elif d.get("severity") == "warning":
            warnings += 1
    if errors or warnings:
        print(f"{errors} error(s), {warnings} warning(s)", file=sys.stderr)


def _print_preview(answer: dict[str, Any], out: TextIO) -> None:
    _print_diagnostics(answer.get("diagnostics"), out)
    base = answer.get("base")
    if isinstance(base, dict):
        print(
            f"Against catalog version {base.get('version')} (sha256 {str(base.get('sha256'))[:12]}, "
            f"applied by {base.get('applied_by')} at {_when(base.get('applied_at'))}):",
            file=out,
        )
    else:
        print("Against no catalog (none has been applied yet):", file=out)
    for note in answer.get("notes") or []:
        print(printable(f"note: {note}"), file=out)
    try:
        diff = diff_from_dict(answer.get("diff"))
    except DiffDecodeError as exc:
        print(f"llmgw ctl: the diff has a shape this llmgw does not know ({exc})", file=sys.stderr)
        return
    print_diff(diff, out)


def print_diff(diff: CatalogDiff, out: TextIO) -> None:
    """One line per model: effect, name, reason; then routing changes and the counts."""
    if diff.unchanged:
        print("  no changes: nothing starts, stops or rolls", file=out)
        return
    if diff.models:
        width = max(len(c.model) for c in diff.models)
        for change in diff.models:
            print(printable(f"  {change.effect:<7} {change.model:<{width}}  {change.reason}"), file=out)
    for line in diff.routing:
        print(printable(f"  routing {line}"), file=out)
    summary = ", ".join(f"{n} {effect}" for effect, n in sorted(diff.counts().items()))
    print(summary or "no model changes", file=out)


def _catalog_request(connection: Connection, method: str, name: str, headers: dict[str, str]) -> Answer:
    filename, text = _read_catalog(name)
    path = "/admin/v1/catalog" if method == "PUT" else "/admin/v1/catalog/diff"
    return connection.request(method, path, {"catalog": text, "filename": filename}, headers)


def _rejected_catalog(answer: Answer) -> int:
    if answer.error_code == "invalid_catalog":
        # Exactly what `llmgw catalog check` prints, on stdout as it does.
        _print_diagnostics(answer.body.get("diagnostics"), sys.stdout)
        return EXIT_REJECTED
    return _refused(answer)


def _diff(args: argparse.Namespace) -> int:
    def body(connection: Connection) -> int:
        answer = _catalog_request(connection, "POST", args.file, {})
        if not answer.ok:
            return _rejected_catalog(answer)
        if connection.as_json:
            _print_json(answer.body)
        else:
            _print_preview(answer.body, sys.stdout)
        return EXIT_OK

    return _run(args, body)


def _apply(args: argparse.Namespace) -> int:
    def body(connection: Connection) -> int:
        if not args.yes and not sys.stdin.isatty():
            raise UsageError("not a terminal to confirm on: pass --yes to apply without asking (CI)")
        if args.file == "-" and not args.yes:
            raise UsageError("a catalog read from standard input cannot be confirmed there: pass --yes")
        preview = _catalog_request(connection, "POST", args.file, {})
        if not preview.ok:
            return _rejected_catalog(preview)
        # With --json, stdout carries only the apply's answer; the preview goes to stderr.
        _print_preview(preview.body, sys.stderr if connection.as_json else sys.stdout)
        base = preview.body.get("base")
        # Apply exactly over what the diff was computed against, unless told otherwise.
        if args.if_match:
            headers = {"If-Match": f'"{args.if_match}"'}
        elif isinstance(base, dict):
            headers = {"If-Match": f'"{base.get("sha256")}"'}
        else:
            headers = {"If-None-Match": "*"}
        if not args.yes and not _confirm():
            print("llmgw ctl: not applied", file=sys.stderr)
            return EXIT_REJECTED
        answer = _catalog_request(connection, "PUT", args.file, headers)
        if not answer.ok:
            return _rejected_catalog(answer)
        if connection.as_json:
            _print_json(answer.body)
        elif answer.body.get("applied"):
            print(
                f"applied: catalog version {answer.body.get('version')} "
                f"(sha256 {str(answer.body.get('sha256'))[:12]})"
            )
        else:
            print(f"nothing applied: catalog version {answer.body.get('version')} is already this text")
        return EXIT_OK

    return _run(args, body)


def _confirm() -> bool:
    print("Apply this catalog? [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        reply = input()
    except EOFError:
        return False
    return reply.strip().lower() in ("y", "yes")


def _catalog_get(args: argparse.Namespace) -> int:
    def print_text(catalog: dict[str, Any]) -> None:
        print(
            f"# catalog version {catalog.get('version')}, sha256 {catalog.get('sha256')}, "
            f"applied by {catalog.get('applied_by')} at {_when(catalog.get('applied_at'))}",
            file=sys.stderr,
        )
        sys.stdout.write(str(catalog.get("text", "")))

    return _request_and_print(args, "GET", "/admin/v1/catalog", print_text)


def _catalog_history(args: argparse.Namespace) -> int:
    def print_text(history: dict[str, Any]) -> None:
        rows = [
            [
                str(v.get("version")),
                _when(v.get("applied_at")),
                str(v.get("applied_by")),
                str(v.get("sha256"))[:12],
            ]
            for v in history.get("versions") or []
            if isinstance(v, dict)
        ]
        _table(["VERSION", "APPLIED AT", "APPLIED BY", "SHA256"], rows)

    query = f"?limit={args.limit}" if args.limit is not None else ""
    return _request_and_print(args, "GET", "/admin/v1/catalog/history" + query, print_text)


# --- keys ------------------------------------------------------------------------------------------


def _keys_create(args: argparse.Namespace) -> int:
    def body(connection: Connection) -> int:
        answer = connection.request(
            "POST",
            "/admin/v1/keys",
            {
                "name": args.name,
                "models": args.models,
                "requests_per_minute": args.requests_per_minute,
                "tokens_per_minute": args.tokens_per_minute,
                "token_budget": args.token_budget,
                "budget_period": args.budget_period,
            },
        )
        if not answer.ok:
            return _refused(answer)
        _warn_unknown_models(connection, args.models or [])
        if connection.as_json:
            _print_json(answer.body)
            return EXIT_OK
        key = answer.body.get("key") or {}
        print(
            f"created API key {key.get('id')} ({key.get('name')}); the secret below is shown once:",
            file=sys.stderr,
        )
        print(answer.body.get("secret"))
        return EXIT_OK

    return _run(args, body)


def _warn_unknown_models(connection: Connection, models: list[str]) -> None:
    """Warn (stderr) about the names the applied catalog has neither as a model nor as an alias.

    Only a warning: a key may be issued before the catalog that adds its model is
    applied. When the catalog cannot be read, nothing is said (the key was created).
    """
    if not models:
        return
    try:
        answer = connection.request("GET", "/admin/v1/catalog")
    except Unreachable:
        return
    if answer.status == 404 and answer.error_code == "no_catalog":
        names: set[str] = set()
        where = "no catalog has been applied yet"
    elif answer.ok and isinstance(answer.body.get("text"), str):
        applied = catalog_names(str(answer.body["text"]))
        if applied is None:
            return
        names = applied
        where = f"the applied catalog (version {answer.body.get('version')}) has no such model or alias"
    else:
        return
    unknown = [m for m in models if m not in names]
    if unknown:
        print(
            f"llmgw ctl: warning: {', '.join(repr(m) for m in unknown)}: {where}; the key allows it "
            "once a catalog serving it is applied (check the spelling)",
            file=sys.stderr,
        )


def catalog_names(text: str) -> set[str] | None:
    """The model names and aliases of an applied catalog's YAML (what a key's models may
    name), read with the catalog's own hardened loader: the text comes from whatever
    server --admin-url names. None when it does not load here."""
    from llmgw.bundled import read_security_policy
    from llmgw.core.catalog import load_catalog

    catalog = load_catalog(text, filename="the applied catalog", policy=read_security_policy()).catalog
    return None if catalog is None else {*catalog.models, *catalog.aliases}


def _limit(value: object) -> str:
    return "-" if value is None else str(value)


def _budget(key: dict[str, Any]) -> str:
    tokens = key.get("token_budget")
    return "-" if tokens is None else f"{tokens}/{key.get('budget_period')}"


def _keys_list(args: argparse.Namespace) -> int:
    def print_text(listing: dict[str, Any]) -> None:
        rows = [
            [
                str(k.get("id")),
                str(k.get("name")),
                "all" if k.get("models") is None else ",".join(k.get("models") or []),
                _limit(k.get("requests_per_minute")),
                _limit(k.get("tokens_per_minute")),
                _budget(k),
                _when(k.get("created_at")),
                _when(k.get("revoked_at")) if k.get("revoked") else "-",
            ]
            for k in listing.get("keys") or []
            if isinstance(k, dict)
        ]
        _table(["ID", "NAME", "MODELS", "REQ/MIN", "TOK/MIN", "BUDGET", "CREATED", "REVOKED"], rows)

    return _request_and_print(args, "GET", "/admin/v1/keys", print_text)


def _keys_revoke(args: argparse.Namespace) -> int:
    def print_text(revoked: dict[str, Any]) -> None:
        key = revoked.get("key") or {}
        print(f"revoked API key {key.get('id')} ({key.get('name')}) at {_when(key.get('revoked_at'))}")

    return _request_and_print(args, "DELETE", f"/admin/v1/keys/{quote(args.key_id, safe='')}", print_text)


def _keys_budget(args: argparse.Namespace) -> int:
    def print_text(changed: dict[str, Any]) -> None:
        key = changed.get("key") or {}
        budget = _budget(key) if key.get("token_budget") is not None else "removed"
        print(f"API key {key.get('id')} ({key.get('name')}): token budget {budget}")

    payload = {"token_budget": None if args.none else args.token_budget, "budget_period": args.budget_period}
    return _request_and_print(
        args, "PUT", f"/admin/v1/keys/{quote(args.key_id, safe='')}/budget", print_text, payload=payload
    )


def _keys_usage(args: argparse.Namespace) -> int:
    def print_text(report: dict[str, Any]) -> None:
        rows = [
            [
                str(u.get(name))
                for name in ("model", "requests", "input_tokens", "output_tokens", "cached_tokens")
            ]
            for u in report.get("usage") or []
            if isinstance(u, dict)
        ]
        key = report.get("key") or {}
        print(f"API key {key.get('id')} ({key.get('name')})")
        if rows:
            _table(["MODEL", "REQUESTS", "INPUT", "OUTPUT", "CACHED"], rows)
        else:
            print("no usage counted yet")
        budget = report.get("budget")
        if isinstance(budget, dict):
            resets = budget.get("resets_at")
            print(
                f"budget: {budget.get('used')} of {budget.get('tokens')} tokens used this period "
                f"({budget.get('period')}, since {_when(budget.get('period_start'))}), "
                f"{budget.get('left')} left; "
                + (f"resets at {_when(resets)}" if resets is not None else "never resets")
            )

    return _request_and_print(args, "GET", f"/admin/v1/keys/{quote(args.key_id, safe='')}/usage", print_text)


# --- models ----------------------------------------------------------------------------------------


def _model_command(args: argparse.Namespace, command: str) -> int:
    def print_text(done: dict[str, Any]) -> None:
        print(f"{args.model}: {done.get('message')}")

    path = f"/admin/v1/models/{quote(args.model, safe='')}/{command}"
    return _request_and_print(args, "POST", path, print_text, payload={})


def _drain(args: argparse.Namespace) -> int:
    return _model_command(args, "drain")


def _restart(args: argparse.Namespace) -> int:
    return _model_command(args, "restart")
