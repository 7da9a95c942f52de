"""The docker driver of a stand-in GPU node: its fingerprint, the refusals of createContainerConfig,
and its image pulls.

Messages are Nomad v2.0.5's (drivers/docker/driver.go, containerBinds and
createContainerConfig; drivers/shared/capabilities/defaults.go, Delta).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import nomad
import pytest

from llmgw.devcluster.nomad import NomadServer, NomadStandIn, StandInConfig, config_from_yaml
from llmgw.devcluster.nomad.config import GPU_NODE_DOCKER, DockerPlugin, HostVolume, NodeSpec, real_gpu_nodes
from llmgw.devcluster.nomad.docker import container_config_refusal, container_run, pull_failure, start_failure
from tests.component.devcluster_nomad.conftest import assert_shape, call, fast_config, group, wait_for

TASK_DIR = "/data/alloc/1/engine"
ALLOC_DIR = "/data/alloc/1"


def refusal(plugin: DockerPlugin, config: dict[str, object], *, gpus: bool = False) -> str | None:
    return container_config_refusal(plugin, config, gpus=gpus, task_dir=TASK_DIR, alloc_dir=ALLOC_DIR)


def test_namespace_modes_need_allowed_modes_or_privileged() -> None:
    # Since Nomad 2.0.4 a default client allows no ipc/pid/uts/userns mode.
    assert refusal(DockerPlugin(), {"ipc_mode": "host"}) == 'cannot apply "ipc_mode" configuration'
    assert refusal(DockerPlugin(), {"pid_mode": "host"}) == 'cannot apply "pid_mode" configuration'
    assert refusal(DockerPlugin(allowed_ipc_modes=("host",)), {"ipc_mode": "host"}) is None
    assert refusal(DockerPlugin(allowed_ipc_modes=("cont*",)), {"ipc_mode": "container:x"}) is None
    assert refusal(DockerPlugin(allowed_ipc_modes=("private",)), {"ipc_mode": "host"}) is not None
    assert refusal(DockerPlugin(allowed_ipc_modes=("h?st",)), {"ipc_mode": "host"}) is not None  # only *
    assert refusal(DockerPlugin(allow_privileged=True), {"ipc_mode": "host", "uts_mode": "host"}) is None
    assert refusal(DockerPlugin(), {"network_mode": "host", "shm_size": 2**30}) is None


def test_host_paths_need_volumes_enabled_but_the_alloc_dir_does_not() -> None:
    bind = "/var/lib/llmgw/models:/var/lib/llmgw/models:ro"
    assert (
        refusal(DockerPlugin(), {"volumes": [bind]})
        == f'volumes are not enabled; cannot mount host path: "{bind}"'
    )
    assert refusal(DockerPlugin(volumes_enabled=True), {"volumes": [bind]}) is None
    # Relative sources resolve in the task dir; within the alloc dir they need nothing.
    assert refusal(DockerPlugin(), {"volumes": ["local/model:/model"]}) is None
    assert refusal(DockerPlugin(), {"volumes": ["../../../etc:/etc"]}) is not None
    assert refusal(DockerPlugin(), {"volume_driver": "rexray"}) == (
        'volumes are not enabled; cannot use volume driver "rexray"'
    )


def test_gpus_need_the_daemons_nvidia_runtime_and_it_must_be_allowed() -> None:
    plain_docker = DockerPlugin()
    assert refusal(plain_docker, {}, gpus=True) == 'requested docker runtime "nvidia" was not found'
    assert refusal(GPU_NODE_DOCKER, {}, gpus=True) is None
    not_allowed = DockerPlugin(daemon_runtimes=("nvidia", "runc"), allow_runtimes=("runc",))
    assert refusal(not_allowed, {}, gpus=True) == 'requested runtime "nvidia" is not allowed'
    assert refusal(GPU_NODE_DOCKER, {"runtime": "runsc"}, gpus=True) == (
        'conflicting runtime requests: gpu runtime "nvidia" conflicts with task runtime "runsc"'
    )
    assert refusal(GPU_NODE_DOCKER, {"runtime": "runsc"}) == 'requested runtime "runsc" is not allowed'
    # The plugin's nvidia_runtime renames the runtime GPU tasks get (drivers/docker/config.go).
    renamed = DockerPlugin(
        nvidia_runtime="nvidia-gpu",
        daemon_runtimes=("nvidia-gpu", "runc"),
        allow_runtimes=("runc", "nvidia-gpu"),
    )
    assert refusal(renamed, {}, gpus=True) is None
    assert refusal(
        DockerPlugin(nvidia_runtime="nvidia-gpu", daemon_runtimes=("nvidia", "runc")), {}, gpus=True
    ) == ('requested docker runtime "nvidia-gpu" was not found')


def test_privileged_and_capabilities_need_the_plugins_leave() -> None:
    assert (
        refusal(DockerPlugin(), {"privileged": True})
        == "Docker privileged mode is disabled on this Nomad agent"
    )
    assert refusal(DockerPlugin(allow_privileged=True), {"privileged": True}) is None
    assert refusal(DockerPlugin(), {"cap_add": ["CAP_SYS_ADMIN", "net_raw", "chown"]}) == (
        "driver does not allow the following capabilities: net_raw, sys_admin"
    )
    assert refusal(DockerPlugin(), {"cap_add": ["chown"]}) is None


async def test_the_node_api_shows_the_docker_driver_and_its_attributes(tmp_path: Path) -> None:
    nodes = (*real_gpu_nodes(1), NodeSpec(name="plain", docker=DockerPlugin(), raw_exec=False))
    async with NomadServer(NomadStandIn(StandInConfig(nodes=nodes, state_dir=tmp_path, strict=True))) as srv:
        looker = nomad.Nomad(host="127.0.0.1", port=srv.port, timeout=10)
        by_name = {n["Name"]: n for n in await call(looker.nodes.get_nodes)}
        gpu = await call(looker.node.get_node, by_name["h100-1"]["ID"])
        assert_shape(gpu, "Node")
        docker = gpu["Drivers"]["docker"]
        assert docker["Detected"] and docker["Healthy"]
        assert gpu["Attributes"]["driver.docker"] == "1"
        assert gpu["Attributes"]["driver.docker.volumes.enabled"] == "true"
        assert gpu["Attributes"]["driver.docker.runtimes"] == "io.containerd.runc.v2,nvidia,runc"
        assert "driver.docker.privileged.enabled" not in gpu["Attributes"]
        [group] = gpu["NodeResources"]["Devices"]
        assert (group["Vendor"], group["Type"], group["Name"]) == ("nvidia", "gpu", "NVIDIA H100 80GB HBM3")
        memory = group["Attributes"]["memory"]
        assert (memory["Int"], memory["Unit"]) == (81559, "MiB")
        assert len(group["Instances"]) == 8
        plain = await call(looker.node.get_node, by_name["plain"]["ID"])
        assert set(plain["Drivers"]) == {"docker"}
        assert "driver.docker.volumes.enabled" not in plain["Attributes"]
        assert "driver.raw_exec" not in plain["Attributes"]


def test_yaml_names_the_docker_plugins_settings() -> None:
    config = config_from_yaml(
        "nodes:\n  - {name: a, gpus: 8, docker: {volumes_enabled: true, allowed_ipc_modes: [host]}}\n"
    )
    [node] = config.nodes
    assert node.docker == DockerPlugin(volumes_enabled=True, allowed_ipc_modes=("host",))
    try:
        config_from_yaml("nodes:\n  - {name: a, docker: {volume: true}}\n")
    except ValueError as exc:
        assert "unknown docker settings ['volume']" in str(exc)
    else:
        raise AssertionError("a misspelt docker setting was accepted")


def test_yaml_declares_host_volumes_as_a_clients_host_volume_blocks() -> None:
    config = config_from_yaml(
        "nodes:\n  - {name: a, host_volumes: [{name: llmgw-models, path: /srv/hf, read_only: true}]}\n"
    )
    [node] = config.nodes
    assert node.host_volumes == (HostVolume("llmgw-models", "/srv/hf", read_only=True),)
    for bad in ("{llmgw-models: /srv/hf}", "[{name: x}]", "[{name: x, path: /p, mode: rw}]"):
        try:
            config_from_yaml(f"nodes:\n  - {{name: a, host_volumes: {bad}}}\n")
        except ValueError as exc:
            assert "host volume" in str(exc)
        else:
            raise AssertionError(f"host_volumes: {bad} was accepted")


LLAMACPP_CONFIG: dict[str, object] = {
    "image": "ghcr.io/ggml-org/llama.cpp:server-cuda-b6700",
    "entrypoint": ["/app/llama-server"],
    "args": ["--model", "/local/model.gguf", "--host", "0.0.0.0", "--port", "23456", "--alias", "m"],
    "network_mode": "host",
    "volumes": ["/var/lib/llmgw/models:/models:ro"],
}


def test_a_llamacpp_server_image_runs_the_nodes_local_binary_with_the_tasks_paths() -> None:
    plugin = DockerPlugin(volumes_enabled=True, llama_server="/opt/bin/llama-server")
    config = {**LLAMACPP_CONFIG, "args": [*LLAMACPP_CONFIG["args"], "--lora", "/models/a/b.gguf"]}  # type: ignore[misc]
    assert start_failure(plugin, config, gpus=False, task_dir=TASK_DIR, alloc_dir=ALLOC_DIR) is None
    run = container_run(
        plugin,
        config,
        {"X": "/secrets/key"},
        task_dir=TASK_DIR,
        alloc_dir=ALLOC_DIR,
        node_address="127.0.0.1",
    )
    assert run is not None
    assert run.argv == [
        "/opt/bin/llama-server",
        "--model",
        f"{TASK_DIR}/local/model.gguf",
        # Host networking on a machine whose every dev node is loopback.
        "--host",
        "127.0.0.1",
        "--port",
        "23456",
        "--alias",
        "m",
        "--lora",
        "/var/lib/llmgw/models/a/b.gguf",
    ]
    assert run.env["X"] == f"{TASK_DIR}/secrets/key"
    assert run.env["NOMAD_TASK_DIR"] == f"{TASK_DIR}/local"


@pytest.mark.parametrize(
    ("plugin", "image"),
    [
        (DockerPlugin(), "ghcr.io/ggml-org/llama.cpp:server-cuda-b6700"),  # no local binary
        (DockerPlugin(llama_server="/opt/bin/llama-server"), "vllm/vllm-openai:v0.11.0"),
        (DockerPlugin(llama_server="/opt/bin/llama-server"), "ghcr.io/ggml-org/llama.cpp:full-b6700"),
        (DockerPlugin(llama_server="/opt/bin/llama-server"), "evil.example/ggml-org/llama.cpp:server"),
    ],
)
def test_an_image_without_a_local_binary_fails_as_a_pull_does(plugin: DockerPlugin, image: str) -> None:
    config = {**LLAMACPP_CONFIG, "image": image, "volumes": []}
    message = start_failure(plugin, config, gpus=False, task_dir=TASK_DIR, alloc_dir=ALLOC_DIR)
    assert message == pull_failure(image)
    assert message.startswith(f"Failed to pull `{image}`: ")
    assert (
        container_run(plugin, config, {}, task_dir=TASK_DIR, alloc_dir=ALLOC_DIR, node_address="127.0.0.1")
        is None
    )


def test_the_plugins_refusals_come_before_the_pull() -> None:
    config = {**LLAMACPP_CONFIG, "image": "vllm/vllm-openai:v0.11.0", "ipc_mode": "host"}
    message = start_failure(
        DockerPlugin(volumes_enabled=True), config, gpus=False, task_dir=TASK_DIR, alloc_dir=ALLOC_DIR
    )
    assert message is not None and message.endswith('cannot apply "ipc_mode" configuration')


def test_a_shell_entrypoint_that_execs_the_server_runs_the_local_binary() -> None:
    # As a mirror source's job reads its GGUF path from a file, then becomes the server.
    plugin = DockerPlugin(llama_server="/opt/bin/llama-server")
    config = {
        **LLAMACPP_CONFIG,
        "entrypoint": ["/bin/sh"],
        "args": ["-c", 'exec "$@" --model "$(cat "$1")"', "llama-server", "/alloc/path", "/app/llama-server"],
    }
    run = container_run(plugin, config, {}, task_dir=TASK_DIR, alloc_dir=ALLOC_DIR, node_address="127.0.0.1")
    assert run is not None
    assert run.argv[:3] == ["/bin/sh", "-c", 'exec "$@" --model "$(cat "$1")"']
    assert run.argv[3:] == ["llama-server", f"{ALLOC_DIR}/alloc/path", "/opt/bin/llama-server"]


async def test_a_node_pulls_an_image_once_unless_told_to_pull_it_again(tmp_path: Path) -> None:
    # drivers/docker/driver.go, createImage: an image the daemon has is used as it is,
    # unless its tag is latest or force_pull is set; a pull is a "Downloading image" event.
    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\nexec sleep 600\n")
    server.chmod(0o755)
    node = NodeSpec(name="gpu-1", docker=DockerPlugin(llama_server=str(server), image_pull_s=0.2))
    async with NomadServer(NomadStandIn(fast_config(tmp_path, nodes=(node,)))) as srv:
        client = nomad.Nomad(host="127.0.0.1", port=srv.port, timeout=10)

        async def run(job_id: str, image: str, **config: object) -> list[str]:
            task = {
                "Name": "engine",
                "Driver": "docker",
                "Config": {"image": image, "entrypoint": ["/app/llama-server"], **config},
                "KillTimeout": 1_000_000_000,
                "Resources": {"CPU": 100, "MemoryMB": 64},
            }
            job = {"ID": job_id, "TaskGroups": [{**group("rank-0"), "Tasks": [task]}]}
            await call(client.jobs.register_job, {"Job": job})

            def running() -> dict[str, object] | None:
                allocs = client.job.get_allocations(job_id)
                return allocs[0] if allocs and allocs[0]["ClientStatus"] == "running" else None

            stub = await wait_for(running, f"{job_id} running")
            alloc = await call(client.allocation.get_allocation, stub["ID"])
            return [str(e.get("DriverMessage") or e["Type"]) for e in alloc["TaskStates"]["engine"]["Events"]]

        image = "ghcr.io/ggml-org/llama.cpp:server-b6700"
        first = await run("first", image)
        assert first.index("Downloading image") < first.index("Started"), first
        assert "Downloading image" not in await run("second", image)  # the node has it now
        assert "Downloading image" in await run("third", image, force_pull=True)


async def test_a_pull_slower_than_its_timeout_fails_the_start_and_the_restart_policy_decides(
    tmp_path: Path,
) -> None:
    # drivers/docker/coordinator.go (v2.0.5), pullImageImpl: the pull runs under
    # context.WithTimeout(image_pull_timeout), "5m" by the plugin's default and the task's
    # own value first (driver.go, StartTask); past it, recoverablePullError ("Failed to pull
    # `I`: context deadline exceeded") and the task runner restarts under its policy.
    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\nexec sleep 600\n")
    server.chmod(0o755)
    plugin = DockerPlugin(llama_server=str(server), image_pull_s=0.5, image_pull_timeout_s=0.2)
    node = NodeSpec(name="gpu-1", docker=plugin)
    image = "ghcr.io/ggml-org/llama.cpp:server-b6700"
    async with NomadServer(NomadStandIn(fast_config(tmp_path, nodes=(node,)))) as srv:
        client = nomad.Nomad(host="127.0.0.1", port=srv.port, timeout=10)

        async def submit(job_id: str, **config: object) -> None:
            task = {
                "Name": "engine",
                "Driver": "docker",
                "Config": {"image": image, "entrypoint": ["/app/llama-server"], **config},
                "KillTimeout": 1_000_000_000,
                "Resources": {"CPU": 100, "MemoryMB": 64},
            }
            policy = {"Attempts": 1, "Interval": 60 * 10**9, "Delay": 10**8, "Mode": "fail"}
            doc = {**group("rank-0"), "Tasks": [task], "RestartPolicy": policy}
            await call(client.jobs.register_job, {"Job": {"ID": job_id, "TaskGroups": [doc]}})

        def settled(job_id: str, status: str) -> Callable[[], dict[str, Any] | None]:
            def probe() -> dict[str, Any] | None:
                allocs = client.job.get_allocations(job_id)
                return allocs[0] if allocs and allocs[0]["ClientStatus"] == status else None

            return probe

        await submit("slow")  # the plugin's timeout: 0.2 s against a 0.5 s pull
        stub = await wait_for(settled("slow", "failed"), "the slow pull failed after its one restart")
        alloc = await call(client.allocation.get_allocation, stub["ID"])
        events = [(e["Type"], e.get("DisplayMessage") or "") for e in alloc["TaskStates"]["engine"]["Events"]]
        deadline = f"Failed to pull `{image}`: context deadline exceeded"
        kinds = [kind for kind, _ in events]
        assert kinds.count("Driver Failure") == 2 and kinds.count("Restarting") == 1, events
        assert ("Driver Failure", deadline) in events
        assert kinds[-1] == "Not Restarting" and "Started" not in kinds, events
        assert alloc["TaskStates"]["engine"]["Restarts"] == 1

        await submit("patient", image_pull_timeout="2s")  # the task's own timeout wins
        await wait_for(settled("patient", "running"), "a pull within the task's timeout runs")
