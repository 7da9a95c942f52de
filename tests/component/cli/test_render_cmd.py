"""`llmgw render` as an operator runs it: files, JSON, --check, and --plan against NOMAD_ADDR."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path

from llmgw.core.records import CatalogVersion, catalog_sha256
from llmgw.devcluster.nomad import NodeSpec, NomadServer, NomadStandIn, StandInConfig
from llmgw.devcluster.nomad.config import real_gpu_nodes

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = str(REPO / "examples" / "catalog.yaml")


async def llmgw(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmgw",
        *args,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode(), err.decode()


async def test_render_writes_files_and_check_says_how_to_refresh(tmp_path: Path) -> None:
    code, _, err = await llmgw("render", EXAMPLE, "--out", str(tmp_path), "--model", "sim-chat")
    assert code == 0, err
    [written] = list(tmp_path.glob("*.nomad.hcl"))
    assert written.name.startswith("llmgw-sim-chat-")
    code, _, _ = await llmgw("render", EXAMPLE, "--out", str(tmp_path), "--model", "sim-chat", "--check")
    assert code == 0
    written.write_text(written.read_text().replace("count = 1", "count = 2"))
    code, out, err = await llmgw("render", EXAMPLE, "--out", str(tmp_path), "--model", "sim-chat", "--check")
    assert code == 1 and "stale" in out and "refresh with: llmgw render" in err


async def test_render_json_is_the_job_nomads_parser_returns() -> None:
    code, out, _ = await llmgw("render", EXAMPLE, "--model", "bge-m3", "--format", "json")
    assert code == 0
    job = json.loads(out)["Job"]
    assert job["Meta"]["llmgw_model"] == "bge-m3"
    assert job["TaskGroups"][0]["Tasks"][0]["Driver"] == "docker"


async def test_plan_answers_in_words(tmp_path: Path) -> None:
    config = StandInConfig(nodes=(NodeSpec(name="gpu-1", gpus=8, fabric="fabric-a"),), state_dir=tmp_path)
    async with NomadServer(NomadStandIn(config)) as nomad:
        env = {"NOMAD_ADDR": nomad.address}
        code, out, err = await llmgw("render", EXAMPLE, "--model", "sim-chat", "--plan", env=env)
        assert code == 0, out + err
        assert out.strip().endswith("places: all 1 group(s) fit now")
        code, out, _ = await llmgw(
            "render", EXAMPLE, "--model", "llama-3.1-405b", "--all-profiles", "--plan", env=env
        )
        assert code == 1
        lines = out.strip().splitlines()
        assert (
            "does not place: group rank-0 needs a node with 8 nvidia/gpu (H100, >= 76293 MiB) free on "
            "fabric fabric-a; none has" in lines[0]
        )
        assert "missing drivers" in lines[0]  # no docker on this cluster
        assert "needs Docker running on the node" in lines[0]
        assert "does not place" in lines[1] and "1 other group(s) would place" in lines[1]


async def test_plan_with_nomad_unreachable_says_so_and_exits_3() -> None:
    # A port nothing listens on: bound, then closed.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"http://127.0.0.1:{probe.getsockname()[1]}"
    code, out, err = await llmgw(
        "render", EXAMPLE, "--model", "sim-chat", "--plan", env={"NOMAD_ADDR": address}
    )
    assert code == 3, out + err  # the README's "the other side cannot be reached", not 1 (a job refused)
    assert "refused" not in out + err
    assert "cannot ask Nomad whether the jobs place" in err and address in err


async def test_plan_shows_what_nomad_warns_about(tmp_path: Path) -> None:
    # An operator's template asks for memory_max, which a Nomad without memory
    # oversubscription ignores; the plan's Warnings say so, and --plan shows them.
    bundled = (REPO / "templates" / "sim.nomad.hcl.j2").read_text()
    call = "{{ m.resources(group, job.resources.cpu, job.resources.memory) }}"
    assert call in bundled
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "sim.nomad.hcl.j2").write_text(
        bundled.replace(call, call[:-3] + ' | replace("memory = ", "memory_max = 1024\n memory = ") }}')
    )
    config = StandInConfig(nodes=(NodeSpec(name="gpu-1", gpus=8, fabric="fabric-a"),), state_dir=tmp_path)
    async with NomadServer(NomadStandIn(config)) as nomad:
        env = {"NOMAD_ADDR": nomad.address}
        args = ("render", EXAMPLE, "--model", "sim-chat", "--plan", "--templates", str(templates))
        code, out, err = await llmgw(*args, env=env)
    assert code == 0, out + err
    first, warned = out.strip().splitlines()
    assert first.endswith("places: all 1 group(s) fit now")
    name = first.split(":")[0]
    assert warned.startswith(f"{name}: Nomad warns: Memory oversubscription is not enabled; Task")
    assert "memory_max value will be ignored" in warned


async def test_plan_says_every_example_job_places_on_real_shaped_gpu_clients(tmp_path: Path) -> None:
    # Nodes fingerprinting docker (volumes on, NVIDIA runtime) and 8 NVIDIA H100s, as real clients do.
    config = StandInConfig(nodes=real_gpu_nodes(2), state_dir=tmp_path)
    async with NomadServer(NomadStandIn(config)) as nomad:
        code, out, err = await llmgw(
            "render", EXAMPLE, "--all-profiles", "--plan", env={"NOMAD_ADDR": nomad.address}
        )
    assert code == 0, out + err
    lines = out.strip().splitlines()
    assert len(lines) == len(list((REPO / "jobspecs").glob("*.nomad.hcl")))
    for line in lines:
        assert ": places: all " in line, line


async def test_the_catalog_hash_is_the_one_the_control_plane_puts_in_the_job(tmp_path: Path) -> None:
    # The control plane stamps jobs with the applied version's sha256 (of the text `ctl apply`
    # sends), so `render` must show that one, however the file is formatted.
    text = Path(EXAMPLE).read_text(encoding="utf-8")
    reformatted = tmp_path / "catalog.yaml"
    reformatted.write_text("# the same catalog, another text\n" + text, encoding="utf-8")
    for path, body in ((EXAMPLE, text), (str(reformatted), reformatted.read_text(encoding="utf-8"))):
        code, out, err = await llmgw("render", path, "--model", "sim-chat", "--format", "json")
        assert code == 0, err
        applied = CatalogVersion.of(1, body, "ctl (no token)", 0.0)
        assert json.loads(out)["Job"]["Meta"]["llmgw_catalog_hash"] == applied.sha256
    code, out, _ = await llmgw("render", EXAMPLE, "--model", "sim-chat")
    assert f'"llmgw_catalog_hash" = "{catalog_sha256(text)}"' in out
