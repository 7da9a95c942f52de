"""A web page in the developer's browser cannot submit a job (a command to run) to the stand-in."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from llmgw.devcluster.browsers import browser_refusal
from llmgw.devcluster.nomad import NomadServer

from .conftest import group

# What a page can send without a CORS preflight: a POST with a text/plain body.
SIMPLE = {"Content-Type": "text/plain;charset=UTF-8"}


def _job(job_id: str) -> bytes:
    return json.dumps({"Job": {"ID": job_id, "TaskGroups": [group("g")]}}).encode()


async def _jobs(http: aiohttp.ClientSession, server: NomadServer) -> list[str]:
    async with http.get(f"{server.address}/v1/jobs") as response:
        assert response.status == 200
        return [job["ID"] for job in await response.json()]


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example"},
        {"Origin": "null"},  # a sandboxed iframe or a file:// page
        {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"},
        {"Sec-Fetch-Site": "same-site"},  # another port of localhost
        {"Host": "evil.example"},  # a DNS-rebinding page, under its own name
        {"Host": "127.0.0.1.nip.io:4646"},
    ],
)
async def test_a_request_a_page_sent_registers_nothing(server: NomadServer, headers: dict[str, str]) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{server.address}/v1/jobs", data=_job("drive-by"), headers={**SIMPLE, **headers}
        ) as response:
            assert response.status in (403, 421)
        assert "drive-by" not in await _jobs(http, server)


async def test_programs_and_a_typed_address_still_get_answers(server: NomadServer) -> None:
    async with aiohttp.ClientSession() as http:
        # The same text/plain body without a browser's marks: a program, which the stand-in serves.
        async with http.post(f"{server.address}/v1/jobs", data=_job("from-a-program"), headers=SIMPLE) as ok:
            assert ok.status == 200
        typed = {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate", "Host": f"localhost:{server.port}"}
        async with http.get(f"{server.address}/v1/jobs", headers=typed) as response:
            assert response.status == 200
            assert "from-a-program" in [job["ID"] for job in await response.json()]
        async with http.delete(f"{server.address}/v1/job/from-a-program", params={"purge": "true"}) as gone:
            assert gone.status == 200


@pytest.mark.parametrize(
    ("host", "origin", "site", "status"),
    [
        ("127.0.0.1:4646", None, None, None),
        ("[::1]:4646", None, None, None),
        ("localhost", None, "none", None),
        ("LOCALHOST:1", None, None, None),
        (None, None, None, 421),
        ("localhost.evil.example", None, None, 421),
        ("[::1", None, None, 421),
        ("127.0.0.1:4646", "http://127.0.0.1:4646", None, 403),  # even a page on the stand-in's own origin
        ("127.0.0.1:4646", None, "same-origin", 403),
    ],
)
def test_the_rules(host: str | None, origin: str | None, site: str | None, status: Any) -> None:
    refusal = browser_refusal(host, origin, site)
    assert (refusal[0] if refusal else None) == status
