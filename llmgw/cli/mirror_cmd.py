"""``llmgw mirror add | list | fetch | serve | gc``: the model mirror's command line.

Parses arguments, wires settings, store and progress, runs one operation and
maps its outcome to an exit code: 0 done, 1 the operation failed (a download,
a verification, an incomplete version), 2 usage (a bad argument, a refused
source). Results go to stdout, progress and errors to stderr; every message
passes through the Hub token's redaction before it is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from llmgw.cli import EXIT_OK, EXIT_REJECTED, EXIT_USAGE
from llmgw.core.mirror import (
    ManifestError,
    MirrorIndex,
    MirrorRef,
    MirrorRefError,
    SelectionError,
    SourceError,
    check_name,
    check_version,
    gguf_to_load,
    is_mirror_source,
    parse_ref,
    parse_sources,
)
from llmgw.core.mirror.sources import HUB_HOSTS, split_url
from llmgw.flags import MIRROR_STORE, parse_rate
from llmgw.mirror.credentials import HubToken, read_hub_token
from llmgw.mirror.errors import MirrorError
from llmgw.mirror.progress import ProgressMode, human_bytes, make_progress
from llmgw.mirror.settings import MirrorSettings

STORE_ENV = MIRROR_STORE.name
DEFAULT_PORT = 8900
_EXITS = "Exit 0 done, 1 the operation failed, 2 usage."


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "mirror",
        help="mirror model weights once, verify them, serve them to the nodes",
        description="A store of model versions (NAME@VERSION), each fetched once and verified byte for "
        "byte. A catalog profile names one as source: mirror:NAME@VERSION; its replicas then fetch "
        "and verify it (mirror fetch) before the engine starts, from the server LLMGW_MIRROR_URL names. "
        "The store is a directory (--store or LLMGW_MIRROR_STORE); serve and list also read an "
        "S3-compatible bucket (s3://BUCKET/PREFIX, the s3 extra, AWS_* variables). Exit 0 done, 1 the "
        "operation failed (a download, a verification, an incomplete version), 2 usage.",
    )
    commands = parser.add_subparsers(dest="mirror_command", metavar="SUBCOMMAND", required=True)

    add = commands.add_parser(
        "add",
        help="download a model version into the store (resumable; run again to resume)",
        description="Mirror a Hugging Face repository (what an engine needs: safetensors + index, config, "
        "tokenizer) or one or more file URLs as NAME@VERSION. VERSION defaults to the resolved commit. "
        "HF_TOKEN / HUGGING_FACE_HUB_TOKEN / $HF_HOME/token is used for the Hub and never printed; "
        "LLMGW_MIRROR_HF_ENDPOINT (else HF_ENDPOINT) points at another Hub. Progress goes to stderr, "
        "the result to stdout. Exit 0 complete, 1 not complete (run the same command again to "
        "resume), 2 usage or a refused source.",
    )
    add.add_argument(
        "ref",
        metavar="NAME[@VERSION]",
        help="the name catalogs use as mirror:NAME@VERSION (VERSION defaults to the commit's first 12 "
        "hex digits)",
    )
    add.add_argument("sources", nargs="+", metavar="SOURCE", help="ORG/NAME, or http(s) URLs of files")
    add.add_argument(
        "--revision", help="branch, tag or commit of the repository (default main); the commit is recorded"
    )
    add.add_argument(
        "--file",
        dest="patterns",
        action="append",
        default=[],
        metavar="NAME|GLOB",
        help="take these files of the repository (e.g. a GGUF) instead of the safetensors set",
    )
    _store_argument(add)
    _transfer_arguments(add)
    add.set_defaults(handler=_add)

    listing = commands.add_parser(
        "list",
        help="versions with their state (complete/incomplete/downloading)",
        description="Every version of a store (or of a running mirror, with --mirror) with its state, "
        "files and size. " + _EXITS,
    )
    where = listing.add_mutually_exclusive_group()
    where.add_argument("--store", help=f"store directory, or s3://BUCKET/PREFIX (default ${STORE_ENV})")
    where.add_argument("--mirror", metavar="URL", help="ask a running mirror instead of reading a store")
    listing.add_argument("--json", action="store_true", help="the index as JSON, for scripts")
    listing.set_defaults(handler=_list)

    fetch = commands.add_parser(
        "fetch",
        help="node side: fetch a complete version into DEST and verify every file's sha256",
        description="What a replica's fetch-model prestart task runs on its node: fetch a complete "
        "version's files into DIR (resuming partial files, keeping verified ones) and check every "
        "sha256. Exit 0 only when every file of the manifest is in DIR with its sha256; a file that "
        "fails verification is deleted and named on stderr, exit 1; 2 usage.",
    )
    fetch.add_argument(
        "--mirror", required=True, metavar="URL", help="the mirror server, e.g. http://mirror:8900"
    )
    fetch.add_argument(
        "--ref", required=True, metavar="NAME@VERSION", help="the version to fetch (mirror: prefix allowed)"
    )
    fetch.add_argument("--dest", required=True, type=Path, metavar="DIR", help="the model directory to fill")
    fetch.add_argument(
        "--trust-stamps",
        action="store_true",
        help="skip re-hashing files an earlier fetch verified and nobody touched since "
        "(same size, mtime, inode)",
    )
    fetch.add_argument(
        "--gguf-path-file",
        type=Path,
        metavar="FILE",
        help="for llama.cpp: once verified, write into FILE the path of the GGUF file to load "
        "(the single .gguf, or the first part of a split one); exit 1 when the version holds "
        "no GGUF model or more than one",
    )
    _transfer_arguments(fetch)
    fetch.set_defaults(handler=_fetch)

    serve = commands.add_parser(
        "serve",
        help="serve the store over HTTP (index, manifests, files with Range)",
        description="Serve the store's complete versions to the nodes over plain HTTP: "
        "/v1/mirror/index, /models/NAME/VERSION/manifest.json and files (with Range, so fetches "
        "resume), /healthz. There is no authentication: listen only where the GPU nodes, and "
        "nobody else, can reach it. Runs until SIGINT or SIGTERM.",
    )
    _store_argument(serve, readable_s3=True)
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: give the nodes' side)"
    )
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    serve.set_defaults(handler=_serve)

    gc = commands.add_parser(
        "gc",
        help="delete versions no catalog or --keep references (never one that is downloading)",
        description="Delete every version of a directory store that no --catalog file and no --keep "
        "names; a version being downloaded is never deleted. Give at least one --keep or --catalog; "
        "try --dry-run first. " + _EXITS,
    )
    gc.add_argument(
        "--keep",
        action="append",
        default=[],
        metavar="REF",
        help="NAME@VERSION or mirror:NAME@VERSION to keep (repeatable)",
    )
    gc.add_argument(
        "--catalog",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="keep every mirror: source of this catalog (repeatable)",
    )
    gc.add_argument(
        "--policy", type=Path, help="engine security policy for --catalog (default: the bundled one)"
    )
    gc.add_argument("--dry-run", action="store_true", help="print what would be deleted; delete nothing")
    gc.add_argument(
        "--json", action="store_true", help="what was (or would be) deleted, as JSON, for scripts"
    )
    _store_argument(gc)
    gc.set_defaults(handler=_gc)


def _store_argument(parser: argparse.ArgumentParser, *, readable_s3: bool = False) -> None:
    where = "store directory, or s3://BUCKET/PREFIX" if readable_s3 else "store directory"
    parser.add_argument("--store", help=f"{where} (default ${STORE_ENV})")


def _transfer_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency", type=int, help="files downloaded at once (default $LLMGW_MIRROR_CONCURRENCY or 4)"
    )
    parser.add_argument(
        "--limit-rate",
        metavar="RATE",
        help="bandwidth limit over all files in bytes/s, e.g. 50M (default $LLMGW_MIRROR_BANDWIDTH_LIMIT)",
    )
    parser.add_argument(
        "--progress",
        choices=[m.value for m in ProgressMode],
        default=ProgressMode.AUTO.value,
        help="bars on a terminal, plain lines otherwise (auto), or none",
    )


class _Usage(Exception):
    """A bad argument: exit 2."""


_Say = Callable[[str], str]  # redacts the Hub token from a message
_Body = Callable[[argparse.Namespace, _Say], int]


def _settings(args: argparse.Namespace) -> MirrorSettings:
    try:
        settings = MirrorSettings.from_env(os.environ)
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    if getattr(args, "concurrency", None) is not None:
        if args.concurrency < 1:
            raise _Usage("--concurrency must be at least 1")
        settings = replace(settings, concurrency=args.concurrency)
    if getattr(args, "limit_rate", None):
        try:
            settings = replace(settings, bandwidth_limit=parse_rate(args.limit_rate))
        except ValueError as exc:
            raise _Usage(str(exc)) from None
    return settings


def _store_location(args: argparse.Namespace) -> str:
    location: str | None = args.store or MIRROR_STORE.read(os.environ)
    if not location:
        raise _Usage(f"give --store DIR (or set {STORE_ENV})")
    return location


def _run(name: str, args: argparse.Namespace, token: HubToken | None, body: _Body) -> int:
    """Run a subcommand body; print its failure (token-redacted) and map it to an exit code."""

    def say(text: str) -> str:
        return token.redact(text) if token is not None else text

    try:
        return body(args, say)
    except _Usage as exc:
        print(f"llmgw mirror {name}: {say(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except (SourceError, MirrorRefError) as exc:
        print(f"llmgw mirror {name}: {say(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except (MirrorError, ManifestError, OSError) as exc:
        print(f"llmgw mirror {name}: {say(str(exc))}", file=sys.stderr)
        return EXIT_REJECTED


# -- add ------------------------------------------------------------------------------------
def _add(args: argparse.Namespace) -> int:
    token = read_hub_token(os.environ, Path.home())
    return _run("add", args, token, lambda a, say: _add_body(a, say, token))


def _add_body(args: argparse.Namespace, say: _Say, token: HubToken | None) -> int:
    from llmgw.mirror.adding import AddRequest, add_version
    from llmgw.mirror.store import open_store

    settings = _settings(args)
    name, _, version = args.ref.removeprefix("mirror:").partition("@")
    check_name(name)  # refused before any request to the Hub
    if version:
        check_version(version)
    hub = split_url(settings.hub_endpoint)
    hosts = HUB_HOSTS | ({hub.host} if hub else set())
    request = AddRequest(
        name=name,
        version=version or None,
        sources=parse_sources(args.sources, frozenset(hosts)),
        revision=args.revision,
        patterns=tuple(args.patterns),
    )
    store = open_store(_store_location(args))
    progress = make_progress(ProgressMode(args.progress), sys.stderr, settings.progress_interval)
    try:
        outcome = asyncio.run(add_version(store, request, settings, progress, token))
    except MirrorRefError as exc:
        raise _Usage(str(exc)) from None
    status = outcome.status
    for failure in outcome.failures:
        print(say(f"llmgw mirror add: {failure}"), file=sys.stderr)
    if outcome.complete:
        print(
            f"{status.ref.source} complete: {status.files_total} files, {human_bytes(status.bytes_verified)}"
            f" ({len(outcome.downloaded)} downloaded, {outcome.already_verified} already verified)"
        )
        return EXIT_OK
    print(
        say(f"{status.ref.source} is not complete: {status.summary}; run the same command again to resume"),
        file=sys.stderr,
    )
    return EXIT_REJECTED


# -- list -------------------------------------------------------------------------------------
def _list(args: argparse.Namespace) -> int:
    return _run("list", args, None, _list_body)


def _list_body(args: argparse.Namespace, say: _Say) -> int:
    from llmgw.mirror.indexing import load_index

    index = load_index(args.mirror) if args.mirror else load_index(_store_location(args))
    if args.json:
        sys.stdout.write(index.to_json())
        return EXIT_OK
    _print_index(index)
    return EXIT_OK


def _print_index(index: MirrorIndex) -> None:
    if not index.versions:
        print("no versions")
        return
    rows = [("REF", "STATE", "FILES", "SIZE", "SOURCE", "REVISION")]
    for v in index.versions:
        size = human_bytes(v.bytes_verified)
        if v.bytes_verified != v.bytes_total:
            size += f" of {human_bytes(v.bytes_total)}"
        rows.append(
            (
                str(v.ref),
                v.state.value,
                f"{v.files_verified}/{v.files_total}",
                size,
                v.source,
                (v.revision or "-")[:12],
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


# -- fetch -------------------------------------------------------------------------------------
def _fetch(args: argparse.Namespace) -> int:
    return _run("fetch", args, None, _fetch_body)


def _fetch_body(args: argparse.Namespace, say: _Say) -> int:
    from llmgw.mirror.fetching import FetchFailed, fetch_version

    ref = parse_ref(args.ref)
    settings = _settings(args)
    progress = make_progress(ProgressMode(args.progress), sys.stderr, settings.progress_interval)
    try:
        report = asyncio.run(
            fetch_version(args.mirror, ref, args.dest, settings, progress, trust_stamps=args.trust_stamps)
        )
    except FetchFailed as exc:
        for failure in exc.failures:
            print(f"llmgw mirror fetch: {failure}", file=sys.stderr)
        print(f"llmgw mirror fetch: {ref.source} is NOT ready in {args.dest}", file=sys.stderr)
        return EXIT_REJECTED
    for path in report.kept:
        print(f"kept     {path} (sha256 verified)")
    for path in report.replaced:
        print(f"replaced {path} (local copy did not match the manifest)")
    for result in report.fetched:
        resumed = f", resumed at {result.resumed_from} bytes" if result.resumed_from else ""
        print(f"fetched  {result.job.label} ({human_bytes(result.size)}{resumed})")
    manifest = report.manifest
    print(
        f"{ref.source} ready in {args.dest}: {len(manifest.files)} files, "
        f"{human_bytes(manifest.total_bytes)}, every sha256 verified"
    )
    if args.gguf_path_file is not None:
        try:
            gguf = gguf_to_load(f.path for f in manifest.files)
        except SelectionError as exc:
            print(f"llmgw mirror fetch: {ref.source}: {exc}", file=sys.stderr)
            return EXIT_REJECTED
        args.gguf_path_file.write_text(f"{args.dest / gguf}\n", encoding="utf-8")
        print(f"llama.cpp loads {args.dest / gguf}")
    return EXIT_OK


# -- serve -------------------------------------------------------------------------------------
def _serve(args: argparse.Namespace) -> int:
    return _run("serve", args, None, _serve_body)


def _serve_body(args: argparse.Namespace, say: _Say) -> int:
    from aiohttp import web

    from llmgw.mirror.server import create_app
    from llmgw.mirror.store import open_read_store

    store = open_read_store(_store_location(args))
    print(f"serving {store.describe()} on http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    web.run_app(create_app(store), host=args.host, port=args.port, print=None)
    return EXIT_OK


# -- gc ------------------------------------------------------------------------------------------
def _gc(args: argparse.Namespace) -> int:
    return _run("gc", args, None, _gc_body)


def catalog_mirror_refs(path: Path, policy: Path | None = None) -> frozenset[MirrorRef]:
    """Every ``mirror:`` source of a catalog file; refuses an invalid catalog (gc must not guess)."""
    from llmgw.bundled import read_security_policy
    from llmgw.core.catalog import load_catalog

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise _Usage(f"{path}: {exc.strerror}") from None
    result = load_catalog(text, filename=str(path), policy=read_security_policy(policy))
    if result.catalog is None:
        raise MirrorError(
            f"{path} is not a valid catalog (run `llmgw catalog check {path}`); nothing was deleted"
        )
    return frozenset(
        parse_ref(profile.source)
        for model in result.catalog.models.values()
        for profile in model.profiles
        if profile.source is not None and is_mirror_source(profile.source)
    )


def _gc_body(args: argparse.Namespace, say: _Say) -> int:
    from llmgw.mirror.collecting import collect_garbage
    from llmgw.mirror.store import open_store

    if not args.keep and not args.catalog:
        raise _Usage("give --keep REF or --catalog FILE: gc with nothing kept would delete every version")
    keep = {parse_ref(r) for r in args.keep}
    for catalog in args.catalog:
        keep |= catalog_mirror_refs(catalog, args.policy)
    store = open_store(_store_location(args))
    result = collect_garbage(store, keep, dry_run=args.dry_run)
    skipped = {d.status.ref for d, _ in result.skipped}
    if args.json:
        doc = {
            "dry_run": result.dry_run,
            "versions": [
                {
                    "ref": str(d.status.ref),
                    "state": d.status.state.value,
                    "bytes": d.status.bytes_verified,
                    "delete": d.delete and d.status.ref not in skipped,
                    "reason": d.reason,
                }
                for d in result.plan.decisions
            ],
            "unknown_keeps": [str(r) for r in result.plan.unknown_keeps],
        }
        print(json.dumps(doc, indent=2, sort_keys=True))
        return EXIT_OK
    verb = "would delete" if result.dry_run else "deleted"
    for d in result.plan.decisions:
        if d.delete and d.status.ref not in skipped:
            print(f"{verb} {d.status.ref} ({d.reason}, {human_bytes(d.status.bytes_verified)})")
        elif d.delete:
            print(f"kept    {d.status.ref} (a download started meanwhile)")
        else:
            print(f"kept    {d.status.ref} ({d.reason})")
    for ref in result.plan.unknown_keeps:
        print(f"warning: {ref} is kept but the mirror does not have it", file=sys.stderr)
    freed = sum(d.status.bytes_verified for d in result.plan.deletions if d.status.ref not in skipped)
    print(f"{verb} {len(result.plan.deletions) - len(skipped)} version(s), {human_bytes(freed)}")
    return EXIT_OK
