"""The router's machine instructions per streamed request and per forwarded SSE event,
counted by valgrind's callgrind: a figure the machine's other load does not move, to
compare two versions of the router on a shared machine where CPU time (``router_proxy.py``'s
saturation figure) moves by half with the load.

Starts one simulated engine and the router (endpoints fixed, no Consul, as
``router_proxy.py --serve-router``) under callgrind with its counting off; after a
warm-up it counts ``--clients`` clients streaming ``--requests`` requests each, once
of ``--tokens`` tokens and once of one token. The difference between the two gives
what each further event costs (the relay: the engine's chunk decoded, framed and
written) apart from what every request costs once (its head, parse, route, engine
call, metrics). ``--against REV`` also counts the router of git revision REV (its
``llmgw`` and ``bench``, extracted to a temporary folder) against the same engine,
each figure beside this tree's.

The counts are exact for what ran, but what runs depends a little on timing: events
that arrive together are decoded in one callback, so the per-event figure moves by a
few percent from run to run (the one-token requests' much less). Instructions are not
time (cache misses, branch mispredictions), so this tells where work was added or taken
out, and ``router_proxy.py`` says what it costs.

    .venv/bin/python bench/router_instructions.py                    # this tree
    .venv/bin/python bench/router_instructions.py --against main     # and main's router
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
MODEL = "bench"
_PORT = re.compile(rb"port=(\d+)")
_TOTALS = re.compile(r"^totals: (\d+)", re.MULTILINE)
_TRIGGER = re.compile(r"^desc: Trigger: dump (\w+)", re.MULTILINE)


async def _start(
    args: list[str], pattern: bytes, env: dict[str, str], cwd: Path
) -> tuple[asyncio.subprocess.Process, int]:
    """Start a process that prints ``... port=N`` on stdout once it listens."""
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env, cwd=cwd
    )
    assert process.stdout is not None
    while True:
        line = await asyncio.wait_for(process.stdout.readline(), 300)
        if not line:
            raise RuntimeError(f"{args[:3]} exited before listening")
        if pattern in line:
            found = _PORT.search(line)
            assert found is not None, line
            return process, int(found.group(1))


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.terminate()
        await process.wait()


async def _streams(url: str, clients: int, requests: int, tokens: int) -> int:
    """``clients`` clients each streaming ``requests`` chat completions: the SSE events received."""
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "benchmark the proxy"}],
         "max_tokens": tokens, "stream": True}
    ).encode()  # fmt: skip
    events = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def client(index: int) -> None:
            nonlocal events
            await asyncio.sleep(index * 0.01)  # arrivals spread a little, as real ones are
            for _ in range(requests):
                async with session.post(
                    url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
                ) as response:
                    if response.status != 200:
                        raise RuntimeError(f"the router answered {response.status}: {await response.text()}")
                    async for line in response.content:
                        if line.startswith(b"data: {"):
                            events += 1

        await asyncio.gather(*(client(i) for i in range(clients)))
    return events


def _callgrind(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


@dataclass
class Count:
    name: str
    per_request: float  # instructions per request of --tokens tokens
    events: float  # SSE events per such request
    per_short: float  # per request of one token
    short_events: float
    per_event: float  # what one more event costs
    fixed: float  # what a request costs apart from its events


async def count(name: str, tree: Path, engine_port: int, args: argparse.Namespace) -> Count:
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-callgrind-") as tmp:
        out = Path(tmp, "callgrind.out")
        env = {**os.environ, "PYTHONPATH": str(tree)}
        router, port = await _start(
            [
                "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                sys.executable, str(tree / "bench" / "router_proxy.py"), "--serve-router",
                "--engine-port", str(engine_port), "--router-loop", args.router_loop,
            ],
            b"router listening", env, tree,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        events: dict[str, int] = {}
        try:
            await _streams(url, args.clients, 2, args.tokens)  # warm-up: imports, pools, caches
            for phase, tokens in (("long", args.tokens), ("short", 1)):
                _callgrind(router.pid, "--instr=on")
                events[phase] = await _streams(url, args.clients, args.requests, tokens)
                _callgrind(router.pid, "--instr=off")
                _callgrind(router.pid, f"--dump={phase}")
        finally:
            await _stop(router)
        totals = _totals(Path(tmp))
    requests = args.clients * args.requests
    long_events, short_events = events["long"] / requests, events["short"] / requests
    per_long, per_short = totals["long"] / requests, totals["short"] / requests
    per_event = (per_long - per_short) / (long_events - short_events)
    return Count(
        name, per_long, long_events, per_short, short_events, per_event, per_short - per_event * short_events
    )


def _totals(folder: Path) -> dict[str, int]:
    """The instructions counted in each dump in ``folder``, by the dump's name."""
    totals: dict[str, int] = {}
    for path in folder.glob("callgrind.out.*"):
        text = path.read_text()
        trigger, total = _TRIGGER.search(text), _TOTALS.search(text)
        if trigger is not None and total is not None:
            totals[trigger.group(1)] = int(total.group(1))
    return totals


@contextlib.contextmanager
def revision_tree(revision: str) -> Iterator[Path]:
    """``revision``'s files, extracted to a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-rev-") as tmp:
        archive = subprocess.run(["git", "archive", revision], cwd=ROOT, check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        yield Path(tmp)


async def main(args: argparse.Namespace) -> None:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind is not installed: apt-get install -y valgrind")
    # The engine from this tree, the same for both routers; the security policy refuses
    # PYTHONPATH, and none is needed: this tree's llmgw is the venv's.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    sim, sim_port = await _start(
        [
            sys.executable, "-m", "llmgw.sim", "--host", "127.0.0.1", "--port", "0", "--load-time", "0",
            "--served-model-name", MODEL, "--token-rate", str(args.token_rate), "--max-num-seqs", "4096",
            "--max-model-len", str(args.tokens + 1000), "--log-level", "WARNING",
        ],
        b"llmgw-sim listening", env, ROOT,
    )  # fmt: skip
    counts: list[Count] = []
    try:
        counts.append(await count("this tree", ROOT, sim_port, args))
        if args.against:
            with revision_tree(args.against) as tree:
                counts.append(await count(args.against, tree, sim_port, args))
    finally:
        await _stop(sim)
    print(
        f"router instructions (callgrind), {args.clients} clients x {args.requests} streamed requests, "
        f"engine at {args.token_rate:g} tokens/s per stream, thousands of instructions:"
    )
    header = ("per request", "per event", "1-token request", "per extra event", "fixed per req")
    print(f"  {'':<12}" + "".join(f"{cell:>17}" for cell in header))
    for c in counts:
        cells = (
            f"{c.per_request / 1e3:.0f} ({c.events:.0f} ev)",
            f"{c.per_request / c.events / 1e3:.1f}",
            f"{c.per_short / 1e3:.0f} ({c.short_events:.0f} ev)",
            f"{c.per_event / 1e3:.1f}",
            f"{c.fixed / 1e3:.0f}",
        )
        print(f"  {c.name:<12}" + "".join(f"{cell:>17}" for cell in cells))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--against", metavar="REV", help="also count the router of this git revision")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=10, help="streamed requests per client and phase")
    parser.add_argument("--tokens", type=int, default=50)
    parser.add_argument(
        "--token-rate", type=float, default=100_000.0,
        help="the engine's tokens/s per stream (default: as fast as it goes, as at router_proxy.py's "
        "saturation)",
    )  # fmt: skip
    parser.add_argument("--router-loop", choices=("auto", "asyncio", "uvloop"), default="auto")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
