"""Rendered jobs on stand-in nodes shaped like real 8 x H100 Nomad 2.0 clients with Docker and NVIDIA.

The nodes fingerprint the docker driver and the NVIDIA device plugin as real ones do
(``real_gpu_nodes``); the stand-in checks each docker task as Nomad's docker driver
does and fails it with the driver's words. Driven through llmgw's own Nomad client
and python-nomad, as against a real cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import nomad
import pytest

from llmgw.adapters.nomad import NomadClient
from llmgw.bundled import read_security_policy
from llmgw.core.catalog import Catalog, Engine, catalog_digest, load_catalog
from llmgw.devcluster.cluster import DevCluster, DevClusterConfig
from llmgw.devcluster.consul import ConsulSettings
from llmgw.devcluster.nomad import StandInConfig
from llmgw.devcluster.nomad.config import (
    GPU_NODE_DOCKER,
    GPU_NODE_MODEL_CACHE,
    DockerPlugin,
    HostVolume,
    real_gpu_nodes,
)
from llmgw.devcluster.nomad.docker import pull_failure
from llmgw.render import Renderer, RenderSettings, ReplicaRequest
from llmgw.settings import NomadConnection
from tests.support.waiting import eventually

MULTI_NODE = """
models:
  vllm-two-nodes:
    roles: [chat]
    profiles:
      - engine: vllm
        source: meta-llama/Llama-3.1-405B-Instruct-FP8
        tp: 8
        pp: 2
        nodes: 2
        gpu: {model: H100, memory_gb: 80}
        resources: {cpu_mhz: 32000, memory_mb: 262144}
  sglang-two-nodes:
    roles: [chat]
    profiles:
      - engine: sglang
        source: meta-llama/Llama-3.1-405B-Instruct-FP8
        tp: 16
        nodes: 2
        gpu: {model: H100, memory_gb: 80}
  mirrored:
    roles: [chat]
    profiles:
      - engine: vllm
        source: mirror:llama-8b@v1
        gpu: {memory_gb: 24}
"""


def _catalog(text: str) -> Catalog:
    catalog = load_catalog(text, filename="test.yaml", policy=read_security_policy()).catalog
    assert catalog is not None
    return catalog


async def _cluster(
    tmp_path: Path,
    docker: DockerPlugin,
    *,
    count: int = 3,
    host_volumes: tuple[HostVolume, ...] = (GPU_NODE_MODEL_CACHE,),
    artifact_files: dict[str, str] | None = None,
) -> DevCluster:
    cluster = DevCluster(
        DevClusterConfig(
            nomad=StandInConfig(
                nodes=real_gpu_nodes(count, docker=docker, host_volumes=host_volumes),
                artifact_files=artifact_files or {},
                strict=True,
                heartbeat_grace_s=0.5,
                event_heartbeat_s=1.0,
                template_retry_s=0.2,
                kill_grace_s=2.0,
            ),
            consul=ConsulSettings.for_tests(),
            state_dir=tmp_path / "nomad",
        )
    )
    await cluster.start()
    return cluster


@pytest.fixture
async def gpu_cluster(tmp_path: Path) -> AsyncIterator[DevCluster]:
    cluster = await _cluster(tmp_path, GPU_NODE_DOCKER)
    try:
        yield cluster
    finally:
        await cluster.stop()


def _renderer(nvidia_runtime: str = "nvidia") -> Renderer:
    settings = RenderSettings(
        llmgw_command=("${attr.driver.raw_exec.python}", "-m", "llmgw"),
        mirror_url="http://127.0.0.1:9",
        nvidia_runtime=nvidia_runtime,
    )
    return Renderer(settings, read_security_policy())


async def _plan(
    dev: DevCluster,
    catalog: Catalog,
    model: str,
    profile: int,
    nodes: int,
    *,
    renderer: Renderer | None = None,
) -> tuple[bool, str]:
    rendered = (renderer or _renderer()).render(
        catalog,
        ReplicaRequest(model, profile, "0", "fabric-a" if nodes > 1 else None),
        catalog_hash=catalog_digest(catalog),
    )
    async with NomadClient(NomadConnection(address=dev.nomad_addr, token=dev.nomad_token)) as client:
        plan = await client.plan(await client.parse_hcl(rendered.hcl))
    return plan.feasible, plan.explanation


async def test_every_example_job_and_two_node_vllm_and_sglang_place_on_real_gpu_clients(
    gpu_cluster: DevCluster, example_catalog: Catalog
) -> None:
    for name, model in example_catalog.models.items():
        for index, profile in enumerate(model.profiles):
            feasible, explanation = await _plan(gpu_cluster, example_catalog, name, index, profile.node_count)
            assert feasible, (name, index, explanation)
            assert explanation.startswith("places: all"), explanation
    extra = _catalog(MULTI_NODE)
    for name in extra.models:
        feasible, explanation = await _plan(
            gpu_cluster, extra, name, 0, extra.models[name].profiles[0].node_count
        )
        # Each rank asks for its own node's 8 GPUs once (not 16 on rank 0's node).
        assert feasible, (name, explanation)


async def test_a_node_without_docker_volumes_or_the_nvidia_runtime_is_filtered_and_the_plan_names_the_setting(
    tmp_path: Path,
) -> None:
    cluster = await _cluster(tmp_path, DockerPlugin())  # the docker plugin's defaults, plain Docker
    try:
        feasible, explanation = await _plan(cluster, _catalog(MULTI_NODE), "mirrored", 0, 1)
        assert not feasible
        assert "3 filtered by ${attr.driver.docker.volumes.enabled} = true" in explanation, explanation
        assert 'plugin "docker" { config { volumes { enabled = true } } }' in explanation, explanation
    finally:
        await cluster.stop()
    cluster = await _cluster(tmp_path / "2", DockerPlugin(volumes_enabled=True))
    try:
        feasible, explanation = await _plan(cluster, _catalog(MULTI_NODE), "mirrored", 0, 1)
        assert not feasible
        assert "3 filtered by ${attr.driver.docker.runtimes} set_contains nvidia" in explanation, explanation
        assert "NVIDIA Container Toolkit" in explanation, explanation
    finally:
        await cluster.stop()


async def test_a_renamed_nvidia_runtime_places_only_with_the_render_setting_naming_it(tmp_path: Path) -> None:
    """The docker plugin's nvidia_runtime renames the runtime GPU tasks get
    (drivers/docker/config.go, default "nvidia"); Docker lists it under that name, so the
    rendered constraint must name it too (RenderSettings.nvidia_runtime, LLMGW_NVIDIA_RUNTIME)."""
    renamed = DockerPlugin(
        volumes_enabled=True,
        nvidia_runtime="nvidia-gpu",
        allow_runtimes=("runc", "nvidia-gpu"),
        daemon_runtimes=("io.containerd.runc.v2", "nvidia-gpu", "runc"),
    )
    cluster = await _cluster(tmp_path, renamed)
    try:
        feasible, explanation = await _plan(cluster, _catalog(MULTI_NODE), "mirrored", 0, 1)
        assert not feasible
        assert "3 filtered by ${attr.driver.docker.runtimes} set_contains nvidia" in explanation, explanation
        feasible, explanation = await _plan(
            cluster, _catalog(MULTI_NODE), "mirrored", 0, 1, renderer=_renderer(nvidia_runtime="nvidia-x")
        )
        assert not feasible
        assert 'registered with Docker as "nvidia-x"' in explanation, explanation
        assert 'nvidia_runtime = "nvidia-x"' in explanation, explanation
        feasible, explanation = await _plan(
            cluster, _catalog(MULTI_NODE), "mirrored", 0, 1, renderer=_renderer(nvidia_runtime="nvidia-gpu")
        )
        assert feasible, explanation
    finally:
        await cluster.stop()


def _python_nomad(dev: DevCluster) -> nomad.Nomad:
    address = urlsplit(dev.nomad_addr)
    return nomad.Nomad(host=address.hostname, port=address.port, timeout=10, token=dev.nomad_token)


async def _failed_engine_events(dev: DevCluster, job_id: str) -> list[dict[str, object]]:
    """The task events of the job's engine task, once its allocation failed."""
    looker = _python_nomad(dev)

    async def failed_events() -> list[dict[str, object]] | None:
        for stub in await asyncio.to_thread(looker.job.get_allocations, job_id):
            if stub["ClientStatus"] != "failed":
                continue
            alloc = await asyncio.to_thread(looker.allocation.get_allocation, stub["ID"])
            return list(alloc["TaskStates"]["engine"]["Events"])
        return None

    return await eventually(failed_events, 30, f"a failed engine allocation of {job_id}")


async def _failed_engine_event(dev: DevCluster, job_id: str) -> str:
    """The Driver Failure message of the job's engine task, once its allocation failed."""
    events = await _failed_engine_events(dev, job_id)
    # Not restarted: the driver's start error is unrecoverable.
    assert events[-1]["Type"] == "Not Restarting", events
    assert events[-1]["DisplayMessage"] == "Error was unrecoverable", events
    for event in events:
        if event["Type"] == "Driver Failure":
            return str(event["DisplayMessage"])
    raise AssertionError(f"no Driver Failure among {events}")


async def test_a_gguf_artifact_is_copied_from_the_local_file_dev_names_else_its_download_fails(
    tmp_path: Path, example_catalog: Catalog
) -> None:
    rendered = _renderer().render(
        example_catalog,
        ReplicaRequest("qwen2.5-7b-gguf", 0, "0"),
        catalog_hash=catalog_digest(example_catalog),
    )
    url = str(example_catalog.models["qwen2.5-7b-gguf"].profiles[0].source)
    gguf = tmp_path / "qwen.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    for index, files in enumerate(({}, {url: str(gguf)})):
        cluster = await _cluster(tmp_path / str(index), GPU_NODE_DOCKER, artifact_files=files)
        try:
            async with NomadClient(
                NomadConnection(address=cluster.nomad_addr, token=cluster.nomad_token)
            ) as client:
                await client.register(await client.parse_hcl(rendered.hcl))
            if not files:
                events = await _failed_engine_events(cluster, rendered.job_id)
                assert events[-1]["Type"] == "Failed Artifact Download", events
                assert str(events[-1]["DisplayMessage"]).startswith(f'failed to download artifact "{url}": ')
                assert "llmgw dev --artifact URL=FILE" in str(events[-1]["DisplayMessage"])
            else:
                # Copied where the task's artifact block puts it; then the image (no local
                # llama-server on these nodes) is not pulled.
                image = _renderer().settings.images[Engine.LLAMACPP]
                assert await _failed_engine_event(cluster, rendered.job_id) == pull_failure(image)
                [copied] = (tmp_path / "1" / "nomad").rglob("local/model.gguf")
                assert copied.read_bytes() == gguf.read_bytes()
                # Hard-linked, not copied: one file on disk however many allocations load it.
                assert copied.stat().st_ino == gguf.stat().st_ino and gguf.stat().st_nlink == 2
        finally:
            await cluster.stop()


DOCKER_JOB = """
job "ipc" {
  datacenters = ["*"]
  group "g" {
    task "engine" {
      driver = "docker"
      config {
        image    = "vllm/vllm-openai:v0.11.0"
        ipc_mode = "host"
      }
    }
  }
}
"""


async def test_host_ipc_fails_the_allocation_with_the_docker_drivers_message(tmp_path: Path) -> None:
    cluster = await _cluster(tmp_path, GPU_NODE_DOCKER)  # no allowed_modes, as a default client
    try:
        async with NomadClient(
            NomadConnection(address=cluster.nomad_addr, token=cluster.nomad_token)
        ) as client:
            await client.register(await client.parse_hcl(DOCKER_JOB))
        message = await _failed_engine_event(cluster, "ipc")
        assert message == (
            'Failed to create container configuration for image "vllm/vllm-openai:v0.11.0" '
            '("vllm/vllm-openai:v0.11.0"): cannot apply "ipc_mode" configuration'
        )
    finally:
        await cluster.stop()


async def test_a_rendered_engine_passes_the_drivers_checks_and_its_image_is_not_pulled_in_dev(
    gpu_cluster: DevCluster, example_catalog: Catalog
) -> None:
    rendered = _renderer().render(
        example_catalog, ReplicaRequest("llama-3.1-70b", 0, "0"), catalog_hash=catalog_digest(example_catalog)
    )
    async with NomadClient(
        NomadConnection(address=gpu_cluster.nomad_addr, token=gpu_cluster.nomad_token)
    ) as client:
        job = await client.parse_hcl(rendered.hcl)
        await client.register(job)
    message = await _failed_engine_event(gpu_cluster, rendered.job_id)
    [engine] = [t for t in job["TaskGroups"][0]["Tasks"] if t["Name"] == "engine"]
    image = engine["Config"]["image"]
    assert message == pull_failure(image)
    assert message.startswith(f"Failed to pull `{image}`: ")


async def test_a_node_without_the_model_cache_volume_is_filtered_and_the_plan_names_the_client_setting(
    tmp_path: Path, example_catalog: Catalog
) -> None:
    cluster = await _cluster(tmp_path, GPU_NODE_DOCKER, host_volumes=())
    try:
        feasible, explanation = await _plan(cluster, example_catalog, "llama-3.1-8b", 0, 1)
        assert not feasible
        assert "3 filtered by missing compatible host volumes" in explanation, explanation
        assert 'host_volume "llmgw-models"' in explanation, explanation
        # llama.cpp downloads nothing itself: it needs no cache volume.
        feasible, explanation = await _plan(cluster, example_catalog, "qwen2.5-7b-gguf", 0, 1)
        assert feasible, explanation
    finally:
        await cluster.stop()


async def _placed_alloc(dev: DevCluster, job_id: str) -> dict:  # type: ignore[type-arg]
    looker = _python_nomad(dev)
    stubs = await eventually(
        lambda: asyncio.to_thread(looker.job.get_allocations, job_id), 30, f"{job_id} placed"
    )
    return dict(await asyncio.to_thread(looker.allocation.get_allocation, stubs[0]["ID"]))


async def test_a_replica_rebuilt_on_the_same_node_mounts_the_same_model_cache(
    tmp_path: Path, example_catalog: Catalog
) -> None:
    """What the Nomad client mounts (``client/allocrunner/taskrunner/volume_hook.go``): the
    group's host volume request resolved against the node's ``HostVolumes`` by its source."""
    cache = HostVolume("llmgw-models", str(tmp_path / "hf-cache"))
    cluster = await _cluster(tmp_path, GPU_NODE_DOCKER, count=1, host_volumes=(cache,))
    looker = _python_nomad(cluster)
    mounted: list[tuple[str, str, str, str]] = []
    try:
        for replica in ("a", "b"):  # the replica, then the one llmgw rebuilds in its place
            rendered = _renderer().render(
                example_catalog, ReplicaRequest("llama-3.1-8b", 0, replica), catalog_hash="h"
            )
            async with NomadClient(
                NomadConnection(address=cluster.nomad_addr, token=cluster.nomad_token)
            ) as c:
                await c.register(await c.parse_hcl(rendered.hcl))
            alloc = await _placed_alloc(cluster, rendered.job_id)
            node = await asyncio.to_thread(looker.node.get_node, alloc["NodeID"])
            [group] = alloc["Job"]["TaskGroups"]
            engine = next(t for t in group["Tasks"] if t["Name"] == "engine")
            [mount] = engine["VolumeMounts"]
            request = group["Volumes"][mount["Volume"]]
            assert request["Type"] == "host" and not mount["ReadOnly"]
            host_path = node["HostVolumes"][request["Source"]]["Path"]
            mounted.append((node["ID"], host_path, mount["Destination"], engine["Env"]["HF_HUB_CACHE"]))
            async with NomadClient(
                NomadConnection(address=cluster.nomad_addr, token=cluster.nomad_token)
            ) as c:
                await c.deregister(rendered.job_id)
    finally:
        await cluster.stop()
    first, rebuilt = mounted
    assert first == rebuilt
    assert first[1] == cache.path and first[3] == f"{first[2]}/hub"


def test_an_artifact_on_another_filesystem_is_copied_and_said_to_be(tmp_path: Path) -> None:
    from llmgw.devcluster.nomad.client import TaskRunner

    elsewhere = Path("/dev/shm")
    if not elsewhere.is_dir() or elsewhere.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the test's folder")
    local = elsewhere / f"llmgw-test-{tmp_path.name}.gguf"
    local.write_bytes(b"GGUF" + bytes(60))
    try:
        dest = tmp_path / "alloc" / "local" / "model.gguf"
        dest.parent.mkdir(parents=True)
        dest.write_bytes(b"the last run's")
        assert TaskRunner._link_artifact(local, dest) is False  # copied: a link cannot cross
        assert dest.read_bytes() == local.read_bytes() and local.stat().st_nlink == 1
    finally:
        local.unlink()
