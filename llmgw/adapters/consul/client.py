"""A thin, typed async client for the part of Consul's HTTP API llmgw uses.

Owns the one aiohttp session per client (opened on :meth:`ConsulClient.start`,
closed on :meth:`ConsulClient.close`), everything in
:class:`llmgw.settings.ConsulConnection` (address, ACL token, TLS CA, client
certificate and key, verification, server name, namespace), per-request
timeouts (a blocking query gets its wait plus Consul's jitter plus slack),
Consul's query meta headers, and turning every failure into a
:class:`ConsulError` that says whether to retry. Raw JSON is parsed here, at the
edge, into :class:`KvEntry` and :class:`QueryMeta`; health entries stay raw for
:mod:`llmgw.adapters.consul.endpoints` to parse.

Must not: log or put the ACL token in an exception or a repr (it travels only in
the ``X-Consul-Token`` header); know llmgw's key names or records (the stores
do); retry (the watchers and stores decide).

Why not py-consul: see DESIGN.md ("Why a client of our own").
"""

from __future__ import annotations

import base64
import binascii
import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Final
from urllib.parse import quote

import aiohttp
from yarl import URL

from llmgw.adapters.consul.settings import ClientSettings
from llmgw.settings import ConsulConnection, SettingsError

TOKEN_HEADER: Final = "X-Consul-Token"  # noqa: S105 (a header name, not a secret)
# Consul's own limit on a blocking wait (longer ones are cut to this).
MAX_WAIT_SECONDS: Final = 600.0


class ConsulError(Exception):
    """Consul did not do what was asked. ``temporary``: retrying later may work."""

    temporary: bool = True


class ConsulUnavailable(ConsulError):
    """No usable answer: connection refused or dropped, timed out, or a 5xx
    (Consul answers 500 "No cluster leader" while its servers elect one). Retry later."""


class ConsulRejected(ConsulError):
    """Consul answered 4xx: the request itself is wrong (or the token lacks a right).
    Retrying the same request will not help until someone changes something."""

    temporary = False

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ConsulNamespaceUnsupported(ConsulRejected):
    """CONSUL_NAMESPACE is set but this Consul has no namespaces (Consul CE refuses
    every request that names one with 400; agent/http_ce.go, parseEntMeta)."""


# The end of Consul CE's answer to ``?ns=`` (agent/http_ce.go, parseEntMeta).
_CE_NAMESPACE_ANSWER: Final = "Namespaces are a Consul Enterprise feature"


class ConsulProtocolError(ConsulError):
    """Consul (or something pretending to be it) answered with a shape llmgw cannot read."""


@dataclass(frozen=True, slots=True)
class QueryMeta:
    """Consul's answer headers for a read: the index to block on next, and leader contact."""

    index: int  # X-Consul-Index; 0 when the header is missing
    known_leader: bool
    last_contact_ms: int
    # X-Consul-Results-Filtered-By-ACLs: the token could not see everything asked for.
    results_filtered: bool = False


@dataclass(frozen=True, slots=True)
class KvEntry:
    """One KV pair (Consul's KVPair) with its value decoded from base64."""

    key: str
    value: bytes
    flags: int
    create_index: int
    modify_index: int
    lock_index: int
    session: str  # "" when no session holds the key


def tls_context(connection: ConsulConnection) -> ssl.SSLContext | None:
    """The TLS context CONSUL_CACERT / CONSUL_CLIENT_CERT / CONSUL_CLIENT_KEY /
    CONSUL_HTTP_SSL_VERIFY describe, or None for plain http. Raises SettingsError
    naming the variable when a file is missing or not PEM."""
    if connection.scheme != "https":
        return None
    tls = connection.tls
    try:
        context = ssl.create_default_context(cafile=tls.ca_cert)
    except (OSError, ssl.SSLError) as exc:
        raise SettingsError(f"CONSUL_CACERT={tls.ca_cert!r}: cannot use it as a CA file ({exc})") from None
    if tls.client_cert:
        try:
            context.load_cert_chain(tls.client_cert, tls.client_key)
        except (OSError, ssl.SSLError) as exc:
            raise SettingsError(
                f"CONSUL_CLIENT_CERT={tls.client_cert!r} / CONSUL_CLIENT_KEY={tls.client_key!r}: "
                f"cannot load them as a PEM certificate and key ({exc})"
            ) from None
    if not tls.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def go_duration(seconds: float) -> str:
    """Seconds as the Go duration string Consul parses (``?wait=``, TTL, LockDelay): ``1500ms``."""
    return f"{max(0, round(seconds * 1000))}ms"


class ConsulClient:
    """Consul's HTTP API over one aiohttp session. Use ``async with ConsulClient(...)``
    or :meth:`start` / :meth:`close`; every method needs a started client."""

    def __init__(self, connection: ConsulConnection, settings: ClientSettings | None = None) -> None:
        self._connection = connection
        self._settings = settings or ClientSettings()
        self._session: aiohttp.ClientSession | None = None
        self._base = URL(connection.url)

    def __repr__(self) -> str:  # the connection's repr already hides the token
        return f"ConsulClient({self._connection!r})"

    @property
    def connection(self) -> ConsulConnection:
        return self._connection

    @property
    def settings(self) -> ClientSettings:
        return self._settings

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._session is not None:
            return
        context = tls_context(self._connection)
        connector = aiohttp.TCPConnector(
            limit=self._settings.max_connections,
            ssl=context if context is not None else True,
        )
        headers = {TOKEN_HEADER: self._connection.token} if self._connection.token else {}
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=headers,
            # The token is a default header; aiohttp never logs headers, and no
            # trace config is installed that could.
            raise_for_status=False,
        )

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def __aenter__(self) -> ConsulClient:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def check_namespace(self) -> None:
        """With CONSUL_NAMESPACE set, one read that Consul CE refuses: raises
        :class:`ConsulNamespaceUnsupported` if this Consul has no namespaces, so a program
        fails at start with one clear error instead of every request failing later. If
        Consul does not answer, nothing is known yet and nothing is raised."""
        if not self._connection.namespace:
            return
        try:
            # A KV read: CE refuses its namespace before it looks at the key or the token.
            await self._request("GET", "/v1/kv/llmgw/leader", ok_404=True)
        except ConsulNamespaceUnsupported:
            raise
        except ConsulError:
            return  # unreachable, or the token may not list: later requests will say so

    # ------------------------------------------------------------------ raw HTTP

    def _url(self, path: str) -> URL:
        # Keys may hold any character; "/" stays a separator as Consul expects.
        return self._base.with_path(quote(path, safe="/"), encoded=True)

    def _params(self, params: Mapping[str, str] | None) -> dict[str, str]:
        out = dict(params or {})
        if self._connection.namespace:
            out.setdefault("ns", self._connection.namespace)
        return out

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: bytes | None = None,
        budget: float | None = None,
        ok_404: bool = False,
    ) -> tuple[int, bytes, Mapping[str, str]]:
        session = self._session
        if session is None:
            raise RuntimeError("ConsulClient used before start() or after close()")
        what = f"Consul {method} {path}"
        client_timeout = aiohttp.ClientTimeout(
            total=budget if budget is not None else self._settings.request_timeout,
            sock_connect=self._settings.connect_timeout,
        )
        try:
            async with session.request(
                method,
                self._url(path),
                params=self._params(params),
                data=body,
                timeout=client_timeout,
                server_hostname=self._connection.tls.server_name,
            ) as response:
                payload = await response.read()
                status = response.status
                headers = response.headers
        except aiohttp.ConnectionTimeoutError:
            # Before the timeout of the whole request: aiohttp raises this (a TimeoutError too)
            # when the connect timeout fires. Its timer runs on the event loop, so it also fires
            # when Consul accepted the connection but this process's loop was blocked for longer
            # than the timeout and saw it late: the message must not blame Consul's answer.
            raise ConsulUnavailable(
                f"{what}: no connection to {self._connection.url} within {client_timeout.sock_connect:g}s "
                "(Consul is down or unreachable, or this process's event loop was blocked that long)"
            ) from None
        except TimeoutError:
            raise ConsulUnavailable(f"{what}: no answer within {client_timeout.total:g}s") from None
        except aiohttp.ClientConnectorCertificateError as exc:
            raise ConsulRejected(
                f"{what}: TLS certificate not accepted ({exc.certificate_error}); "
                "check CONSUL_CACERT and CONSUL_TLS_SERVER_NAME",
                0,
            ) from None
        except aiohttp.ClientError as exc:
            raise ConsulUnavailable(f"{what}: {type(exc).__name__}: {exc}") from None
        if status == 200 or (status == 404 and ok_404):
            return status, payload, headers
        text = payload[: self._settings.error_body_chars].decode("utf-8", "replace").strip()
        if status == 403:
            raise ConsulRejected(
                f"{what}: 403 {text} (the ACL token in CONSUL_HTTP_TOKEN is missing, unknown "
                "or lacks this permission)",
                status,
            )
        if status == 400 and self._connection.namespace and _CE_NAMESPACE_ANSWER in text:
            raise ConsulNamespaceUnsupported(
                f"CONSUL_NAMESPACE={self._connection.namespace!r} is set, but the Consul at "
                f"{self._connection.url} has no namespaces (it is Consul CE, which refuses every request "
                f"naming one: {text!r}). Unset CONSUL_NAMESPACE to use Consul's only namespace, or point "
                "CONSUL_HTTP_ADDR at Consul Enterprise",
                status,
            )
        if 400 <= status < 500:
            raise ConsulRejected(f"{what}: {status} {text}", status)
        raise ConsulUnavailable(f"{what}: {status} {text}")

    async def _read(
        self,
        path: str,
        params: Mapping[str, str] | None,
        *,
        index: int,
        wait: float | None,
        stale: bool,
    ) -> tuple[object | None, QueryMeta]:
        """GET with blocking parameters; ``None`` as the body on 404 (the index is still valid)."""
        query = dict(params or {})
        timeout = None
        if index > 0:
            query["index"] = str(index)
            if wait is not None:
                wait = min(wait, MAX_WAIT_SECONDS)
                query["wait"] = go_duration(wait)
            blocking_for = wait if wait is not None else 300.0
            # Consul adds up to wait/16 to spread wake-ups; then our slack.
            timeout = blocking_for + blocking_for / 16 + self._settings.blocking_slack
        if stale:
            query["stale"] = ""
        status, payload, headers = await self._request("GET", path, params=query, budget=timeout, ok_404=True)
        meta = _query_meta(headers)
        if status == 404:
            return None, meta
        return _json(payload, f"Consul GET {path}"), meta

    # ------------------------------------------------------------------ health

    async def health_service(
        self, service: str, *, index: int = 0, wait: float | None = None, stale: bool = False
    ) -> tuple[list[object], QueryMeta]:
        """``GET /v1/health/service/:service``: every instance with its node and checks,
        unfiltered (raw ServiceEntry objects)."""
        body, meta = await self._read(
            f"/v1/health/service/{service}", None, index=index, wait=wait, stale=stale
        )
        if body is None:
            return [], meta
        if not isinstance(body, list):
            raise ConsulProtocolError(f"Consul GET /v1/health/service/{service}: expected a JSON array")
        return body, meta

    # ------------------------------------------------------------------ KV

    async def kv_get(
        self, key: str, *, index: int = 0, wait: float | None = None, stale: bool = False
    ) -> tuple[KvEntry | None, QueryMeta]:
        body, meta = await self._read(f"/v1/kv/{key}", None, index=index, wait=wait, stale=stale)
        if body is None:
            return None, meta
        entries = _kv_entries(body, key)
        return (entries[0] if entries else None), meta

    async def kv_list(
        self, prefix: str, *, index: int = 0, wait: float | None = None, stale: bool = False
    ) -> tuple[list[KvEntry], QueryMeta]:
        """Every pair under ``prefix`` (``?recurse``); empty when there are none."""
        body, meta = await self._read(
            f"/v1/kv/{prefix}", {"recurse": ""}, index=index, wait=wait, stale=stale
        )
        return ([] if body is None else _kv_entries(body, prefix)), meta

    async def kv_keys(self, prefix: str, *, separator: str | None = None) -> list[str]:
        params = {"keys": ""}
        if separator:
            params["separator"] = separator
        body, _ = await self._read(f"/v1/kv/{prefix}", params, index=0, wait=None, stale=False)
        if body is None:
            return []
        if not isinstance(body, list) or not all(isinstance(k, str) for k in body):
            raise ConsulProtocolError(f"Consul GET /v1/kv/{prefix}?keys: expected an array of strings")
        return [str(k) for k in body]

    async def kv_put(
        self,
        key: str,
        value: bytes,
        *,
        cas: int | None = None,
        acquire: str | None = None,
        release: str | None = None,
    ) -> bool:
        """``PUT /v1/kv/:key``; False when a ``cas`` (0: only if absent), ``acquire`` or
        ``release`` did not apply."""
        params: dict[str, str] = {}
        if cas is not None:
            params["cas"] = str(cas)
        if acquire is not None:
            params["acquire"] = acquire
        if release is not None:
            params["release"] = release
        _, payload, _ = await self._request("PUT", f"/v1/kv/{key}", params=params, body=value)
        return _bool(payload, f"Consul PUT /v1/kv/{key}")

    async def kv_delete(self, key: str, *, cas: int | None = None, recurse: bool = False) -> bool:
        params: dict[str, str] = {}
        if cas is not None:
            params["cas"] = str(cas)
        if recurse:
            params["recurse"] = ""
        _, payload, _ = await self._request("DELETE", f"/v1/kv/{key}", params=params)
        return _bool(payload, f"Consul DELETE /v1/kv/{key}")

    # ------------------------------------------------------------------ sessions

    async def session_create(
        self,
        *,
        name: str,
        ttl: float,
        lock_delay: float,
        behavior: str = "release",
        service_checks: tuple[str, ...] = (),
    ) -> str:
        """A session on the agent's node, tied to its serfHealth check and to
        ``service_checks`` (check ids on the same agent): Consul invalidates it the moment
        any of them goes critical. Returns its ID."""
        request: dict[str, object] = {
            "Name": name,
            "TTL": go_duration(ttl),
            "LockDelay": go_duration(lock_delay),
            "Behavior": behavior,
        }
        if service_checks:
            # Consul >= 1.7: NodeChecks / ServiceChecks (a custom list replaces the
            # default serfHealth, so it is named again).
            request["NodeChecks"] = ["serfHealth"]
            request["ServiceChecks"] = [{"ID": check} for check in service_checks]
        body = json.dumps(request).encode()
        _, payload, _ = await self._request("PUT", "/v1/session/create", body=body)
        doc = _json(payload, "Consul PUT /v1/session/create")
        if not isinstance(doc, dict) or not isinstance(doc.get("ID"), str) or not doc["ID"]:
            raise ConsulProtocolError("Consul PUT /v1/session/create: no ID in the answer")
        return str(doc["ID"])

    async def session_renew(self, session_id: str) -> bool:
        """True when renewed; False when Consul no longer knows the session (it expired
        or was destroyed, so every lock it held is gone)."""
        status, _, _ = await self._request("PUT", f"/v1/session/renew/{session_id}", ok_404=True)
        return status == 200

    async def session_destroy(self, session_id: str) -> None:
        await self._request("PUT", f"/v1/session/destroy/{session_id}")

    # ------------------------------------------------------------------ the local agent

    async def agent_service_register(self, registration: Mapping[str, object]) -> None:
        """``PUT /v1/agent/service/register`` on the agent this client talks to."""
        body = json.dumps(registration).encode()
        await self._request("PUT", "/v1/agent/service/register", body=body)

    async def agent_service_deregister(self, service_id: str) -> None:
        await self._request("PUT", f"/v1/agent/service/deregister/{service_id}")

    async def agent_check_pass(self, check_id: str) -> None:
        """``PUT /v1/agent/check/pass/:check_id``: a TTL check stays passing for its TTL."""
        await self._request("PUT", f"/v1/agent/check/pass/{check_id}")


def _query_meta(headers: Mapping[str, str]) -> QueryMeta:
    def number(name: str) -> int:
        try:
            return max(0, int(headers.get(name, "0")))
        except ValueError:
            return 0

    return QueryMeta(
        index=number("X-Consul-Index"),
        known_leader=headers.get("X-Consul-KnownLeader", "").lower() == "true",
        last_contact_ms=number("X-Consul-LastContact"),
        results_filtered=headers.get("X-Consul-Results-Filtered-By-ACLs", "").lower() == "true",
    )


def _json(payload: bytes, what: str) -> object:
    try:
        return json.loads(payload)
    except (ValueError, RecursionError):
        raise ConsulProtocolError(f"{what}: the answer is not JSON") from None


def _bool(payload: bytes, what: str) -> bool:
    doc = _json(payload, what)
    if not isinstance(doc, bool):
        raise ConsulProtocolError(f"{what}: expected true or false")
    return doc


def _uint(raw: Mapping[str, object], name: str, what: str) -> int:
    value = raw.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConsulProtocolError(f"{what}: {name} is not a whole number")
    return value


def _kv_entries(body: object, what_key: str) -> list[KvEntry]:
    what = f"Consul KV {what_key!r}"
    if not isinstance(body, list):
        raise ConsulProtocolError(f"{what}: expected a JSON array")
    out: list[KvEntry] = []
    for raw in body:
        if not isinstance(raw, dict) or not isinstance(raw.get("Key"), str):
            raise ConsulProtocolError(f"{what}: an entry has no Key")
        encoded = raw.get("Value")
        if encoded is None:
            value = b""
        elif isinstance(encoded, str):
            try:
                value = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                raise ConsulProtocolError(f"{what}: a Value is not base64") from None
        else:
            raise ConsulProtocolError(f"{what}: a Value is not a string")
        session = raw.get("Session") or ""
        out.append(
            KvEntry(
                key=raw["Key"],
                value=value,
                flags=_uint(raw, "Flags", what),
                create_index=_uint(raw, "CreateIndex", what),
                modify_index=_uint(raw, "ModifyIndex", what),
                lock_index=_uint(raw, "LockIndex", what),
                session=session if isinstance(session, str) else "",
            )
        )
    return out
