"""Fixtures for the admin API: the real Consul adapter on the Consul stand-in, the real
renderer and policy, a recorded fake of the control plane's model commands, and admin
listeners on free loopback ports (stopped at teardown)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from llmgw.adapters.consul import ApiKeyStore, CatalogStore, ClientSettings, ConsulClient, StatusPublisher
from llmgw.admin import AdminDeps, AdminListener, AdminSettings, CommandReceipt, start_admin
from llmgw.admin.ports import UsageSource
from llmgw.core.catalog import SecurityPolicy
from llmgw.devcluster.consul import ConsulSettings, ConsulStandIn
from llmgw.render import Renderer, RenderSettings
from llmgw.settings import ConsulConnection

TOKEN = "test-admin-token-0123456789abcdef0123"
FAST_CLIENT = ClientSettings(request_timeout=2.0, blocking_slack=0.5)

GOOD = """\
models:
  chat:
    description: the chat model
    profiles:
      - engine: sim
        tp: 2
    scaling: {min: 1, max: 2}
  lazy:
    profiles:
      - engine: sim
    scaling: {min: 0, max: 1}
aliases:
  gpt: chat
"""
# The same catalog with chat's spec changed (a roll), lazy's bound raised (a scale) and one new model.
NEXT = (
    GOOD.replace("tp: 2", "tp: 4")
    .replace("{min: 0, max: 1}", "{min: 0, max: 3}")
    .replace("aliases:", "  fresh:\n    profiles: [{engine: sim}]\n    scaling: {min: 1, max: 1}\naliases:")
)
# Two errors, one of them the security policy's.
BAD = """\
models:
  chat:
    profiles:
      - engine: vllm
        source: org/chat
        args: ["--trust-remote-code"]
    scaling: {min: 1}
"""


@dataclass
class RecordedModelCommands:
    """The control plane's model commands, recorded: (command, model, actor)."""

    known: set[str] = field(default_factory=lambda: {"chat", "org/model"})
    calls: list[tuple[str, str, str]] = field(default_factory=list)

    async def drain(self, model: str, *, actor: str) -> CommandReceipt:
        return self._record("drain", model, actor)

    async def restart(self, model: str, *, actor: str) -> CommandReceipt:
        return self._record("restart", model, actor)

    def _record(self, command: str, model: str, actor: str) -> CommandReceipt:
        if model not in self.known:
            raise LookupError(f"no model {model!r} in the applied catalog")
        self.calls.append((command, model, actor))
        return CommandReceipt(f"{command} started for 1 replica", (f"llmgw-{model}-r1",))


@dataclass
class Stores:
    client: ConsulClient
    catalogs: CatalogStore
    keys: ApiKeyStore
    status: StatusPublisher


@pytest.fixture
async def standin() -> AsyncIterator[ConsulStandIn]:
    async with ConsulStandIn(ConsulSettings.for_tests()) as cs:
        yield cs


def consul_client(url: str) -> ConsulClient:
    return ConsulClient(ConsulConnection.from_env({"CONSUL_HTTP_ADDR": url}), FAST_CLIENT)


@pytest.fixture
async def stores(standin: ConsulStandIn) -> AsyncIterator[Stores]:
    async with consul_client(standin.url) as client:
        yield Stores(client, CatalogStore(client), ApiKeyStore(client), StatusPublisher(client))


@pytest.fixture
def models() -> RecordedModelCommands:
    return RecordedModelCommands()


StartAdmin = Callable[..., Awaitable[AdminListener]]


@pytest.fixture
async def start(shipped_policy: SecurityPolicy) -> AsyncIterator[StartAdmin]:
    """``start(stores, models=None, **settings)``: an admin listener on a free loopback port."""
    listeners: list[AdminListener] = []
    renderer = Renderer(RenderSettings(), shipped_policy)

    async def _start(
        stores: Stores,
        models: RecordedModelCommands | None = None,
        usage: UsageSource | None = None,
        **overrides: Any,
    ) -> AdminListener:
        settings = AdminSettings(**{"host": "127.0.0.1", "port": 0, "token": TOKEN, **overrides})
        deps = AdminDeps(
            catalogs=stores.catalogs,
            keys=stores.keys,
            status=stores.status,
            policy=shipped_policy,
            renderer=renderer,
            models=models,
            usage=usage,
        )
        listener = await start_admin(settings, deps)
        listeners.append(listener)
        return listener

    yield _start
    for listener in listeners:
        await listener.stop()


@pytest.fixture
async def admin(start: StartAdmin, stores: Stores, models: RecordedModelCommands) -> AdminListener:
    return await start(stores, models)


@dataclass
class Reply:
    status: int
    body: dict[str, Any]
    headers: CIMultiDict[str]


@dataclass
class Client:
    """A curl-like client: JSON content type and the token, unless told otherwise."""

    session: aiohttp.ClientSession
    url: str
    token: str | None = TOKEN

    async def call(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        headers: dict[str, str] | None = None,
        raw: bytes | str | None = None,
        content_type: str | None = "application/json",
    ) -> Reply:
        sent: dict[str, str] = {}
        if content_type is not None:
            sent["Content-Type"] = content_type
        if self.token is not None:
            sent["Authorization"] = f"Bearer {self.token}"
        sent.update(headers or {})
        data: bytes | str | None = raw
        if body is not None:
            data = json.dumps(body)
        async with self.session.request(method, self.url + path, data=data, headers=sent) as resp:
            text = await resp.text()
            parsed = json.loads(text) if text else {}
            return Reply(resp.status, parsed, CIMultiDict(resp.headers))


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


@pytest.fixture
def client(session: aiohttp.ClientSession, admin: AdminListener) -> Client:
    return Client(session, admin.url)


@pytest.fixture
def client_for(session: aiohttp.ClientSession) -> Callable[[AdminListener], Client]:
    return lambda listener: Client(session, listener.url)


@pytest.fixture
async def other_stores(standin: ConsulStandIn) -> AsyncIterator[Stores]:
    """A second control plane's stores: its own Consul client (as after a failover)."""
    async with consul_client(standin.url) as client:
        yield Stores(client, CatalogStore(client), ApiKeyStore(client), StatusPublisher(client))


@pytest.fixture
def catalog_files(tmp_path: Path) -> Callable[[str, str], Path]:
    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write


@dataclass(frozen=True)
class Texts:
    good: str = GOOD
    next: str = NEXT
    bad: str = BAD
    token: str = TOKEN


@pytest.fixture
def texts() -> Texts:
    """The catalogs and the token the tests share (fixtures: test modules cannot import conftest)."""
    return Texts()
