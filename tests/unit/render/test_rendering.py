"""What a rendered job contains, and what llmgw refuses to submit."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from llmgw.cli.render_cmd import REFRESH_HINT, catalog_file_hash, render_files
from llmgw.core.catalog import Catalog, SecurityPolicy, catalog_digest, load_catalog
from llmgw.core.conventions import ENGINE_SERVICE
from llmgw.render import Renderer, RenderError, RenderSettings, ReplicaRequest, job_id_for

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def example(shipped_policy: SecurityPolicy) -> Catalog:
    text = (REPO / "examples" / "catalog.yaml").read_text()
    catalog = load_catalog(text, filename="examples/catalog.yaml", policy=shipped_policy).catalog
    assert catalog is not None
    return catalog


@pytest.fixture
def renderer(shipped_policy: SecurityPolicy) -> Renderer:
    return Renderer(RenderSettings(), shipped_policy)


def job(
    renderer: Renderer, catalog: Catalog, model: str, profile: int = 0, fabric: str | None = None
) -> dict:  # type: ignore[type-arg]
    rendered = renderer.render(catalog, ReplicaRequest(model, profile, "0", fabric), catalog_hash="h")
    return renderer.check(rendered, model=model)


def test_golden_jobspecs_are_current(example: Catalog, shipped_policy: SecurityPolicy) -> None:
    args = argparse.Namespace(
        model=[], all_profiles=True, profile=None, replica="0", fabric="fabric-a", format="hcl"
    )
    text = (REPO / "examples" / "catalog.yaml").read_text(encoding="utf-8")
    files = render_files(
        example, Renderer(RenderSettings(), shipped_policy), args, catalog_hash=catalog_file_hash(text)
    )
    folder = REPO / "jobspecs"
    stale = [
        f.name for f in files if not (folder / f.name).exists() or (folder / f.name).read_text() != f.text
    ]
    extra = {p.name for p in folder.glob("*.nomad.hcl")} - {f.name for f in files}
    assert not stale and not extra, f"jobspecs/ is stale ({stale}, {extra}); refresh with: {REFRESH_HINT}"


def test_job_ids_are_stable_and_collision_free() -> None:
    assert job_id_for("llama-3.1-8b", "0") == job_id_for("llama-3.1-8b", "0")
    assert job_id_for("Llama-3.1-8B", "0") != job_id_for("llama-3.1-8b", "0")
    assert job_id_for("a/b", "1") != job_id_for("a-b", "1")
    with pytest.raises(RenderError, match="replica id"):
        job_id_for("m", "../x")


def test_two_node_sglang_replica_is_one_job_of_two_groups_on_one_fabric(
    renderer: Renderer, example: Catalog
) -> None:
    spec = job(renderer, example, "llama-3.1-405b", 0, fabric="fabric-a")
    assert [g["Name"] for g in spec["TaskGroups"]] == ["rank-0", "rank-1"]
    assert {"LTarget": "${meta.llmgw_fabric}", "Operand": "=", "RTarget": "fabric-a"} in spec["Constraints"]
    assert any(c["Operand"] == "distinct_hosts" for c in spec["Constraints"])
    for group in spec["TaskGroups"]:
        assert group["Count"] == 1
        engine = next(t for t in group["Tasks"] if t["Name"] == "engine")
        [device] = engine["Resources"]["Devices"]
        assert device["Name"] == "nvidia/gpu" and device["Count"] == 8
        assert {c["LTarget"] for c in device["Constraints"]} == {"${device.model}", "${device.attr.memory}"}
    rank0, rank1 = spec["TaskGroups"]
    assert [s["Name"] for s in rank0["Services"]] == [ENGINE_SERVICE, "llmgw-rank"]
    assert [s["Name"] for s in rank1["Services"]] == ["llmgw-rank"]
    # The worker learns rank 0's address from Consul at run time, after a prestart wait.
    assert [t["Name"] for t in rank1["Tasks"]] == ["await-head", "engine"]
    assert rank1["Tasks"][0]["Lifecycle"] == {"Hook": "prestart", "Sidecar": False}
    assert "${LLMGW_HEAD_ADDR}" in rank1["Tasks"][1]["Config"]["args"]


def test_vllm_two_nodes_serves_inside_the_ray_heads_container_with_one_gpu_request_per_node(
    renderer: Renderer, shipped_policy: SecurityPolicy
) -> None:
    # vLLM's run_cluster.sh: `vllm serve` in the head's container, workers `ray start --address`
    # (0.11.0, which has no --nnodes).
    text = (
        "models:\n  big:\n    profiles: [{engine: vllm, image: 'vllm/vllm-openai:v0.11.0', "
        "source: org/m, tp: 8, pp: 2, nodes: 2}]\n"
    )
    catalog = load_catalog(text, filename="c", policy=shipped_policy).catalog
    assert catalog is not None
    rank0, rank1 = job(renderer, catalog, "big", fabric="f")["TaskGroups"]
    assert [t["Name"] for t in rank0["Tasks"]] == ["engine"]
    [engine] = rank0["Tasks"]
    assert engine["Config"]["entrypoint"] == ["/bin/sh"]
    script, args = engine["Config"]["args"][1], engine["Config"]["args"][2:]
    assert script.startswith("ray start --head ") and script.endswith('exec "$@"')
    assert args[:4] == ["ray-head", "${NOMAD_PORT_ray}", "${NOMAD_IP_ray}", "8"]
    assert args[4:6] == ["vllm", "serve"] and "--distributed-executor-backend" in args
    assert engine["Env"]["VLLM_HOST_IP"] == "${NOMAD_IP_ray}"
    assert [t["Name"] for t in rank1["Tasks"]] == ["await-head", "engine"]
    assert rank1["Tasks"][1]["Config"]["entrypoint"] == ["ray"]
    for group in (rank0, rank1):
        gpu_requests = [d for t in group["Tasks"] for d in (t["Resources"].get("Devices") or [])]
        assert [d["Count"] for d in gpu_requests] == [8], group["Name"]


def test_vllm_two_nodes_from_0_34_runs_vllm_serve_on_every_rank_without_ray(
    renderer: Renderer, shipped_policy: SecurityPolicy
) -> None:
    # vLLM 0.34.0 (the default image): --nnodes/--node-rank/--master-addr/--master-port with
    # the mp executor, --headless on the worker (vllm/entrypoints/cli/serve.py run_headless).
    text = "models:\n  big:\n    profiles: [{engine: vllm, source: org/m, tp: 8, pp: 2, nodes: 2}]\n"
    catalog = load_catalog(text, filename="c", policy=shipped_policy).catalog
    assert catalog is not None
    rank0, rank1 = job(renderer, catalog, "big", fabric="f")["TaskGroups"]
    [head] = rank0["Tasks"]
    assert head["Config"]["entrypoint"] == ["vllm"]
    args = head["Config"]["args"]

    def value(argv: list[str], flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert args[0] == "serve" and "ray" not in " ".join(args)
    assert value(args, "--distributed-executor-backend") == "mp"
    assert (value(args, "--nnodes"), value(args, "--node-rank")) == ("2", "0")
    assert (value(args, "--master-addr"), value(args, "--master-port")) == (
        "${NOMAD_IP_dist}",
        "${NOMAD_PORT_dist}",
    )
    assert "--headless" not in args and value(args, "--port") == "${NOMAD_PORT_http}"
    assert head["Env"]["VLLM_HOST_IP"] == "${NOMAD_IP_dist}"
    assert [t["Name"] for t in rank1["Tasks"]] == ["await-head", "engine"]
    worker = rank1["Tasks"][1]
    wargs = worker["Config"]["args"]
    assert worker["Config"]["entrypoint"] == ["vllm"] and wargs[0] == "serve"
    assert (value(wargs, "--nnodes"), value(wargs, "--node-rank")) == ("2", "1")
    # The head's address, each half rendered from Consul into the worker's environment.
    assert (value(wargs, "--master-addr"), value(wargs, "--master-port")) == (
        "${LLMGW_HEAD_IP}",
        "${LLMGW_HEAD_PORT}",
    )
    assert "--headless" in wargs and "--port" not in wargs and "--host" not in wargs
    [head_env] = [t for t in worker["Templates"] if t["DestPath"].endswith(".env")]
    assert "LLMGW_HEAD_IP={{ range service" in head_env["EmbeddedTmpl"]
    assert "{{ .Address }}{{ end }}\nLLMGW_HEAD_PORT=" in head_env["EmbeddedTmpl"]
    for group in (rank0, rank1):
        gpu_requests = [d for t in group["Tasks"] for d in (t["Resources"].get("Devices") or [])]
        assert [d["Count"] for d in gpu_requests] == [8], group["Name"]


def test_engines_get_shared_memory_not_host_ipc(renderer: Renderer, example: Catalog) -> None:
    # Nomad >= 2.0.4's docker driver refuses ipc_mode = "host" on a default client.
    for model, profile, shm_gib in (("llama-3.1-70b", 0, 10), ("llama-3.1-405b", 0, 32)):
        spec = job(renderer, example, model, profile, fabric="fabric-a" if model.endswith("405b") else None)
        for group in spec["TaskGroups"]:
            engine = next(t for t in group["Tasks"] if t["Name"] == "engine")
            assert "ipc_mode" not in engine["Config"], model
            assert engine["Config"]["shm_size"] == shm_gib * 2**30, model
            targets = {c["LTarget"]: c for c in engine.get("Constraints") or []}
            assert targets["${attr.driver.docker.runtimes}"]["RTarget"] == "nvidia"


def test_restart_then_fail_and_no_rescheduling(renderer: Renderer, example: Catalog) -> None:
    spec = job(renderer, example, "llama-3.1-70b")
    assert spec["Reschedule"] == {"Attempts": 0, "Unlimited": False}
    assert spec["Update"]["MaxParallel"] == 0  # no Nomad deployment
    [group] = spec["TaskGroups"]
    assert group["RestartPolicy"]["Mode"] == "fail"
    assert group["Disconnect"]["Replace"] is False
    assert group["ShutdownDelay"] > 0 and group["Tasks"][0]["KillTimeout"] > 0


def test_spec_hash_changes_with_what_runs_not_with_the_catalog_hash(
    renderer: Renderer, example: Catalog, shipped_policy: SecurityPolicy
) -> None:
    request = ReplicaRequest("llama-3.1-8b", 0, "0")
    first = renderer.render(example, request, catalog_hash="one")
    second = renderer.render(example, request, catalog_hash="two")
    assert first.spec_hash == second.spec_hash and first.hcl != second.hcl
    changed_text = (REPO / "examples" / "catalog.yaml").read_text().replace('"16384"', '"8192"')
    changed = load_catalog(changed_text, filename="c", policy=shipped_policy).catalog
    assert changed is not None
    assert renderer.render(changed, request, catalog_hash="one").spec_hash != first.spec_hash
    assert catalog_digest(changed) != catalog_digest(example)


def test_policy_is_checked_again_at_render(renderer: Renderer) -> None:
    # A catalog built without the loader (an API, a bug): the renderer still refuses.
    catalog = Catalog.model_validate(
        {
            "models": {
                "m": {
                    "profiles": [
                        {
                            "engine": "vllm",
                            "source": "org/m",
                            "env": {"LD_PRELOAD": "/tmp/x.so"},
                            "args": ["--trust-remote-code"],
                        }
                    ]
                }
            }
        }
    )
    with pytest.raises(RenderError, match=r"LD_PRELOAD|trust-remote-code"):
        renderer.render(catalog, ReplicaRequest("m", 0, "0"), catalog_hash="h")


def test_operator_templates_override_and_are_held_to_the_contract(
    tmp_path: Path, example: Catalog, shipped_policy: SecurityPolicy
) -> None:
    bundled = (REPO / "templates" / "sim.nomad.hcl.j2").read_text()
    own = Renderer(RenderSettings(templates_dir=tmp_path), shipped_policy)

    (tmp_path / "sim.nomad.hcl.j2").write_text(
        bundled.replace("datacenters = {{ job.datacenters | hcl_list }}", 'datacenters = ["dc-east"]')
    )
    # (the datacenters line lives in the shared macros, so this override changes nothing but is valid)
    assert job(own, example, "sim-chat")["ID"].startswith("llmgw-sim-chat")

    (tmp_path / "sim.nomad.hcl.j2").write_text(bundled.replace("{{- m.engine_service(job, group) }}", ""))
    rendered = own.render(example, ReplicaRequest("sim-chat", 0, "0"), catalog_hash="h")
    with pytest.raises(RenderError, match="llmgw-engine service"):
        own.check(rendered, model="sim-chat")

    deploying = "group {{ group.name | hcl }} {\n    update {\n      max_parallel = 1\n    }\n"
    (tmp_path / "sim.nomad.hcl.j2").write_text(bundled.replace("group {{ group.name | hcl }} {\n", deploying))
    rendered = own.render(example, ReplicaRequest("sim-chat", 0, "0"), catalog_hash="h")
    with pytest.raises(RenderError, match=r"update block with max_parallel other than 0"):
        own.check(rendered, model="sim-chat")

    (tmp_path / "sim.nomad.hcl.j2").write_text(bundled + "\n{{ job.no_such_thing }}\n")
    with pytest.raises(RenderError, match="no_such_thing"):
        own.render(example, ReplicaRequest("sim-chat", 0, "0"), catalog_hash="h")

    (tmp_path / "sim.nomad.hcl.j2").write_text(bundled.replace("group {{ group.name | hcl }} {", "group {"))
    rendered = own.render(example, ReplicaRequest("sim-chat", 0, "0"), catalog_hash="h")
    with pytest.raises(RenderError, match="Nomad would refuse"):
        own.check(rendered, model="sim-chat")


def test_multi_node_needs_a_fabric(renderer: Renderer, example: Catalog) -> None:
    with pytest.raises(RenderError, match="needs a fabric"):
        renderer.render(example, ReplicaRequest("llama-3.1-405b", 0, "0"), catalog_hash="h")


def test_mirror_sources_fetch_and_verify_before_the_engine(shipped_policy: SecurityPolicy) -> None:
    text = "models:\n  m:\n    profiles: [{engine: vllm, source: 'mirror:llama@v1'}]\n"
    catalog = load_catalog(text, filename="c", policy=shipped_policy).catalog
    assert catalog is not None
    with pytest.raises(RenderError, match="mirror's address"):
        Renderer(RenderSettings(), shipped_policy).render(
            catalog, ReplicaRequest("m", 0, "0"), catalog_hash="h"
        )
    renderer = Renderer(RenderSettings(mirror_url="http://mirror.internal:8900"), shipped_policy)
    [group] = job(renderer, catalog, "m")["TaskGroups"]
    fetch, engine = group["Tasks"]
    assert fetch["Name"] == "fetch-model" and fetch["Lifecycle"]["Hook"] == "prestart"
    assert fetch["Config"]["args"] == [
        "mirror",
        "fetch",
        "--mirror",
        "http://mirror.internal:8900",
        "--ref",
        "llama@v1",
        "--dest",
        "/var/lib/llmgw/models/llama/v1",
    ]
    assert engine["Config"]["args"][1] == "/var/lib/llmgw/models/llama/v1"
    assert engine["Config"]["volumes"] == ["/var/lib/llmgw/models:/var/lib/llmgw/models:ro"]


def test_spec_hash_is_the_same_for_every_replica_and_fabric_of_a_profile(
    renderer: Renderer, example: Catalog
) -> None:
    one = renderer.render(example, ReplicaRequest("llama-3.1-405b", 1, "r1", "fabric-a"), catalog_hash="h")
    two = renderer.render(example, ReplicaRequest("llama-3.1-405b", 1, "r2", "fabric-b"), catalog_hash="h")
    assert one.spec_hash == two.spec_hash
    assert one.job_id != two.job_id and "r2" in two.hcl and "fabric-b" in two.hcl and "@@" not in two.hcl
    hostile_fabric = renderer.render(
        example, ReplicaRequest("llama-3.1-405b", 1, "r3", 'a" } job { "'), catalog_hash="h"
    )
    assert (
        renderer.check(hostile_fabric, model="llama-3.1-405b")["Constraints"][-1]["RTarget"] == 'a" } job { "'
    )


def test_an_llmgw_upgrade_that_renders_the_same_job_keeps_the_spec_hash(
    renderer: Renderer, example: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = renderer.render(example, ReplicaRequest("sim-chat", 0, "0"), catalog_hash="h")
    monkeypatch.setattr("llmgw.render.renderer.__version__", "99.0.0")
    after = renderer.render(example, ReplicaRequest("sim-chat", 0, "0"), catalog_hash="h")
    assert after.spec_hash == before.spec_hash
    assert 'llmgw_version" = "99.0.0"' in after.hcl and "llmgw 99.0.0" in after.hcl


def test_a_replica_id_is_letters_and_digits_only_even_at_its_end() -> None:
    for bad in ("0\n", "abc\n", "a-b", ""):
        with pytest.raises(RenderError, match="replica id"):
            job_id_for("m", bad)


def test_ops_asks_gpu_clients_for_a_max_kill_timeout_that_covers_the_rendered_one(
    renderer: Renderer, example: Catalog
) -> None:
    # Nomad caps a task's kill_timeout at the client's max_kill_timeout (30 s by default).
    rendered = job(renderer, example, "sim-chat")
    kill_timeout_ns = rendered["TaskGroups"][0]["Tasks"][0]["KillTimeout"]
    assert kill_timeout_ns == RenderSettings().kill_timeout_s * 10**9 == 60 * 10**9
    ops = " ".join((REPO / "ops" / "README.md").read_text(encoding="utf-8").split())
    assert 'client { max_kill_timeout = "1m" }' in ops
    assert "max_kill_timeout` at least the rendered jobs' `kill_timeout`, 1 minute" in ops


@pytest.mark.parametrize(
    ("setting", "instead"),
    [
        ('max_client_disconnect = "5m"', "disconnect { lost_after"),
        ('stop_after_client_disconnect = "1m"', "disconnect { stop_on_client_after"),
        ("prevent_reschedule_on_lost = true", "disconnect { replace = false }"),
    ],
)
def test_an_operator_template_using_a_setting_nomad_2_ignores_is_refused_naming_it(
    tmp_path: Path, example: Catalog, shipped_policy: SecurityPolicy, setting: str, instead: str
) -> None:
    # Nomad 2.0's HTTP API drops these before its server sees the job, and warns of nothing.
    bundled = (REPO / "templates" / "sim.nomad.hcl.j2").read_text()
    opening = "group {{ group.name | hcl }} {"
    assert opening in bundled
    (tmp_path / "sim.nomad.hcl.j2").write_text(bundled.replace(opening, f"{opening}\n    {setting}"))
    own = Renderer(RenderSettings(templates_dir=tmp_path), shipped_policy)
    rendered = own.render(example, ReplicaRequest("sim-chat", 0, "0"), catalog_hash="h")
    with pytest.raises(RenderError) as refused:
        own.check(rendered, model="sim-chat")
    name = setting.split(" ")[0]
    assert f"group rank-0: {name} is ignored by Nomad 2.0" in str(refused.value)
    assert instead in str(refused.value)
