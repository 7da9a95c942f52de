"""A gated model's token reaches its engine only through Nomad: a Variable read by the task's identity.

The job is rendered with `LLMGW_HF_TOKEN_VARIABLE`'s path, registered on the Nomad
stand-in, and the Variable and the ACL policy are written over Nomad's HTTP API as
`nomad var put` and `nomad acl policy apply` write them. The token is then looked
for where it must be (the engine process's environment) and where it must not
(the rendered HCL, the job Nomad stores, the task's logs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from llmgw.adapters.nomad import NomadClient
from llmgw.core.catalog import Catalog, catalog_digest
from llmgw.devcluster.cluster import DevCluster
from llmgw.render import Renderer, ReplicaRequest
from llmgw.settings import NomadConnection
from tests.support.waiting import eventually

from .conftest import dev_render_settings

TOKEN = "hf_s3cr3tT0kenForAGatedModel"
VARIABLE = "llmgw/hf-token"
POLICY = f"""namespace "default" {{
  variables {{
    path "{VARIABLE}" {{
      capabilities = ["read"]
    }}
  }}
}}
"""


async def _nomad(dev: DevCluster, method: str, path: str, body: object = None) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(headers={"X-Nomad-Token": dev.nomad_token}) as session,
        session.request(method, f"{dev.nomad_addr}{path}", json=body) as resp,
    ):
        text = await resp.text()
        return resp.status, text


async def _put_token(dev: DevCluster) -> None:
    status, text = await _nomad(
        dev,
        "PUT",
        f"/v1/var/{VARIABLE}",
        {"Namespace": "default", "Path": VARIABLE, "Items": {"HF_TOKEN": TOKEN}},
    )
    assert status == 200, text


async def _attach_policy(dev: DevCluster, job_id: str) -> None:
    body = {"Name": "llmgw-hf-token", "Rules": POLICY, "JobACL": {"Namespace": "default", "JobID": job_id}}
    status, text = await _nomad(dev, "PUT", "/v1/acl/policy/llmgw-hf-token", body)
    assert status == 200, text


def _render(catalog: Catalog) -> Any:
    renderer = Renderer(dev_render_settings(hf_token_variable=VARIABLE), _policy())
    return renderer.render(catalog, ReplicaRequest("sim-chat", 0, "0"), catalog_hash=catalog_digest(catalog))


def _policy() -> Any:
    from llmgw.bundled import read_security_policy

    return read_security_policy()


async def _register(dev: DevCluster, hcl: str) -> dict[str, Any]:
    async with NomadClient(NomadConnection(address=dev.nomad_addr, token=dev.nomad_token)) as client:
        job = await client.parse_hcl(hcl)
        await client.register(job)
        stored = await client.job(str(job["ID"]))
        assert stored is not None
        return stored


def _engine(dev: DevCluster, job_id: str) -> Any:
    assert dev.nomad is not None
    for runner in dev.nomad.runners.values():
        if runner.alloc.job.get("ID") == job_id and "engine" in runner.tasks:
            return runner.tasks["engine"]
    return None


def _process_tree(root: int) -> list[int]:
    """``root`` and every process descended from it, from /proc's parent links."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone since the listing
        parents[int(stat.parent.name)] = int(fields[1])
    tree = [root]
    for pid in tree:
        tree.extend(child for child, parent in parents.items() if parent == pid)
    return tree


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.split("=", 1) for entry in raw.decode().split("\0") if "=" in entry)


async def test_the_engine_gets_hf_token_from_the_variable_and_nowhere_else_holds_it(
    dev: DevCluster, example_catalog: Catalog
) -> None:
    rendered = _render(example_catalog)
    assert TOKEN not in rendered.hcl
    assert f'nomadVar \\"{VARIABLE}\\"' in rendered.hcl or f'nomadVar "{VARIABLE}"' in rendered.hcl
    await _put_token(dev)
    await _attach_policy(dev, rendered.job_id)
    stored = await _register(dev, rendered.hcl)

    async def running_engine() -> Any:
        task = _engine(dev, rendered.job_id)
        return task if task is not None and task.proc is not None and task.state.state == "running" else None

    task = await eventually(running_engine, 30, "the engine running")
    assert _environ(task.proc.pid).get("HF_TOKEN") == TOKEN
    assert TOKEN not in str(stored), "the job Nomad keeps does not hold the token"
    logs = "".join(p.read_text(errors="replace") for p in (task.ar.root / "alloc" / "logs").glob("*"))
    assert TOKEN not in logs
    # The rendered file is in the task's secrets directory, not the shared alloc directory.
    assert (task.task_dir / "secrets" / "hf-token.env").read_text() == f"HF_TOKEN={TOKEN}\n"


async def test_a_missing_variable_keeps_the_task_pending_until_it_is_written(
    dev: DevCluster, example_catalog: Catalog
) -> None:
    rendered = _render(example_catalog)
    await _attach_policy(dev, rendered.job_id)
    await _register(dev, rendered.hcl)

    async def waiting() -> bool:
        task = _engine(dev, rendered.job_id)
        return task is not None and any(
            e["Type"] == "Template"
            and e["DisplayMessage"] == f"Missing: nomad.var.block({VARIABLE}@default.global)"
            for e in task.state.events
        )

    await eventually(waiting, 30, "the template reporting the missing variable")
    task = _engine(dev, rendered.job_id)
    assert task.proc is None and task.state.state == "pending"
    await _put_token(dev)

    async def started() -> bool:
        return task.proc is not None and task.state.state == "running"

    await eventually(started, 30, "the engine starting once the variable exists")
    assert _environ(task.proc.pid).get("HF_TOKEN") == TOKEN


async def test_without_a_policy_for_the_path_the_task_fails_with_permission_denied(
    dev: DevCluster, example_catalog: Catalog
) -> None:
    rendered = _render(example_catalog)
    await _put_token(dev)
    await _register(dev, rendered.hcl)

    async def failed() -> Any:
        status, text = await _nomad(dev, "GET", f"/v1/job/{rendered.job_id}/allocations")
        assert status == 200, text
        allocs = json.loads(text)
        state = (allocs[0].get("TaskStates") or {}).get("engine") if allocs else None
        return state if state and state["State"] == "dead" else None

    state = await eventually(failed, 30, "the task failing on the template")
    assert state["Failed"]
    messages = [e["DisplayMessage"] for e in state["Events"]]
    assert any("Template failed" in m and "403 (Permission denied)" in m for m in messages), messages


async def test_a_job_reads_its_own_nomad_jobs_path_without_any_policy(dev: DevCluster) -> None:
    """Nomad's implicit workload access (acl/acl.go, matchingVariablesCapabilitySet)."""
    assert dev.nomad is not None
    variables = dev.nomad.variables
    from llmgw.devcluster.nomad.variables import Workload

    who = Workload("default", "llmgw-x-0", "rank-0", "engine")
    for path in (
        "nomad/jobs",
        "nomad/jobs/llmgw-x-0",
        "nomad/jobs/llmgw-x-0/rank-0",
        "nomad/jobs/llmgw-x-0/rank-0/engine",
    ):
        assert variables.workload_may_read(who, path), path
    for path in (
        "nomad/jobs/llmgw-y-0",
        "nomad/jobs/llmgw-x-0/rank-1",
        VARIABLE,
        "nomad/jobs/llmgw-x-0/rank-0/engine/x",
    ):
        assert not variables.workload_may_read(who, path), path
    # An operator's path, once a policy attached to the job allows it; not for another job.
    status, text = await _nomad(
        dev,
        "PUT",
        "/v1/acl/policy/p",
        {"Name": "p", "Rules": POLICY, "JobACL": {"Namespace": "default", "JobID": "llmgw-x-0"}},
    )
    assert status == 200, text
    assert variables.workload_may_read(who, VARIABLE)
    assert not variables.workload_may_read(Workload("default", "llmgw-y-0", "rank-0", "engine"), VARIABLE)


async def test_variables_api_needs_the_acl_token(dev: DevCluster) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{dev.nomad_addr}/v1/var/{VARIABLE}") as resp:
        assert resp.status == 403
    await _put_token(dev)
    status, text = await _nomad(dev, "GET", f"/v1/var/{VARIABLE}")
    assert status == 200 and TOKEN in text
    status, _ = await _nomad(dev, "DELETE", f"/v1/var/{VARIABLE}")
    assert status == 200
    status, _ = await _nomad(dev, "GET", f"/v1/var/{VARIABLE}")
    assert status == 404
    status, text = await _nomad(dev, "PUT", "/v1/var/nomad/other", {"Items": {"a": "b"}})
    assert status == 400 and "reserved" in text


async def test_an_engine_with_a_key_passes_its_check_refuses_strangers_and_serves_the_router(
    dev: DevCluster, example_catalog: Catalog
) -> None:
    """The control plane's Variable write, the job's template, the sim's VLLM_API_KEY, the router's header.

    The key is in the engine's environment (readable by its own user and root only) and
    on no command line (/proc/PID/cmdline, which every user of the node reads).
    """
    from llmgw.core import engine_keys
    from llmgw.core.conventions import ENGINE_SERVICE
    from llmgw.core.records import Endpoint, HealthStatus
    from llmgw.gateway.settings import RouterSettings
    from llmgw.gateway.upstream import Upstream

    keys = engine_keys.EngineKeys("c" * 48)
    renderer = Renderer(dev_render_settings(engine_api_keys=True), _policy())
    rendered = renderer.render(
        example_catalog, ReplicaRequest("sim-chat", 0, "0"), catalog_hash=catalog_digest(example_catalog)
    )
    key = keys.for_replica(rendered.job_id)
    assert key not in rendered.hcl
    async with NomadClient(NomadConnection(address=dev.nomad_addr, token=dev.nomad_token)) as client:
        # What the executor does before registering: the job's own variable, no ACL policy.
        await client.put_variable(engine_keys.variable_path(rendered.job_id), {engine_keys.KEY_ITEM: key})
        await client.register(await client.parse_hcl(rendered.hcl))
        stored = await client.job(rendered.job_id)
    assert key not in str(stored)

    async def passing() -> Any:
        async with (
            aiohttp.ClientSession(headers={"X-Consul-Token": dev.consul_token}) as session,
            session.get(f"{dev.consul_addr}/v1/health/service/{ENGINE_SERVICE}?passing=1") as resp,
        ):
            entries = await resp.json()
        ours = [e for e in entries if e["Service"]["Meta"].get("llmgw_job") == rendered.job_id]
        return ours[0]["Service"] if ours else None

    # The Consul check (GET /health) needs no key: the replica turns healthy.
    service = await eventually(passing, 30, "the keyed engine passing its health check")
    task = _engine(dev, rendered.job_id)
    assert _environ(task.proc.pid).get("VLLM_API_KEY") == key
    for pid in _process_tree(task.proc.pid):
        assert key.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes(), pid
    base = f"http://{service['Address']}:{service['Port']}"
    body = {"model": "sim-chat", "prompt": "hi", "max_tokens": 1}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}/v1/completions", json=body) as resp:
            assert resp.status == 401 and await resp.json() == {"error": "Unauthorized"}
        async with session.post(
            f"{base}/v1/completions",
            json=body,
            headers={"Authorization": f"Bearer {keys.for_replica('other')}"},
        ) as resp:
            assert resp.status == 401
    endpoint = Endpoint(
        service_id=service["ID"], node="n", model="sim-chat", model_slug="sim-chat", replica=rendered.job_id,
        alloc_id="a", address=service["Address"], port=service["Port"], engine="sim", profile=0,
        simulated=True, status=HealthStatus.PASSING,
    )  # fmt: skip
    upstream = Upstream(RouterSettings(), keys)
    await upstream.start()
    try:
        response = await upstream.send(endpoint, "/v1/completions", json.dumps(body).encode(), "req-1")
        assert response.status == 200
        assert json.loads(await upstream.read_body(response))["choices"]
    finally:
        await upstream.close()
    assert dev.nomad is not None
    logs = "".join(p.read_text(errors="replace") for p in dev.nomad.alloc_root("x").parent.rglob("*.0"))
    assert key not in logs


async def test_a_rotated_token_re_renders_and_restarts_the_engine_with_it(
    dev: DevCluster, example_catalog: Catalog
) -> None:
    rendered = _render(example_catalog)
    await _put_token(dev)
    await _attach_policy(dev, rendered.job_id)
    await _register(dev, rendered.hcl)

    async def running_engine() -> Any:
        task = _engine(dev, rendered.job_id)
        return task if task is not None and task.proc is not None and task.state.state == "running" else None

    task = await eventually(running_engine, 30, "the engine running")
    first_pid = task.proc.pid
    rotated = "hf_r0tatedT0ken"
    status, text = await _nomad(
        dev,
        "PUT",
        f"/v1/var/{VARIABLE}",
        {"Namespace": "default", "Path": VARIABLE, "Items": {"HF_TOKEN": rotated}},
    )
    assert status == 200, text

    async def restarted_with_the_new_token() -> bool:
        proc = task.proc
        return (
            proc is not None
            and proc.pid != first_pid
            and task.state.state == "running"
            and _environ(proc.pid).get("HF_TOKEN") == rotated
        )

    await eventually(restarted_with_the_new_token, 30, "the engine restarted with the rotated token")
