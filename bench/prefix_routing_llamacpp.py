"""Prefix-aware routing against least outstanding on real llama-server replicas on this machine.

    .venv/bin/python bench/prefix_routing_llamacpp.py                 # LLMGW_LLAMA_SERVER's binary
    .venv/bin/python bench/prefix_routing_llamacpp.py --llama-server PATH --replicas 2
    .venv/bin/python bench/prefix_routing_llamacpp.py --rounds 3 --settings sized
    .venv/bin/python bench/prefix_routing.py --llama-server PATH      # after the sim's figures

Each run starts fresh replicas of llama.cpp's llama-server (``--threads 1`` each) on one
random-weight llama (tests/e2e/tinygguf.py at width 128 and 4 layers, so a prompt of
thousands of tokens costs a CPU a second or so: a tokenizer of bytes, a token a
character), and the router in its own process with those replicas as its endpoints, the
model's ``routing: {prefix_affinity: ...}`` off (least outstanding, the baseline) or on
(prefix-aware, the default). Then an agentic workload through the router: sessions each
with one of two shared system prompts and a first turn of its own, streaming each turn
and resending the whole grown conversation (the answer and a tool's output) after a
pause while the tool runs, the sessions starting staggered so they do not move in
lockstep. The reference, sessions pinned by hand, sends session n straight to replica
n mod the replicas (no router). Every policy runs the same seeded workload; with
``--rounds N`` each runs N times, the policies' order rotated each round, and the
figures are medians (with the range of p90).

Printed per run: TTFT p50/p90 (to the first content token, at the client), the
cache-hit rate from the engines' own counts (``llamacpp:prompt_tokens_cached_total``
over it and ``llamacpp:prompt_tokens_total``, the tokens computed, from each replica's
/metrics), the load spread (the busiest replica's requests, and prompt tokens computed,
over the mean), and the wall time.

Two engine settings:

- **sized**: each replica's cache holds its share of the sessions and no more, as a
  GPU's KV cache holds a fraction of a cluster's sessions: ``--parallel`` slots of
  8,192 tokens, one for each session a replica would get with the sessions dealt out
  evenly, and ``--cache-ram 0`` (no host-memory prompt cache);
- **defaults**: llama-server's own (and llmgw's llama.cpp profile's, which passes no
  slot or cache flag): 4 slots over one unified KV cache of the model's context, and
  up to 8 GiB of host-memory prompt cache (``--cache-ram``, common/common.h at
  b11434), where a slot's prompt goes when the slot is given to another (and from where
  a later request that shares it takes it back).

And two placements (pinned for the sized caches only): **pinned**, replica i on CPU i
mod the CPUs (``sched_setaffinity``, taskset's call; the router and this load generator
on every CPU), and **shared**, everything on every CPU. On a machine with fewer CPUs
than replicas, pinned replicas share CPUs too, and the router and the load generator
always compete with them: a miss's prefill then slows the replicas beside it as well.

Prints figures; asserts nothing (a shared machine's load moves them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
SELF = str(Path(__file__).resolve())
sys.path.insert(0, str(ROOT))

from llmgw.core.routing import Api, affinity_key, rendezvous_order  # noqa: E402
from tests.e2e.tinygguf import write_llama  # noqa: E402

MODEL = "bench-llama"
SLOT_TOKENS = 8192
WORDS = ("the", "a", "and", "of", "to", "in", "is", "it", "you", "that", "model", "engine", "router")


def llama_server_binary(named: str | None = None) -> str | None:
    """``named`` (``--llama-server``), else ``$LLMGW_LLAMA_SERVER``; None: neither."""
    return named or os.environ.get("LLMGW_LLAMA_SERVER", "").strip() or None


# --- the workload ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    sessions: int = 12
    turns: int = 6
    systems: int = 2  # system prompts, each shared by sessions / systems sessions
    system_chars: int = 800  # a token a character with this model's byte vocabulary
    first_chars: int = 200
    tool_chars: int = 500
    answer_tokens: int = 16
    think: float = 0.5  # mean seconds a tool runs between turns
    stagger: float = 3.0  # sessions start over this many seconds


def text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(WORDS)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)


@dataclass
class Figures:
    ttft: list[float] = field(default_factory=list)
    # The engines' own counts, by replica: requests (tokens predicted over the answer's
    # length), prompt tokens read from the cache, prompt tokens computed.
    served: dict[int, float] = field(default_factory=dict)
    cached: dict[int, float] = field(default_factory=dict)
    computed: dict[int, float] = field(default_factory=dict)
    decisions: dict[str, float] = field(default_factory=dict)  # the router's, by outcome
    wall: float = 0.0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.ttft)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def hit_rate(self) -> float:
        cached = sum(self.cached.values())
        return cached / max(1.0, cached + sum(self.computed.values()))

    @property
    def spread(self) -> float:
        counts = list(self.served.values())
        return max(counts) / statistics.mean(counts)

    @property
    def work_spread(self) -> float:
        return max(self.computed.values()) / max(1.0, statistics.mean(self.computed.values()))


def opening(workload: Workload, number: int, seed: int) -> tuple[random.Random, list[dict[str, str]]]:
    """Session ``number``'s own random source and its first turn's messages."""
    rng = random.Random(seed * 1000 + number)
    system = number % workload.systems
    shared = random.Random(seed * 1000 + 999 + system)
    return rng, [
        {"role": "system", "content": f"system {system}: " + text(shared, workload.system_chars)},
        {"role": "user", "content": f"session {number}: " + text(rng, workload.first_chars)},
    ]


def owners(workload: Workload, seed: int, count: int) -> list[int]:
    """How many sessions each replica owns: first in its key's rendezvous order, as the
    router computes both (``routing.affinity_key``, ``routing.rendezvous_order``)."""
    ids = [f"bench-{index}" for index in range(count)]
    owned = dict.fromkeys(ids, 0)
    for number in range(workload.sessions):
        key = affinity_key(Api.CHAT, {"messages": opening(workload, number, seed)[1]})
        assert key is not None
        owned[rendezvous_order(key, ids)[0]] += 1
    return list(owned.values())


async def session(
    http: aiohttp.ClientSession, url: str, workload: Workload, number: int, seed: int, figures: Figures
) -> None:
    """One agent's turns, to ``url`` (the router's, or one replica's for pinned by hand)."""
    rng, messages = opening(workload, number, seed)
    await asyncio.sleep(rng.uniform(0, workload.stagger))
    for _ in range(workload.turns):
        body = {
            "model": MODEL,
            "messages": messages,
            "max_tokens": workload.answer_tokens,
            "temperature": 0,
            "stream": True,
            "logit_bias": {"2": -100},  # never </s>: every answer is answer_tokens long
        }
        started = time.monotonic()
        first: float | None = None
        parts: list[str] = []
        async with http.post(url, json=body) as response:
            response.raise_for_status()
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: {"):
                    continue
                for choice in json.loads(line[len("data: ") :]).get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        if first is None:
                            first = time.monotonic()
                        parts.append(content)
        figures.ttft.append((first or time.monotonic()) - started)
        messages += [
            {"role": "assistant", "content": "".join(parts)},
            {"role": "user", "content": "tool output: " + text(rng, workload.tool_chars)},
        ]
        await asyncio.sleep(rng.expovariate(1 / workload.think))  # the tool runs


# --- the processes --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()


async def _healthy(port: int, process: asyncio.subprocess.Process, what: str) -> None:
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if process.returncode is not None:
                raise RuntimeError(f"{what} exited with {process.returncode} before it was ready")
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"http://127.0.0.1:{port}/health") as response:
                    if response.status == 200:  # 503 while the model loads
                        return
            await asyncio.sleep(0.05)  # polling another process's readiness
    raise RuntimeError(f"{what} was not ready within 60 s")


def engine_args(setting: str, slots: int) -> list[str]:
    if setting == "sized":
        return ["--parallel", str(slots), "--ctx-size", str(slots * SLOT_TOKENS), "--cache-ram", "0"]
    return []  # llama-server's defaults, as llmgw's llama.cpp profile launches it


@contextlib.asynccontextmanager
async def replicas(
    binary: str, model: Path, count: int, cpus: list[int] | None, extra: list[str]
) -> AsyncIterator[list[int]]:
    """``count`` llama-servers, replica i on CPU ``cpus[i % len(cpus)]`` when ``cpus``."""
    started: list[tuple[asyncio.subprocess.Process, int]] = []
    try:
        for index in range(count):
            port = _free_port()
            cpu = None if cpus is None else {cpus[index % len(cpus)]}
            process = await asyncio.create_subprocess_exec(
                binary, "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
                "--alias", MODEL, "--no-slots", "--metrics", "--threads", "1", *extra,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                preexec_fn=None if cpu is None else functools.partial(os.sched_setaffinity, 0, cpu),
            )  # fmt: skip
            started.append((process, port))
        for number, (process, port) in enumerate(started):
            await _healthy(port, process, f"llama-server {number}")
        yield [port for _, port in started]
    finally:
        for process, _ in started:
            await _stop(process)


@contextlib.asynccontextmanager
async def router(ports: list[int], affinity: bool) -> AsyncIterator[int]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, SELF, "--serve-router", ",".join(map(str, ports)),
        "--affinity", "on" if affinity else "off",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, cwd=ROOT,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        if b"router listening port=" not in line:
            raise RuntimeError(f"the router did not start: {line!r}")
        yield int(line.rsplit(b"port=", 1)[1])
    finally:
        await _stop(process)


async def scraped(http: aiohttp.ClientSession, port: int) -> dict[str, float]:
    """A /metrics page's samples, by name and labels as written."""
    async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
        page = await response.text()
    samples: dict[str, float] = {}
    for line in page.splitlines():
        name, _, value = line.rpartition(" ")
        if name and not line.startswith("#"):
            samples[name] = float(value)
    return samples


async def run_once(
    binary: str, model: Path, count: int, cpus: list[int] | None, setting: str, policy: str,
    workload: Workload, seed: int,
) -> Figures:  # fmt: skip
    """One policy on fresh replicas: "least-outstanding" and "prefix-aware" through the
    router, "pinned" (session n straight to replica n mod count) without it."""
    slots = -(-workload.sessions // count)
    async with (
        replicas(binary, model, count, cpus, engine_args(setting, slots)) as ports,
        router(ports, policy == "prefix-aware") as router_port,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as http,
    ):
        figures = Figures()
        started = time.monotonic()

        def url(n: int) -> str:
            port = ports[n % count] if policy == "pinned" else router_port
            return f"http://127.0.0.1:{port}/v1/chat/completions"

        await asyncio.gather(
            *(session(http, url(n), workload, n, seed, figures) for n in range(workload.sessions))
        )
        figures.wall = time.monotonic() - started
        for index, port in enumerate(ports):
            engine = await scraped(http, port)
            figures.served[index] = engine["llamacpp:tokens_predicted_total"] / workload.answer_tokens
            figures.cached[index] = engine["llamacpp:prompt_tokens_cached_total"]
            figures.computed[index] = engine["llamacpp:prompt_tokens_total"]
        routed = await scraped(http, router_port)
        for outcome in ("affinity", "overflow", "no-key"):
            key = f'llmgw_router_routing_decisions_total{{model="{MODEL}",outcome="{outcome}"}}'
            figures.decisions[outcome] = routed.get(key, 0.0)
        return figures


POLICIES = {
    "least-outstanding": "least outstanding (baseline)",
    "prefix-aware": "prefix-aware",
    "pinned": "pinned by hand (no router)",
}


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def show(label: str, runs: Sequence[Figures]) -> None:
    """Medians over the rounds (the range of p90 beside it when there are several)."""
    p90s = [f.percentile(0.9) for f in runs]
    spread = f" [{min(p90s):.2f}-{max(p90s):.2f}]" if len(runs) > 1 else ""
    decisions = {
        o: median([f.decisions.get(o, 0.0) for f in runs]) for o in ("affinity", "overflow", "no-key")
    }
    routed = ", ".join(f"{outcome} {n:g}" for outcome, n in decisions.items() if n)
    print(
        f"  {label:<30} ttft p50 {median([f.percentile(0.5) for f in runs]):6.3f}s "
        f"p90 {median(p90s):6.3f}s{spread}  hit {median([f.hit_rate for f in runs]):4.2f}  "
        f"spread {median([f.spread for f in runs]):4.2f} "
        f"(computed {median([f.work_spread for f in runs]):4.2f})  "
        f"wall {median([f.wall for f in runs]):5.1f}s" + (f"  [{routed}]" if routed else "")
    )


def ratio(a: Sequence[Figures], b: Sequence[Figures], q: float) -> float:
    """``a``'s median TTFT quantile ``q`` over ``b``'s."""
    return median([f.percentile(q) for f in a]) / median([f.percentile(q) for f in b])


def where(cpus: list[int] | None, count: int) -> str:
    if cpus is None:
        return "every process on every CPU"
    shared = f" ({count} replicas on {len(cpus)} CPUs: some share one)" if count > len(cpus) else ""
    return f"replica i on CPU i mod {len(cpus)}{shared}"


def flags(setting: str, workload: Workload, count: int) -> str:
    return " ".join(engine_args(setting, -(-workload.sessions // count))) or "llama-server's own"


async def compare(
    binary: str, count: int, workload: Workload, seed: int, settings: Sequence[str], rounds: int
) -> None:
    available = sorted(os.sched_getaffinity(0))
    print(
        f"\nreal llama-server ({binary}), {count} replicas of a random-weight llama "
        f"(width 128, 4 layers, --threads 1) on this machine's {len(available)} CPUs; "
        f"{workload.sessions} sessions x {workload.turns} turns "
        f"({workload.systems} shared system prompts, ~{workload.system_chars + workload.first_chars} "
        f"tokens at the first turn, ~{workload.tool_chars + workload.answer_tokens} more a turn); "
        f"sessions each replica owns by rendezvous hashing: "
        f"{'/'.join(map(str, owners(workload, seed, count)))}; "
        f"medians of {rounds} round(s), the policies' order rotated each round"
    )
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-prefix-") as folder:
        model = write_llama(Path(folder) / "bench.gguf", seed=7, context=16384, width=128, layers=4)
        for setting in settings:
            placements: list[tuple[str, list[int] | None]] = [("shared", None)]
            if setting == "sized":
                placements.insert(0, ("pinned", available))
            for placement, cpus in placements:
                engine = flags(setting, workload, count)
                print(f" {setting} caches ({engine}), {placement}: {where(cpus, count)}")
                runs: dict[str, list[Figures]] = {policy: [] for policy in POLICIES}
                order = list(POLICIES)
                for turn in range(rounds):
                    for policy in order[turn % len(order) :] + order[: turn % len(order)]:
                        runs[policy].append(
                            await run_once(binary, model, count, cpus, setting, policy, workload, seed)
                        )
                for policy, label in POLICIES.items():
                    show(label, runs[policy])
                lo, px, pin = (runs[policy] for policy in POLICIES)
                print(
                    f"  {'baseline / prefix-aware':<30} ttft p50 {ratio(lo, px, 0.5):5.2f}x "
                    f"p90 {ratio(lo, px, 0.9):5.2f}x; prefix-aware p90 {ratio(px, pin, 0.9):.2f}x pinned's"
                )


def report(
    binary: str | None,
    *,
    replicas: int = 3,
    seed: int = 1,
    settings: Sequence[str] = ("sized", "defaults"),
    rounds: int = 1,
) -> None:
    """The real llama-server rows, or why there are none (``bench/prefix_routing.py`` calls it)."""
    if binary is None:
        print(
            "\nreal llama-server: skipped, no binary (pass --llama-server PATH or set LLMGW_LLAMA_SERVER; "
            "scripts/build-llama-server builds one)"
        )
        return
    if not os.access(binary, os.X_OK):
        print(f"\nreal llama-server: skipped, {binary} is not an executable file")
        return
    asyncio.run(compare(binary, replicas, Workload(), seed, settings, rounds))


# --- the router process ---------------------------------------------------------------------------


async def serve_router(ports: list[int], affinity: bool) -> None:
    from llmgw.core.names import slug
    from llmgw.core.records import CatalogVersion, Endpoint, EndpointSnapshot, HealthStatus
    from llmgw.gateway.app import RouterServer
    from llmgw.gateway.ports import FixedValue, RouterDeps
    from llmgw.gateway.settings import RouterSettings

    catalog = f"""
models:
  {MODEL}:
    roles: [chat]
    profiles: [{{engine: llamacpp, source: "https://models.example.com/bench.gguf", gpus_per_node: 0}}]
    scaling: {{min: {len(ports)}, max: {len(ports)}}}
    routing: {{prefix_affinity: {"true" if affinity else "false"}}}
"""
    endpoints = tuple(
        Endpoint(
            service_id=f"bench-{index}",
            node="local",
            model=MODEL,
            model_slug=slug(MODEL),
            replica=f"bench-r{index}",
            alloc_id="",
            address="127.0.0.1",
            port=port,
            engine="llamacpp",
            profile=0,
            simulated=False,
            status=HealthStatus.PASSING,
        )
        for index, port in enumerate(ports)
    )
    deps = RouterDeps(
        endpoints=FixedValue(EndpointSnapshot(endpoints, 1), "endpoints"),
        catalog=FixedValue(CatalogVersion.of(1, catalog, "bench", 0.0), "catalog"),
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with RouterServer(RouterSettings(host="127.0.0.1", port=0, no_auth=True), deps) as server:
        print(f"router listening port={server.port}", flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", help="the binary (default: $LLMGW_LLAMA_SERVER)")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--settings", default="sized,defaults", help="engine settings: sized, defaults")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each policy, interleaved")
    parser.add_argument("--serve-router", metavar="PORTS", help=argparse.SUPPRESS)
    parser.add_argument("--affinity", choices=("on", "off"), default="on", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_router:
        asyncio.run(serve_router([int(p) for p in args.serve_router.split(",")], args.affinity == "on"))
        return 0
    binary = llama_server_binary(args.llama_server)
    report(
        binary, replicas=args.replicas, seed=args.seed, settings=args.settings.split(","), rounds=args.rounds
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
