"""What limits shared across routers cost per request, beside the router's own limiter.

Starts Debian's ``redis-server`` (on a Unix socket and on loopback TCP, without
persistence) and times, in this process on uvloop as the router runs:

- the baseline: ``RateLimiter.admit`` and its hold's ``settle``, the limiter a router
  uses alone (no I/O);
- ``SharedLimits.admit`` and ``settle`` against Redis (``admit.lua``, ``settle.lua``),
  one request at a time (the round trip) and with C requests at once (what Redis
  sustains for one router);
- the usage count each answered request also sends;
- the same with a token budget on the key (``admit.lua`` checks and takes the budget
  period's counter in the same script, ``settle.lua`` settles it).

Each figure is the median of several rounds, with its range. By default Redis runs on
one CPU and this process on the other (``--shared``: every process on every CPU).
For scale, it prints the router's own cost per streamed request measured by
``bench/router_proxy.py`` (kept in ``bench/README.md``), which a shared admission adds to.

    .venv/bin/python bench/shared_limits.py [--requests 5000] [--concurrency 64] [--rounds 5] [--shared]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop

from llmgw.adapters.redis.limits import RedisLimitStore
from llmgw.gateway.keys import RateLimiter, new_api_key
from llmgw.gateway.shared_limits import SharedLimits


def _start_redis(folder: Path, cpus: set[int] | None) -> tuple[subprocess.Popen[bytes], str, str]:
    server = shutil.which("redis-server")
    if server is None:
        sys.exit("needs Debian's redis-server: apt-get install -y redis-server")
    sock = folder / "redis.sock"
    port = 6390 + os.getpid() % 500
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--unixsocket", str(sock),
         "--save", "", "--appendonly", "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    if cpus is not None:
        os.sched_setaffinity(process.pid, cpus)
    deadline = time.monotonic() + 10
    while not sock.exists():
        if time.monotonic() > deadline:
            sys.exit("redis-server did not start")
        time.sleep(0.02)
    return process, f"unix://{sock}", f"redis://127.0.0.1:{port}/0"


async def _rate(requests: int, concurrency: int, one: Callable[[], Awaitable[None]]) -> float:
    """Microseconds per request, ``concurrency`` at once."""
    left = requests

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await one()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return (time.perf_counter() - started) * 1e6 / requests


async def _measure(args: argparse.Namespace, unix_url: str, tcp_url: str) -> dict[str, list[float]]:
    # Limits no run reaches: the figures are of admission's cost, not of refusals.
    record = new_api_key("bench", now=0.0, requests_per_minute=10**9, tokens_per_minute=10**12).record
    budgeted = new_api_key(
        "bench", now=0.0, requests_per_minute=10**9, tokens_per_minute=10**12, token_budget=10**15
    ).record
    local = RateLimiter()

    async def local_one() -> None:
        hold = local.admit(record, time.monotonic(), 500)
        assert hold is not None
        hold.settle(420)

    figures: dict[str, list[float]] = {}
    shared: dict[str, SharedLimits] = {}
    for name, url in (("unix", unix_url), ("tcp", tcp_url)):
        limits = SharedLimits(RedisLimitStore(url, timeout=2.0), f"bench-{name}")
        await limits.start()
        shared[name] = limits

    def shared_one(limits: SharedLimits, count: bool, budget: bool = False) -> Callable[[], Awaitable[None]]:
        key = budgeted if budget else record

        async def one() -> None:
            hold = await limits.admit(key, 500)
            hold.settle(420)
            if count:
                limits.count_usage(key, "bench-model", {"prompt_tokens": 400, "completion_tokens": 20})
            await limits.drain()  # the settle's round trip, counted in the request's cost

        return one

    cases: list[tuple[str, int, Callable[[], Awaitable[None]]]] = [("local limiter (baseline)", 1, local_one)]
    for name, limits in shared.items():
        many = args.concurrency
        cases += [
            (f"shared, Redis over {name}, 1 at a time", 1, shared_one(limits, False)),
            (f"shared, Redis over {name}, {many} at once", many, shared_one(limits, False)),
            (f"shared + usage count, {name}, {many} at once", many, shared_one(limits, True)),
            (f"shared + budget + usage, {name}, {many} at once", many, shared_one(limits, True, True)),
        ]
    for _, concurrency, one in cases:  # warm-up: connections, script caches
        await _rate(max(200, args.requests // 10), concurrency, one)
    for _ in range(args.rounds):
        for label, concurrency, one in cases:
            figures.setdefault(label, []).append(await _rate(args.requests, concurrency, one))
    fell_back = [name for name, limits in shared.items() if not limits.up or limits.reaped_holds]
    if fell_back:  # a figure of the local fallback is no figure of Redis
        sys.exit(f"Redis stopped answering during the run ({', '.join(fell_back)}): no figures")
    for limits in shared.values():
        await limits.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shared", action="store_true", help="every process on every CPU")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    pinned = not args.shared and len(cpus) >= 2
    with tempfile.TemporaryDirectory() as folder:
        process, unix_url, tcp_url = _start_redis(Path(folder), {cpus[-1]} if pinned else None)
        try:
            if pinned:
                os.sched_setaffinity(0, set(cpus[:-1]))
            figures = uvloop.run(_measure(args, unix_url, tcp_url))
        finally:
            process.terminate()
            process.wait()
    print(f"limits per request, {'pinned: Redis on its own CPU' if pinned else 'shared CPUs'}; "
          f"median of {args.rounds} rounds of {args.requests} requests [range]")  # fmt: skip
    base = statistics.median(figures["local limiter (baseline)"])
    for label, values in figures.items():
        median = statistics.median(values)
        rate = 1e6 / median
        print(f"  {label:<44} {median:9.1f} us  [{min(values):.1f}-{max(values):.1f}]  "
              f"{rate:10,.0f}/s  {median / base:8.1f}x baseline")  # fmt: skip
    print("  for scale: the router's own CPU per streamed request is in bench/README.md (router_proxy.py)")


if __name__ == "__main__":
    main()
