"""How many streamed tokens one simulated engine can push, and what its pacing costs.

Starts a sim in process on a loopback port, runs C concurrent streaming chat
clients for R requests each, and prints requests/s, delivered tokens/s, and
the ratio to the configured ideal (C x token rate). Prints figures; asserts
nothing.

    .venv/bin/python bench/sim_throughput.py --concurrency 64 --requests 4 --tokens 200 --token-rate 500
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer

# The sim's test settings live with the tests (tests/support), which the wheel does not ship.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmgw.sim.app import create_app
from tests.support.sim import TEST_MODEL, fast_settings


async def _one_client(session: aiohttp.ClientSession, url: str, requests: int, tokens: int) -> int:
    received = 0
    body = {
        "model": TEST_MODEL,
        "messages": [{"role": "user", "content": "benchmark"}],
        "max_tokens": tokens,
        "stream": True,
    }
    for _ in range(requests):
        async with session.post(url, json=body) as response:
            async for line in response.content:
                if line.startswith(b"data: {"):
                    chunk = json.loads(line[6:])
                    if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                        received += 1
    return received


async def run(concurrency: int, requests: int, tokens: int, token_rate: float) -> None:
    settings = fast_settings(
        token_rate=token_rate, max_num_seqs=max(concurrency, 1), max_model_len=tokens + 100
    )
    server = TestServer(create_app(settings), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("/v1/chat/completions"))
    connector = aiohttp.TCPConnector(limit=concurrency)
    try:
        async with aiohttp.ClientSession(connector=connector) as session:
            started = time.perf_counter()
            counts = await asyncio.gather(
                *(_one_client(session, url, requests, tokens) for _ in range(concurrency))
            )
            elapsed = time.perf_counter() - started
    finally:
        await server.close()
    total_tokens = sum(counts)
    total_requests = concurrency * requests
    ideal = concurrency * token_rate
    print(
        f"concurrency={concurrency} requests={total_requests} tokens/request={tokens} token_rate={token_rate}"
    )
    print(f"elapsed_s={elapsed:.2f} requests_per_s={total_requests / elapsed:.1f}")
    rate = total_tokens / elapsed
    print(f"tokens_per_s={rate:.0f} ideal_tokens_per_s={ideal:.0f} ratio={rate / ideal:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=4, help="requests per client")
    parser.add_argument("--tokens", type=int, default=100, help="max_tokens per request")
    parser.add_argument("--token-rate", type=float, default=500.0)
    args = parser.parse_args()
    asyncio.run(run(args.concurrency, args.requests, args.tokens, args.token_rate))


if __name__ == "__main__":
    main()
