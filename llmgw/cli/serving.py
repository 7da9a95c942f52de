"""Wiring llmgw's programs to Nomad and Consul: what ``llmgw serve`` and ``llmgw dev`` both run.

Owns the order things start and stop in (Consul client, then the control plane
and the router; the reverse on the way down) and turning connection settings
into adapters. It decides nothing about the cluster.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType

from llmgw.adapters.consul import (
    ApiKeyStore,
    CatalogConflict,
    CatalogStore,
    ClientSettings,
    ConsulClient,
    DemandPublisher,
    DrainingMarks,
    ElectionSettings,
    ResponseKV,
    StatusPublisher,
    UnavailableStore,
    watch_endpoints,
)
from llmgw.adapters.nomad import AllocationWatch, NomadClient
from llmgw.admin import AdminDeps, AdminListener, AdminSettings, CommandReceipt, start_admin
from llmgw.control import ControlPlane, ControlSettings, ControlSettingsError, lost_node_problem
from llmgw.control.commands import ModelCommandStore, OperatorCommands
from llmgw.control.metrics_server import MetricsListener, MetricsListenerSettings
from llmgw.control.wiring import control_deps
from llmgw.core.catalog import SecurityPolicy
from llmgw.core.engine_keys import EngineKeys
from llmgw.core.records import CatalogVersion
from llmgw.gateway.app import RouterServer
from llmgw.gateway.ports import RouterDeps
from llmgw.gateway.settings import RouterSettings
from llmgw.gateway.tracing import Tracing
from llmgw.render import Renderer, RenderSettings
from llmgw.settings import ConsulConnection, NomadConnection

log = logging.getLogger("llmgw")


class Role(StrEnum):
    ALL = "all"
    CONTROL_PLANE = "control-plane"
    ROUTER = "router"


@dataclass(frozen=True)
class ServiceSettings:
    role: Role
    nomad: NomadConnection
    consul: ConsulConnection
    policy: SecurityPolicy
    render: RenderSettings = field(default_factory=RenderSettings)
    control: ControlSettings = field(default_factory=ControlSettings)
    router: RouterSettings = field(default_factory=RouterSettings)
    # The control plane's /metrics and /health listener; None runs none.
    control_metrics: MetricsListenerSettings | None = field(default_factory=MetricsListenerSettings)
    # The admin API runs beside the control plane; None runs none.
    admin: AdminSettings | None = field(default_factory=AdminSettings)
    # This instance's name in the leader lock and logs.
    instance_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{time.time_ns() % 10**9}")
    # The leader lock's timings; None: ElectionSettings' defaults (tests shorten them).
    election: ElectionSettings | None = None
    # The engines' API keys (LLMGW_ENGINE_KEY_SECRET): the control plane writes each
    # replica's into its job's Nomad Variable, routers send it. The renderer's
    # engine_api_keys must be on with it (the jobs then require a key).
    engine_keys: EngineKeys | None = field(default=None, repr=False)
    # The router's own connections when it runs beside the control plane (role all) with
    # tokens of its own, as llmgw dev runs it (each with its ops/acl policy); None: the same.
    router_nomad: NomadConnection | None = None
    router_consul: ConsulConnection | None = None
    # The router's traces (OpenTelemetry's OTEL_EXPORTER_OTLP_* variables: gateway/tracing.py).
    tracing: Tracing = field(default_factory=Tracing)


async def publish_catalog(consul: ConsulClient, text: str, *, applied_by: str) -> CatalogVersion | None:
    """Apply ``text`` as the next catalog version unless it is already current; None when unchanged."""
    store = CatalogStore(consul)
    for _ in range(3):  # another writer may win a round; then read again and retry
        current = await store.current()
        candidate = CatalogVersion.of((current.version + 1) if current else 1, text, applied_by, time.time())
        if current is not None and current.sha256 == candidate.sha256:
            return None
        try:
            return await store.apply(candidate, current.version if current else None)
        except CatalogConflict:
            continue
    raise RuntimeError("the catalog kept changing under llmgw while it tried to apply its own")


class AdminModelCommands:
    """The control plane's ``OperatorCommands`` as the admin API's ``ModelCommands``: the
    two programs do not import each other, so their values meet here."""

    def __init__(self, commands: OperatorCommands) -> None:
        self._commands = commands

    async def drain(self, model: str, *, actor: str) -> CommandReceipt:
        result = await self._commands.drain(model, actor=actor)
        return CommandReceipt(result.message, result.replicas)

    async def restart(self, model: str, *, actor: str) -> CommandReceipt:
        result = await self._commands.restart(model, actor=actor)
        return CommandReceipt(result.message, result.replicas)


class Services:
    """``async with Services(settings) as running:`` the control plane and/or the router."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self._stack = AsyncExitStack()
        self.consul: ConsulClient | None = None
        self.router: RouterServer | None = None
        self.control: ControlPlane | None = None
        self.admin: AdminListener | None = None
        self.control_metrics: MetricsListener | None = None

    async def __aenter__(self) -> Services:
        try:
            await self._start()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stack.aclose()

    async def _start(self) -> None:
        s = self.settings
        if s.role in (Role.ALL, Role.CONTROL_PLANE):
            problem = lost_node_problem(s.control, s.render.lost_after_s)
            if problem is not None:
                raise ControlSettingsError(f"the control plane will not start: {problem}")
        consul = ConsulClient(s.consul, ClientSettings())
        await consul.start()
        self._stack.push_async_callback(consul.close)
        await consul.check_namespace()  # CONSUL_NAMESPACE on Consul CE: one clear error, now
        self.consul = consul
        if s.role in (Role.ALL, Role.CONTROL_PLANE):
            nomad = NomadClient(s.nomad)
            self._stack.push_async_callback(nomad.close)
            deps = control_deps(
                nomad=nomad,
                renderer=Renderer(s.render, s.policy),
                consul=consul,
                instance_id=s.instance_id,
                policy=s.policy,
                election=s.election,
                engine_keys=s.engine_keys,
            )
            plane = ControlPlane(s.control, deps)
            await plane.start()
            self._stack.push_async_callback(plane.stop)
            self.control = plane
            if s.control_metrics is not None:
                listener = MetricsListener(
                    s.control_metrics, deps.metrics.registry, lambda: deps.leader.is_leader
                )
                await listener.start()
                self._stack.push_async_callback(listener.stop)
                self.control_metrics = listener
            if s.admin is not None:
                view = plane.view

                def replicas_of(model: str) -> list[str]:
                    jobs, _ = view.snapshot()
                    return [j.job_id for j in jobs.values() if j.model == model and not j.stopped]

                commands = OperatorCommands(
                    ModelCommandStore(consul), CatalogStore(consul), s.policy, replicas=replicas_of
                )
                admin = await start_admin(
                    s.admin,
                    AdminDeps(
                        catalogs=CatalogStore(consul),
                        keys=ApiKeyStore(consul),
                        status=StatusPublisher(consul),
                        policy=s.policy,
                        # The same renderer settings the reconciler compares with, so a
                        # diff's rolls are the reconciler's rolls.
                        renderer=Renderer(s.render, s.policy),
                        allowlists=s.render.allowlists,
                        models=AdminModelCommands(commands),
                    ),
                )
                self._stack.push_async_callback(admin.stop)
                self.admin = admin
        if s.role in (Role.ALL, Role.ROUTER):
            router_settings = s.router
            # The router's own Nomad client: it follows allocations with a read token
            # (ops/README.md), and its stream must not share the control plane's fate.
            router_nomad = NomadClient(s.router_nomad or s.nomad)
            self._stack.push_async_callback(router_nomad.close)
            if s.router_consul is not None:
                consul = ConsulClient(s.router_consul, ClientSettings())
                await consul.start()
                self._stack.push_async_callback(consul.close)
            deps_router = RouterDeps(
                endpoints=watch_endpoints(consul),
                catalog=CatalogStore(consul).watch(),
                draining=DrainingMarks(consul).watch(),
                unavailable=UnavailableStore(consul).watch(),
                api_keys=None if router_settings.no_auth else ApiKeyStore(consul).watch(),
                demand=DemandPublisher(consul, router_settings.resolved_router_id()),
                engine_keys=s.engine_keys,
                allocations=AllocationWatch(router_nomad),
                responses=ResponseKV(consul),
                tracing=s.tracing,
            )
            router = RouterServer(router_settings, deps_router, policy=s.policy)
            await router.start()
            self._stack.push_async_callback(router.stop)
            self.router = router


async def wait_for_signal() -> None:
    """Until SIGINT or SIGTERM."""
    import signal

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
