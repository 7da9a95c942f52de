"""A task's runtime environment and ``${...}`` interpolation, as the Nomad client builds them.

Owns: the ``NOMAD_*`` variables (alloc, job, group, task, directories, limits, ports,
meta), ``NVIDIA_VISIBLE_DEVICES`` for assigned GPUs, and interpolating ``${NOMAD_*}``,
``${attr.*}``, ``${node.*}``, ``${meta.*}`` and ``${env.*}`` into strings, lists and
maps. Unknown variables are left untouched, as Nomad does.

Must not: start processes or read files.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_VAR = re.compile(r"\$\{([^{}]+)\}")


@dataclass(frozen=True)
class TaskEnv:
    env: dict[str, str]  # the process environment (NOMAD_* and the task's env block)
    node_values: dict[str, str]  # attr.*, node.*, meta.* lookups

    def lookup(self, name: str) -> str | None:
        if name in self.env:
            return self.env[name]
        if name.startswith("env."):
            return self.env.get(name[4:])
        return self.node_values.get(name)

    def interpolate(self, text: str) -> str:
        def sub(match: re.Match[str]) -> str:
            value = self.lookup(match.group(1).strip())
            return match.group(0) if value is None else value

        return _VAR.sub(sub, text)

    def interpolate_any(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.interpolate(value)
        if isinstance(value, list):
            return [self.interpolate_any(v) for v in value]
        if isinstance(value, dict):
            return {self.interpolate(str(k)): self.interpolate_any(v) for k, v in value.items()}
        return value


def node_values(
    node_id: str,
    node_name: str,
    datacenter: str,
    node_class: str,
    node_pool: str,
    region: str,
    attributes: Mapping[str, str],
    meta: Mapping[str, str],
) -> dict[str, str]:
    values = {
        "node.unique.id": node_id,
        "node.unique.name": node_name,
        "node.datacenter": datacenter,
        "node.class": node_class,
        "node.pool": node_pool,
        "node.region": region,
    }
    values.update({f"attr.{k}": v for k, v in attributes.items()})
    values.update({f"meta.{k}": v for k, v in meta.items()})
    return values


def build_env(
    *,
    alloc: Mapping[str, Any],
    job: Mapping[str, Any],
    group: Mapping[str, Any],
    task: Mapping[str, Any],
    alloc_dir: str,
    task_dir: str,
    region: str,
    datacenter: str,
    node: dict[str, str],
    extra: Mapping[str, str] | None = None,
) -> TaskEnv:
    """The environment of one task of ``alloc`` (an Allocation document)."""
    alloc_id = str(alloc["ID"])
    name = str(alloc["Name"])
    index = name.rsplit("[", 1)[1].rstrip("]") if "[" in name else "0"
    resources = task.get("Resources") or {}
    env: dict[str, str] = {
        "NOMAD_ALLOC_DIR": alloc_dir,
        "NOMAD_TASK_DIR": f"{task_dir}/local",
        "NOMAD_SECRETS_DIR": f"{task_dir}/secrets",
        "NOMAD_ALLOC_ID": alloc_id,
        "NOMAD_SHORT_ALLOC_ID": alloc_id[:8],
        "NOMAD_ALLOC_NAME": name,
        "NOMAD_ALLOC_INDEX": index,
        "NOMAD_GROUP_NAME": str(group["Name"]),
        "NOMAD_TASK_NAME": str(task["Name"]),
        "NOMAD_JOB_ID": str(job["ID"]),
        "NOMAD_JOB_NAME": str(job.get("Name") or job["ID"]),
        "NOMAD_JOB_PARENT_ID": str(job.get("ParentID") or ""),
        "NOMAD_DC": datacenter,
        "NOMAD_REGION": region,
        "NOMAD_NAMESPACE": str(job.get("Namespace") or "default"),
        "NOMAD_CPU_LIMIT": str(resources.get("CPU") or 100),
        "NOMAD_MEMORY_LIMIT": str(resources.get("MemoryMB") or 300),
    }
    if resources.get("MemoryMaxMB"):
        env["NOMAD_MEMORY_MAX_LIMIT"] = str(resources["MemoryMaxMB"])
    meta: dict[str, str] = {}
    for source in (job.get("Meta"), group.get("Meta"), task.get("Meta")):
        meta.update({str(k): str(v) for k, v in (source or {}).items()})
    for key, value in meta.items():
        env[f"NOMAD_META_{key}"] = value
        env[f"NOMAD_META_{key.upper()}"] = value
    shared = (alloc.get("AllocatedResources") or {}).get("Shared") or {}
    for port in shared.get("Ports") or []:
        label = str(port["Label"])
        value = str(port["Value"])
        host_ip = str(port.get("HostIP") or "127.0.0.1")
        to = int(port.get("To") or 0)
        env[f"NOMAD_HOST_IP_{label}"] = host_ip
        env[f"NOMAD_HOST_PORT_{label}"] = value
        env[f"NOMAD_HOST_ADDR_{label}"] = f"{host_ip}:{value}"
        env[f"NOMAD_IP_{label}"] = host_ip
        env[f"NOMAD_PORT_{label}"] = str(to) if to > 0 else value
        env[f"NOMAD_ADDR_{label}"] = f"{host_ip}:{env[f'NOMAD_PORT_{label}']}"
        env[f"NOMAD_ALLOC_IP_{label}"] = host_ip
        env[f"NOMAD_ALLOC_PORT_{label}"] = env[f"NOMAD_PORT_{label}"]
        env[f"NOMAD_ALLOC_ADDR_{label}"] = env[f"NOMAD_ADDR_{label}"]
    task_alloc = ((alloc.get("AllocatedResources") or {}).get("Tasks") or {}).get(str(task["Name"])) or {}
    gpu_ids: list[str] = []
    for device in task_alloc.get("Devices") or []:
        if device.get("Vendor") == "nvidia":
            gpu_ids.extend(device.get("DeviceIDs") or [])
    if gpu_ids:
        env["NVIDIA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
    if extra:
        env.update(extra)
    base = TaskEnv(env, node)
    # The task's env block may itself use ${...}; it is interpolated against the runtime values.
    for key, value in (task.get("Env") or {}).items():
        env[base.interpolate(str(key))] = base.interpolate(str(value))
    return TaskEnv(env, node)
