"""The Nomad client's side of Consul: agent registrations and template lookups over HTTP.

Owns: the few Consul HTTP calls a Nomad client makes, with Consul's own paths and
JSON — ``PUT /v1/agent/service/register`` (a service with its checks inline, one
call, as ``command/agent/consul/service_client.go`` of Nomad 2.0.5 does),
``PUT /v1/agent/service/deregister/:id``, blocking
``GET /v1/health/service/:name`` and ``GET /v1/kv/:key`` for templates — and turning
a Nomad ``Service`` block into those registration documents.

This is the only coupling between the Nomad and Consul stand-ins.

Must not: decide when to register (the task runner does) or cache beyond one call.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urljoin

import aiohttp

from llmgw.apispec.jobspec.goduration import format_go_duration

JSON = dict[str, Any]


class ConsulError(Exception):
    """Consul answered with an error, or could not be reached."""


@dataclass(frozen=True)
class Registration:
    service: JSON  # AgentServiceRegistration, its checks inline (AgentServiceCheck)


def service_id(alloc_id: str, workload: str, service: JSON) -> str:
    """MakeAllocServiceID: ``_nomad-task-<alloc>-<task or group-<name>>-<service>-<port label>``."""
    return f"_nomad-task-{alloc_id}-{workload}-{service.get('Name') or ''}-{service.get('PortLabel') or ''}"


def check_id(svc_id: str, check: JSON) -> str:
    """MakeCheckID: ``_nomad-check-`` and the hex SHA-256 of the check's fields in the
    order and with the omissions of ``ServiceCheck.Hash`` (``nomad/structs/services.go``,
    Nomad 2.0.5; SHA-1 before hashicorp/nomad#28383). ``check`` is canonicalized (its
    default ``Name`` filled in); the check's own ``PortLabel`` is hashed, blank or not."""
    digest = hashlib.sha256()

    def text(value: object) -> None:
        digest.update(str(value or "").encode())

    def if_set(value: object) -> None:
        if value:
            text(value)

    text(svc_id)
    for key in ("Name", "Type", "Command"):
        text(check.get(key))
    text("".join(str(a) for a in check.get("Args") or []))
    for key in ("Path", "Protocol", "PortLabel"):
        text(check.get(key))
    text(format_go_duration(int(check.get("Interval") or 0)))
    text(format_go_duration(int(check.get("Timeout") or 0)))
    for key in ("Method", "Body", "OnUpdate", "Notes"):
        text(check.get(key))
    if check.get("TLSSkipVerify"):
        text("true")
    if_set(check.get("TLSServerName"))
    header = check.get("Header") or {}
    if header:
        text("".join(sorted(str(k) + "".join(str(v) for v in vs or []) for k, vs in header.items())))
    if_set(check.get("AddressMode"))
    if_set(check.get("GRPCService"))
    if check.get("GRPCUseTLS"):
        text("true")
    for name, key in (
        ("success", "SuccessBeforePassing"),
        ("failures", "FailuresBeforeCritical"),
        ("failures-before-warning", "FailuresBeforeWarning"),
    ):
        if check.get(key):
            text(f"{name}:{int(check[key])}")
    return f"_nomad-check-{digest.hexdigest()}"


def registration(
    *, alloc_id: str, workload: str, service: JSON, address: str, port: int, check_ports: dict[str, int]
) -> Registration:
    """The Consul agent documents for one interpolated Nomad service block."""
    sid = service_id(alloc_id, workload, service)
    meta = {str(k): str(v) for k, v in (service.get("Meta") or {}).items()}
    meta["external-source"] = "nomad"  # Nomad marks its registrations this way
    svc: JSON = {
        "ID": sid,
        "Name": service.get("Name"),
        "Tags": list(service.get("Tags") or []),
        "Port": port,
        "Address": address,
        "Meta": meta,
        "EnableTagOverride": bool(service.get("EnableTagOverride")),
        "Kind": "",
    }
    if service.get("TaggedAddresses"):
        svc["TaggedAddresses"] = {
            k: {"Address": v.split(":")[0], "Port": int(v.split(":")[1]) if ":" in v else 0}
            for k, v in service["TaggedAddresses"].items()
        }
    checks: list[JSON] = []
    for declared in service.get("Checks") or []:
        # ServiceCheck.Canonicalize (server side) names an unnamed check.
        check = {**declared, "Name": declared.get("Name") or f'service: "{service.get("Name")}" check'}
        check_type = str(check.get("Type") or "")
        label = str(check.get("PortLabel") or service.get("PortLabel") or "")
        check_port = check_ports.get(label, port)
        reg: JSON = {
            "CheckID": check_id(sid, check),
            "Name": check["Name"],
            "Status": check.get("InitialStatus") or "",
            "Interval": format_go_duration(int(check.get("Interval") or 0)),
            "Timeout": format_go_duration(int(check.get("Timeout") or 0)),
        }
        for key in ("SuccessBeforePassing", "FailuresBeforeCritical", "FailuresBeforeWarning"):
            if check.get(key):
                reg[key] = check[key]
        if check_type == "http":
            proto = check.get("Protocol") or "http"
            base = f"{proto}://{address}:{check_port}"
            reg["HTTP"] = (
                urljoin(base + "/", str(check.get("Path") or "").lstrip("/")) if check.get("Path") else base
            )
            if check.get("Method"):
                reg["Method"] = check["Method"]
            if check.get("Header"):
                reg["Header"] = check["Header"]
            if check.get("TLSSkipVerify"):
                reg["TLSSkipVerify"] = True
        elif check_type == "tcp":
            reg["TCP"] = f"{address}:{check_port}"
        elif check_type == "grpc":
            reg["GRPC"] = f"{address}:{check_port}/{check.get('GRPCService') or ''}"
        else:
            raise ConsulError(
                f"check type {check_type!r} not valid for the dev stand-in (use http, tcp or grpc)"
            )
        checks.append(reg)
    # The checks go inline, in the service's own registration: one agent call
    # (serviceRegs, apiCheckRegistrationToCheck in service_client.go, Nomad 2.0.5).
    svc["Checks"] = checks
    return Registration(svc)


class ConsulAgent:
    """One Consul agent's HTTP API, as the Nomad client on a node talks to it."""

    def __init__(self, session: aiohttp.ClientSession, addr: str, token: str | None = None) -> None:
        self.session = session
        self.addr = addr.rstrip("/")
        self.headers = {"X-Consul-Token": token} if token else {}

    def with_token(self, token: str) -> ConsulAgent:
        """The same agent, asked with another token (a task's, for its templates)."""
        return ConsulAgent(self.session, self.addr, token)

    async def login(self, auth_method: str, bearer: str) -> str:
        """``PUT /v1/acl/login`` with a workload identity: the Consul token's SecretID."""
        body = {"AuthMethod": auth_method, "BearerToken": bearer}
        try:
            async with self.session.put(f"{self.addr}/v1/acl/login", json=body) as resp:
                if resp.status >= 300:
                    raise ConsulError(f"PUT /v1/acl/login: HTTP {resp.status}: {(await resp.text()).strip()}")
                answer = await resp.json()
        except aiohttp.ClientError as exc:
            raise ConsulError(f"PUT /v1/acl/login: {exc}") from exc
        return str(answer.get("SecretID") or "") if isinstance(answer, dict) else ""

    async def _put(self, path: str, body: JSON | None) -> None:
        try:
            async with self.session.put(f"{self.addr}{path}", json=body, headers=self.headers) as resp:
                if resp.status >= 300:
                    raise ConsulError(f"PUT {path}: HTTP {resp.status}: {(await resp.text()).strip()}")
        except aiohttp.ClientError as exc:
            raise ConsulError(f"PUT {path}: {exc}") from exc

    async def register(self, reg: Registration) -> None:
        await self._put("/v1/agent/service/register", reg.service)

    async def deregister(self, svc_id: str) -> None:
        await self._put(f"/v1/agent/service/deregister/{quote(svc_id, safe='')}", None)

    async def health_service(
        self, name: str, *, tag: str = "", passing: bool = True, index: int = 0, wait_s: float = 0
    ) -> tuple[list[JSON], int]:
        params: dict[str, str] = {}
        if passing:
            params["passing"] = "1"
        if tag:
            params["tag"] = tag
        if index:
            params["index"] = str(index)
            params["wait"] = f"{max(1, int(wait_s))}s"
        return await self._get_list(f"/v1/health/service/{quote(name, safe='')}", params, wait_s)

    async def agent_checks(self) -> list[JSON]:
        """The checks this agent runs (``/v1/agent/checks``), each with its ServiceID and Status."""
        path = "/v1/agent/checks"
        try:
            async with self.session.get(
                f"{self.addr}{path}", headers=self.headers, timeout=aiohttp.ClientTimeout(total=10)
            ) as resp:
                if resp.status >= 300:
                    # consul/api requireOK: the words a template's failure quotes.
                    text = (await resp.text()).strip()
                    raise ConsulError(f"Unexpected response code: {resp.status} ({text})")
                body = await resp.json()
        except aiohttp.ClientError as exc:
            raise ConsulError(f"GET {path}: {exc}") from exc
        except TimeoutError as exc:
            raise ConsulError(f"GET {path}: timed out") from exc
        return [c for c in body.values() if isinstance(c, dict)] if isinstance(body, dict) else []

    async def kv_get(self, key: str, *, index: int = 0, wait_s: float = 0) -> tuple[str | None, int]:
        params: dict[str, str] = {}
        if index:
            params["index"] = str(index)
            params["wait"] = f"{max(1, int(wait_s))}s"
        entries, new_index = await self._get_list(
            f"/v1/kv/{quote(key.lstrip('/'), safe='/')}", params, wait_s
        )
        if not entries:
            return None, new_index
        raw = entries[0].get("Value")
        value = base64.b64decode(raw).decode("utf-8", "replace") if raw else ""
        return value, new_index

    async def _get_list(self, path: str, params: dict[str, str], wait_s: float) -> tuple[list[JSON], int]:
        timeout = aiohttp.ClientTimeout(total=wait_s + 10)
        try:
            async with self.session.get(
                f"{self.addr}{path}", params=params, headers=self.headers, timeout=timeout
            ) as resp:
                new_index = int(resp.headers.get("X-Consul-Index", "0") or 0)
                if resp.status == 404:
                    return [], new_index
                if resp.status >= 300:
                    # consul/api requireOK: the words a template's failure quotes.
                    text = (await resp.text()).strip()
                    raise ConsulError(f"Unexpected response code: {resp.status} ({text})")
                body = await resp.json()
                return (list(body) if isinstance(body, list) else []), new_index
        except aiohttp.ClientError as exc:
            raise ConsulError(f"GET {path}: {exc}") from exc
        except TimeoutError as exc:
            raise ConsulError(f"GET {path}: timed out") from exc
