"""The router in front of a real engine, llama.cpp's llama-server, beside the simulated engine.

For each engine (the simulator at a fixed token rate, then llama-server on a tiny
random-weight llama that ``tests/e2e/tinygguf.py`` writes with ``gguf``) it starts the
engine, the router in its own process with that engine as its one endpoint (as
``router_proxy.py`` runs it), and measures both targets, direct and through the router,
in interleaved rounds with C concurrent streaming clients. It prints, per engine:
delivered tokens/s direct and through the router and their ratio, and the time to first
token p50/p99 and what the router adds to it (medians over the rounds, with their range).

llama-server is ``$LLMGW_LLAMA_SERVER``, else ``llama-server`` on PATH, else the one
``scripts/build-llama-server`` cached; it listens on 127.0.0.1 with one slot per client.
A real engine's time per token varies with the machine's load more than the simulator's,
so its ratio is the noisier figure. llama-server closes its connection after a streamed
answer, so the load generator opens one per request to it (direct and through the router
alike; the router itself copes with the closed connections: it reports no failures). Prints
figures; asserts nothing.

    .venv/bin/python bench/real_engine.py                    # 4 clients, 32 tokens, 5 rounds of 3 s
    .venv/bin/python bench/real_engine.py --concurrency 2 --rounds 3 --seconds 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.router_proxy import (
    MODEL,
    _free_port,
    _stop,
    measure,
    report,
    start_router,
    start_sim,
)
from tests.e2e.tinygguf import write_llama

CACHE = Path(os.environ.get("LLMGW_CACHE_DIR") or Path.home() / ".cache" / "llmgw")


def llama_server_binary() -> str | None:
    named = os.environ.get("LLMGW_LLAMA_SERVER", "").strip()
    if named:
        return named
    return shutil.which("llama-server") or next(
        (str(p) for p in sorted(CACHE.glob("llama-server-*/llama-server"), reverse=True)), None
    )


async def start_llama_server(binary: str, model: Path, slots: int) -> tuple[asyncio.subprocess.Process, int]:
    port = _free_port()
    process = await asyncio.create_subprocess_exec(
        binary, "--model", str(model), "--host", "127.0.0.1", "--port", str(port), "--alias", MODEL,
        "--parallel", str(slots), "--ctx-size", str(slots * 512), "--threads", "1", "--no-slots",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if process.returncode is not None:
                raise RuntimeError(f"{binary} exited with {process.returncode} before it was ready")
            try:
                # 503 while the model loads, 200 once it serves.
                async with session.get(f"http://127.0.0.1:{port}/health") as response:
                    if response.status == 200:
                        return process, port
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    await _stop(process)
    raise RuntimeError(f"{binary} was not ready within 60 s")


async def compare(
    args: argparse.Namespace, name: str, engine: asyncio.subprocess.Process, port: int, kind: str
) -> dict[str, float]:
    router, router_port = await start_router(port, args.router_loop, engine=kind)
    try:
        print(f"\n== {name} ==")
        targets = {"direct": port, "router": router_port}
        # llama-server closes a connection after a streamed answer: clients open one per
        # request, to both targets alike.
        return report(await measure(args, targets, stream=True, force_close=kind != "sim"), stream=True)
    finally:
        await _stop(router)
        await _stop(engine)


async def main(args: argparse.Namespace) -> None:
    binary = llama_server_binary()
    print(
        f"real engine bench: {args.concurrency} streaming clients, {args.max_tokens} tokens, "
        f"{args.rounds} rounds of {args.seconds:g} s per target, {os.cpu_count()} cores; "
        f"sim at {args.token_rate:g} tokens/s per stream; llama-server {binary or '(none)'}"
    )
    results: dict[str, dict[str, float]] = {}
    sim, sim_port = await start_sim(args.token_rate, args.max_tokens)
    results["sim"] = await compare(
        args, f"sim engine ({args.token_rate:g} tokens/s per stream)", sim, sim_port, "sim"
    )
    if binary is None:
        print("\nno llama-server: run scripts/build-llama-server or set LLMGW_LLAMA_SERVER")
    else:
        with tempfile.TemporaryDirectory(prefix="llmgw-bench-gguf-") as folder:
            model = write_llama(Path(folder) / "tiny-llama.gguf")
            engine, port = await start_llama_server(binary, model, args.concurrency)
            results["llama-server"] = await compare(
                args, "llama-server (tiny llama, CPU)", engine, port, "llamacpp"
            )
    print("\nside by side (medians over rounds):")
    print(
        f"  {'engine':<14} {'router/direct tokens/s':>24} {'added ttft p50 ms':>18} {'added ttft p99 ms':>18}"
    )
    for name, figures in results.items():
        print(
            f"  {name:<14} {figures['tokens_ratio']:>24.3f} {figures['router ttft_p50']:>18.2f} "
            f"{figures['router ttft_p99']:>18.2f}"
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--token-rate", type=float, default=200.0, help="the simulator's tokens/s per stream")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one measured run")
    parser.add_argument("--rounds", type=int, default=5, help="measured runs per target, interleaved")
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="seconds of unmeasured load per target first"
    )
    parser.add_argument("--router-loop", choices=("auto", "asyncio", "uvloop"), default="auto")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
