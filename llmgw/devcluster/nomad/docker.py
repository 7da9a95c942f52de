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

A task that passes these checks runs only where the node has a local stand-in for its
image: llama.cpp's server images (``ghcr.io/ggml-org/llama.cpp:server*``, whose
entrypoint is ``/app/llama-server``, ``.devops/cuda.Dockerfile``) run the node's
``DockerPlugin.llama_server`` binary as the container's process (or the host's
``/bin/sh`` for an entrypoint that execs the server after computing its arguments;
``ContainerRun``:
the paths Nomad mounts, ``/local``, ``/secrets``, ``/alloc`` and the ``volumes``
binds, translated to the host paths behind them; host networking). Any other image
fails as a pull the daemon cannot do fails (``createImage``: "Failed to pull `<image>`:
<daemon error>", ``recoverablePullError``; unrecoverable as an image not found).

Must not: start processes (the task runner does, with the argv this module builds).
"""

from __future__ import annotations

import os.path
import re
from dataclasses import dataclass
from typing import Any

from llmgw.devcluster.nomad.config import DockerPlugin

JSON = dict[str, Any]

# llama.cpp's published server images (ggml-org/llama.cpp, docs/docker.md): ``server``,
# ``server-cuda``, ``server-cuda-b6700``, ``server-vulkan``, ... ; their entrypoint.
LLAMACPP_IMAGE_REPOSITORY = "ghcr.io/ggml-org/llama.cpp"
LLAMACPP_ENTRYPOINT = "/app/llama-server"
# What of the image the stand-in provides: its server (the local binary) and a POSIX shell
# (the host's), which a job may run first to compute the server's arguments.
IMAGE_PROGRAMS = frozenset({LLAMACPP_ENTRYPOINT, "/bin/sh"})
# The directories Nomad's docker driver mounts into every container (drivers/docker/driver.go,
# createContainerConfig: alloc dir, task local/ and secrets/ at these paths).
ALLOC_MOUNT = "/alloc"
LOCAL_MOUNT = "/local"
SECRETS_MOUNT = "/secrets"


def _image_reference(config: JSON) -> str:
    return str(config.get("image") or "").removeprefix("https://")


def is_llamacpp_server_image(image: str) -> bool:
    repository, _, tag = image.rpartition(":")
    if not repository or "/" in tag:
        repository, tag = image, "latest"
    return repository == LLAMACPP_IMAGE_REPOSITORY and tag.startswith("server")


def pull_failure(image: str) -> str:
    """What the daemon answers for an image the stand-in has no local binary for."""
    hint = (
        "set LLMGW_LLAMA_SERVER or put llama-server on PATH (scripts/build-llama-server builds it)"
        if is_llamacpp_server_image(image)
        else "the stand-in runs only llama.cpp's server images, with a local llama-server"
    )
    return (
        f"Failed to pull `{image}`: Error response from daemon: manifest for {image} not found "
        f"on this dev node ({hint})"
    )


@dataclass(frozen=True)
class ContainerRun:
    """The container's process as the stand-in runs it on the host."""

    argv: list[str]
    env: dict[str, str]


def _mounts(config: JSON, task_dir: str, alloc_dir: str) -> list[tuple[str, str]]:
    """(container path, host path), longest container path first."""
    mounts = [
        (ALLOC_MOUNT, os.path.join(alloc_dir, "alloc")),
        (LOCAL_MOUNT, os.path.join(task_dir, "local")),
        (SECRETS_MOUNT, os.path.join(task_dir, "secrets")),
    ]
    for bind in _strings(config.get("volumes")):
        parts = bind.split(":")
        if len(parts) >= 2:
            source = parts[0] if os.path.isabs(parts[0]) else os.path.join(task_dir, parts[0])
            mounts.append((os.path.normpath(parts[1]), os.path.normpath(source)))
    return sorted(mounts, key=lambda m: len(m[0]), reverse=True)


def host_path(word: str, mounts: list[tuple[str, str]]) -> str:
    """A container path as the host sees it; any other word unchanged."""
    for inside, outside in mounts:
        if word == inside or word.startswith(inside + "/"):
            return outside + word[len(inside) :]
    return word


def container_run(
    plugin: DockerPlugin,
    config: JSON,
    env: dict[str, str],
    *,
    task_dir: str,
    alloc_dir: str,
    node_address: str,
) -> ContainerRun | None:
    """The local process standing in for this container, or None when its image has none here."""
    image = _image_reference(config)
    if plugin.llama_server is None or not is_llamacpp_server_image(image):
        return None
    entrypoint = _strings(config.get("entrypoint")) or [LLAMACPP_ENTRYPOINT]
    if entrypoint[0] not in IMAGE_PROGRAMS:
        return None
    mounts = _mounts(config, task_dir, alloc_dir)
    words = [*entrypoint, *_strings(config.get("args"))]
    argv: list[str] = []
    for index, word in enumerate(words):
        if word == "0.0.0.0" and index > 0 and words[index - 1] == "--host":  # noqa: S104
            # Host networking on a machine whose every node is loopback: all interfaces would
            # expose the engine beyond this machine, so it listens where Nomad's port is.
            word = node_address
        # The image's server, wherever it is named (the entrypoint, or a word a shell execs).
        argv.append(plugin.llama_server if word == LLAMACPP_ENTRYPOINT else host_path(word, mounts))
    container_env = {
        **{key: host_path(value, mounts) for key, value in env.items()},
        # Inside the container Nomad points these at the mounts (taskenv, SetDriverNetwork...).
        "NOMAD_ALLOC_DIR": os.path.join(alloc_dir, "alloc"),
        "NOMAD_TASK_DIR": os.path.join(task_dir, "local"),
        "NOMAD_SECRETS_DIR": os.path.join(task_dir, "secrets"),
    }
    return ContainerRun(argv, container_env)


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


def start_failure(
    plugin: DockerPlugin, config: JSON, *, gpus: bool, task_dir: str, alloc_dir: str
) -> str | None:
    """The ``Driver Failure`` message of StartTask for this task on this node, or None: it runs."""
    image = _image_reference(config)
    if not image:
        return "image name required for docker driver"
    refusal = container_config_refusal(plugin, config, gpus=gpus, task_dir=task_dir, alloc_dir=alloc_dir)
    if refusal is not None:
        return f'Failed to create container configuration for image "{image}" ("{image}"): {refusal}'
    # StartTask pulls (createImage) before createContainerConfig; the stand-in checks the
    # config first, so the plugin's refusals, which no image changes, show for every image.
    if plugin.llama_server is None or not is_llamacpp_server_image(image):
        return pull_failure(image)
    return None
