"""Settings of the Nomad stand-in: its simulated client nodes and its timings.

Owns: the ``NodeSpec`` / ``StandInConfig`` values and reading them from a small YAML
document. Every timing is a named field with its default and the reason for it.

Must not: start anything or hold state; ``NomadStandIn`` reads these values.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

# The docker plugin's ``allow_caps`` default: Docker's default set without net_raw
# (Nomad v2.0.5 drivers/shared/capabilities/defaults.go, HCLSpecLiteral).
NOMAD_DEFAULT_CAPS: tuple[str, ...] = (
    "audit_write",
    "chown",
    "dac_override",
    "fowner",
    "fsetid",
    "kill",
    "mknod",
    "net_bind_service",
    "setfcap",
    "setgid",
    "setpcap",
    "setuid",
    "sys_chroot",
)


@dataclass(frozen=True)
class DockerPlugin:
    """A client's ``plugin "docker" { config { ... } }`` and what its Docker daemon offers.

    Field defaults are the docker plugin's own (Nomad v2.0.5 drivers/docker/config.go,
    ``configSpec``): volumes off, privileged off, no namespace mode allowed,
    ``allow_runtimes = ["runc", "nvidia"]``, ``nvidia_runtime = "nvidia"``.
    ``daemon_runtimes`` is what ``docker info`` lists (the NVIDIA Container Toolkit
    adds ``nvidia``); the driver fingerprints it as ``driver.docker.runtimes``.
    """

    allow_privileged: bool = False
    volumes_enabled: bool = False
    allowed_ipc_modes: tuple[str, ...] = ()
    allowed_pid_modes: tuple[str, ...] = ()
    allowed_uts_modes: tuple[str, ...] = ()
    allowed_userns_modes: tuple[str, ...] = ()
    allow_caps: tuple[str, ...] = NOMAD_DEFAULT_CAPS
    allow_runtimes: tuple[str, ...] = ("runc", "nvidia")
    nvidia_runtime: str = "nvidia"
    daemon_runtimes: tuple[str, ...] = ("io.containerd.runc.v2", "runc")
    version: str = "27.5.1"
    # The local llama-server binary that stands in for llama.cpp's server images on this
    # node (the stand-in runs no containers); None: those images cannot be pulled here.
    llama_server: str | None = None
    # Seconds the daemon takes to pull an image this node does not have yet (0: each is
    # there): the task, hence its allocation, stays pending meanwhile ("Downloading image").
    image_pull_s: float = 0.0
    # The plugin's ``image_pull_timeout``, for the whole pull (the layers' extraction is part
    # of the daemon's pull stream): "5m" by default (drivers/docker/config.go, configSpec,
    # v2.0.5); a task's own ``config { image_pull_timeout }`` overrides it (driver.go,
    # StartTask). A pull longer than it fails the start, recoverably.
    image_pull_timeout_s: float = 300.0


# A GPU node set up as ops/README.md's checklist says: the NVIDIA runtime registered
# with Docker and the host paths llmgw mounts allowed; nothing else widened.
GPU_NODE_DOCKER = DockerPlugin(
    volumes_enabled=True,
    daemon_runtimes=("io.containerd.runc.v2", "nvidia", "runc"),
)


@dataclass(frozen=True)
class HostVolume:
    """A client's ``host_volume "NAME" { path = PATH  read_only = BOOL }``.

    Nomad copies each into the node's ``HostVolumes`` (api ``HostVolumeInfo``: ID, Path,
    ReadOnly; ID is empty for a volume of the client config); the scheduler's
    ``HostVolumeChecker`` filters nodes without a group's host volumes.
    """

    name: str
    path: str
    read_only: bool = False


# The model cache ops/README.md's GPU-node checklist has every GPU client declare
# (the render setting LLMGW_MODEL_CACHE_VOLUME names it).
GPU_NODE_MODEL_CACHE = HostVolume("llmgw-models", "/var/lib/llmgw/hf-cache")


@dataclass(frozen=True)
class NodeSpec:
    """One simulated Nomad client node.

    ``docker`` set makes the node fingerprint the docker driver with that plugin
    config (the stand-in validates docker tasks against it, then runs llama.cpp's
    server images with its local ``llama_server`` and fails other images' pulls);
    ``raw_exec`` is the raw_exec plugin's ``enabled``; ``exec`` fingerprints the exec
    driver, whose tasks the stand-in runs as raw_exec's (no chroot or cgroup isolation).
    """

    name: str
    datacenter: str = "dc1"
    node_class: str = ""
    node_pool: str = "default"
    gpus: int = 0
    gpu_vendor: str = "nvidia"
    gpu_model: str = "H100"
    gpu_memory_mib: int = 81920
    fabric: str = ""  # exported as Meta["llmgw_fabric"]
    meta: dict[str, str] = field(default_factory=dict)
    attributes: dict[str, str] = field(default_factory=dict)
    cpu_shares: int = 64000  # generous: the stand-in does not simulate CPU pressure
    memory_mb: int = 262144
    disk_mb: int = 1048576
    docker: DockerPlugin | None = None
    raw_exec: bool = True
    exec: bool = False
    host_volumes: tuple[HostVolume, ...] = ()


def default_nodes(count: int = 3, gpus: int = 2, gpu_model: str = "H100") -> tuple[NodeSpec, ...]:
    return tuple(
        NodeSpec(name=f"dev-node-{i + 1}", gpus=gpus, gpu_model=gpu_model, fabric=f"fabric-{(i % 2) + 1}")
        for i in range(count)
    )


def real_gpu_nodes(
    count: int = 2,
    *,
    docker: DockerPlugin = GPU_NODE_DOCKER,
    fabric: str = "fabric-a",
    prefix: str = "h100",
    host_volumes: tuple[HostVolume, ...] = (GPU_NODE_MODEL_CACHE,),
) -> tuple[NodeSpec, ...]:
    """Nodes shaped like a real 8 x H100 80GB client of Nomad 2.0 with Docker and the NVIDIA plugin.

    The device group is named and sized as nomad-device-nvidia reports it (NVML's
    name, total memory in MiB), not as a catalog writes it.
    """
    return tuple(
        NodeSpec(
            name=f"{prefix}-{i + 1}",
            gpus=8,
            gpu_model="NVIDIA H100 80GB HBM3",
            gpu_memory_mib=81559,
            fabric=fabric,
            cpu_shares=2 * 56 * 2000,
            memory_mb=2 * 1024 * 1024,
            docker=docker,
            host_volumes=host_volumes,
        )
        for i in range(count)
    )


@dataclass(frozen=True)
class StandInConfig:
    """How the stand-in behaves. Defaults suit ``llmgw dev``; tests shorten the timings."""

    nodes: tuple[NodeSpec, ...] = field(default_factory=default_nodes)
    region: str = "global"
    # Where allocation directories live; None means a fresh temporary directory.
    state_dir: Path | None = None
    # Consul agent HTTP address ("http://127.0.0.1:8500") used for services and templates;
    # None disables service registration and renders Consul lookups as empty.
    consul_addr: str | None = None
    # Per-node Consul agent addresses (node name -> URL): a Nomad client talks to the
    # agent on its own machine. Nodes not listed use ``consul_addr``.
    consul_agents: dict[str, str] = field(default_factory=dict)
    # The X-Consul-Token the clients send to their agents (Nomad's ``consul { token }``).
    consul_token: str | None = field(default=None, repr=False)
    # Workload identities for Consul (Nomad 2.0.5). With ``consul_task_identity`` (the
    # servers' ``consul { task_identity { aud = ["consul.io"] } }``) a task whose group or
    # task has a ``consul`` block gets the implicit identity ``consul_default``
    # (nomad/job_endpoint_hook_implicit_identities.go, handleConsulTask) and its client logs
    # it in to Consul's ``consul_auth_method``, signed with ``identity_signing_key`` (what
    # Consul's JWKS check verifies), for the token its templates read Consul with. Any
    # other task's templates read Consul with "invalid-token"
    # (client/allocrunner/taskrunner/template_hook.go), unless the client sets
    # ``template { use_client_consul_token = true }``: then with ``consul_token``.
    consul_task_identity: bool = True
    consul_auth_method: str = "nomad-workloads"
    identity_signing_key: bytes | None = field(default=None, repr=False)
    template_use_client_consul_token: bool = False
    # Refuse request bodies with keys real Nomad would silently drop (tests turn this on).
    strict: bool = False
    # When set, every API call must carry this token (X-Nomad-Token or a Bearer header),
    # as with ACLs on: 403 "Permission denied" without one, "ACL token not found" for another.
    acl_token: str | None = field(default=None, repr=False)  # repr: never print a secret
    # Nomad's server keeps the last 100 event batches by default (event_buffer_size).
    event_buffer_size: int = 100
    # Nomad's event stream writes "{}" on connect and every 30s (nomad/event_endpoint.go,
    # NewJsonStream(ctx, 30*time.Second)) so idle connections stay open and readers can
    # tell a quiet stream from a dead one.
    event_heartbeat_s: float = 30.0
    # Time between a node failing and the server noticing the missed heartbeat
    # (Nomad: heartbeat TTL + heartbeat_grace, tens of seconds; short here for dev).
    heartbeat_grace_s: float = 2.0
    # A client destroys its terminal allocations' directories, oldest first, while it holds
    # more than gc_max_allocs allocations (running and terminal) or the alloc dir's disk is
    # fuller than gc_disk_usage_threshold percent (client/gc.go, keepUsageBelowThreshold;
    # defaults of client/config/config.go: 50 and 80, v2.0.5).
    gc_max_allocs: int = 50
    gc_disk_usage_threshold: float = 80.0
    # Default and cap of a blocking query's ?wait: both 5 min in Nomad
    # (DefaultBlockingRPCQueryTime, MaxBlockingRPCQueryTime, QueryOptions.TimeToBlock in
    # nomad/structs/structs.go, v2.0.5).
    blocking_default_wait_s: float = 300.0
    blocking_max_wait_s: float = 300.0
    # How often template watchers poll Consul when its blocking query returns early.
    template_retry_s: float = 1.0
    # A template's failed Consul reads before it gives up and the task is killed
    # ("Template failed: ..."): Nomad's client template { consul_retry { attempts = 12 } }
    # (client/config/config.go, DefaultTemplateConfig), one template_retry_s apart here
    # (Nomad backs off from 250 ms to 1 min: about 5 min in all).
    template_consul_attempts: int = 12
    # A registration the Consul agent refused or could not take is tried again after this,
    # then twice this, ... at most ``consul_retry_max_s`` apart, until it is taken or the
    # service deregistered: Nomad's sync loop (command/agent/consul/service_client.go,
    # ``Run``: ``retryInterval * failures`` capped at ``maxRetryInterval``, 1 s and 30 s).
    consul_retry_s: float = 1.0
    consul_retry_max_s: float = 30.0
    # How long a stopped task may take to exit after SIGKILL before we give up waiting.
    kill_grace_s: float = 5.0
    # The node's artifact fetcher downloads nothing in dev: an artifact whose source URL is
    # a key here is copied from that local file (go-getter's "file" mode); others fail.
    artifact_files: dict[str, str] = field(default_factory=dict)

    def with_overrides(self, **changes: Any) -> StandInConfig:
        return replace(self, **changes)


def node_spec_from_mapping(doc: dict[str, Any], index: int) -> NodeSpec:
    known = {f for f in NodeSpec.__dataclass_fields__}
    unknown = set(doc) - known
    if unknown:
        raise ValueError(f"node #{index + 1}: unknown keys {sorted(unknown)}; known keys are {sorted(known)}")
    if "name" not in doc:
        doc = {**doc, "name": f"dev-node-{index + 1}"}
    docker = doc.get("docker")
    if docker is not None:
        doc = {**doc, "docker": docker_plugin_from_mapping(docker, index)}
    if "host_volumes" in doc:
        doc = {**doc, "host_volumes": host_volumes_from_list(doc["host_volumes"], index)}
    return NodeSpec(**doc)


def host_volumes_from_list(doc: object, index: int) -> tuple[HostVolume, ...]:
    """``host_volumes: [{name: llmgw-models, path: /var/lib/llmgw/hf-cache, read_only: false}]``."""
    if not isinstance(doc, list) or not all(isinstance(v, dict) for v in doc):
        raise ValueError(
            f"node #{index + 1}: host_volumes must be a list of host volumes, each {{name, path, read_only}}"
        )
    known = set(HostVolume.__dataclass_fields__)
    volumes = []
    for volume in doc:
        unknown = set(volume) - known
        if unknown or not {"name", "path"} <= set(volume):
            raise ValueError(
                f"node #{index + 1}: a host volume has name and path (and read_only); got {sorted(volume)}"
            )
        volumes.append(
            HostVolume(str(volume["name"]), str(volume["path"]), bool(volume.get("read_only", False)))
        )
    return tuple(volumes)


def docker_plugin_from_mapping(doc: object, index: int) -> DockerPlugin:
    """``docker: {volumes_enabled: true, allowed_ipc_modes: [host]}``; ``{}`` is the plugin's defaults."""
    if not isinstance(doc, dict):
        raise ValueError(f"node #{index + 1}: docker must be a mapping of the docker plugin's settings")
    known = set(DockerPlugin.__dataclass_fields__)
    unknown = set(doc) - known
    if unknown:
        raise ValueError(
            f"node #{index + 1}: unknown docker settings {sorted(unknown)}; "
            f"known settings are {sorted(known)}"
        )
    values: dict[str, Any] = {
        str(k): tuple(str(x) for x in v) if isinstance(v, list) else v for k, v in doc.items()
    }
    return DockerPlugin(**values)


def config_from_yaml(text: str) -> StandInConfig:
    """A config from YAML such as::

    nodes:
      - {name: a, gpus: 4, gpu_model: H100, fabric: ib-1}
      - {name: b, gpus: 2, gpu_model: A100, gpu_memory_mib: 40960}
      - {name: c, gpus: 8, docker: {volumes_enabled: true, daemon_runtimes: [nvidia, runc]},
         host_volumes: [{name: llmgw-models, path: /var/lib/llmgw/hf-cache}]}
    heartbeat_grace_s: 1
    """
    doc = yaml.safe_load(text) or {}
    if not isinstance(doc, dict):
        raise ValueError("the stand-in config must be a YAML mapping")
    nodes_doc = doc.pop("nodes", None)
    known = set(StandInConfig.__dataclass_fields__) - {"nodes"}
    unknown = set(doc) - known
    if unknown:
        raise ValueError(f"unknown stand-in settings {sorted(unknown)}; known settings are {sorted(known)}")
    if "state_dir" in doc and doc["state_dir"] is not None:
        doc["state_dir"] = Path(doc["state_dir"])
    config = StandInConfig(**doc)
    if nodes_doc is not None:
        if not isinstance(nodes_doc, list):
            raise ValueError("nodes must be a list of mappings")
        config = replace(
            config, nodes=tuple(node_spec_from_mapping(dict(n), i) for i, n in enumerate(nodes_doc))
        )
    return config
