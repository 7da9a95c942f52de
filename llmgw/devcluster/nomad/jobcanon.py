"""Job canonicalization and validation, as Nomad's API and server do on register and plan.

Owns: the defaults real Nomad fills into a submitted job (``api.Job.Canonicalize``:
priority 50, region, namespace, datacenters ``["*"]``, per-type restart and reschedule
policies merged job -> group -> task, kill timeout 5s, resources 100 MHz / 300 MB,
template and service defaults...) and the validation errors a register returns.
Durations are integer nanoseconds, as on the wire.

Also what the server makes of an accepted job: the group fields Nomad 2.0 no longer
reads are dropped (``as_registered``), and the warnings a register or plan answers
with are computed (``job_warnings``).

Must not: touch state; it maps a job document to a job document.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from llmgw.devcluster.nomad.apishape import fill

JSON = dict[str, Any]

S = 1_000_000_000
MINUTE = 60 * S
HOUR = 60 * MINUTE

_RESTART_DEFAULTS = {
    "service": {
        "Delay": 15 * S,
        "Attempts": 2,
        "Interval": 30 * MINUTE,
        "Mode": "fail",
        "RenderTemplates": False,
    },
    "batch": {
        "Delay": 15 * S,
        "Attempts": 3,
        "Interval": 24 * HOUR,
        "Mode": "fail",
        "RenderTemplates": False,
    },
}
_RESCHEDULE_DEFAULTS = {
    "service": {
        "Attempts": 0,
        "Interval": 0,
        "Delay": 30 * S,
        "DelayFunction": "exponential",
        "MaxDelay": HOUR,
        "Unlimited": True,
    },
    "batch": {
        "Attempts": 1,
        "Interval": 24 * HOUR,
        "Delay": 5 * S,
        "DelayFunction": "constant",
        "MaxDelay": 0,
        "Unlimited": False,
    },
}


class JobInvalid(ValueError):
    """The job cannot be registered; the message is Nomad's multierror text."""


def _merge(base: JSON | None, *overrides: JSON | None) -> JSON:
    out = dict(base or {})
    for override in overrides:
        for key, value in (override or {}).items():
            if value is not None:
                out[key] = value
    return out


def canonicalize(job_in: JSON) -> JSON:
    """A deep copy of ``job_in`` with Nomad's defaults filled in and every API key present."""
    job = copy.deepcopy(job_in)
    job_id = job.get("ID") or ""
    job["Name"] = job.get("Name") or job_id
    job["Namespace"] = job.get("Namespace") or "default"
    job["Region"] = job.get("Region") or "global"
    job_type = job.get("Type") or "service"
    job["Type"] = job_type
    job["Priority"] = job.get("Priority") if job.get("Priority") is not None else 50
    job["AllAtOnce"] = bool(job.get("AllAtOnce"))
    job["Datacenters"] = job.get("Datacenters") or ["*"]
    job["NodePool"] = job.get("NodePool") or "default"
    job["ParentID"] = job.get("ParentID") or ""
    job["ConsulNamespace"] = job.get("ConsulNamespace") or ""
    job["VaultNamespace"] = job.get("VaultNamespace") or ""
    job["NomadTokenID"] = ""
    job["Dispatched"] = bool(job.get("Dispatched"))
    job_update = job.get("Update")
    if job_type == "service":
        job["Update"] = _merge(
            {
                "Stagger": 30 * S,
                "MaxParallel": 1,
                "HealthCheck": "",
                "MinHealthyTime": 0,
                "HealthyDeadline": 0,
                "ProgressDeadline": 0,
                "AutoRevert": False,
                "AutoPromote": False,
                "Canary": 0,
            },
            job_update,
        )
    restart_defaults = _RESTART_DEFAULTS.get(job_type, _RESTART_DEFAULTS["service"])
    reschedule_defaults = _RESCHEDULE_DEFAULTS.get(job_type, _RESCHEDULE_DEFAULTS["service"])
    for group in job.get("TaskGroups") or []:
        group["Count"] = group.get("Count") if group.get("Count") is not None else 1
        group["RestartPolicy"] = _merge(restart_defaults, group.get("RestartPolicy"))
        group["ReschedulePolicy"] = _merge(
            reschedule_defaults, job.get("Reschedule"), group.get("ReschedulePolicy")
        )
        group["EphemeralDisk"] = _merge(
            {"Sticky": False, "Migrate": False, "SizeMB": 300}, group.get("EphemeralDisk")
        )
        if job_type == "service":
            group["Update"] = _merge(
                {
                    "Stagger": 30 * S,
                    "MaxParallel": 1,
                    "HealthCheck": "checks",
                    "MinHealthyTime": 10 * S,
                    "HealthyDeadline": 5 * MINUTE,
                    "ProgressDeadline": 10 * MINUTE,
                    "AutoRevert": False,
                    "AutoPromote": False,
                    "Canary": 0,
                },
                job_update,
                group.get("Update"),
            )
            group["Migrate"] = _merge(
                {
                    "MaxParallel": 1,
                    "HealthCheck": "checks",
                    "MinHealthyTime": 10 * S,
                    "HealthyDeadline": 5 * MINUTE,
                },
                job.get("Migrate"),
                group.get("Migrate"),
            )
        for net in group.get("Networks") or []:
            _canonical_network(net)
        for service in group.get("Services") or []:
            _canonical_service(service)
        for task in group.get("Tasks") or []:
            _canonical_task(task, group["RestartPolicy"])
    return fill("Job", job)


def _canonical_network(net: JSON) -> None:
    net["Mode"] = net.get("Mode") or "host"
    for key in ("DynamicPorts", "ReservedPorts"):
        for port in net.get(key) or []:
            port["HostNetwork"] = port.get("HostNetwork") or "default"


def _canonical_service(service: JSON) -> None:
    service["AddressMode"] = service.get("AddressMode") or "auto"
    service["OnUpdate"] = service.get("OnUpdate") or "require_healthy"
    service["Provider"] = service.get("Provider") or "consul"
    for check in service.get("Checks") or []:
        check["OnUpdate"] = check.get("OnUpdate") or "require_healthy"
        check["AddressMode"] = check.get("AddressMode") or ""


def _canonical_task(task: JSON, group_restart: JSON) -> None:
    task["KillTimeout"] = task.get("KillTimeout") if task.get("KillTimeout") is not None else 5 * S
    task["LogConfig"] = _merge(
        {"MaxFiles": 10, "MaxFileSizeMB": 10, "Disabled": False, "Enabled": None}, task.get("LogConfig")
    )
    resources = task.get("Resources") or {}
    resources["CPU"] = resources.get("CPU") if resources.get("CPU") is not None else 100
    resources["Cores"] = resources.get("Cores") or 0
    resources["MemoryMB"] = resources.get("MemoryMB") if resources.get("MemoryMB") is not None else 300
    resources["MemoryMaxMB"] = resources.get("MemoryMaxMB") or 0
    for device in resources.get("Devices") or []:
        device["Count"] = device.get("Count") if device.get("Count") is not None else 1
    task["Resources"] = resources
    task["RestartPolicy"] = _merge(group_restart, task.get("RestartPolicy"))
    lifecycle = task.get("Lifecycle")
    if lifecycle is not None and not lifecycle.get("Hook"):
        task["Lifecycle"] = None
    for template in task.get("Templates") or []:
        template["ChangeMode"] = template.get("ChangeMode") or "restart"
        template["ChangeSignal"] = template.get("ChangeSignal") or ""
        template["Splay"] = template.get("Splay") if template.get("Splay") is not None else 5 * S
        template["Perms"] = template.get("Perms") or "0644"
        template["LeftDelim"] = template.get("LeftDelim") or "{{"
        template["RightDelim"] = template.get("RightDelim") or "}}"
        template["Envvars"] = bool(template.get("Envvars"))
        template["Once"] = bool(template.get("Once"))
        template["ErrMissingKey"] = bool(template.get("ErrMissingKey"))
        template["SourcePath"] = template.get("SourcePath") or ""
        template["EmbeddedTmpl"] = template.get("EmbeddedTmpl") or ""
        template["DestPath"] = template.get("DestPath") or ""
    for service in task.get("Services") or []:
        _canonical_service(service)


def validate(job: JSON) -> None:
    """Raise ``JobInvalid`` with Nomad's multierror formatting when the job cannot run."""
    errors: list[str] = []
    if not job.get("ID"):
        errors.append("Missing job ID")
    elif " " in str(job["ID"]):
        errors.append("Job ID contains a space")
    if job.get("Type") not in ("service", "batch", "system", "sysbatch"):
        errors.append(f"Invalid job type: {job.get('Type')!r}")
    groups = job.get("TaskGroups") or []
    if not groups:
        errors.append("Missing job task groups")
    seen: set[str] = set()
    for i, group in enumerate(groups):
        name = group.get("Name") or ""
        if not name:
            errors.append(f"Job task group {i + 1} missing name")
        if name in seen:
            errors.append(f"Job task group {i + 1} redefines '{name}' from group {i}")
        seen.add(name)
        tasks = group.get("Tasks") or []
        if not tasks:
            errors.append(f"Task group {name} validation failed: Missing tasks for task group")
        for task in tasks:
            if not task.get("Driver"):
                errors.append(
                    f"Task group {name} validation failed: Task {task.get('Name')} validation failed: "
                    "Missing task driver"
                )
        if int(group.get("Count") or 0) < 0:
            errors.append(f"Task group {name} validation failed: Task group count can't be negative")
    if errors:
        body = "".join(f"\t* {e}\n" for e in errors)
        noun = "error" if len(errors) == 1 else "errors"
        raise JobInvalid(f"{len(errors)} {noun} occurred:\n{body}\n")


# Group fields Nomad deprecated in 1.8 for the ``disconnect`` block and stopped reading in
# 1.10 (hashicorp/nomad#25284): ``command/agent/job_endpoint.go`` ``ApiTgToStructsTG``
# copies none of them into the server's job, so they are lost at the HTTP API, silently
# (``TaskGroup.Warnings`` in ``nomad/structs/structs.go`` still names them, but only sees
# what reaches the server: over HTTP, never). The values are what the server's zero
# values read back as.
IGNORED_GROUP_FIELDS: dict[str, Any] = {
    "MaxClientDisconnect": None,
    "StopAfterClientDisconnect": None,
    "PreventRescheduleOnLost": False,
}


def as_registered(job_in: JSON) -> JSON:
    """The job as Nomad 2.0's server keeps it: the fields it ignores are gone."""
    job = copy.deepcopy(job_in)
    for group in job.get("TaskGroups") or []:
        group.update(IGNORED_GROUP_FIELDS)
    return job


def job_warnings(job: JSON) -> str:
    """The ``Warnings`` of a register or plan answer, as Nomad 2.0.5 words and joins them.

    The warnings of the admission validators that apply to jobs the stand-in takes, in
    their order (``nomad/job_endpoint.go``): ``jobValidate`` (``Job.Warnings``: a service
    whose task or group has no ``shutdown_delay``, ``nomad/structs/structs.go``
    ``generateTaskGroupServiceShutdownDelayWarnings``), then
    ``memoryOversubscriptionValidate`` (``memory_max`` is ignored: the stand-in, like a
    default Nomad, has memory oversubscription off; ``nomad/job_endpoint_hooks.go``).
    Joined by ``helper.MergeMultierrorWarnings`` (``helper/warning.go``).
    """
    warnings: list[str] = []
    for group in job.get("TaskGroups") or []:
        warnings.extend(_shutdown_delay_warnings(group))
    for group in job.get("TaskGroups") or []:
        for task in group.get("Tasks") or []:
            if (task.get("Resources") or {}).get("MemoryMaxMB"):
                where = f"{group.get('Name')}.{task.get('Name')}"
                warnings.append(
                    f"Memory oversubscription is not enabled; Task {_q(where)} memory_max value will be "
                    "ignored. Update the Scheduler Configuration to allow oversubscription."
                )
    if not warnings:
        return ""
    head = "1 warning:\n" if len(warnings) == 1 else f"{len(warnings)} warnings:\n"
    return head + "".join(f"\n* {w.strip()}" for w in warnings)


def _q(value: object) -> str:
    """Go's ``%q`` of a plain name."""
    return json.dumps(str(value or ""))


def _shutdown_delay_warnings(group: JSON) -> list[str]:
    warnings: list[str] = []
    name = _q(group.get("Name"))
    referenced: set[str] = set()
    unscoped = False
    any_task_delay = False
    group_delay = bool(group.get("ShutdownDelay"))
    for service in group.get("Services") or []:
        if service.get("TaskName"):
            referenced.add(str(service["TaskName"]))
            continue
        sidecar = (service.get("Connect") or {}).get("SidecarTask")
        if sidecar is not None:
            if sidecar.get("ShutdownDelay") is None:
                warnings.append(
                    f"service {_q(service.get('Name'))} defines a sidecar task in Consul Connect "
                    "definition, but the task has no shutdown_delay set"
                )
            continue
        unscoped = True
    for task in group.get("Tasks") or []:
        task_name = str(task.get("Name") or "")
        delay = int(task.get("ShutdownDelay") or 0)
        if task_name in referenced and delay == 0:
            warnings.append(
                f"group {name} references task {_q(task_name)} in a service definition, but the "
                "task has no shutdown_delay set"
            )
        if delay > 0:
            any_task_delay = True
        elif task.get("Services"):
            warnings.append(
                f"task {_q(task_name)} in group {name} defines services, but has no shutdown_delay set"
            )
    if unscoped and not group_delay and not any_task_delay:
        warnings.append(
            f"group {name} defines services, but neither the group nor any of its tasks have "
            "shutdown_delay set"
        )
    return warnings
