"""The fault and topology controls behind ``/_dev/...`` and the stand-in's Python API.

Owns :class:`DevControl`, the few operations ``llmgw dev`` and tests use to shape
the simulated cluster (add or remove a node, fail or recover it, slow its checks,
start or end a Consul outage), and :class:`StateOnlyControl`, the version that
works on a bare :class:`ConsulState` (no listeners to open or close), used when an
app is built with ``create_consul_app`` alone.

Must not: answer HTTP (that is :mod:`llmgw.devcluster.consul.devapi`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from llmgw.devcluster.consul.model import OutageMode
from llmgw.devcluster.consul.state import ConsulState, Outage


class DevControl(Protocol):
    """What can be done to the simulated cluster from outside the Consul API."""

    async def add_node(self, name: str, address: str) -> str | None:
        """Join a node; returns its agent's base URL when it gets a port of its own."""
        ...

    async def remove_node(self, name: str) -> None: ...

    def fail_node(self, name: str) -> None: ...

    def recover_node(self, name: str) -> None: ...

    def slow_node_checks(self, name: str, delay: float) -> None: ...

    async def start_outage(self, mode: OutageMode, duration: float | None = None) -> None: ...

    async def end_outage(self) -> None: ...

    def agent_urls(self) -> Mapping[str, str]: ...


class StateOnlyControl:
    """DevControl over the store alone: no ports to open, so REFUSE only drops
    connections that arrive (see the outage middleware)."""

    def __init__(self, state: ConsulState) -> None:
        self._state = state

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    async def add_node(self, name: str, address: str) -> str | None:
        self._state.add_node(name, address)
        return None

    async def remove_node(self, name: str) -> None:
        self._state.remove_node(name, self._now())

    def fail_node(self, name: str) -> None:
        self._state.fail_node(name, self._now())

    def recover_node(self, name: str) -> None:
        self._state.recover_node(name, self._now())

    def slow_node_checks(self, name: str, delay: float) -> None:
        self._state.set_check_latency(name, delay)

    async def start_outage(self, mode: OutageMode, duration: float | None = None) -> None:
        until = self._now() + duration if duration is not None else None
        self._state.set_outage(Outage(mode, until))

    async def end_outage(self) -> None:
        self._state.set_outage(None)

    def agent_urls(self) -> Mapping[str, str]:
        return {}
