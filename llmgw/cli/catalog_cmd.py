"""``llmgw catalog check | schema | upgrade``: the catalog tools CI pipelines and editors call.

Output follows the compiler convention so editors and CI annotate the right
line: ``FILE:LINE:COL: error: PATH: message``. Exit codes: 0 valid (warnings
are printed, not fatal), 1 invalid, 2 usage (including an unreadable file).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from llmgw.cli import EXIT_OK, EXIT_REJECTED, EXIT_USAGE

if TYPE_CHECKING:  # imported where used: every llmgw command builds this parser
    from llmgw.core.catalog import LoadResult, SecurityPolicy


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("catalog", help="check, describe and upgrade model catalogs")
    commands = parser.add_subparsers(dest="catalog_command", metavar="SUBCOMMAND", required=True)

    check = commands.add_parser(
        "check",
        help="validate catalog files; every problem, one per line, compiler-style",
        description="Validate catalog files. Exit 0 when valid (warnings do not fail), "
        "1 when any file is invalid, 2 on usage errors.",
    )
    check.add_argument("files", nargs="+", metavar="FILE", help="catalog YAML files (- for standard input)")
    check.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="json: a list of {file, line, column, path, severity, message}",
    )
    check.add_argument("--policy", type=Path, help="engine security policy (default: the bundled one)")
    check.set_defaults(handler=_check)

    schema = commands.add_parser("schema", help="print the catalog's JSON Schema (for editor completion)")
    schema.set_defaults(handler=_schema)

    upgrade = commands.add_parser(
        "upgrade",
        help="rewrite legacy spellings, keeping comments and key order",
        description="Print what would change as a diff; --write changes the file in place.",
    )
    upgrade.add_argument("file", type=Path, metavar="FILE")
    upgrade.add_argument("--write", action="store_true", help="write the upgraded catalog back to FILE")
    upgrade.add_argument("--policy", type=Path, help="engine security policy (default: the bundled one)")
    upgrade.set_defaults(handler=_upgrade)


def _read_text(name: str) -> tuple[str, str] | None:
    if name == "-":
        return "<stdin>", sys.stdin.read()
    try:
        return name, Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"llmgw catalog: cannot read {name}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return None


def load_catalog_file(name: str, policy: SecurityPolicy) -> LoadResult | None:
    """Read and load one catalog file; None (after saying why on stderr) when it cannot be read."""
    from llmgw.core.catalog import load_catalog

    read = _read_text(name)
    if read is None:
        return None
    filename, text = read
    return load_catalog(text, filename=filename, policy=policy)


def _check(args: argparse.Namespace) -> int:
    from llmgw.bundled import read_security_policy
    from llmgw.core.diagnostics import Diagnostic, Severity

    policy = read_security_policy(args.policy)
    diagnostics: list[Diagnostic] = []
    unreadable = False
    for name in args.files:
        result = load_catalog_file(name, policy)
        if result is None:
            unreadable = True
            continue
        diagnostics.extend(result.diagnostics)
    if args.format == "json":
        print(json.dumps([d.as_dict() for d in diagnostics], indent=2))
    else:
        for diagnostic in diagnostics:
            print(diagnostic.format())
        errors = sum(d.severity is Severity.ERROR for d in diagnostics)
        warnings = len(diagnostics) - errors
        if errors or warnings:
            print(f"{errors} error(s), {warnings} warning(s)", file=sys.stderr)
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

    read = _read_text(str(args.file))
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
