"""Prefix-aware routing against least outstanding requests, on the simulated engine's cache.

    .venv/bin/python bench/prefix_routing.py              # 8 and 32 replicas
    .venv/bin/python bench/prefix_routing.py --replicas 8 --seed 3

A discrete-event simulation on a virtual clock, not processes: at 8 and 32 replicas of a
GPU shape this machine cannot run the engines, so each replica is the sim's own
``PrefixCache`` (vLLM 0.34.0's blocks of 64 tokens, LRU) in front of a prefill queue
(``PREFILL_TOKEN_TIME`` per uncached token, one prompt at a time, as a GPU's prefill is
compute bound) and decode at ``TOKEN_RATE`` per sequence. The clock is virtual, so the
figures are the same whatever else shares the CPUs: there is no "pinned" against
"shared CPUs" pair to print, and a run's wall time says nothing. The routers choose
with the gateway's own functions: ``routing.affinity_key`` and ``routing.has_history``
of each request's body, and ``routing.choose_by_prefix`` (prefix-aware) or
``routing.choose_endpoint`` (least outstanding, the policy before it), over each
router's own counts: its outstanding requests, its requests of each key in flight, and
the conversations it sent each replica lately (``gateway.book.HeldConversations``, as
the gateway keeps them). The baseline (least outstanding) and the reference (each
session pinned to a replica by hand, evenly) run in the same invocation on the same
workload, seeded; the seed draws the conversations' contents too, so each seed puts
their keys on other replicas.

Workloads (the issue's):
  (a) agentic: sessions resending their growing conversation each turn (system prompts
      shared by groups of sessions, a pause while a tool runs), more context in total
      than one replica's cache holds. The sessions arrive at random over 180 s, each
      about a minute long, so about 8 run at once on each replica as in a cluster
      that has been serving a while (sessions start and end all the time);
  (a, cold start) the same 8 a replica all starting within 20 s on empty caches:
      printed with its ratios, not judged (see the DESIGN note): every replica meets
      the system prompts for the first time at once, and the pinned reference, which
      pins session ``i`` to replica ``i mod n`` and gives it system prompt ``i mod 4``,
      puts one system prompt on each replica by that arithmetic;
  (b) no shared prefix: every request a new prompt, Poisson arrivals;
  (c) (a) through three routers, each request to one of them in turn, each with only
      its own counts.

Printed per run: TTFT p50/p90/p99, throughput, the engines' cache-hit rate (cached /
prompt tokens) and the load spread (the busiest replica's requests over the mean), then
the targets with verdicts. Then, with ``--llama-server PATH`` (default
``$LLMGW_LLAMA_SERVER``), real llama-server replicas on this machine:
``prefix_routing_llamacpp.py``, whose docstring says what it runs.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import prefix_routing_llamacpp
from llmgw.core.routing import (
    Api,
    Candidate,
    affinity_key,
    choose_by_prefix,
    choose_endpoint,
    has_history,
)
from llmgw.gateway.book import HeldConversations
from llmgw.sim.prefix_cache import PrefixCache

# An 8B model on one H100-class GPU, roughly: 10,000 prompt tokens/s of prefill, 40 tokens/s
# per sequence of decode, KV for 96k tokens once the weights are in.
PREFILL_TOKEN_TIME = 1e-4
TOKEN_RATE = 40.0
KV_CACHE_TOKENS = 96 * 1024
BLOCK_SIZE = 64
MODEL = "agent-8b"


@dataclass
class Request:
    session: int
    tokens: list[str]
    key: str | None
    answer_tokens: int
    history: bool = False  # ``routing.has_history`` of its body: an earlier answer in it
    concurrent: int = 0  # its router's requests of its key in flight as it arrives
    arrived: float = 0.0


@dataclass
class Replica:
    name: str
    cache: PrefixCache
    prefill_free_at: float = 0.0
    served: int = 0


@dataclass
class Figures:
    ttft: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    answer_tokens: int = 0
    finished_at: float = 0.0
    served: list[int] = field(default_factory=list)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.ttft)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / max(1, self.prompt_tokens)

    @property
    def spread(self) -> float:
        return max(self.served) / statistics.mean(self.served)

    @property
    def throughput(self) -> float:
        return self.answer_tokens / self.finished_at


Policy = Callable[[list[Candidate], Request, int], str]


def least_outstanding(candidates: list[Candidate], request: Request, turn: int) -> str:
    chosen = choose_endpoint(candidates, (), turn)
    assert chosen is not None
    return chosen


def prefix_aware(candidates: list[Candidate], request: Request, turn: int) -> str:
    chosen = choose_by_prefix(
        candidates, (), request.key, turn, history=request.history, concurrent=request.concurrent
    ).key
    assert chosen is not None
    return chosen


def pinned(candidates: list[Candidate], request: Request, turn: int) -> str:
    return candidates[request.session % len(candidates)].key


def words(prefix: str, count: int) -> list[str]:
    return [f"{prefix}.{index}" for index in range(count)]


def body_of(system: list[str], first: list[str], answered: bool = False) -> dict[str, object]:
    """The body as a client sends it, as far as routing reads it: the leading turns (the
    key) and whether an answer follows them (the history); the later turns are left out."""
    messages: list[dict[str, str]] = [{"role": "user", "content": " ".join(first)}]
    if system:
        messages.insert(0, {"role": "system", "content": " ".join(system)})
    if answered:
        messages += [{"role": "assistant", "content": "..."}, {"role": "user", "content": "..."}]
    return {"messages": messages}


def key_of(system: list[str], first: list[str]) -> str | None:
    return affinity_key(Api.CHAT, body_of(system, first))


@dataclass
class Agentic:
    """Sessions of ``turns`` turns: a shared system prompt (one of ``systems``), a first
    turn of their own, then each turn the answer and a tool's output appended."""

    sessions: int
    turns: int = 10
    systems: int = 4
    system_tokens: int = 2000
    first_tokens: int = 300
    answer_tokens: int = 120
    tool_tokens: int = 600
    think: float = 3.0  # mean seconds a tool runs between turns
    stagger: float = 20.0  # sessions start over this many seconds


@dataclass
class Unshared:
    requests: int
    prompt_tokens: int = 1500
    answer_tokens: int = 120
    rate: float = 10.0  # arrivals per second


def simulate(
    replicas: int, policy: Policy, workload: Agentic | Unshared, routers: int = 1, seed: int = 1
) -> Figures:
    rng = random.Random(seed)
    pool = [Replica(f"engine-{i:02d}", PrefixCache(KV_CACHE_TOKENS, BLOCK_SIZE)) for i in range(replicas)]
    outstanding = [dict.fromkeys((r.name for r in pool), 0) for _ in range(routers)]
    # Each router's own count of the conversations it sent each replica lately, kept as
    # the gateway's book keeps it (``EndpointBook.choose_by_prefix``).
    held = [HeldConversations() for _ in range(routers)]
    by_key: list[dict[str | None, int]] = [{} for _ in range(routers)]
    by_name = {r.name: r for r in pool}
    figures = Figures()
    events: list[tuple[float, int, str, object]] = []
    order = itertools.count()
    turns = itertools.count()
    router_turn = itertools.count()
    conversations: dict[int, tuple[list[str], int]] = {}

    def arrive(at: float, request: Request) -> None:
        heapq.heappush(events, (at, next(order), "arrive", request))

    if isinstance(workload, Agentic):
        for session in range(workload.sessions):
            # The seed in the contents too: each seed is other conversations, whose keys
            # fall on other replicas.
            system = words(f"sys{seed}.{session % workload.systems}", workload.system_tokens)
            first = words(f"s{seed}.{session}.first", workload.first_tokens)
            key = key_of(system, first)
            conversations[session] = (system + first, 1)
            at = rng.uniform(0, workload.stagger)
            arrive(at, Request(session, system + first, key, workload.answer_tokens))
    else:
        at = 0.0
        for index in range(workload.requests):
            at += rng.expovariate(workload.rate)
            tokens = words(f"u{seed}.{index}", workload.prompt_tokens)
            arrive(at, Request(index, tokens, key_of([], tokens), workload.answer_tokens))

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            request = payload
            assert isinstance(request, Request)
            request.arrived = now
            router = next(router_turn) % routers
            counts, mine = outstanding[router], held[router]
            counted = request.history and request.key is not None
            if counted:
                mine.expire(now)
            candidates = [
                Candidate(
                    r.name,
                    counts[r.name],
                    True,
                    load=mine.load(MODEL, request.key, r.name) if counted and request.key else None,
                )
                for r in pool
            ]
            request.concurrent = by_key[router].get(request.key, 0)
            replica = by_name[policy(candidates, request, next(turns))]
            by_key[router][request.key] = request.concurrent + 1
            if counted and request.key:
                mine.record(MODEL, request.key, replica.name, now)
            counts[replica.name] += 1
            replica.served += 1
            cached = replica.cache.admit(request.tokens)
            start = max(now, replica.prefill_free_at)
            prefilled = start + (len(request.tokens) - cached) * PREFILL_TOKEN_TIME
            replica.prefill_free_at = prefilled
            figures.ttft.append(prefilled + 1 / TOKEN_RATE - now)
            figures.prompt_tokens += len(request.tokens)
            figures.cached_tokens += cached
            done = prefilled + request.answer_tokens / TOKEN_RATE
            heapq.heappush(events, (done, next(order), "done", (request, router, replica.name)))
        else:
            assert isinstance(payload, tuple)
            request, router, name = payload
            assert isinstance(request, Request) and isinstance(router, int) and isinstance(name, str)
            outstanding[router][name] -= 1
            by_key[router][request.key] -= 1
            figures.answer_tokens += request.answer_tokens
            figures.finished_at = now
            if isinstance(workload, Agentic):
                tokens, turn = conversations[request.session]
                if turn < workload.turns:
                    grown = [
                        *tokens,
                        *words(f"s{request.session}.a{turn}", request.answer_tokens),
                        *words(f"s{request.session}.t{turn}", workload.tool_tokens),
                    ]
                    conversations[request.session] = (grown, turn + 1)
                    history = has_history(Api.CHAT, body_of([], [], answered=True))
                    nxt = Request(request.session, grown, request.key, workload.answer_tokens, history)
                    arrive(now + rng.expovariate(1 / workload.think), nxt)
    figures.served = [r.served for r in pool]
    return figures


def show(label: str, f: Figures) -> None:
    print(
        f"  {label:<34} ttft p50 {f.percentile(0.5):7.3f}s p90 {f.percentile(0.9):7.3f}s "
        f"p99 {f.percentile(0.99):7.3f}s  {f.throughput:8.0f} tok/s  hit {f.hit_rate:5.2f}  "
        f"spread {f.spread:4.2f}"
    )


def verdict(target: str, figure: str, ok: bool) -> bool:
    print(f"  {target:<64} {figure:<22} {'MET' if ok else 'NOT MET'}")
    return ok


def run(replicas: int, seed: int) -> list[bool]:
    # Sessions arriving for 180 s, each about a minute long: about 8 at once a replica.
    agentic = Agentic(sessions=replicas * 24, stagger=180.0)
    # The same 8 a replica all starting within 20 s on empty caches.
    cold = Agentic(sessions=replicas * 8, stagger=20.0)
    unshared = Unshared(requests=replicas * 150, rate=replicas * 1.2)
    print(
        f"\n{replicas} replicas: agentic {agentic.sessions} sessions x {agentic.turns} turns arriving over "
        f"{agentic.stagger:.0f} s (~{agentic.system_tokens + agentic.first_tokens + agentic.turns * 720} "
        f"tokens at the end, {KV_CACHE_TOKENS} of KV a replica); unshared {unshared.requests} requests"
    )
    a_lo = simulate(replicas, least_outstanding, agentic, seed=seed)
    a_px = simulate(replicas, prefix_aware, agentic, seed=seed)
    a_pin = simulate(replicas, pinned, agentic, seed=seed)
    a_px3 = simulate(replicas, prefix_aware, agentic, routers=3, seed=seed)
    a_lo3 = simulate(replicas, least_outstanding, agentic, routers=3, seed=seed)
    b_lo = simulate(replicas, least_outstanding, unshared, seed=seed)
    b_px = simulate(replicas, prefix_aware, unshared, seed=seed)
    cold_lo = simulate(replicas, least_outstanding, cold, seed=seed)
    cold_px = simulate(replicas, prefix_aware, cold, seed=seed)
    cold_pin = simulate(replicas, pinned, cold, seed=seed)
    print(" (a) agentic")
    show("least outstanding (baseline)", a_lo)
    show("prefix-aware", a_px)
    show("pinned by hand", a_pin)
    print(f" (a, cold start) {cold.sessions} sessions all starting within {cold.stagger:.0f} s, caches empty")
    show("least outstanding (baseline)", cold_lo)
    show("prefix-aware", cold_px)
    show("pinned by hand", cold_pin)
    print(" (c) agentic through three routers")
    show("least outstanding, 3 routers", a_lo3)
    show("prefix-aware, 3 routers", a_px3)
    print(" (b) no shared prefix")
    show("least outstanding (baseline)", b_lo)
    show("prefix-aware", b_px)
    gain = a_lo.percentile(0.9) / a_px.percentile(0.9)
    to_pinned = a_px.percentile(0.9) / a_pin.percentile(0.9)
    worse_b = b_px.percentile(0.9) / b_lo.percentile(0.9)
    kept = a_px3.hit_rate / a_px.hit_rate
    spread = max(a_px.spread, b_px.spread, a_px3.spread)
    print(" targets")
    results = [
        verdict("(a) TTFT p90 at least 3x better than least outstanding", f"{gain:.1f}x", gain >= 3.0)
        if replicas == 8
        else verdict("(a) TTFT p90 better than least outstanding (3x is at 8)", f"{gain:.1f}x", gain > 1.0),
        verdict("(a) TTFT p90 within 1.3x of pinned by hand", f"{to_pinned:.2f}x", to_pinned <= 1.3),
        verdict("(b) TTFT p90 no more than 5% worse", f"{worse_b:.3f}x", worse_b <= 1.05),
        verdict(
            "(b) throughput no more than 5% worse",
            f"{b_px.throughput / b_lo.throughput:.3f}x",
            b_px.throughput >= 0.95 * b_lo.throughput,
        ),
        verdict("(c) three routers keep 0.9 of one router's hit rate", f"{kept:.2f}", kept >= 0.9),
        verdict("no replica above 1.5x the mean load (a, b, c)", f"{spread:.2f}x", spread <= 1.5),
    ]
    cold_gain = cold_lo.percentile(0.9) / cold_px.percentile(0.9)
    cold_pinned = cold_px.percentile(0.9) / cold_pin.percentile(0.9)
    print(
        f"  not a target: the cold start's TTFT p90 is {cold_gain:.1f}x better than least outstanding and "
        f"{cold_pinned:.2f}x that of pinned by hand, spread {cold_px.spread:.2f}"
    )
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, action="append", help="replica counts (default 8 and 32)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--llama-server", default=prefix_routing_llamacpp.llama_server_binary(),
        help="real llama-server rows too, with this binary (default: $LLMGW_LLAMA_SERVER)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    print("discrete-event simulation on a virtual clock (the CPU's load does not move its figures)")
    results = [ok for replicas in args.replicas or [8, 32] for ok in run(replicas, args.seed)]
    print(f"\n{sum(results)}/{len(results)} targets met")
    prefix_routing_llamacpp.report(args.llama_server)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
