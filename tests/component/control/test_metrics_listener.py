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


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:8082", "[::1", "127.0.0.1.nip.io"])
async def test_a_loopback_listener_answers_no_dns_rebinding_page(host: str) -> None:
    """A page rebinding its own name to 127.0.0.1 sends that name as Host: refused, while a
    scrape by address (what reaches a loopback listener) is answered."""
    listener = MetricsListener(MetricsListenerSettings(port=0), CollectorRegistry(), lambda: True)
    await listener.start()
    try:
        async with aiohttp.ClientSession() as session:
            for path in ("/metrics", "/health"):
                async with session.get(listener.url + path, headers={"Host": host}) as response:
                    assert response.status == 403, path
                    assert "llmgw" not in await response.text()
                for scrape in (f"127.0.0.1:{listener.port}", f"localhost:{listener.port}"):
                    async with session.get(listener.url + path, headers={"Host": scrape}) as response:
                        assert response.status == 200, (path, scrape)
    finally:
        await listener.stop()


async def test_a_listener_bound_beyond_loopback_answers_the_names_it_is_scraped_by() -> None:
    listener = MetricsListener(
        MetricsListenerSettings(host="0.0.0.0", port=0), CollectorRegistry(), lambda: True
    )
    await listener.start()
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{listener.port}/health"
            async with session.get(url, headers={"Host": "llmgw-control.service.consul"}) as response:
                assert response.status == 200
    finally:
        await listener.stop()
