"""A web page cannot write to the Consul stand-in: no KV (catalogs, API keys), no fake engine endpoints."""

from __future__ import annotations

import json

import aiohttp
import pytest

from llmgw.devcluster.consul import ConsulStandIn

SERVICE = {"Name": "llmgw-engine", "ID": "drive-by", "Address": "203.0.113.9", "Port": 80}


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Host": "evil.example"},
    ],
)
async def test_a_request_a_page_sent_changes_nothing(
    standin: ConsulStandIn, http: aiohttp.ClientSession, headers: dict[str, str]
) -> None:
    plain = {"Content-Type": "text/plain", **headers}
    agent = f"http://{standin.host}:{standin.agent_port('node-1')}"
    async with http.put(f"{agent}/v1/agent/service/register", data=json.dumps(SERVICE), headers=plain) as r:
        assert r.status in (403, 421)
    async with http.put(f"{standin.url}/v1/kv/llmgw/keys/k", data=b"{}", headers=plain) as r:
        assert r.status in (403, 421)
    async with http.get(f"{standin.url}/v1/catalog/service/llmgw-engine") as r:
        assert await r.json() == []
    async with http.get(f"{standin.url}/v1/kv/llmgw/keys/k") as r:
        assert r.status == 404


async def test_programs_still_write(standin: ConsulStandIn, http: aiohttp.ClientSession) -> None:
    async with http.put(
        f"{standin.url}/v1/kv/llmgw/x", data=b"1", headers={"Content-Type": "text/plain"}
    ) as r:
        assert r.status == 200
