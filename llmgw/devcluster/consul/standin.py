"""ConsulStandIn: a whole simulated Consul cluster on 127.0.0.1, one port per agent.

Owns the store, its supervisor (check runners, timers) and one HTTP listener per
node's agent: the server node's agent is :attr:`ConsulStandIn.url` (what llmgw's
``CONSUL_HTTP_ADDR`` points at) and every node added with :meth:`add_node` gets
an agent of its own at :meth:`agent_url`, as every Nomad client node runs a local
Consul agent. Registering a service through a node's agent puts it on that node,
with that node's name and address, exactly as Nomad does through the local agent.

Also owns the faults' effects on listeners: a REFUSE outage closes every agent's
listening socket and drops open connections, and reopens them on the same ports
when it ends.

Must not: hold data (the store) or answer HTTP itself (the apps do).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType

from aiohttp import web

from llmgw.devcluster.consul.app import create_consul_app
from llmgw.devcluster.consul.blocking import ChangeFeed
from llmgw.devcluster.consul.model import ConsulError, OutageMode
from llmgw.devcluster.consul.settings import ConsulSettings
from llmgw.devcluster.consul.state import ConsulState, Outage
from llmgw.devcluster.consul.supervisor import Supervisor
from llmgw.http_server import listener_log


@dataclass(slots=True)
class _Agent:
    node: str
    host: str
    port: int
    runner: web.AppRunner
    site: web.TCPSite | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def open(self) -> None:
        async with self.lock:
            if self.site is not None:
                return
            site = web.TCPSite(self.runner, self.host, self.port, reuse_address=True)
            await site.start()
            self.site = site
            if self.port == 0:
                # Keep the port the kernel picked, so a REFUSE outage reopens the same one.
                self.port = int(self.runner.addresses[0][1])

    async def close(self) -> None:
        """Stop listening and drop every open connection (a dead agent's view)."""
        async with self.lock:
            if self.site is None:
                return
            site, self.site = self.site, None
            await site.stop()
            server = self.runner.server
            if server is not None:
                for conn in server.connections:
                    conn.force_close()


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ConsulStandIn:
    """A simulated Consul cluster: see the module docstring.

    ``async with ConsulStandIn(ConsulSettings.for_tests()) as consul: ...``, or
    :meth:`start` / :meth:`stop`. All methods run on the event loop that started it.
    """

    def __init__(
        self,
        settings: ConsulSettings | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        state: ConsulState | None = None,
    ) -> None:
        self._state = state if state is not None else ConsulState(settings)
        self._host = host
        self._port = port
        self._agents: dict[str, _Agent] = {}
        self._feed: ChangeFeed | None = None
        self._supervisor: Supervisor | None = None
        self._started = False

    # ------------------------------------------------------------------ lifecycle

    @property
    def state(self) -> ConsulState:
        """The store (for reading in tests; change it through the HTTP API or the fault methods)."""
        return self._state

    @property
    def settings(self) -> ConsulSettings:
        return self._state.settings

    @property
    def blocked_queries(self) -> int:
        """Blocking queries parked on a change of the store right now."""
        return self._feed.waiting if self._feed is not None else 0

    async def start(self) -> None:
        """Listen for the server node's agent and start the background work."""
        if self._started:
            return
        self._feed = ChangeFeed(self._state)
        self._supervisor = Supervisor(self._state, self._feed, extra_step=self._match_listeners)
        self._started = True
        try:
            await self._open_agent(self.settings.server_node, self._port)
            self._supervisor.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Release every waiter, stop the background work, close every port."""
        if not self._started:
            return
        self._started = False
        if self._feed is not None:
            self._feed.close()
        if self._supervisor is not None:
            await self._supervisor.stop()
        agents, self._agents = list(self._agents.values()), {}
        for agent in agents:
            await agent.runner.cleanup()

    async def __aenter__(self) -> ConsulStandIn:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ------------------------------------------------------------------ addresses

    @property
    def url(self) -> str:
        """The server agent's base URL, e.g. ``http://127.0.0.1:41234`` (CONSUL_HTTP_ADDR)."""
        return self.agent_url(self.settings.server_node)

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        return self._require_agent(self.settings.server_node).port

    def agent_url(self, node: str) -> str:
        """The base URL of ``node``'s agent: register that node's services there."""
        return self._require_agent(node).url

    def agent_port(self, node: str) -> int:
        return self._require_agent(node).port

    def agent_urls(self) -> Mapping[str, str]:
        return {name: a.url for name, a in sorted(self._agents.items())}

    def _require_agent(self, node: str) -> _Agent:
        agent = self._agents.get(node)
        if agent is None:
            raise KeyError(f"no Consul agent for node {node!r}: add it with add_node() first")
        return agent

    # ------------------------------------------------------------------ topology

    async def add_node(self, name: str, address: str = "127.0.0.1", *, port: int = 0) -> str:
        """Join node ``name`` (catalog address ``address``) and start its agent on
        ``port`` (0: a free one); returns the agent's base URL. Idempotent."""
        if not self._started:
            raise RuntimeError("start the Consul stand-in before adding nodes")
        self._state.add_node(name, address)
        if name not in self._agents:
            await self._open_agent(name, port)
        return self._agents[name].url

    async def remove_node(self, name: str) -> None:
        """The node leaves the cluster: its services, checks and sessions go, its agent stops."""
        if name == self.settings.server_node:
            raise ConsulError(400, "the server node cannot leave the stand-in")
        self._state.remove_node(name, asyncio.get_running_loop().time())
        agent = self._agents.pop(name, None)
        if agent is not None:
            await agent.runner.cleanup()

    async def _open_agent(self, node: str, port: int) -> None:
        assert self._feed is not None
        app = create_consul_app(self._state, agent_node=node, feed=self._feed, control=self, supervise=False)
        runner = web.AppRunner(
            app,
            handle_signals=False,
            shutdown_timeout=self.settings.shutdown_timeout,
            handler_cancellation=True,
            access_log=None,
            # Malformed requests are logged without their bytes (the ACL token is among them).
            logger=listener_log("llmgw.devcluster.consul.http"),
        )
        await runner.setup()
        refusing = self._refusing()
        # Without a listener now (REFUSE outage) the port is picked ahead, to open later.
        agent = _Agent(node, self._host, port or (_free_port(self._host) if refusing else 0), runner)
        self._agents[node] = agent
        if not refusing:
            try:
                await agent.open()
            except BaseException:
                del self._agents[node]
                await runner.cleanup()
                raise

    # ------------------------------------------------------------------ faults

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def fail_node(self, name: str) -> None:
        """Serf marks the node failed: its serfHealth goes critical, so none of its
        services pass; its sessions are invalidated; its agent's check results stop
        reaching the catalog (its service checks keep their last status, as in Consul)."""
        self._state.fail_node(name, self._now())

    def recover_node(self, name: str) -> None:
        self._state.recover_node(name, self._now())

    def slow_node_checks(self, name: str, delay: float) -> None:
        """Every check on ``name`` waits ``delay`` seconds first (inside its timeout,
        so a delay past the timeout fails the check); 0 clears it."""
        self._state.set_check_latency(name, delay)

    async def start_outage(self, mode: OutageMode = OutageMode.HANG, duration: float | None = None) -> None:
        """Consul stops answering (see :class:`OutageMode`) until :meth:`end_outage`
        or, with ``duration``, for that many seconds. Returns once it is in force."""
        until = self._now() + duration if duration is not None else None
        self._state.set_outage(Outage(mode, until))
        await self._match_listeners()

    async def end_outage(self) -> None:
        self._state.set_outage(None)
        await self._match_listeners()

    def _refusing(self) -> bool:
        outage = self._state.faults.outage
        return outage is not None and outage.mode is OutageMode.REFUSE

    async def _match_listeners(self) -> None:
        refusing = self._refusing()
        for agent in list(self._agents.values()):
            with contextlib.suppress(OSError):
                # OSError: the port was taken meanwhile; the next pass retries.
                await (agent.close() if refusing else agent.open())
