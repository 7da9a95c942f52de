"""Traces across the router: a client's W3C trace context reaches the engine (the sim records
what it received), and with OpenTelemetry's OTLP variables set the router exports a span per
request, the client's span's child and the engine's parent, to a real OTLP/HTTP receiver."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from llmgw.gateway.app import RouterServer
from llmgw.gateway.tracing import OtlpTracing, TracingUnavailable, tracing_from_environment
from llmgw.gateway.tracing import Tracing as PassThrough
from tests.support.waiting import eventually

from .conftest import Cluster, router_settings

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
BODY = {"model": "sim-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@dataclass
class Collector:
    """An OTLP/HTTP trace receiver (the protocol's protobuf encoding, opentelemetry-proto)."""

    url: str = ""
    spans: list[Any] = field(default_factory=list)
    resources: list[dict[str, str]] = field(default_factory=list)


@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    found = Collector()

    async def traces(request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in export.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    found.resources.append(resource)
                    found.spans.append(span)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    found.url = f"http://{host}:{port}/v1/traces"
    yield found
    await runner.cleanup()


async def _router(cluster: Cluster, tracing: PassThrough) -> RouterServer:
    router = RouterServer(router_settings(), replace(cluster.deps(), tracing=tracing))
    await router.start()
    await cluster.seen_by(router)
    return router


def _attributes(span: Any) -> dict[str, object]:
    values: dict[str, object] = {}
    for attribute in span.attributes:
        value = attribute.value
        kind = value.WhichOneof("value")
        values[attribute.key] = getattr(value, kind)
    return values


async def test_a_clients_trace_context_reaches_the_engine_as_sent(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    engine = await cluster.add_sim("sim-chat")
    router = await _router(cluster, PassThrough())
    try:
        headers = {"traceparent": TRACEPARENT, "tracestate": "vendor=abc"}
        async with http.post(router.url + "/v1/chat/completions", json=BODY, headers=headers) as response:
            assert response.status == 200
        # A traceparent that is not W3C's format, and a tracestate past W3C's bounds, stay here.
        bad = {"traceparent": TRACEPARENT.upper(), "tracestate": "k=" + "v" * 600}
        async with http.post(router.url + "/v1/chat/completions", json=BODY, headers=bad) as response:
            assert response.status == 200
        async with http.post(
            router.url + "/v1/chat/completions",
            json=BODY,
            headers={"traceparent": TRACEPARENT, "tracestate": "k=" + "v" * 600},
        ) as response:
            assert response.status == 200
        stats = await engine.stats(http)
        assert stats["trace_contexts"] == [
            {"traceparent": TRACEPARENT, "tracestate": "vendor=abc"},
            {"traceparent": TRACEPARENT},
        ]
    finally:
        await router.stop()


async def test_with_an_otlp_endpoint_each_request_is_a_genai_span_between_client_and_engine(
    cluster: Cluster, http: aiohttp.ClientSession, collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    import os

    tracing = tracing_from_environment(os.environ)
    assert isinstance(tracing, OtlpTracing)
    engine = await cluster.add_sim("sim-chat")
    router = await _router(cluster, tracing)
    try:
        async with http.post(
            router.url + "/v1/chat/completions",
            json={**BODY, "stream": True, "stream_options": {"include_usage": True}},
            headers={"traceparent": TRACEPARENT},
        ) as response:
            assert response.status == 200
            await response.read()
        # A request without a trace context starts a trace of its own.
        async with http.post(router.url + "/v1/chat/completions", json=BODY) as response:
            assert response.status == 200
        # Not a model call: no span.
        async with http.get(router.url + "/v1/models") as response:
            assert response.status == 200
        await eventually(lambda: collector.spans if len(collector.spans) >= 2 else None)
    finally:
        await router.stop()  # flushes the batch: nothing more may arrive
    assert len(collector.spans) == 2
    joined, fresh = sorted(collector.spans, key=lambda s: s.trace_id.hex() != TRACE_ID)
    assert joined.trace_id.hex() == TRACE_ID and joined.parent_span_id.hex() == CLIENT_SPAN
    assert joined.name == "chat sim-chat"
    assert joined.kind == 2  # SPAN_KIND_SERVER
    attributes = _attributes(joined)
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == attributes["gen_ai.response.model"] == "sim-chat"
    assert attributes["gen_ai.request.stream"] is True
    assert attributes["gen_ai.usage.output_tokens"] == 3
    prompt = attributes["gen_ai.usage.input_tokens"]
    assert isinstance(prompt, int) and prompt > 0
    assert isinstance(attributes["gen_ai.server.time_to_first_token"], float)
    assert collector.resources[0]["service.name"] == "llmgw-router"
    # The engine's parent is the router's span, in the client's trace.
    received = (await engine.stats(http))["trace_contexts"]
    assert received[0]["traceparent"] == f"00-{TRACE_ID}-{joined.span_id.hex()}-01"
    assert fresh.trace_id.hex() != TRACE_ID and not fresh.parent_span_id
    # A trace the router starts is sampled, its id drawn at random (W3C level 2's flag 02).
    version, trace_id, parent_id, flags = received[1]["traceparent"].split("-")
    assert (version, trace_id, parent_id) == ("00", fresh.trace_id.hex(), fresh.span_id.hex())
    assert int(flags, 16) & 1
    assert "gen_ai.server.time_to_first_token" not in _attributes(fresh)


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"},
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "  "},
    ],
)
def test_no_span_is_recorded_unless_opentelemetry_is_asked_to(environ: dict[str, str]) -> None:
    tracing = tracing_from_environment(environ)
    assert type(tracing) is PassThrough


def test_an_endpoint_without_the_sdk_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(TracingUnavailable, match=r"llmgw\[otel\]"):
        tracing_from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})


async def test_a_stopped_router_leaves_no_span_unexported(
    cluster: Cluster, http: aiohttp.ClientSession, collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch waits 5 s by default; stopping the router flushes it."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "router-east")
    import os

    await cluster.add_sim("sim-chat")
    router = await _router(cluster, tracing_from_environment(os.environ))
    async with http.post(router.url + "/v1/chat/completions", json=BODY) as response:
        assert response.status == 200
    await asyncio.sleep(0)  # the span ends in the loop step after the answer
    await router.stop()
    assert len(collector.spans) == 1
    assert collector.resources[0]["service.name"] == "router-east"
