"""Nomad stand-in + Consul stand-in (DevCluster): services with checks, templates fed by Consul."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import nomad

from llmgw.devcluster.acl import ops_policies
from llmgw.devcluster.cluster import DevCluster, DevClusterConfig
from llmgw.devcluster.consul import ConsulSettings
from llmgw.devcluster.nomad.config import DockerPlugin, NodeSpec
from llmgw.devcluster.partition import TcpProxy
from tests.support.waiting import eventually

from .conftest import call, fast_config, group, read_alloc_file, wait_for

S = 1_000_000_000


def agent_may_write(*services: str) -> dict[str, str]:
    """ops/acl's policies, with the Nomad agents' Consul token also writing (and reading)
    these jobs' services: a real cluster's agent token needs a rule for every service its
    jobs register (ops/acl/consul-nomad-agent.policy.hcl names llmgw's)."""
    policies = ops_policies()
    rules = "".join(f'\nservice "{name}" {{\n  policy = "write"\n}}\n' for name in services)
    policies["consul-nomad-agent"] += rules + '\nnode_prefix "" {\n  policy = "read"\n}\n'
    return policies


async def passing(dev: DevCluster, name: str) -> list[dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"{dev.consul_addr}/v1/health/service/{name}?passing=1",
            headers={"X-Consul-Token": dev.consul_token},
        ) as resp,
    ):
        return list(await resp.json())


async def test_services_register_with_checks_and_templates_render_from_consul(tmp_path: Path) -> None:
    # The watcher's template reads Consul with the client's token (no consul block in its group).
    nomad_config = replace(fast_config(tmp_path), template_use_client_consul_token=True)
    config = DevClusterConfig(
        nomad=nomad_config, consul=ConsulSettings.for_tests(), acl_policies=agent_may_write("web")
    )
    async with DevCluster(config) as dev:
        client = nomad.Nomad(address=dev.nomad_addr, timeout=10, token=dev.nomad_token)
        web = group(
            "web",
            count=2,
            Services=[
                {
                    "Name": "web",
                    "PortLabel": "http",
                    "Tags": ["v1"],
                    "Meta": {"alloc": "${NOMAD_ALLOC_ID}"},
                    "Checks": [{"Type": "http", "Path": "/", "Interval": S // 10, "Timeout": S}],
                }
            ],
        )
        watcher = group("watcher")
        watcher["Tasks"][0]["Templates"] = [
            {
                "EmbeddedTmpl": (
                    '{{ range service "web" }}{{ .Address }}:{{ .Port }} '
                    '{{ index .ServiceMeta "alloc" }}\n{{ else }}none\n{{ end }}'
                ),
                "DestPath": "local/upstreams.txt",
                "ChangeMode": "noop",
            }
        ]
        await call(client.jobs.register_job, {"Job": {"ID": "svc", "TaskGroups": [web, watcher]}})

        async def both_passing() -> list[dict[str, Any]] | None:
            entries = await passing(dev, "web")
            return entries if len(entries) == 2 else None

        entries = await eventually(both_passing, 20, "both instances registered and their HTTP checks pass")
        allocs = {a["ID"]: a for a in await call(client.job.get_allocations, "svc")}
        for entry in entries:
            svc = entry["Service"]
            alloc_id = svc["Meta"]["alloc"]
            assert alloc_id in allocs, "Meta is interpolated with the alloc's own id"
            assert svc["ID"] == f"_nomad-task-{alloc_id}-group-web-web-http"
            assert svc["Meta"]["external-source"] == "nomad"
            assert svc["Tags"] == ["v1"]
            assert entry["Node"]["Node"] == allocs[alloc_id]["NodeName"], (
                "registered with its own node's agent"
            )

        watcher_alloc = next(a for a in allocs.values() if a["TaskGroup"] == "watcher")

        def rendered_both() -> str | None:
            text = client.client.cat.read_file(watcher_alloc["ID"], "server/local/upstreams.txt")
            return text if text.count("127.0.0.1:") == 2 else None

        text = await wait_for(rendered_both, "the template re-rendered with both instances")
        assert {line.split()[1] for line in text.splitlines()} == {
            a for a in allocs if allocs[a]["TaskGroup"] == "web"
        }
        assert await read_alloc_file(client, watcher_alloc["ID"], "server/local/pid")

        await call(client.job.deregister_job, "svc")
        await wait_for(
            lambda: all(a["ClientStatus"] == "complete" for a in client.job.get_allocations("svc")), "stopped"
        )
        assert await passing(dev, "web") == [], "services are deregistered on stop"


def llamacpp_group(name: str, image: str) -> dict[str, Any]:
    """A group like llmgw's: its engine service at group level, a docker task whose image
    the node pulls (llama.cpp's server, run as the node's local binary)."""
    task = {
        "Name": "engine",
        "Driver": "docker",
        "Config": {
            "image": image,
            "entrypoint": ["/app/llama-server"],
            "args": ["--port", "${NOMAD_PORT_http}"],
        },
        "KillTimeout": S,
        "Resources": {"CPU": 100, "MemoryMB": 64},
    }
    service = {
        "Name": "engine",
        "PortLabel": "http",
        "Checks": [{"Type": "tcp", "Interval": S // 10, "Timeout": S}],
    }
    return {**group(name), "Tasks": [task], "Services": [service]}


async def test_a_group_service_registers_before_its_task_pulls_and_the_allocation_is_pending_meanwhile(
    tmp_path: Path,
) -> None:
    # Nomad registers group services in the allocation runner's Prerun, before any task
    # starts (client/allocrunner/group_service_hook.go); the docker driver pulls in
    # StartTask, the task pending until it returns (drivers/docker/driver.go, createImage).
    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\nexec sleep 600\n")
    server.chmod(0o755)
    node = NodeSpec(name="gpu-1", docker=DockerPlugin(llama_server=str(server), image_pull_s=600))
    config = DevClusterConfig(
        nomad=fast_config(tmp_path, nodes=(node,)),
        consul=ConsulSettings.for_tests(),
        acl_policies=agent_may_write("engine"),
    )
    async with DevCluster(config) as dev:
        client = nomad.Nomad(address=dev.nomad_addr, timeout=10, token=dev.nomad_token)
        job = {
            "ID": "engine",
            "TaskGroups": [llamacpp_group("rank-0", "ghcr.io/ggml-org/llama.cpp:server-b6700")],
        }
        await call(client.jobs.register_job, {"Job": job})

        async def registered() -> list[dict[str, Any]] | None:
            async with (
                aiohttp.ClientSession() as http,
                http.get(
                    f"{dev.consul_addr}/v1/health/service/engine",
                    headers={"X-Consul-Token": dev.consul_token},
                ) as resp,
            ):
                entries = list(await resp.json())
            return entries or None

        async def checked() -> list[dict[str, Any]] | None:
            # Nomad registers the service, then its check: wait for both.
            entries = await registered() or []
            return (
                entries if any(c["ServiceName"] == "engine" for e in entries for c in e["Checks"]) else None
            )

        [entry] = await eventually(checked, 20, "the group service registered with its check")
        assert [c["Status"] for c in entry["Checks"] if c["ServiceName"] == "engine"] == ["critical"]
        [stub] = await call(client.job.get_allocations, "engine")

        def pulling() -> dict[str, Any] | None:
            alloc = client.allocation.get_allocation(stub["ID"])
            events = alloc["TaskStates"]["engine"]["Events"]
            return alloc if events and events[-1]["Type"] == "Driver" else None

        alloc = await wait_for(pulling, "the image pull announced")
        assert alloc["ClientStatus"] == "pending"
        state = alloc["TaskStates"]["engine"]
        assert state["State"] == "pending" and state["Events"][-1]["DriverMessage"] == "Downloading image"

        # Stopped while it pulls: the task never ran, the service is deregistered.
        await call(client.job.deregister_job, "engine")
        await wait_for(
            lambda: client.allocation.get_allocation(stub["ID"])["ClientStatus"] == "complete", "stopped"
        )
        stopped = await call(client.allocation.get_allocation, stub["ID"])
        assert stopped["TaskStates"]["engine"]["StartedAt"] == "0001-01-01T00:00:00Z"  # Go's zero time
        assert await registered() is None


async def test_a_registration_the_agent_could_not_take_is_retried_while_the_allocation_runs(
    tmp_path: Path,
) -> None:
    # Nomad queues registrations and its sync loop retries a failed one (1 s, 2 s, ... at
    # most 30 s apart: command/agent/consul/service_client.go, Run), so an allocation can
    # run before Consul has its service. Short retries here.
    nomad_config = fast_config(
        tmp_path, nodes=(NodeSpec(name="gpu-1"),), consul_retry_s=0.05, consul_retry_max_s=0.2
    )
    config = DevClusterConfig(
        nomad=nomad_config, consul=ConsulSettings.for_tests(), acl_policies=agent_may_write("web")
    )
    async with DevCluster(config) as dev:
        assert dev.nomad is not None
        agent = urlsplit(dev.nomad.config.consul_agents["gpu-1"])
        with socket.socket() as probe:  # a port nothing listens on: the agent refuses
            probe.bind(("127.0.0.1", 0))
            down_port = probe.getsockname()[1]
        dev.nomad.config.consul_agents["gpu-1"] = f"http://127.0.0.1:{down_port}"
        client = nomad.Nomad(address=dev.nomad_addr, timeout=10, token=dev.nomad_token)
        web = group("web", Services=[{"Name": "web", "PortLabel": "http"}])
        await call(client.jobs.register_job, {"Job": {"ID": "svc", "TaskGroups": [web]}})
        await wait_for(
            lambda: [a["ClientStatus"] for a in client.job.get_allocations("svc")] == ["running"], "running"
        )
        registered = await listed(dev, "web")
        assert registered == [], "no agent took the registration yet"

        proxy = TcpProxy(str(agent.hostname), int(agent.port or 0))
        await proxy.start(down_port)  # the agent is back
        try:

            async def listed_once() -> list[dict[str, Any]] | None:
                return await listed(dev, "web") or None

            [entry] = await eventually(listed_once, 20, "the registration retried and taken")
            [alloc] = await call(client.job.get_allocations, "svc")
            assert entry["Service"]["ID"] == f"_nomad-task-{alloc['ID']}-group-web-web-http"
            await call(client.job.deregister_job, "svc")
            await wait_for(
                lambda: all(a["ClientStatus"] == "complete" for a in client.job.get_allocations("svc")),
                "stopped",
            )
            assert await listed(dev, "web") == []
        finally:
            await proxy.stop()


async def listed(dev: DevCluster, name: str) -> list[dict[str, Any]]:
    """Every instance of ``name`` Consul lists, passing or not."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"{dev.consul_addr}/v1/health/service/{name}", headers={"X-Consul-Token": dev.consul_token}
        ) as resp,
    ):
        return list(await resp.json())
