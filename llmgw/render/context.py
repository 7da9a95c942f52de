"""The values a job template is rendered with, built from the catalog, a replica and the settings.

Owns every decision about what a replica's job contains (its id, meta,
groups, services, devices, rendezvous, where the weights come from); the
templates only arrange these values as HCL. Catalog strings stay plain ``str``
(escaped when written); llmgw's own run-time interpolations are ``Runtime``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from llmgw.core import conventions as c
from llmgw.core import engine_keys
from llmgw.core.catalog import Catalog, Engine, MirrorSource, Profile, allowlist_refusals, parse_source
from llmgw.core.catalog.images import Release, image_release
from llmgw.core.catalog.sources import FileUrlSource
from llmgw.core.durations import format_duration
from llmgw.core.engines import (
    KeyFromEnv,
    KeyIntake,
    Launch,
    LaunchContext,
    LoggingConfigFile,
    ModelFiles,
    RankLaunch,
    Runtime,
    Word,
    launch,
)
from llmgw.core.engines.base import HeadAddress
from llmgw.core.names import slug
from llmgw.core.planning.settings import PlanningSettings
from llmgw.render.settings import DEFAULT_RESOURCES, DEFAULT_SHM_MB, RenderSettings

_REPLICA_ID = re.compile(r"^[a-z0-9]{1,12}$")
_TASK_DIR = "${NOMAD_TASK_DIR}"
HEAD_FILE = "llmgw-head"
RANKS_FILE = "llmgw-ranks"
GGUF_DESTINATION = "local/model.gguf"
GGUF_IN_CONTAINER = "/local/model.gguf"
# The allocation's directory is shared by its tasks: the raw_exec fetch sees it at its host
# path, the engine's container at /alloc, and Nomad gives each its own NOMAD_ALLOC_DIR.
GGUF_PATH_FILE = Runtime("${NOMAD_ALLOC_DIR}/llmgw-gguf-path")
# The node's model cache in the engine's container. vLLM and SGLang download a repository
# with huggingface_hub, whose cache is HF_HUB_CACHE (huggingface_hub constants.py; it wins
# over HF_HOME/hub); llama.cpp downloads nothing (a Nomad artifact or the mirror's files).
MODEL_CACHE_VOLUME = "model-cache"
MODEL_CACHE_IN_CONTAINER = "/llmgw-cache"
HUB_CACHE_ENV = {"HF_HUB_CACHE": f"{MODEL_CACHE_IN_CONTAINER}/hub"}
HUB_DOWNLOADING_ENGINES = frozenset({Engine.VLLM, Engine.SGLANG})
# The Nomad Variable item an operator stores the Hugging Face token under.
HF_TOKEN_ITEM = "HF_TOKEN"  # noqa: S105 - the name of an item, not a token


class RenderError(Exception):
    """A replica cannot be rendered; the message says what to change."""


@dataclass(frozen=True, slots=True)
class ReplicaRequest:
    model: str
    profile_index: int
    replica_id: str
    # The fabric (node meta llmgw_fabric) a multi-node replica is constrained to.
    fabric: str | None = None


# Rendered in place of the replica id and the fabric, so one render's text is the
# same for every replica of a profile; names and fabrics never contain "@@".
REPLICA_SLOT = "@@replica@@"
FABRIC_SLOT = "@@fabric@@"
# And the version: an llmgw upgrade that renders the same job must not roll replicas.
VERSION_SLOT = "@@version@@"


# Metacharacters of RE2, Nomad's regexp syntax: each written escaped.
_RE2_SPECIAL = set("\\.+*?()|[]{}^$")


def gpu_model_pattern(model: str) -> str:
    """The catalog's GPU model as a whole word in the device's name, case-insensitively:
    "H100" matches "NVIDIA H100 80GB HBM3", not "H1000"."""
    literal = "".join(f"\\{char}" if char in _RE2_SPECIAL else char for char in model)
    return f"(?i)(^|[^a-z0-9]){literal}([^a-z0-9]|$)"


def job_id_for(model: str, replica_id: str) -> str:
    """``llmgw-<model slug>-<replica id>``: stable, collision-free (the slug carries a hash)."""
    if replica_id != REPLICA_SLOT and not _REPLICA_ID.fullmatch(replica_id):
        raise RenderError(f"replica id {replica_id!r} must be 1 to 12 lowercase letters or digits")
    return f"llmgw-{slug(model)}-{replica_id}"


def _runtime_words(words: tuple[str, ...]) -> tuple[Word, ...]:
    """Operator settings are trusted: their ${...} is Nomad interpolation."""
    return tuple(Runtime(w) if "${" in w else w for w in words)


def build_context(
    catalog: Catalog,
    request: ReplicaRequest,
    settings: RenderSettings,
    *,
    template: str,
    catalog_hash: str,
    spec_hash: str,
) -> dict[str, Any]:
    model = catalog.models.get(request.model)
    if model is None:
        raise RenderError(f"the catalog has no model {request.model!r}")
    if not 0 <= request.profile_index < len(model.profiles):
        raise RenderError(
            f"model {request.model!r} has {len(model.profiles)} profile(s); "
            f"there is no profile {request.profile_index}"
        )
    profile = model.profiles[request.profile_index]
    job_id = job_id_for(request.model, request.replica_id)
    # The cluster's allowed images and source networks: the same rule and words as the
    # catalog's doors, here for a catalog that did not come through them.
    refused = next(allowlist_refusals(profile, settings.allowlists, model.roles), None)
    if refused is not None:
        raise RenderError(f"model {request.model!r} profile {request.profile_index}: {refused[1]}")
    # The operator's own default image is held to the same minimum release.
    gpus = profile.gpus_per_replica_node
    default_refused = None if profile.image else settings.default_image_refusal(profile.engine, gpus)
    if default_refused is not None:
        raise RenderError(f"model {request.model!r} profile {request.profile_index}: {default_refused}")
    if profile.node_count > 1 and request.fabric is None:
        raise RenderError(f"model {request.model!r}: a replica on {profile.node_count} nodes needs a fabric")
    llmgw_command = _runtime_words(settings.llmgw_command)
    files, fetch, artifact = _model_files(request.model, profile, settings, llmgw_command)
    image = profile.image or settings.default_image(profile.engine, gpus) or ""
    launched = launch(
        profile,
        LaunchContext(
            served_name=request.model,
            model=files,
            llmgw_command=llmgw_command,
            roles=model.roles,
            requires_api_key=settings.engine_api_keys,
            release=_image_release(profile, settings),
            load_wait_s=_load_wait_s(profile),
        ),
    )
    cpu, memory = DEFAULT_RESOURCES[profile.engine]
    if profile.resources is not None:
        cpu = profile.resources.cpu_mhz or cpu
        memory = profile.resources.memory_mb or memory
    meta = {
        c.JOB_META_MANAGED_BY: c.MANAGED_BY_VALUE,
        c.JOB_META_MODEL: request.model,
        c.JOB_META_PROFILE: str(request.profile_index),
        c.JOB_META_REPLICA: request.replica_id,
        c.JOB_META_ENGINE: profile.engine.value,
        c.JOB_META_CATALOG_HASH: catalog_hash,
        c.JOB_META_SPEC_HASH: spec_hash,
        c.JOB_META_VERSION: VERSION_SLOT,
    }
    if request.fabric is not None:
        meta[c.JOB_META_FABRIC] = request.fabric
    model_cache = None
    if settings.model_cache_volume and profile.engine in HUB_DOWNLOADING_ENGINES and fetch is None:
        model_cache = {
            "name": MODEL_CACHE_VOLUME,
            "source": settings.model_cache_volume,
            "destination": MODEL_CACHE_IN_CONTAINER,
        }
    groups = [
        _group(
            job_id, request, profile, launched, rank, settings, llmgw_command, fetch, artifact, model_cache
        )
        for rank in launched.ranks
    ]
    return {
        "job": {
            "id": job_id,
            "template": template,
            "llmgw_version": VERSION_SLOT,
            "model": request.model,
            "profile_index": request.profile_index,
            "engine": profile.engine.value,
            "datacenters": list(settings.datacenters),
            "region": settings.region,
            "namespace": settings.namespace,
            "node_pool": settings.node_pool,
            "priority": settings.priority,
            "meta": meta,
            "fabric": request.fabric,
            "fabric_meta_key": c.NODE_META_FABRIC,
            "containerised": launched.containerised,
            "image": image,
            "volumes": [f"{settings.model_cache_dir}:{settings.model_cache_dir}:ro"] if fetch else [],
            "model_cache": model_cache,
            "resources": {"cpu": cpu, "memory": memory},
            "restart": {
                "attempts": settings.restart_attempts,
                "interval": format_duration(settings.restart_interval_s),
                "delay": format_duration(settings.restart_delay_s),
            },
            "check": {
                "interval": format_duration(settings.check_interval_s),
                "timeout": format_duration(settings.check_timeout_s),
            },
            "kill_timeout": format_duration(settings.kill_timeout_s),
            "image_pull_timeout": format_duration(settings.image_pull_timeout_s),
            "nvidia_runtime": settings.nvidia_runtime,
            # Docker's shm_size is in bytes.
            "shm_size": (settings.shm_size_mb or DEFAULT_SHM_MB.get(profile.engine, 64)) * 2**20,
            "shutdown_delay": format_duration(settings.shutdown_delay_s),
            "lost_after": format_duration(settings.lost_after_s),
            "groups": groups,
        }
    }


def _image_release(profile: Profile, settings: RenderSettings) -> Release | None:
    """The engine release the replica's image names (the profile's, else the default)."""
    image = profile.image or settings.images.get(profile.engine)
    return None if image is None else image_release(profile.engine, image)


def _load_wait_s(profile: Profile) -> int:
    """How long the control plane waits for a replica to load: its placement timeout (the
    last rank's image pull) or the profile's load timeout, the longer (PlanningSettings'
    defaults, which ``llmgw serve`` runs with)."""
    planning = PlanningSettings()
    return math.ceil(
        max(planning.placement_timeout, planning.load_timeout(profile.engine, profile.load_timeout))
    )


def _model_files(
    model: str, profile: Profile, settings: RenderSettings, llmgw_command: tuple[Word, ...]
) -> tuple[ModelFiles, dict[str, Any] | None, dict[str, str] | None]:
    """What the engine loads, and how it gets there (a mirror fetch step, a Nomad artifact)."""
    if profile.source is None:
        return ModelFiles(model), None, None
    source = parse_source(profile.source)
    if isinstance(source, MirrorSource):
        if settings.mirror_url is None:
            if profile.engine is Engine.SIM:
                # The simulator loads nothing, so it runs without a mirror; with one, its
                # replicas fetch and verify like any engine's (the same job, the same failures).
                return ModelFiles(str(source)), None, None
            raise RenderError(f"{source} needs the mirror's address (--mirror-url or LLMGW_MIRROR_URL)")
        dest = f"{settings.model_cache_dir}/{source.name}/{source.version}"
        argv: tuple[Word, ...] = (
            *llmgw_command,
            "mirror",
            "fetch",
            "--mirror",
            settings.mirror_url,
            "--ref",
            f"{source.name}@{source.version}",
            "--dest",
            dest,
        )
        if profile.engine is Engine.LLAMACPP:
            # llama-server loads one GGUF file, which only the manifest names: the fetch
            # writes its path into the allocation's shared directory for the engine to read.
            argv = (*argv, "--gguf-path-file", GGUF_PATH_FILE)
            return ModelFiles(dest, path_file=GGUF_PATH_FILE), {"argv": list(argv)}, None
        return ModelFiles(dest), {"argv": list(argv)}, None
    if isinstance(source, FileUrlSource) and profile.engine is Engine.LLAMACPP:
        return ModelFiles(GGUF_IN_CONTAINER), None, {"source": source.url, "destination": GGUF_DESTINATION}
    return ModelFiles(profile.source), None, None


def _service_query(tag: str) -> str:
    return f'service "{tag}.{c.RANK_SERVICE}"'


def _group(
    job_id: str,
    request: ReplicaRequest,
    profile: Profile,
    launched: Launch,
    rank: RankLaunch,
    settings: RenderSettings,
    llmgw_command: tuple[Word, ...],
    fetch: dict[str, Any] | None,
    artifact: dict[str, str] | None,
    model_cache: dict[str, str] | None,
) -> dict[str, Any]:
    multi_rank = len(launched.ranks) > 1
    role_tag = f"head={job_id}" if rank.rank == 0 else f"worker={job_id}"
    common_meta: dict[str, Word] = {
        c.META_MODEL: request.model,
        c.META_MODEL_SLUG: slug(request.model),
        c.META_REPLICA: request.replica_id,
        c.META_JOB: job_id,
        c.META_PROFILE: str(request.profile_index),
        c.META_ENGINE: profile.engine.value,
        c.META_RANK: str(rank.rank),
        c.META_ALLOC: Runtime("${NOMAD_ALLOC_ID}"),
        c.META_SIMULATED: "true" if profile.engine is Engine.SIM else "false",
    }
    engine_service = None
    if rank.serves_api:
        engine_service = {
            "name": c.ENGINE_SERVICE,
            "tags": [
                c.SERVICE_TAG,
                f"{c.TAG_MODEL}={slug(request.model)}",
                f"{c.TAG_REPLICA}={job_id}",
                f"{c.TAG_RANK}=0",
            ],
            "meta": common_meta,
            "health_path": launched.health_path,
            # Never shorter than the engine takes to give its own answer (SGLang: 20 s and more).
            "health_timeout": format_duration(max(settings.check_timeout_s, launched.health_answer_within_s)),
        }
    rendezvous_service = None
    if multi_rank:
        rendezvous_service = {
            "name": c.RANK_SERVICE,
            "port": rank.rendezvous_port,
            "tags": [c.SERVICE_TAG, f"{c.TAG_REPLICA}={job_id}", f"{c.TAG_RANK}={rank.rank}", role_tag],
            "meta": common_meta,
            "tcp_check": rank.rendezvous_checked and rank.rendezvous_port is not None,
        }
    address_of_head = (
        "{{ range " + _service_query(f"head={job_id}") + " }}{{ .Address }}:{{ .Port }}{{ end }}"
    )
    head_template = None
    waits: list[dict[str, Any]] = []
    if rank.head_address is HeadAddress.FILE:
        head_template = {"destination": f"local/{HEAD_FILE}", "data": address_of_head + "\n", "env": False}
    elif rank.head_address is HeadAddress.ENV:
        # host:port, and each half on its own for an engine that takes them apart (vLLM's
        # --master-addr and --master-port).
        head_query = "{{ range " + _service_query(f"head={job_id}") + " }}"
        head_template = {
            "destination": f"secrets/{HEAD_FILE}.env",
            "data": f"LLMGW_HEAD_ADDR={address_of_head}\n"
            f"LLMGW_HEAD_IP={head_query}{{{{ .Address }}}}{{{{ end }}}}\n"
            f"LLMGW_HEAD_PORT={head_query}{{{{ .Port }}}}{{{{ end }}}}\n",
            "env": True,
        }
    if head_template is not None:
        # The engine starts once its head is known, whichever way it reads the address, so
        # every worker rank waits in the same prestart task (and a rank whose Consul reads
        # are filtered waits there, where llmgw status can see it: core/planning/replicas.py).
        waits.append(_wait("await-head", llmgw_command, settings, lines=1, head=address_of_head + "\n"))
    if rank.waits_for_ranks:
        others = "{{ range " + _service_query(f"worker={job_id}") + " }}{{ .Address }}:{{ .Port }}\n{{ end }}"
        waits.append(_wait("await-ranks", llmgw_command, settings, lines=rank.waits_for_ranks, ranks=others))
    gpu = None
    if profile.requests_gpus:
        gpu = {
            "count": profile.gpus_per_replica_node,
            "model": profile.gpu.model if profile.gpu else None,
            "model_pattern": gpu_model_pattern(profile.gpu.model)
            if profile.gpu and profile.gpu.model
            else None,
            # Marketing gigabytes to the MiB the device plugin reports, so an
            # "80 GB" card (81559 MiB) satisfies memory_gb: 80.
            "min_memory": f"{profile.gpu.memory_gb * 10**9 // 2**20} MiB"
            if profile.gpu and profile.gpu.memory_gb
            else None,
        }
    return {
        "name": f"rank-{rank.rank}",
        "rank": rank.rank,
        "ports": list(rank.ports),
        "engine_service": engine_service,
        "rendezvous_service": rendezvous_service,
        "gpu": gpu,
        "serve": {
            "argv": list(rank.serve.argv),
            # The key's logging config is llmgw's even where a policy lets a catalog set one.
            "env": {
                **dict(rank.serve.env),
                **(HUB_CACHE_ENV if model_cache else {}),
                **profile.env,
                **_key_logging_env(launched, rank),
            },
        },
        "waits": waits,
        # A template of this group reads Consul: the group needs a Consul identity.
        "reads_consul": head_template is not None or any(any(wait["templates"].values()) for wait in waits),
        "head_address_template": head_template,
        "ranks_template": None,
        "fetch": fetch,
        "artifact": artifact,
        "secret_templates": _secret_templates(
            settings, job_id, launched.key_intake if rank.serves_api else None
        ),
        "logging_template": _logging_template(launched.key_logging) if rank.serves_api else None,
    }


def _key_logging_env(launched: Launch, rank: RankLaunch) -> dict[str, Word]:
    config = launched.key_logging
    return {config.variable: config.path} if config is not None and rank.serves_api else {}


def _logging_template(config: LoggingConfigFile | None) -> dict[str, Any] | None:
    """The engine's logging config, written by Nomad into the task's ``local/`` before it
    starts. Plain text, not a secret: llmgw's own, so it reads no Variable."""
    if config is None:
        return None
    return {"destination": f"local/{config.file_name}", "data": config.text}


def _secret_templates(
    settings: RenderSettings, job_id: str, key_intake: KeyIntake | None
) -> list[dict[str, Any]]:
    """Secrets Nomad renders for the engine from Variables: never in the job's text or argv.

    Each is a ``template`` under ``secrets/`` (the task's directory Nomad keeps out of
    the allocation's shared directory and of ``nomad alloc fs``'s reach for other tasks),
    read through the task's workload identity, with ``env = true`` when the engine reads
    the secret from its environment; a variable that does not exist keeps the task
    pending until it is written. ``key_intake``: where rank 0's engine reads its API key.
    """
    templates: list[dict[str, Any]] = []
    if settings.hf_token_variable is not None:
        templates.append(
            {
                "destination": "secrets/hf-token.env",
                "data": (
                    f'{{{{ with nomadVar "{settings.hf_token_variable}" }}}}'
                    f"{HF_TOKEN_ITEM}={{{{ .{HF_TOKEN_ITEM} }}}}{{{{ end }}}}\n"
                ),
                "env": True,
            }
        )
    if key_intake is not None:
        # The job's own variable: its workload identity reads it without any ACL policy.
        variable = engine_keys.variable_path(job_id)
        key = f"{{{{ .{engine_keys.KEY_ITEM} }}}}"
        if isinstance(key_intake, KeyFromEnv):
            destination, text, env = "secrets/engine-key.env", f"{key_intake.variable}={key}", True
        else:
            # The key is hex after a fixed prefix (engine_keys.for_replica): safe quoted in YAML.
            destination, text, env = f"secrets/{key_intake.file_name}", f'{key_intake.item}: "{key}"', False
        templates.append(
            {
                "destination": destination,
                "data": f'{{{{ with nomadVar "{variable}" }}}}{text}{{{{ end }}}}\n',
                "env": env,
            }
        )
    return templates


def _wait(
    name: str,
    llmgw_command: tuple[Word, ...],
    settings: RenderSettings,
    *,
    lines: int,
    head: str | None = None,
    ranks: str | None = None,
) -> dict[str, Any]:
    filename = HEAD_FILE if head is not None else RANKS_FILE
    argv = (
        *llmgw_command,
        "rendezvous",
        "wait",
        "--file",
        Runtime(f"{_TASK_DIR}/{filename}"),
        "--lines",
        str(lines),
        "--timeout",
        str(settings.rendezvous_timeout_s),
    )
    templates: dict[str, Any] = {"head_address_template": None, "ranks_template": None}
    if head is not None:
        templates["head_address_template"] = {"destination": f"local/{HEAD_FILE}", "data": head, "env": False}
    if ranks is not None:
        templates["ranks_template"] = {"destination": f"local/{RANKS_FILE}", "data": ranks}
    return {"name": name, "argv": list(argv), "templates": templates}
