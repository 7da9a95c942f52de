"""A thin async Nomad HTTP client: the calls llmgw makes, with Nomad's own conventions.

Owns the connection (NOMAD_ADDR, NOMAD_TOKEN, NOMAD_NAMESPACE, NOMAD_REGION and
the TLS files, verified by default), one aiohttp session, blocking queries
(``index``/``wait`` in, ``X-Nomad-Index`` out) and the event stream. It never
logs the token and never puts it in an exception. It does not decide anything.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final
from urllib.parse import quote

import aiohttp
from aiohttp.http_exceptions import LineTooLong

from llmgw.adapters.nomad.plans import PlanOutcome, explain_plan, split_warnings
from llmgw.settings import NomadConnection

JSON = dict[str, Any]


class NomadError(Exception):
    """Nomad answered with an error, or could not be reached. ``status`` is None for the latter."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


# Nomad blocks a query at most 5 min whatever ?wait= asks (QueryOptions.TimeToBlock,
# MaxBlockingRPCQueryTime in nomad/structs/structs.go, v2.0.5; blockingRPC then adds up to
# 1/16 of jitter, within request_s). A longer wait is clamped here, so the request's own
# timeout (request_s + wait) is not stretched past what Nomad will ever hold it.
NOMAD_MAX_BLOCKING_WAIT_S: Final = 300.0


@dataclass(frozen=True, slots=True)
class NomadTimeouts:
    # Connecting to the Nomad server.
    connect_s: float = 5.0
    # A plain request; blocking queries add their wait to it.
    request_s: float = 30.0
    # Longest wait llmgw asks of a blocking query: Nomad's cap (NOMAD_MAX_BLOCKING_WAIT_S).
    blocking_wait_s: float = 300.0
    # Silence on the event stream after which the connection counts as dead (half-open:
    # a server gone without a FIN, a NAT that forgot the flow). Nomad writes a ``{}``
    # heartbeat on connect and every 30 s; two of them may be missed before this fires.
    event_read_s: float = 75.0


# Nomad sends each event batch as one line, however many allocations it carries; a line
# longer than this is refused (the stream is reopened) rather than held in memory.
EVENT_LINE_MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Page:
    items: list[JSON]
    index: int


@dataclass(frozen=True, slots=True)
class Registered:
    eval_id: str
    # What Nomad warns about in the job, one entry per warning (``split_warnings``).
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class EventBatch:
    index: int
    events: list[JSON]


def _ssl_context(connection: NomadConnection) -> ssl.SSLContext | bool:
    if not connection.address.startswith("https://"):
        return True
    context = ssl.create_default_context(cafile=connection.tls.ca_cert)
    if connection.tls.client_cert:
        context.load_cert_chain(connection.tls.client_cert, connection.tls.client_key)
    if not connection.tls.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class NomadClient:
    def __init__(self, connection: NomadConnection, timeouts: NomadTimeouts | None = None) -> None:
        self._connection = connection
        self._timeouts = timeouts or NomadTimeouts()
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> NomadClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def address(self) -> str:
        return self._connection.address

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            headers = {"X-Nomad-Token": self._connection.token} if self._connection.token else {}
            self._session = aiohttp.ClientSession(
                headers=headers,
                connector=aiohttp.TCPConnector(ssl=_ssl_context(self._connection), limit=32),
                timeout=aiohttp.ClientTimeout(total=None, connect=self._timeouts.connect_s),
            )
        return self._session

    def _params(self, extra: Mapping[str, str | int | bool | None] | None = None) -> list[tuple[str, str]]:
        params: list[tuple[str, str]] = []
        if self._connection.namespace:
            params.append(("namespace", self._connection.namespace))
        if self._connection.region:
            params.append(("region", self._connection.region))
        for key, value in (extra or {}).items():
            if value is None or value is False:
                continue
            params.append((key, "true" if value is True else str(value)))
        return params

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int | bool | None] | None = None,
        body: JSON | None = None,
        wait_s: float = 0.0,
        not_found_ok: bool = False,
    ) -> tuple[Any, int]:
        url = f"{self._connection.address}{path}"
        timeout = aiohttp.ClientTimeout(
            total=self._timeouts.request_s + wait_s, connect=self._timeouts.connect_s
        )
        try:
            async with self._client().request(
                method,
                url,
                params=self._params(params),
                json=body,
                timeout=timeout,
                server_hostname=self._connection.tls.server_name,
            ) as response:
                text = await response.text()
                index = int(response.headers.get("X-Nomad-Index", "0") or 0)
                if response.status == 404 and not_found_ok:
                    return None, index
                if response.status >= 400:
                    raise NomadError(
                        f"{method} {path}: {response.status} {text.strip()[:500]}", response.status
                    )
                return (json.loads(text) if text.strip() else None), index
        except aiohttp.ClientError as exc:
            raise NomadError(
                f"{method} {path}: cannot reach Nomad at {self._connection.address}: {exc}"
            ) from exc
        except TimeoutError as exc:
            raise NomadError(
                f"{method} {path}: no answer from Nomad at {self._connection.address} "
                f"within {timeout.total:g}s"
            ) from exc

    def _blocking(self, index: int | None, wait_s: float | None) -> tuple[dict[str, str | int | None], float]:
        if index is None:
            return {}, 0.0
        wait = min(
            wait_s if wait_s is not None else self._timeouts.blocking_wait_s, NOMAD_MAX_BLOCKING_WAIT_S
        )
        return {"index": index, "wait": f"{int(wait * 1000)}ms"}, wait

    # --- jobs ------------------------------------------------------------------------------------

    async def parse_hcl(self, hcl: str, *, canonicalize: bool = True) -> JSON:
        """Nomad's own parser (``POST /v1/jobs/parse``): the HCL as the api.Job Nomad would register."""
        job, _ = await self._request(
            "POST", "/v1/jobs/parse", body={"JobHCL": hcl, "Canonicalize": canonicalize}
        )
        if not isinstance(job, dict):
            raise NomadError("POST /v1/jobs/parse: Nomad returned no job")
        return job

    async def plan(self, job: JSON) -> PlanOutcome:
        answer, _ = await self._request(
            "POST", f"/v1/job/{_segment(job['ID'])}/plan", body={"Job": job, "Diff": False}
        )
        return explain_plan(job, answer or {})

    async def register(self, job: JSON) -> Registered:
        answer, _ = await self._request("POST", "/v1/jobs", body={"Job": job})
        answer = answer or {}
        return Registered(str(answer.get("EvalID", "")), split_warnings(answer.get("Warnings")))

    async def deregister(self, job_id: str, *, purge: bool = True) -> None:
        """Stop (and purge) a job. Already gone counts as done."""
        await self._request(
            "DELETE", f"/v1/job/{_segment(job_id)}", params={"purge": purge}, not_found_ok=True
        )

    # --- variables ----------------------------------------------------------------------------

    async def put_variable(self, path: str, items: Mapping[str, str]) -> None:
        """Write a Nomad Variable (``PUT /v1/var/<path>``), in the connection's namespace."""
        body: JSON = {"Path": path, "Items": dict(items)}
        if self._connection.namespace:
            body["Namespace"] = self._connection.namespace
        await self._request("PUT", f"/v1/var/{quote(path, safe='/')}", body=body)

    async def delete_variable(self, path: str) -> None:
        """Delete a Nomad Variable; already gone counts as done."""
        await self._request("DELETE", f"/v1/var/{quote(path, safe='/')}", not_found_ok=True)

    async def jobs(
        self, *, prefix: str | None = None, index: int | None = None, wait_s: float | None = None
    ) -> Page:
        extra, wait = self._blocking(index, wait_s)
        items, new_index = await self._request(
            "GET", "/v1/jobs", params={"prefix": prefix, "meta": True, **extra}, wait_s=wait
        )
        return Page(list(items or []), new_index)

    async def job(self, job_id: str) -> JSON | None:
        job, _ = await self._request("GET", f"/v1/job/{_segment(job_id)}", not_found_ok=True)
        return job if isinstance(job, dict) else None

    async def job_allocations(
        self, job_id: str, *, index: int | None = None, wait_s: float | None = None
    ) -> Page:
        """The job's allocation list stubs. Nomad never puts ``AllocatedResources`` (devices,
        ports) in these: read ``allocation`` for them, or list ``allocations(resources=True)``."""
        extra, wait = self._blocking(index, wait_s)
        items, new_index = await self._request(
            "GET", f"/v1/job/{_segment(job_id)}/allocations", params=extra, wait_s=wait, not_found_ok=True
        )
        return Page(list(items or []), new_index)

    async def allocations(
        self, *, resources: bool = False, index: int | None = None, wait_s: float | None = None
    ) -> Page:
        """Every allocation's list stub. Nomad includes ``AllocatedResources`` (the GPUs an
        allocation holds, its ports) only with ``resources=True``; without it the field is absent."""
        extra, wait = self._blocking(index, wait_s)
        items, new_index = await self._request(
            "GET", "/v1/allocations", params={"resources": resources, **extra}, wait_s=wait
        )
        return Page(list(items or []), new_index)

    async def allocation(self, alloc_id: str) -> JSON | None:
        alloc, _ = await self._request("GET", f"/v1/allocation/{_segment(alloc_id)}", not_found_ok=True)
        return alloc if isinstance(alloc, dict) else None

    async def nodes(self, *, index: int | None = None, wait_s: float | None = None) -> Page:
        extra, wait = self._blocking(index, wait_s)
        items, new_index = await self._request("GET", "/v1/nodes", params=extra, wait_s=wait)
        return Page(list(items or []), new_index)

    async def node(self, node_id: str) -> JSON | None:
        node, _ = await self._request("GET", f"/v1/node/{_segment(node_id)}", not_found_ok=True)
        return node if isinstance(node, dict) else None

    async def events(self, topics: Sequence[str], *, index: int = 0) -> AsyncIterator[EventBatch]:
        """Nomad's event stream from ``index`` on; heartbeats (``{}``) are dropped.

        Nomad starts at its oldest retained batch when ``index`` has left its
        buffer, and includes the batch at ``index`` itself: callers resume from
        their last index + 1 and resync in full after every reconnect. A stream
        silent for ``event_read_s`` (no batch, no heartbeat) raises ``NomadError``,
        so a dead connection is reopened instead of waited on for ever. A batch's
        line is read whole up to ``EVENT_LINE_MAX_BYTES`` (aiohttp's own line
        limit, 512 KiB, is less than one batch of a busy cluster's allocations).
        """
        params: list[tuple[str, str]] = [*self._params({"index": index}), *(("topic", t) for t in topics)]
        url = f"{self._connection.address}/v1/event/stream"
        silence = self._timeouts.event_read_s
        timeout = aiohttp.ClientTimeout(total=None, connect=self._timeouts.connect_s, sock_read=silence)
        try:
            async with self._client().get(
                url, params=params, timeout=timeout, server_hostname=self._connection.tls.server_name
            ) as response:
                if response.status >= 400:
                    raise NomadError(
                        f"event stream: {response.status} {(await response.text())[:300]}", response.status
                    )
                opened = False
                while line := await response.content.readuntil(b"\n", max_size=EVENT_LINE_MAX_BYTES):
                    if not line.strip():
                        continue
                    opened = True
                    frame = json.loads(line)
                    if not frame or not frame.get("Events"):
                        continue  # heartbeat
                    yield EventBatch(int(frame.get("Index", 0)), list(frame["Events"]))
                if not opened:
                    raise NomadError(self._refused_stream(topics), 403)
        except aiohttp.ServerTimeoutError as exc:
            raise NomadError(
                f"event stream: nothing from {self._connection.address} for {silence:g}s, not even "
                "Nomad's heartbeat (sent every 30s): the connection is dead"
            ) from exc
        except LineTooLong as exc:
            raise NomadError(
                f"event stream: an event batch longer than {EVENT_LINE_MAX_BYTES} bytes; llmgw "
                "reopens the stream and resyncs"
            ) from exc
        except aiohttp.ClientError as exc:
            raise NomadError(
                f"event stream: lost the connection to {self._connection.address}: {exc}"
            ) from exc

    def _refused_stream(self, topics: Sequence[str]) -> str:
        """Words for a stream that ended before its first heartbeat. Nomad's HTTP agent
        answers ``200 OK`` before the server checks the subscription's ACL and has
        nowhere to put the RPC's ``403 Permission denied`` (``EventStream`` in
        command/agent/event_endpoint.go, Nomad 2.0.5); an open subscription always
        writes ``{}`` first (nomad/stream/ndjson.go)."""
        namespace = self._connection.namespace or "default"
        return (
            f"event stream: {self._connection.address} answered 200 and closed the stream before its "
            "first heartbeat, which is how Nomad answers a subscription its ACL check refuses "
            f"(Permission denied): the token needs {'; '.join(event_stream_rules(topics, namespace))}"
        )


def event_stream_rules(topics: Sequence[str], namespace: str) -> list[str]:
    """The ACL rule each topic of an event stream needs, as ``validateNsOp`` checks them
    (nomad/event_endpoint.go, Nomad 2.0.5), one entry per distinct rule."""
    rules: list[str] = []
    for topic in topics:
        if topic in ("Job", "Evaluation", "Allocation", "Deployment", "Service", "CSIPlugin"):
            rule = f'namespace "{namespace}" {{ capabilities = ["read-job"] }} (topic {topic})'
        elif topic == "Node":
            rule = 'node { policy = "read" } (topic Node)'
        elif topic == "HostVolume":
            rule = f'namespace "{namespace}" {{ capabilities = ["host-volume-read"] }} (topic HostVolume)'
        elif topic == "CSIVolume":
            rule = f'namespace "{namespace}" {{ capabilities = ["csi-read-volume"] }} (topic CSIVolume)'
        elif topic == "Operator":
            rule = 'operator { policy = "read" } (topic Operator)'
        elif topic == "Variable":
            variables = 'variables { path "*" { capabilities = ["list"] } }'
            rule = f'namespace "{namespace}" {{ {variables} }} (topic Variable)'
        else:
            rule = f"a management token (topic {topic})"
        if rule not in rules:
            rules.append(rule)
    return rules


def _segment(value: str) -> str:
    return quote(value, safe="")
