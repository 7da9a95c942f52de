"""The control plane's metrics listener: what it serves, and malformed requests logged
without their bytes like every llmgw listener (``llmgw/http_server.py``)."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter

from llmgw.control.metrics_server import MetricsListener, MetricsListenerSettings


async def test_metrics_health_and_a_malformed_request(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    Counter("llmgw_test_passes", "passes", registry=registry).inc()
    listener = MetricsListener(MetricsListenerSettings(port=0), registry, lambda: True)
    await listener.start()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(listener.url + "/metrics") as response:
                assert "llmgw_test_passes_total 1.0" in await response.text()
            async with session.get(listener.url + "/health") as response:
                assert json.loads(await response.text()) == {"status": "ok", "leader": True}
        with caplog.at_level(logging.DEBUG):
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
            writer.write(b"GET /metrics HTTP/1.1\nHost: 127.0.0.1\nAuthorization: Bearer scraper-secret\n\n")
            answer = await asyncio.wait_for(reader.read(), 10.0)
            writer.close()
    finally:
        await listener.stop()
    assert b" 400 " in answer.split(b"\r\n", 1)[0]
    assert "scraper-secret" not in caplog.text
    assert [r.name for r in caplog.records if "malformed request" in r.getMessage()] == ["llmgw.control.http"]
