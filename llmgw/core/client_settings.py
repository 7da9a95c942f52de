"""Which Nomad client setting a failure asks for, in words an operator can act on.

Owns the mapping from what Nomad says when a job cannot run on a client (a task's
``Driver Failure`` message from the docker driver, a plan's filter reason) to the
setting of ``ops/README.md``'s GPU-node checklist that fixes it. The messages are
the driver's own (Nomad v2.0.5 ``drivers/docker/driver.go`` ``createContainerConfig``
and ``containerBinds``, ``drivers/shared/capabilities/defaults.go`` ``Delta``); the
filter reasons are the scheduler's (``scheduler/feasible/feasible.go``:
``FilterConstraintDrivers = "missing drivers"``, ``FilterConstraintDevices = "missing
devices"``, ``FilterConstraintHostVolumes = "missing compatible host volumes"``) and the
constraints the templates render (``${attr.driver.docker.*}``).
"""

from __future__ import annotations

import re

_NAMESPACE = re.compile(r'cannot apply "(?P<field>ipc|pid|uts|userns)_mode" configuration')
_RUNTIME_NOT_FOUND = re.compile(r'requested docker runtime "(?P<runtime>[^"]*)" was not found')
_RUNTIME_NOT_ALLOWED = re.compile(r'requested runtime "(?P<runtime>[^"]*)" is not allowed')

NVIDIA_RUNTIME_HINT = (
    "the NVIDIA Container Toolkit on the node with its runtime registered with Docker "
    "(nvidia-ctk runtime configure --runtime=docker, then restart dockerd), so `docker info` "
    'lists "nvidia"'
)
VOLUMES_HINT = 'plugin "docker" { config { volumes { enabled = true } } } on the node\'s Nomad client'
DEVICE_PLUGIN_HINT = (
    "Nomad's NVIDIA device plugin (the nomad-device-nvidia binary in the client's plugin_dir, "
    "configured by its plugin block), so the node's GPUs are nvidia/gpu devices"
)
MODEL_CACHE_HINT = (
    'client { host_volume "llmgw-models" { path = "/var/lib/llmgw/hf-cache" } } on the node\'s '
    "Nomad client (the model cache: the volume LLMGW_MODEL_CACHE_VOLUME names, llmgw-models by "
    "default; set it empty for no cache)"
)
RAW_EXEC_HINT = 'plugin "raw_exec" { config { enabled = true } } on the node\'s Nomad client'
DOCKER_DRIVER_HINT = "Docker running on the node and the docker driver healthy (nomad node status -verbose)"


def hint_for_driver_failure(message: str) -> str | None:
    """The client setting a docker ``Driver Failure`` message asks for, or None."""
    namespace = _NAMESPACE.search(message)
    if namespace:
        field = namespace.group("field")
        block = f'plugin "docker" {{ config {{ allowed_modes {{ {field} = [...] }} }} }}'
        return f"the task's {field}_mode in {block} on the node's Nomad client (or a job template without it)"
    if "volumes are not enabled" in message:
        return VOLUMES_HINT
    runtime = _RUNTIME_NOT_FOUND.search(message)
    if runtime:
        name = runtime.group("runtime")
        return runtime_hint(name)
    allowed = _RUNTIME_NOT_ALLOWED.search(message)
    if allowed:
        return f'"{allowed.group("runtime")}" in plugin "docker" {{ config {{ allow_runtimes = [...] }} }}'
    if "privileged mode is disabled" in message:
        return 'plugin "docker" { config { allow_privileged = true } } (or a job template without privileged)'
    if "does not allow the following capabilities" in message:
        return 'the capabilities named in plugin "docker" { config { allow_caps = [...] } }'
    return None


def hint_for_filter(reason: str, drivers: frozenset[str]) -> str | None:
    """The client setting a plan's ``ConstraintFiltered`` reason asks for, or None.

    ``drivers`` are the task drivers the group uses: Nomad names no driver in
    "missing drivers", so every one the group needs is listed.
    """
    if reason == "missing drivers":
        needs = []
        if "docker" in drivers:
            needs.append(DOCKER_DRIVER_HINT)
        if "raw_exec" in drivers:
            needs.append(RAW_EXEC_HINT)
        return "; ".join(needs) or None
    if reason == "missing devices":
        return DEVICE_PLUGIN_HINT
    if reason == "missing compatible host volumes":
        return MODEL_CACHE_HINT
    if reason.startswith("${attr.driver.docker.volumes.enabled}"):
        return VOLUMES_HINT
    if reason.startswith("${attr.driver.docker.runtimes}"):
        # The scheduler words a constraint "<attribute> <operator> <value>".
        return runtime_hint(reason.rsplit(" ", 1)[-1])
    return None


def runtime_hint(name: str) -> str:
    """What a node lacks when Docker does not list the runtime ``name`` GPU tasks get."""
    if name == "nvidia":
        return NVIDIA_RUNTIME_HINT
    return (
        f'the NVIDIA runtime registered with Docker as "{name}" on the node, so `docker info` lists it, '
        f'and plugin "docker" {{ config {{ nvidia_runtime = "{name}" }} }} on its Nomad client '
        "(LLMGW_NVIDIA_RUNTIME names it in the rendered jobs)"
    )
