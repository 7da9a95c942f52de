"""The router's /metrics as an operator scrapes it: series bounded by what exists now
(replicas come and go, clients send any model name), refusals counted under the
model they were for, and rejections by their OpenAI error code."""

from __future__ import annotations

import ast
import asyncio
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from llmgw.gateway.app import RouterServer
from llmgw.gateway.context import CONTEXT
from llmgw.gateway.keys import new_api_key
from llmgw.gateway.metrics import OTHER_REASON, REJECTION_REASONS, rejection_reason

from .conftest import Cluster, Engine, OpenAIFor, StartRouter, eventually

MESSAGES: Any = [{"role": "user", "content": "hello there"}]
REPO = Path(__file__).resolve().parents[3]
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


def samples(text: str, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """Every sample of ``name`` in Prometheus text, by its exact label set (a
    duplicated series fails the test: Prometheus rejects those)."""
    found: dict[frozenset[tuple[str, str]], float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match["name"] != name:
            continue
        labels = frozenset((m["key"], m["value"]) for m in _LABEL.finditer(match["labels"] or ""))
        assert labels not in found, f"duplicate series {line!r}"
        found[labels] = float(match["value"])
    return found


def sample(text: str, name: str, **labels: str) -> float | None:
    return samples(text, name).get(frozenset(labels.items()))


async def scrape(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url + "/metrics") as response:
        assert response.status == 200
        return await response.text()


def as_replica(engine: Engine, job_id: str, alloc: str = "a") -> Engine:
    """The engine registered as Nomad job ``job_id`` (a rebuild gets a new random id)."""
    engine.endpoint = replace(engine.endpoint, replica=job_id, service_id=f"_nomad-task-{job_id}-{alloc}")
    return engine


# --- 1 and 2: series bounded by the replicas that exist now -------------------------------------------


async def test_replica_series_leave_with_the_replica_and_counters_carry_no_replica(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    engine = as_replica(await cluster.add_sim("sim-chat", publish=False), "sim-chat-4f1c2a9e")
    cluster.publish()
    router = await start_router()
    client = openai_for(router)
    job_ids = ["sim-chat-4f1c2a9e"]
    for rebuild in range(3):
        for _ in range(2):
            await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=2)
        stream = await client.chat.completions.create(
            model="sim-chat", messages=MESSAGES, max_tokens=2, stream=True
        )
        [chunk async for chunk in stream]
        # The control plane rebuilds the model: a new job with a new id, the old one gone.
        job_ids.append(f"sim-chat-{rebuild}e77d0{rebuild}b")
        fresh = as_replica(await cluster.add_sim("sim-chat", publish=False), job_ids[-1])
        cluster.engines.remove(engine)
        cluster.publish()
        engine = fresh
        assert await _book_has(router, job_ids[-1])

    text = await scrape(http, router.url)
    assert samples(text, "llmgw_router_in_flight") == {
        frozenset({("model", "sim-chat"), ("replica", job_ids[-1])}): 0.0
    }
    for gone in job_ids[:-1]:
        assert gone not in text, f"a series still names the departed replica {gone}"
    # Counters and histograms: one series per model and status, however many rebuilds.
    assert samples(text, "llmgw_router_requests_total") == {
        frozenset({("model", "sim-chat"), ("status", "200")}): 9.0
    }
    assert sample(text, "llmgw_router_request_seconds_count", model="sim-chat") == 9
    assert sample(text, "llmgw_router_time_to_first_token_seconds_count", model="sim-chat") == 3
    for line in text.splitlines():
        if not line.startswith("#") and "replica=" in line:
            assert line.startswith("llmgw_router_in_flight{"), (
                f"only the in-flight gauge names replicas: {line}"
            )


async def _book_has(router: RouterServer, job_id: str) -> bool:
    book = router.app[CONTEXT].book
    return bool(await eventually(lambda: any(e.replica == job_id for e in book.endpoints())))


async def test_in_flight_is_one_series_per_replica_even_while_nomad_replaces_its_allocation(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    """Two allocations of one job registered at once (Nomad replacing one): their
    outstanding requests add up in the replica's one series."""
    release = asyncio.Event()
    arrived = 0

    async def hold(request: web.Request) -> web.StreamResponse:
        nonlocal arrived
        arrived += 1
        await release.wait()
        return web.json_response(
            {"id": "x", "object": "chat.completion", "model": "chat-b", "created": 0, "choices": []}
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", hold)
    as_replica(await cluster.add_app("chat-b", app, publish=False), "chat-b-9a0b", alloc="old")
    app2 = web.Application()
    app2.router.add_post("/v1/chat/completions", hold)
    as_replica(await cluster.add_app("chat-b", app2, publish=False), "chat-b-9a0b", alloc="new")
    cluster.publish()
    router = await start_router()
    client = openai_for(router)
    calls = [
        asyncio.create_task(client.chat.completions.create(model="chat-b", messages=MESSAGES))
        for _ in range(3)
    ]
    try:
        assert await eventually(lambda: arrived == 3)
        text = await scrape(http, router.url)
        assert samples(text, "llmgw_router_in_flight") == {
            frozenset({("model", "chat-b"), ("replica", "chat-b-9a0b")}): 3.0
        }
    finally:
        release.set()
        await asyncio.gather(*calls)
    text = await scrape(http, router.url)
    assert samples(text, "llmgw_router_in_flight") == {
        frozenset({("model", "chat-b"), ("replica", "chat-b-9a0b")}): 0.0
    }


# --- 3 and 4: refusals under the model they were for, by OpenAI error code ---------------------------


async def test_refusals_count_under_the_model_that_resolved_and_by_error_code(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    router = await start_router()  # sim-chat has no replica at all
    client = openai_for(router)
    for name in ("sim-chat", "fast"):  # the model and its alias
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model=name, messages=MESSAGES)
        assert caught.value.status_code == 503 and caught.value.code == "no_healthy_replica", name
    with pytest.raises(openai.BadRequestError) as wrong_api:
        await client.embeddings.create(model="fast", input="hi")
    assert wrong_api.value.code == "model_not_supported"
    for invented in ("nope-7f3a", "attacker-chooses-this-label"):
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model=invented, messages=MESSAGES)
    async with http.post(router.url + "/v1/chat/completions", data=b"{not json") as response:
        assert response.status == 400 and (await response.json())["error"]["code"] is None
    async with http.get(router.url + "/v1/nowhere") as response:
        assert response.status == 404

    text = await scrape(http, router.url)
    assert samples(text, "llmgw_router_requests_total") == {
        frozenset({("model", "sim-chat"), ("status", "503")}): 2.0,
        frozenset({("model", "sim-chat"), ("status", "400")}): 1.0,
        frozenset({("model", ""), ("status", "404")}): 3.0,
        frozenset({("model", ""), ("status", "400")}): 1.0,
    }
    assert samples(text, "llmgw_router_rejections_total") == {
        frozenset({("model", "sim-chat"), ("reason", "no_healthy_replica")}): 2.0,
        frozenset({("model", "sim-chat"), ("reason", "model_not_supported")}): 1.0,
        frozenset({("model", ""), ("reason", "model_not_found")}): 2.0,
        frozenset({("model", ""), ("reason", "unknown_url")}): 1.0,
        frozenset({("model", ""), ("reason", OTHER_REASON)}): 1.0,
    }
    assert "nope-7f3a" not in text and "attacker-chooses-this-label" not in text
    # A refusal is not a latency sample: request_seconds times answers.
    assert sample(text, "llmgw_router_request_seconds_count", model="sim-chat") is None


async def test_key_and_limit_refusals_are_counted_by_code(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    await cluster.add_sim("sim-chat")
    issued = new_api_key("team", now=cluster.clock.now, requests_per_minute=1)
    cluster.keys.publish({issued.record.key_id: issued.record})
    router = await start_router(with_keys=True)
    client = openai_for(router, api_key=issued.key)
    await client.chat.completions.create(model="fast", messages=MESSAGES, max_tokens=1)
    with pytest.raises(openai.RateLimitError) as limited:
        await client.chat.completions.create(model="fast", messages=MESSAGES, max_tokens=1)
    assert limited.value.code == "rate_limit_exceeded"
    with pytest.raises(openai.AuthenticationError):
        await openai_for(router, api_key="sk-wrong").chat.completions.create(model="fast", messages=MESSAGES)

    text = await scrape(http, router.url)
    assert sample(text, "llmgw_router_requests_total", model="sim-chat", status="200") == 1
    assert sample(text, "llmgw_router_requests_total", model="sim-chat", status="429") == 1
    assert sample(text, "llmgw_router_requests_total", model="", status="401") == 1
    assert sample(text, "llmgw_router_rejections_total", model="sim-chat", reason="rate_limit_exceeded") == 1
    assert sample(text, "llmgw_router_rejections_total", model="", reason="invalid_api_key") == 1


async def test_a_refusal_inside_a_started_stream_is_a_rejection_of_its_model(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    """A stream kept alive while its model loads has sent its 200 head; the refusal
    that ends it still counts, by code, under the model."""
    router = await start_router(load_wait_streaming=0.3)
    client = openai_for(router)
    stream = await client.chat.completions.create(model="sleepy", messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError) as caught:
        [chunk async for chunk in stream]
    assert caught.value.code == "model_loading"

    text = await scrape(http, router.url)
    assert sample(text, "llmgw_router_requests_total", model="sleepy", status="200") == 1
    assert samples(text, "llmgw_router_rejections_total") == {
        frozenset({("model", "sleepy"), ("reason", "model_loading")}): 1.0
    }


def test_rejection_reasons_are_a_fixed_set() -> None:
    assert rejection_reason("no_healthy_replica") == "no_healthy_replica"
    assert rejection_reason(None) == OTHER_REASON
    assert rejection_reason("an engine's own invention") == OTHER_REASON


def _literal_codes(path: Path) -> set[str]:
    """Every error code written as a literal in a refusal the router can answer with."""
    codes: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        code: ast.expr | None = None
        if name == "Refusal" and len(node.args) >= 4:
            code = node.args[3]
        code = next((k.value for k in node.keywords if k.arg == "code"), code)
        if name in ("Refusal", "bad_request") and isinstance(code, ast.Constant) and code.value is not None:
            codes.add(str(code.value))
    return codes


def test_every_code_the_router_answers_with_is_a_rejection_reason() -> None:
    sources = [*sorted((REPO / "llmgw" / "gateway").glob("*.py")), REPO / "llmgw" / "core" / "routing.py"]
    codes = set().union(*(_literal_codes(path) for path in sources))
    assert {"model_not_found", "no_healthy_replica", "guard_unavailable", "rate_limit_exceeded"} <= codes
    missing = codes - REJECTION_REASONS
    assert not missing, f"add these codes to REJECTION_REASONS in llmgw/gateway/metrics.py: {sorted(missing)}"
