"""Nomad's answer to "would this job place?", in words an operator can act on.

A plan's ``FailedTGAllocs`` counts nodes per reason (filtered by a constraint,
missing a driver, exhausted on a dimension). This turns them into a sentence
per group, naming what the group asked for (GPUs of a model and memory, a
fabric) and why no node had it, instead of a raw evaluation dump; a reason
that a Nomad client setting fixes (a driver, the NVIDIA device plugin, docker
volumes) names that setting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from llmgw.core.client_settings import hint_for_filter

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class PlanOutcome:
    feasible: bool
    explanation: str
    # Per task group that would not place: Nomad's AllocationMetric, as sent.
    failed_groups: dict[str, JSON] = field(default_factory=dict)
    # What Nomad warns about in the job (``split_warnings`` of the answer's Warnings).
    warnings: tuple[str, ...] = ()


_WARNINGS_HEAD = re.compile(r"^\s*\d+ warnings?:\s*")


def split_warnings(text: object) -> tuple[str, ...]:
    """Nomad's ``Warnings`` string, one entry per warning.

    Nomad joins them with ``helper.MergeMultierrorWarnings`` (``helper/warning.go``):
    ``"2 warnings:\\n\\n* first\\n* second"``; a warning may itself span lines (a group's
    own list, indented with a tab), which are folded into one line here.
    """
    if not isinstance(text, str) or not text.strip():
        return ()
    body = _WARNINGS_HEAD.sub("", text, count=1)
    items = re.split(r"(?:^|\n)\* ", body)
    return tuple(" ".join(item.split()) for item in items if item.strip())


_WHOLE_WORD = re.compile(r"^\(\?i\)\(\^\|\[\^a-z0-9\]\)(?P<model>.*)\(\[\^a-z0-9\]\|\$\)$")


def _model_named(value: str) -> str:
    """The GPU model a device constraint asks for, as the catalog wrote it."""
    match = _WHOLE_WORD.match(value)
    return re.sub(r"\\(.)", r"\1", match.group("model")) if match else value


def _asks(job: JSON, group_name: str) -> str:
    """What one group asks for, e.g. "8 nvidia/gpu (H100, >= 76293 MiB) on fabric fabric-a"."""
    parts: list[str] = []
    group: JSON = next((g for g in job.get("TaskGroups") or [] if g.get("Name") == group_name), {})
    for task in group.get("Tasks") or []:
        for device in (task.get("Resources") or {}).get("Devices") or []:
            details = []
            for constraint in device.get("Constraints") or []:
                target = constraint.get("LTarget", "")
                value = constraint.get("RTarget", "")
                operand = constraint.get("Operand", "=")
                if target.endswith("device.model}"):
                    details.append(_model_named(str(value)))
                elif target.endswith("device.attr.memory}"):
                    details.append(f"{operand} {value}")
            suffix = f" ({', '.join(details)})" if details else ""
            parts.append(f"{device.get('Count', 1)} {device.get('Name')}{suffix} free")
    for constraint in job.get("Constraints") or []:
        if constraint.get("LTarget", "").startswith("${meta.llmgw_fabric"):
            parts.append(f"on fabric {constraint.get('RTarget')}")
    return " ".join(parts) if parts else "room for its tasks"


def _drivers(job: JSON, group_name: str) -> frozenset[str]:
    group: JSON = next((g for g in job.get("TaskGroups") or [] if g.get("Name") == group_name), {})
    return frozenset(str(t.get("Driver") or "") for t in group.get("Tasks") or [])


def _why(metric: JSON, drivers: frozenset[str] = frozenset()) -> str:
    evaluated = int(metric.get("NodesEvaluated") or 0)
    reasons: list[str] = []
    for constraint, count in sorted((metric.get("ConstraintFiltered") or {}).items()):
        hint = hint_for_filter(constraint, drivers)
        reasons.append(f"{count} filtered by {constraint}" + (f" (needs {hint})" if hint else ""))
    for node_class, count in sorted((metric.get("ClassFiltered") or {}).items()):
        reasons.append(f"{count} of class {node_class} filtered")
    for dimension, count in sorted((metric.get("DimensionExhausted") or {}).items()):
        reasons.append(f"{count} without enough {dimension}")
    exhausted = int(metric.get("NodesExhausted") or 0)
    if exhausted and not metric.get("DimensionExhausted"):
        reasons.append(f"{exhausted} full")
    if evaluated == 0 and not reasons:
        return "no node is ready and eligible in the job's datacenters and pool"
    return f"of {evaluated} node(s) evaluated: " + "; ".join(reasons) if reasons else f"{evaluated} evaluated"


def explain_plan(job: JSON, answer: JSON) -> PlanOutcome:
    failed: dict[str, JSON] = dict(answer.get("FailedTGAllocs") or {})
    warnings = split_warnings(answer.get("Warnings"))
    if not failed:
        groups = len(job.get("TaskGroups") or [])
        return PlanOutcome(True, f"places: all {groups} group(s) fit now", warnings=warnings)
    sentences = []
    for group_name, metric in sorted(failed.items()):
        sentences.append(
            f"group {group_name} needs a node with {_asks(job, group_name)}; "
            f"none has ({_why(metric, _drivers(job, group_name))})"
        )
    placed = len(job.get("TaskGroups") or []) - len(failed)
    if placed:
        sentences.append(f"{placed} other group(s) would place (and hold their GPUs) without them")
    return PlanOutcome(False, "does not place: " + "; ".join(sentences), failed, warnings)
