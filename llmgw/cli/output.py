"""What the command lines print: aligned tables, ``--json`` documents, times, and the status report.

Owns the human shapes llmgw's commands share, so ``llmgw status`` and ``llmgw ctl status``
print a cluster's status the same way. Every function writes to the stream it is given
(stdout by default); none decides an exit code or reads the clock (``now`` is passed in).

Must not: import anything heavy at module level. Every ``llmgw`` command imports the CLI
modules to build its parser, so this module stays at the standard library.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from llmgw.core.durations import format_utc

if TYPE_CHECKING:
    from llmgw.core.planning.status import ModelStatus, ReplicaStatus, StatusReport


def print_json(value: object, out: TextIO | None = None) -> None:
    """Indented JSON, non-ASCII kept as is (model names may carry it)."""
    print(json.dumps(value, indent=2, ensure_ascii=False), file=out or sys.stdout)


class UnknownModel(str):
    """Why a status document has no entry for the model asked about (a message for stderr)."""

    __slots__ = ()


def only_model(document: dict[str, Any], model: str) -> dict[str, Any] | UnknownModel:
    """The status document (as published, JSON) with only ``model``'s entry kept."""
    models = document.get("models")
    entries = [m for m in models if isinstance(m, Mapping)] if isinstance(models, list) else []
    chosen = [m for m in entries if m.get("model") == model]
    if not chosen:
        names = ", ".join(sorted(str(m.get("model")) for m in entries)) or "none"
        return UnknownModel(f"no model {model!r} in the status (models: {names})")
    return {**document, "models": chosen}


def format_when(seconds: object) -> str:
    """Unix seconds as an RFC 3339 UTC time; ``-`` for anything that is not a number."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return "-"
    return format_utc(seconds)


def format_age(seconds: float) -> str:
    """A duration the way people read it at a glance: ``42s``, ``3m05s``, ``2h10m``, ``3d4h``."""
    total = max(0, int(seconds))
    if total < 60:
        return f"{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h"


# The last column of a table is free text (why, a reason); narrower than this, a table
# would be a column of fragments, so its rows are stacked instead.
MIN_TEXT_COLUMN = 24


def output_width(out: TextIO) -> int | None:
    """The columns to lay a table out in: ``COLUMNS`` when set, else the terminal's width when
    ``out`` is one; None (no limit) for a pipe or a file, so scripts reading lines get whole
    rows (as ``ps`` does: unlimited width when its output is not a terminal)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.strip().isdigit() and int(columns) > 0:
        return int(columns)
    try:
        if out.isatty():
            return shutil.get_terminal_size().columns
    except (AttributeError, ValueError, OSError):
        pass
    return None


def print_table(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    out: TextIO | None = None,
    *,
    width: int | None = None,
) -> None:
    """Columns padded to their widest cell, two spaces apart; the last column is not padded.

    Within ``width``: a last column (free text) that would run past it wraps inside its
    own column; when the other columns leave it less than ``MIN_TEXT_COLUMN``, each row is
    stacked instead (its first cell; then ``header value`` pairs, as many to a line as
    fit; then its free text). No line is longer
    than ``width``, so a terminal never wraps a row into the next one."""
    stream = out or sys.stdout
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=False)]
    lines = [
        "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip()
        for row in (header, *rows)
    ]
    if width is None or all(len(line) <= width for line in lines):
        for line in lines:
            print(line, file=stream)
        return
    lead = sum(widths[:-1]) + 2 * (len(widths) - 1)
    if width - lead >= MIN_TEXT_COLUMN:
        for row in (header, *rows):
            cells = [str(cell).ljust(w) for cell, w in zip(row[:-1], widths, strict=False)]
            text = textwrap.wrap(str(row[-1]), width - lead, break_on_hyphens=False) or [""]
            print(("  ".join([*cells, text[0]])).rstrip(), file=stream)
            for more in text[1:]:
                print(" " * lead + more, file=stream)
        return
    for row in rows:
        print(_fit(str(row[0]), width), file=stream)
        pairs: list[str] = []
        for name, cell in zip(header[1:-1], row[1:-1], strict=False):
            item = _fit(f"{name.lower()} {cell}", width - 2)
            if pairs and len("  ".join([*pairs, item])) > width - 2:
                print("  " + "  ".join(pairs), file=stream)
                pairs = []
            pairs.append(item)
        if pairs:
            print("  " + "  ".join(pairs), file=stream)
        for piece in textwrap.wrap(str(row[-1]), width, initial_indent="  ", subsequent_indent="  "):
            print(piece, file=stream)


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "\u2026"


# --- the status report -----------------------------------------------------------------------------

# Nomad's CLI shows ids by their first 8 characters (command/meta.go, shortId) unless
# -verbose; `llmgw dev crash` takes such a prefix.
SHORT_ID = 8

# A status older than this is called stale. The leader republishes at least every
# ControlSettings.status_refresh (30 s) and passes at least every idle_pass_interval
# (30 s), so twice their sum means it has stopped publishing (down, or cut off from Consul).
STALE_AFTER = 120.0


def status_age(report: StatusReport, now: float) -> str:
    """``published <time> (<age> ago)``, and why an old status cannot be trusted."""
    age = now - report.generated_at
    when = f"published {format_when(report.generated_at)} ({format_age(age)} ago)"
    if age > STALE_AFTER:
        when += (
            f"; STALE: a working leader republishes well within {STALE_AFTER:g}s, so none is "
            "publishing now (down, or cut off from Consul), or this machine's clock is off"
        )
    return when


def model_why(model: ModelStatus, now: float) -> str:
    """Why the model has the replicas it has, in words: what it waits for, its backoff, or its scaling.

    The backoff explains only a model still short of healthy replicas: one serving its
    desired count again keeps its failures until ``backoff_reset_after`` of health, as
    history (``--json``), but WHY says what is true now.
    """
    if model.waiting:
        return model.waiting
    if model.backoff is not None and model.healthy < model.desired:
        b = model.backoff
        retry = f"; next try in {format_age(b.retry_at - now)}" if b.retry_at > now else ""
        return f"rebuilding after {b.failures} failure(s) in a row (last: {b.last_failure}){retry}"
    return model.scaling


def replica_flags(replica: ReplicaStatus) -> str:
    flags = [
        name
        for name, on in (
            ("draining", replica.draining),
            ("stopping", replica.stopping),
            ("outdated", replica.outdated),
        )
        if on
    ]
    return ",".join(flags) or "-"


def print_status(
    report: StatusReport, *, now: float, out: TextIO | None = None, width: int | None = None
) -> None:
    """The status for people: a header, one row per model, then one row per replica (its
    allocations as Nomad's CLI shortens them, 8 characters), laid out within ``width``."""
    stream = out or sys.stdout
    catalog = (report.catalog_hash or "-")[:12]
    heading = f"leader {report.leader or '-'}, catalog {catalog}, {status_age(report, now)}"
    for paragraph in filter(None, (heading, report.note)):
        for line in [paragraph] if width is None else textwrap.wrap(paragraph, width):
            print(line, file=stream)
    if not report.models:
        print("\nno models", file=stream)
        return
    models = [
        [
            m.model,
            m.mode,
            str(m.desired),
            str(m.healthy),
            str(sum(1 for r in m.replicas if not r.stopping)),
            model_why(m, now),
        ]
        for m in report.models
    ]
    print(file=stream)
    print_table(["MODEL", "MODE", "DESIRED", "HEALTHY", "REPLICAS", "WHY"], models, stream, width=width)
    replicas = [
        [
            r.job_id,
            m.model,
            str(r.phase),
            r.health or "-",
            ",".join(r.nodes) or "-",
            str(len(r.gpus)),
            replica_flags(r),
            ",".join(a[:SHORT_ID] for a in r.allocations) or "-",
            r.reason,
        ]
        for m in report.models
        for r in m.replicas
    ]
    if replicas:
        print(file=stream)
        print_table(
            ["REPLICA", "MODEL", "PHASE", "HEALTH", "NODES", "GPUS", "FLAGS", "ALLOCS", "REASON"],
            replicas,
            stream,
            width=width,
        )
    shared = [(m.model, m.spread) for m in report.models if m.spread]
    if shared:
        print("\nReplicas of one model sharing a node (that node's loss takes them all):", file=stream)
        for model, why in shared:
            print(f"  {model}: {why}", file=stream)
    warned = [(r.job_id, w) for m in report.models for r in m.replicas for w in r.warnings]
    if warned:
        print("\nNomad warned when these jobs were registered (a setting it ignores or doubts):", file=stream)
        for job_id, warning in warned:
            print(f"  {job_id}: {warning}", file=stream)
