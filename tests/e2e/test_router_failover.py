"""Faults under steady load, end to end on the dev stand-ins: a two-replica model (one GPU
each, on nodes of one GPU, so its replicas sit on distinct nodes) serves clients that send
streamed and whole chat completions back to back while one fault strikes:

- the node of one replica dies: no request fails before its first byte, and the only
  streams cut are those that were on the dead engine, each ending with OpenAI's error
  event (the router drops the endpoint at Nomad's event, before Consul's check notices);
- one replica's engine crashes: the same;
- Consul stops answering for a while: nothing fails at all;

and a forged registration in Consul (the engine service name, the real replica's meta and
allocation id, a passing check, its own port) is never sent a request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import consul
import consul.aio
import pytest
from aiohttp import web

from llmgw.core import conventions as c
from llmgw.core.catalog import SecurityPolicy
from llmgw.gateway.context import CONTEXT

from .harness import ClientPool, Replica, Stack, endpoints, eventually, nodes, replicas, settled

pytestmark = pytest.mark.e2e

MODEL = "sim-chat"
CATALOG = f"""
models:
  {MODEL}:
    roles: [chat]
    profiles:
      - engine: sim
        sim: {{tokens_per_second: 40, load_seconds: 0.5}}
    scaling: {{min: 2, max: 2}}
"""


@dataclass(frozen=True)
class Outcome:
    stream: bool
    replica: str | None  # x-llmgw-replica
    answered: bool  # 200 and a first chunk (a stream) or the whole answer
    finished: bool  # a stream's [DONE], a whole answer's choices
    error_event: bool  # a stream that ended with OpenAI's error event
    detail: str


@dataclass
class MixedLoad(ClientPool):
    """``concurrency`` clients, each sending a streamed then a whole chat completion, back to back."""

    router_url: str
    concurrency: int = 8
    max_tokens: int = 12
    outcomes: list[Outcome] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _session: aiohttp.ClientSession | None = None

    @property
    def finished(self) -> int:
        return sum(o.finished for o in self.outcomes)

    def failed_before_first_byte(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.answered]

    def cut(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.answered and not o.finished]

    async def wait_finished(self, more: int, within: float = 60.0) -> None:
        target = self.finished + more
        await eventually(lambda: self.finished >= target, within, f"{more} more answers")

    async def _client(self, n: int) -> None:
        stream = n % 2 == 0
        while True:
            try:
                self.outcomes.append(await self._one(stream, n))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the connection to the router itself failed
                self.outcomes.append(
                    Outcome(stream, None, False, False, False, f"{type(exc).__name__}: {exc}")
                )
                await asyncio.sleep(0.05)  # a user's client pauses before it tries again
            stream = not stream

    async def _one(self, stream: bool, n: int) -> Outcome:
        assert self._session is not None
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"client {n}"}],
            "max_tokens": self.max_tokens,
            "stream": stream,
        }
        async with self._session.post(f"{self.router_url}/v1/chat/completions", json=body) as resp:
            replica = resp.headers.get("x-llmgw-replica")
            if resp.status != 200:
                return Outcome(
                    stream, replica, False, False, False, f"{resp.status}: {(await resp.text())[:300]}"
                )
            if not stream:
                text = await resp.text()
                done = bool(json.loads(text).get("choices"))
                return Outcome(stream, replica, done, done, False, text[:300])
            events: list[bytes] = []
            try:
                async for line in resp.content:
                    if line.startswith(b"data: "):
                        events.append(line[6:].strip())
            except aiohttp.ClientPayloadError as exc:
                return Outcome(stream, replica, bool(events), False, False, f"cut without an event: {exc}")
            last = events[-1] if events else b""
            error = last.startswith(b"{") and "error" in json.loads(last)
            return Outcome(stream, replica, bool(events), last == b"[DONE]", error, last[:300].decode())


async def steady(stack: Stack) -> dict[str, Replica]:
    await stack.apply(CATALOG)
    await eventually(lambda: _settled_status(stack), 90, f"{MODEL} running two healthy replicas on two nodes")
    running = await replicas(stack.nomad, MODEL)
    assert len(running) == 2 and len({n for r in running.values() for n in r.nodes}) == 2, running
    return running


async def _settled_status(stack: Stack) -> bool:
    return settled(await stack.status(), MODEL)


async def under_load(stack: Stack, fault: Callable[[Replica], Awaitable[None]]) -> tuple[MixedLoad, Replica]:
    """Steady load, then ``fault`` on one replica, then the load for a while more."""
    running = await steady(stack)
    victim = running[sorted(running)[0]]
    load = MixedLoad(stack.router_url)
    try:
        await load.start()
        await load.wait_finished(30)
        await fault(victim)
        await load.wait_finished(60)
    finally:
        await load.stop()
    return load, victim


def assert_only_the_dead_engines_streams_were_cut(load: MixedLoad, victim: Replica) -> None:
    assert load.failed_before_first_byte() == [], load.failed_before_first_byte()[:5]
    cut = load.cut()
    assert {o.replica for o in cut} <= {victim.job_id}, cut[:5]
    assert all(o.stream and o.error_event for o in cut), [o for o in cut if not o.error_event][:5]
    print(f"{len(load.outcomes)} requests, {len(cut)} streams cut on the failed engine")


async def test_a_node_failure_under_load_fails_no_request_before_its_first_byte(
    tmp_path: Path, shipped_policy: SecurityPolicy
) -> None:
    async with Stack(tmp_path, shipped_policy, nodes(3)) as stack, stack.services("cp-1"):
        assert stack.cluster.nomad is not None
        nomad_standin = stack.cluster.nomad

        async def fail_node(victim: Replica) -> None:
            await nomad_standin.fail_node(sorted(victim.nodes)[0])

        load, victim = await under_load(stack, fail_node)
    assert_only_the_dead_engines_streams_were_cut(load, victim)


async def test_an_engine_crash_under_load_fails_no_request_before_its_first_byte(
    tmp_path: Path, shipped_policy: SecurityPolicy
) -> None:
    async with Stack(tmp_path, shipped_policy, nodes(3)) as stack, stack.services("cp-1"):
        assert stack.cluster.nomad is not None
        nomad_standin = stack.cluster.nomad

        async def crash(victim: Replica) -> None:
            await nomad_standin.crash_task(sorted(victim.allocs)[0])

        load, victim = await under_load(stack, crash)
    assert_only_the_dead_engines_streams_were_cut(load, victim)


async def test_a_consul_outage_under_load_fails_nothing(
    tmp_path: Path, shipped_policy: SecurityPolicy
) -> None:
    async with Stack(tmp_path, shipped_policy, nodes(3)) as stack, stack.services("cp-1"):
        outage = 5.0

        async def consul_outage(victim: Replica) -> None:
            await stack.cluster.consul.start_outage(duration=outage)
            await asyncio.sleep(outage)  # the fault's own length: the load runs through it

        load, _ = await under_load(stack, consul_outage)
    assert load.failed_before_first_byte() == [], load.failed_before_first_byte()[:5]
    assert load.cut() == [], load.cut()[:5]


@dataclass
class Recorder:
    seen: list[str] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(request.path)
        if request.path == "/health":
            return web.Response(text="ok")
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": "stolen"}}]})


async def test_a_forged_consul_registration_is_never_sent_a_request(
    tmp_path: Path, shipped_policy: SecurityPolicy
) -> None:
    async with Stack(tmp_path, shipped_policy, nodes(3)) as stack, stack.services("cp-1"):
        running = await steady(stack)
        real = next(e for e in await endpoints(stack.consul) if e.model == MODEL)
        recorder = Recorder()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", recorder.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        # Someone holding a token that may register services: the engine service name,
        # the real replica's meta (its allocation id too), a passing check, its own port.
        agent_url = urlsplit(stack.cluster.consul.agent_url(real.node))
        forger = consul.aio.Consul(
            host=agent_url.hostname, port=agent_url.port, token=stack.cluster.consul_token
        )
        try:
            meta = {
                c.META_MODEL: real.model,
                c.META_MODEL_SLUG: real.model_slug,
                c.META_JOB: real.replica,
                c.META_REPLICA: "0",
                c.META_ENGINE: real.engine,
                c.META_PROFILE: str(real.profile),
                c.META_RANK: "0",
                c.META_SIMULATED: "true",
                c.META_ALLOC: real.alloc_id,
            }
            await forger.agent.service.register(
                c.ENGINE_SERVICE, service_id="forged", address="127.0.0.1", port=port, meta=meta,
                check=consul.Check.http(f"http://127.0.0.1:{port}/health", "1s"),
            )  # fmt: skip
            await eventually(
                lambda: _passing(stack, "forged"), 30, "the forged registration passing in Consul"
            )
            assert stack.router is not None
            book = stack.router.app[CONTEXT].book
            await eventually(
                lambda: any(e.service_id == "forged" for e in book.endpoints()), 30, "the router seeing it"
            )
            async with aiohttp.ClientSession() as http:
                for n in range(30):
                    body = {"model": MODEL, "messages": [{"role": "user", "content": f"secret {n}"}]}
                    async with http.post(f"{stack.router_url}/v1/chat/completions", json=body) as resp:
                        assert resp.status == 200, await resp.text()
                        assert resp.headers["x-llmgw-replica"] in running
                async with http.get(f"{stack.router_url}/metrics") as resp:
                    metrics = await resp.text()
        finally:
            await forger.close()
            await runner.cleanup()
    assert [p for p in recorder.seen if p != "/health"] == []
    assert "llmgw_router_endpoints_ignored_total 1.0" in metrics


async def _passing(stack: Stack, service_id: str) -> bool:
    return any(e.service_id == service_id and e.passing for e in await endpoints(stack.consul))
