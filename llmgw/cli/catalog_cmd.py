"""``llmgw catalog check | schema | upgrade``: the catalog tools CI pipelines and editors call.

Output follows the compiler convention so editors and CI annotate the right
line: ``FILE:LINE:COL: error: PATH: message``. Exit codes: 0 valid (warnings
are printed, not fatal), 1 invalid, 2 usage (including an unreadable file, which
is also a diagnostic, and wins over 1: the other files are still checked), 3 the
mirror given with ``--mirror`` cannot be read.

Images and file URL sources are checked against the cluster's allowlists as this
environment sets them (``LLMGW_ALLOWED_IMAGES``, ``LLMGW_SOURCE_ALLOWED_NETWORKS``,
read as ``llmgw serve`` reads them), with the renderer's words.

With ``--mirror URL|DIR`` (or ``LLMGW_MIRROR_URL``), every ``mirror:NAME@VERSION``
source must name a version that mirror has complete; the index is read once, and
only when a file has a mirror source. Without it, mirror sources are checked for
their form only.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from llmgw.cli import EXIT_OK, EXIT_REJECTED, EXIT_USAGE
from llmgw.flags import MIRROR_URL

if TYPE_CHECKING:  # imported where used: every llmgw command builds this parser
    from llmgw.core.catalog import Catalog, ClusterAllowlists, LoadResult, SecurityPolicy
    from llmgw.core.mirror import MirrorIndex

MIRROR_ENV = MIRROR_URL.name
EXIT_MIRROR_UNREADABLE = 3


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "catalog",
        help="check catalogs, print their JSON Schema, upgrade legacy spellings",
        description="The catalog (YAML) declares the models llmgw serves: their engine profiles, GPU "
        "shapes, scaling, aliases, fallbacks and guard policies. These commands change nothing that "
        "runs; `llmgw ctl apply` does.",
    )
    commands = parser.add_subparsers(dest="catalog_command", metavar="SUBCOMMAND", required=True)

    check = commands.add_parser(
        "check",
        help="validate catalog files; every problem, one per line, compiler-style",
        description="Validate catalog files. Every file is checked, and every problem printed, "
        "even after one that cannot be read (it is reported as an error diagnostic on the file, in "
        "text and JSON alike). Exit 0 when all are valid (warnings do not fail), 1 when any file is "
        "invalid, 2 when any file cannot be read (2 wins over 1: look at the diagnostics for the "
        "invalid files) or on usage errors, 3 when the --mirror cannot be read (checking stops). "
        "mirror:NAME@VERSION sources are checked against a mirror only with --mirror "
        f"(or ${MIRROR_ENV}); without it, only their form is checked. A profile's image must come "
        "from $LLMGW_ALLOWED_IMAGES (default: the engines' image repositories) with a tag naming an "
        "engine release llmgw supports (vLLM 0.11.0, SGLang 0.5.3, llama.cpp b6700 or later) or a "
        "digest in $LLMGW_TRUSTED_IMAGE_DIGESTS (a profile without image runs the defaults: vLLM "
        "0.34.0, SGLang 0.5.23, llama.cpp b11434, its CPU build with gpus_per_node: 0), and a file URL may "
        "name a non-global address only inside $LLMGW_SOURCE_ALLOWED_NETWORKS, as this environment "
        "sets them: run it with the cluster's values (`llmgw ctl diff` checks with the cluster's own).",
    )
    check.add_argument("files", nargs="+", metavar="FILE", help="catalog YAML files (- for standard input)")
    check.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="json: a list of {file, line, column, path, severity, message}",
    )
    check.add_argument("--policy", type=Path, help="engine security policy (default: the bundled one)")
    check.add_argument(
        "--mirror",
        metavar="URL|DIR",
        help="check that every mirror:NAME@VERSION source is complete in this mirror (its http(s) "
        f"address, or its store: a directory or s3://BUCKET/PREFIX; default ${MIRROR_ENV}); without "
        "it, mirror sources are only checked for their form",
    )
    check.set_defaults(handler=_check)

    schema = commands.add_parser(
        "schema",
        help="print the catalog's JSON Schema (for editor completion)",
        description="Print the catalog's JSON Schema on stdout, e.g. for a YAML language server: "
        "`llmgw catalog schema > catalog.schema.json`. The policy and cross-model rules (aliases, "
        "fallbacks, GPU shapes) are checked by `llmgw catalog check`, not by the schema.",
    )
    schema.set_defaults(handler=_schema)

    upgrade = commands.add_parser(
        "upgrade",
        help="rewrite legacy spellings, keeping comments and key order",
        description="Rewrite spellings older llmgw versions accepted (each is read with a warning by "
        "`llmgw catalog check`) into today's, keeping comments and key order. Prints the change as a "
        "unified diff; --write changes the file in place. Exit 0 when upgraded or nothing to upgrade, "
        "1 when the catalog has errors to fix first, 2 when FILE cannot be read.",
    )
    upgrade.add_argument("file", type=Path, metavar="FILE", help="catalog YAML file")
    upgrade.add_argument("--write", action="store_true", help="write the upgraded catalog back to FILE")
    upgrade.add_argument("--policy", type=Path, help="engine security policy (default: the bundled one)")
    upgrade.set_defaults(handler=_upgrade)


class CatalogUnreadable(Exception):
    """A catalog file that cannot be read; the message says which and why."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"cannot read {name}: {reason}")
        self.name = name
        self.reason = reason


def _read(name: str) -> tuple[str, str]:
    if name == "-":
        return "<stdin>", sys.stdin.read()
    try:
        return name, Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogUnreadable(name, getattr(exc, "strerror", None) or str(exc)) from None


def read_catalog_text(name: str) -> tuple[str, str] | None:
    """(filename as diagnostics name it, text); None (after saying why on stderr) when unreadable."""
    try:
        return _read(name)
    except CatalogUnreadable as exc:
        print(f"llmgw catalog: {exc}", file=sys.stderr)
        return None


def load_catalog_file(
    name: str, policy: SecurityPolicy, allowlists: ClusterAllowlists | None = None
) -> LoadResult | None:
    """Read and load one catalog file; None (after saying why on stderr) when it cannot be read."""
    from llmgw.core.catalog import load_catalog

    read = read_catalog_text(name)
    if read is None:
        return None
    filename, text = read
    return load_catalog(text, filename=filename, policy=policy, allowlists=allowlists)


def catalog_from_file(
    name: str, policy: SecurityPolicy, allowlists: ClusterAllowlists | None = None
) -> Catalog | int:
    """The file's catalog, its diagnostics printed on stderr; else the exit code to end with
    (2: the file cannot be read, 1: the catalog is invalid), for the commands that run one."""
    loaded = load_catalog_file(name, policy, allowlists)
    if loaded is None:
        return EXIT_USAGE
    for diagnostic in loaded.diagnostics:
        print(diagnostic.format(), file=sys.stderr)
    return EXIT_REJECTED if loaded.catalog is None else loaded.catalog


class _MirrorUnreadable(Exception):
    pass


class _MirrorIndex:
    """The mirror's index, read once, and only when a catalog has a mirror source."""

    def __init__(self, location: str) -> None:
        self.location = location
        self._index: MirrorIndex | None = None

    def get(self) -> MirrorIndex:
        if self._index is None:
            # aiohttp and the mirror's I/O load only when a catalog has a mirror source.
            from llmgw.mirror import MirrorError
            from llmgw.mirror.indexing import load_index

            try:
                self._index = load_index(self.location)
            except MirrorError as exc:
                raise _MirrorUnreadable(str(exc)) from None
        return self._index


def _mirror_location(args: argparse.Namespace) -> str | None:
    location: str | None = args.mirror or MIRROR_URL.read(os.environ)
    if location is None or location.startswith(("http://", "https://", "s3://")):
        return location
    if not Path(location).is_dir():
        raise ValueError(f"--mirror {location}: not a directory (give the mirror's http(s) URL or its store)")
    return location


def _check(args: argparse.Namespace) -> int:
    from llmgw.bundled import read_security_policy
    from llmgw.core.catalog import load_catalog
    from llmgw.core.catalog.mirror_check import find_mirror_sources, mirror_diagnostics
    from llmgw.core.diagnostics import Diagnostic, Severity, sort_diagnostics
    from llmgw.render.settings import RenderSettingsError, render_settings_from_env

    policy = read_security_policy(args.policy)
    try:
        location = _mirror_location(args)
        # The allowlists the cluster renders with, read the way `llmgw serve` reads them.
        allowlists = render_settings_from_env(os.environ).allowlists
    except (ValueError, RenderSettingsError) as exc:
        print(f"llmgw catalog: {exc}", file=sys.stderr)
        return EXIT_USAGE
    mirror = _MirrorIndex(location) if location is not None else None
    diagnostics: list[Diagnostic] = []
    unreadable = False
    for name in args.files:
        try:
            filename, text = _read(name)
        except CatalogUnreadable as exc:
            # Said like any other problem (JSON consumers see it too); the other files are still checked.
            unreadable = True
            message = f"cannot read the file: {exc.reason}"
            diagnostics.append(Diagnostic(Severity.ERROR, (), message, file=name))
            continue
        result = load_catalog(text, filename=filename, policy=policy, allowlists=allowlists)
        found = list(result.diagnostics)
        if mirror is not None:
            sources = find_mirror_sources(text, filename=filename)
            if sources.found:
                try:
                    index = mirror.get()
                except _MirrorUnreadable as exc:
                    print(f"llmgw catalog: cannot read the mirror's index: {exc}", file=sys.stderr)
                    return EXIT_MIRROR_UNREADABLE
                found += mirror_diagnostics(sources, index)
        diagnostics.extend(sort_diagnostics(found))
    if args.format == "json":
        print(json.dumps([d.as_dict() for d in diagnostics], indent=2))
    else:
        for diagnostic in diagnostics:
            print(diagnostic.format())
        errors = sum(d.severity is Severity.ERROR for d in diagnostics)
        warnings = sum(d.severity is Severity.WARNING for d in diagnostics)
        notes = len(diagnostics) - errors - warnings
        if errors or warnings or notes:
            print(f"{errors} error(s), {warnings} warning(s), {notes} note(s)", file=sys.stderr)
    if unreadable:
        return EXIT_USAGE
    return EXIT_REJECTED if any(d.severity is Severity.ERROR for d in diagnostics) else EXIT_OK


def _schema(args: argparse.Namespace) -> int:
    from llmgw.core.catalog import json_schema

    print(json.dumps(json_schema(), indent=2))
    return EXIT_OK


def _upgrade(args: argparse.Namespace) -> int:
    from llmgw.bundled import read_security_policy
    from llmgw.core.catalog import upgrade_catalog
    from llmgw.core.diagnostics import Severity

    read = read_catalog_text(str(args.file))
    if read is None:
        return EXIT_USAGE
    filename, text = read
    result = upgrade_catalog(text, filename=filename, policy=read_security_policy(args.policy))
    for diagnostic in result.load.diagnostics:
        if diagnostic.severity is Severity.ERROR:
            print(diagnostic.format())
    if result.load.errors:
        print(f"{filename}: not upgraded: fix the errors above first", file=sys.stderr)
        return EXIT_REJECTED
    if not result.changes:
        print(f"{filename}: nothing to upgrade", file=sys.stderr)
        return EXIT_OK
    for change in result.changes:
        print(f"{filename}: {change.description}", file=sys.stderr)
    if args.write:
        args.file.write_text(result.text, encoding="utf-8")
        print(f"{filename}: wrote {len(result.changes)} change(s)", file=sys.stderr)
    else:
        sys.stdout.writelines(
            difflib.unified_diff(
                text.splitlines(keepends=True),
                result.text.splitlines(keepends=True),
                fromfile=filename,
                tofile=f"{filename} (upgraded)",
            )
        )
        print("run again with --write to apply", file=sys.stderr)
    return EXIT_OK
