"""The docker driver of a simulated node: its fingerprint and the checks it makes before a container.

Owns: what a node with ``NodeSpec.docker`` reports (``DriverInfo`` and node attributes,
as Nomad v2.0.5 ``drivers/docker/fingerprint.go`` does) and the refusals of
``createContainerConfig`` (``drivers/docker/driver.go``) that depend on the client's
plugin configuration, in the driver's order and words:

1. ``containerBinds``: a ``volumes`` entry outside the allocation directory needs
   ``volumes { enabled = true }`` ("volumes are not enabled; cannot mount host path: ...");
2. a task given NVIDIA GPUs (``NVIDIA_VISIBLE_DEVICES`` in its device env) needs the
   daemon to have the ``nvidia_runtime`` ("requested docker runtime "nvidia" was not found"),
   and every runtime must be in ``allow_runtimes``;
3. ``privileged = true`` needs ``allow_privileged``;
4. ``cap_add`` beyond ``allow_caps`` (``capabilities.Delta``);
5. ``ipc_mode`` / ``pid_mode`` / ``uts_mode`` / ``userns_mode`` must glob-match
   ``allowed_modes`` unless ``allow_privileged`` (``validateNamespace``, since v2.0.4).

``StartTask`` wraps each as ``Failed to create container configuration for image "<image>"
("<image id>"): <reason>``. The stand-in pulls no image, so the id is the reference.

Must not: run containers. A task that passes these checks is reported not runnable in dev.
"""

from __future__ import annotations

import os.path
import re
from typing import Any

from llmgw.devcluster.nomad.config import DockerPlugin

JSON = dict[str, Any]

NOT_RUNNABLE_IN_DEV = (
    "the docker driver accepted this task's config on this node, but the dev stand-in runs no "
    "containers: the engine's image does not start here (run the job on a real Nomad client, or "
    "the sim engine in dev)"
)


def fingerprint(plugin: DockerPlugin) -> tuple[JSON, dict[str, str]]:
    """The driver's ``Attributes`` (typed, for ``DriverInfo``) and the node attributes it adds."""
    attributes: dict[str, str] = {
        "driver.docker": "true",
        "driver.docker.version": plugin.version,
        "driver.docker.runtimes": ",".join(sorted(plugin.daemon_runtimes)),
        "driver.docker.os_type": "linux",
        "driver.docker.bridge_ip": "172.17.0.1",
    }
    if plugin.allow_privileged:
        attributes["driver.docker.privileged.enabled"] = "true"
    if plugin.volumes_enabled:
        attributes["driver.docker.volumes.enabled"] = "true"
    node_attributes = {"driver.docker": "1", **{k: v for k, v in attributes.items() if k != "driver.docker"}}
    return attributes, node_attributes


def _strings(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _host_path_outside(source: str, task_dir: str, alloc_dir: str) -> bool:
    """containerBinds: relative sources resolve in the task dir; only the alloc dir is free."""
    path = source if os.path.isabs(source) else os.path.join(task_dir, source)
    path = os.path.normpath(path)
    root = os.path.normpath(alloc_dir)
    return not (path == root or path.startswith(root + os.sep))


def _glob(pattern: str, subject: str) -> bool:
    """github.com/ryanuber/go-glob's Glob, which the driver uses: ``*`` is the only wildcard."""
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, subject, re.DOTALL) is not None


def _namespace_refusal(
    plugin: DockerPlugin, allowed: tuple[str, ...], field: str, desired: str
) -> str | None:
    if plugin.allow_privileged or not desired:
        return None
    if any(_glob(pattern, desired) for pattern in allowed):
        return None
    return f'cannot apply "{field}" configuration'


def container_config_refusal(
    plugin: DockerPlugin, config: JSON, *, gpus: bool, task_dir: str, alloc_dir: str
) -> str | None:
    """What createContainerConfig would refuse in this (interpolated) task config, or None."""
    volume_driver = str(config.get("volume_driver") or "")
    if volume_driver and not plugin.volumes_enabled:
        return f'volumes are not enabled; cannot use volume driver "{volume_driver}"'
    for bind in _strings(config.get("volumes")):
        source = bind.split(":", 1)[0]
        if (
            not volume_driver
            and not plugin.volumes_enabled
            and _host_path_outside(source, task_dir, alloc_dir)
        ):
            return f'volumes are not enabled; cannot mount host path: "{bind}"'
    runtime = str(config.get("runtime") or "")
    if gpus:
        if plugin.nvidia_runtime not in plugin.daemon_runtimes:
            return f'requested docker runtime "{plugin.nvidia_runtime}" was not found'
        if runtime and runtime != plugin.nvidia_runtime:
            return (
                f'conflicting runtime requests: gpu runtime "{plugin.nvidia_runtime}" conflicts with '
                f'task runtime "{runtime}"'
            )
        runtime = plugin.nvidia_runtime
    if runtime and runtime not in plugin.allow_runtimes:
        return f'requested runtime "{runtime}" is not allowed'
    if config.get("privileged") is True and not plugin.allow_privileged:
        return "Docker privileged mode is disabled on this Nomad agent"
    wanted_caps = {c.strip().lower().removeprefix("cap_") for c in _strings(config.get("cap_add"))}
    missing = sorted(wanted_caps - set(plugin.allow_caps))
    if missing:
        return f"driver does not allow the following capabilities: {', '.join(missing)}"
    for allowed, field in (
        (plugin.allowed_ipc_modes, "ipc_mode"),
        (plugin.allowed_pid_modes, "pid_mode"),
        (plugin.allowed_uts_modes, "uts_mode"),
        (plugin.allowed_userns_modes, "userns_mode"),
    ):
        refusal = _namespace_refusal(plugin, allowed, field, str(config.get(field) or ""))
        if refusal is not None:
            return refusal
    return None


def start_failure(plugin: DockerPlugin, config: JSON, *, gpus: bool, task_dir: str, alloc_dir: str) -> str:
    """The ``Driver Failure`` message of StartTask for this task on this node."""
    image = str(config.get("image") or "")
    if not image:
        return "image name required for docker driver"
    image = image.removeprefix("https://")
    refusal = container_config_refusal(plugin, config, gpus=gpus, task_dir=task_dir, alloc_dir=alloc_dir)
    if refusal is not None:
        return f'Failed to create container configuration for image "{image}" ("{image}"): {refusal}'
    return NOT_RUNNABLE_IN_DEV
