"""The api package's Canonicalize defaults, for ``/v1/jobs/parse`` with ``Canonicalize: true``.

Owns filling the defaults that ``api.Job.Canonicalize`` and the TaskGroup, Task,
UpdateStrategy, RestartPolicy, ReschedulePolicy, EphemeralDisk, LogConfig and
Resources methods it calls set, for the fields llmgw's templates use. DESIGN.md
lists them; every other field is left as parsed. Only fields present in the
vendored api tables are set (so the output stays key-exact).
Must not: change a value the jobspec set.
"""

from __future__ import annotations

from collections.abc import Mapping

Doc = dict[str, object]

S = 1_000_000_000  # nanoseconds per second

# api/jobs.go Job.Canonicalize (JobDefaultPriority is 50, GlobalRegion "global", DefaultNamespace "default")
_JOB_DEFAULTS: Mapping[str, object] = {
    "ParentID": "",
    "Namespace": "default",
    "Priority": 50,
    "Stop": False,
    "Region": "global",
    "NodePool": "",
    "Type": "service",
    "AllAtOnce": False,
    "ConsulNamespace": "",
    "VaultNamespace": "",
    "NomadTokenID": "",
    "Status": "",
    "StatusDescription": "",
    "Stable": False,
    "Version": 0,
    "CreateIndex": 0,
    "ModifyIndex": 0,
    "JobModifyIndex": 0,
}

# api DefaultUpdateStrategy(), filled into a service job without update and under a given one
_UPDATE_DEFAULTS: Mapping[str, object] = {
    "Stagger": 30 * S,
    "MaxParallel": 1,
    "HealthCheck": "checks",
    "MinHealthyTime": 10 * S,
    "HealthyDeadline": 300 * S,
    "ProgressDeadline": 600 * S,
    "AutoRevert": False,
    "Canary": 0,
    "AutoPromote": False,
}

_RESTART_DEFAULTS: Mapping[str, Mapping[str, object]] = {
    "service": {
        "Delay": 15 * S,
        "Attempts": 2,
        "Interval": 1800 * S,
        "Mode": "fail",
        "RenderTemplates": False,
    },
    "batch": {
        "Delay": 15 * S,
        "Attempts": 3,
        "Interval": 86400 * S,
        "Mode": "fail",
        "RenderTemplates": False,
    },
}

_RESCHEDULE_DEFAULTS: Mapping[str, Mapping[str, object]] = {
    "service": {
        "Attempts": 0,
        "Interval": 0,
        "Delay": 30 * S,
        "DelayFunction": "exponential",
        "MaxDelay": 3600 * S,
        "Unlimited": True,
    },
    "batch": {
        "Attempts": 1,
        "Interval": 86400 * S,
        "Delay": 5 * S,
        "DelayFunction": "constant",
        "MaxDelay": 0,
        "Unlimited": False,
    },
}

_EPHEMERAL_DISK_DEFAULTS: Mapping[str, object] = {"Sticky": False, "Migrate": False, "SizeMB": 300}
_LOG_DEFAULTS: Mapping[str, object] = {"MaxFiles": 10, "MaxFileSizeMB": 10, "Disabled": False}
_RESOURCE_DEFAULTS: Mapping[str, object] = {"CPU": 100, "Cores": 0, "MemoryMB": 300}


def _fill(target: Doc, defaults: Mapping[str, object]) -> Doc:
    for key, value in defaults.items():
        if target.get(key) is None:
            target[key] = value
    return target


def _docs(v: object) -> list[Doc]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def canonicalize_job(job: Doc) -> None:
    """Fill Canonicalize defaults into ``job`` in place (see DESIGN.md for the list)."""
    if job.get("ID") is None:
        job["ID"] = ""
    if job.get("Name") is None:
        job["Name"] = job["ID"]
    _fill(job, _JOB_DEFAULTS)
    job_type = str(job["Type"])
    update = job.get("Update")
    if isinstance(update, dict):
        _fill(update, _UPDATE_DEFAULTS)
    elif job_type == "service":
        job["Update"] = dict(_UPDATE_DEFAULTS)
    periodic = job.get("Periodic")
    if isinstance(periodic, dict):
        _fill(periodic, {"Enabled": True, "ProhibitOverlap": False, "TimeZone": "UTC"})
        if periodic.get("Spec") is None and periodic.get("Specs") is None:
            periodic["Spec"] = ""
    kind = "batch" if job_type in ("batch", "sysbatch") else "service"
    for group in _docs(job.get("TaskGroups")):
        _canonicalize_group(group, kind)


def _canonicalize_group(group: Doc, kind: str) -> None:
    if group.get("Count") is None:
        group["Count"] = 1
    disk = group.get("EphemeralDisk")
    group["EphemeralDisk"] = _fill(disk if isinstance(disk, dict) else {}, _EPHEMERAL_DISK_DEFAULTS)
    restart = group.get("RestartPolicy")
    group["RestartPolicy"] = _fill(restart if isinstance(restart, dict) else {}, _RESTART_DEFAULTS[kind])
    reschedule = group.get("ReschedulePolicy")
    group["ReschedulePolicy"] = _fill(
        reschedule if isinstance(reschedule, dict) else {}, _RESCHEDULE_DEFAULTS[kind]
    )
    for task in _docs(group.get("Tasks")):
        _canonicalize_task(task, group)


def _canonicalize_task(task: Doc, group: Doc) -> None:
    if task.get("KillTimeout") is None:
        task["KillTimeout"] = 5 * S
    resources = task.get("Resources")
    task["Resources"] = _fill(resources if isinstance(resources, dict) else {}, _RESOURCE_DEFAULTS)
    logs = task.get("LogConfig")
    task["LogConfig"] = _fill(logs if isinstance(logs, dict) else {}, _LOG_DEFAULTS)
    # Task.Canonicalize: the task's restart policy starts from the group's and keeps its own settings
    group_restart = group.get("RestartPolicy")
    own = task.get("RestartPolicy")
    if isinstance(group_restart, dict):
        merged = dict(group_restart)
        if isinstance(own, dict):
            merged.update({k: v for k, v in own.items() if v is not None})
        task["RestartPolicy"] = merged
