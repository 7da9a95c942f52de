"""Compressed request bodies: refused before a byte is inflated (the OpenAI and
Anthropic SDKs send plain JSON), so a gzip bomb small on the wire costs the router
its wire size only, and the router answers ``/health`` meanwhile."""

from __future__ import annotations

import asyncio
import gzip
import json
import resource
import zlib

import aiohttp
import pytest

from .conftest import Cluster, StartRouter

INFLATED = 256 * 1024 * 1024  # 256 MiB of zeros: about 250 kB gzipped


def _bomb() -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    block = b"\x00" * (1024 * 1024)
    return b"".join(compressor.compress(block) for _ in range(INFLATED // len(block))) + compressor.flush()


async def test_a_gzip_bomb_is_refused_at_once_memory_bounded_and_health_answers(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    engine = await cluster.add_sim("sim-chat")
    router = await start_router()
    bomb = _bomb()
    assert len(bomb) < 1024 * 1024 < INFLATED
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}

    async def send() -> tuple[int, dict[str, object]]:
        async with http.post(router.url + "/v1/chat/completions", data=bomb, headers=headers) as response:
            return response.status, await response.json()

    async def health() -> int:
        async with http.get(router.url + "/health") as response:
            return response.status

    results = await asyncio.gather(*(send() for _ in range(4)), health())
    for status, body in results[:4]:  # type: ignore[misc]
        assert status == 415
        assert body["error"]["code"] == "unsupported_content_encoding"  # type: ignore[index]
        assert "uncompressed" in body["error"]["message"]  # type: ignore[index]
    assert results[4] == 200
    growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak_before
    assert growth < INFLATED // 4, f"the process's peak memory grew {growth} bytes"
    assert (await engine.stats(http))["requests_total"] == 0


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd", "x-gzip", "identity, gzip", "GZIP"])
async def test_every_encoding_but_identity_is_refused_even_a_small_valid_one(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, encoding: str
) -> None:
    engine = await cluster.add_sim("sim-chat")
    router = await start_router()
    body = json.dumps({"model": "sim-chat", "messages": [{"role": "user", "content": "hi"}]}).encode()
    async with http.post(
        router.url + "/v1/chat/completions", data=gzip.compress(body), headers={"Content-Encoding": encoding}
    ) as response:
        assert response.status == 415
        assert (await response.json())["error"]["code"] == "unsupported_content_encoding"
    assert (await engine.stats(http))["requests_total"] == 0
    # identity (or none) is plain JSON, served.
    async with http.post(
        router.url + "/v1/chat/completions", data=body, headers={"Content-Encoding": "identity"}
    ) as response:
        assert response.status == 200
