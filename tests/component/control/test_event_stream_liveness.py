"""The control plane's view notices a dead event stream, with llmgw's own Nomad client and the stand-in.

A connection that dies without a FIN (a server gone, a NAT that forgot the flow) sends
nothing: without a read timeout the view would wait on it until the next periodic resync.
Nomad beats every 30 s so a reader can tell; the client gives up after ``event_read_s``
of silence, and the view reopens the stream and resyncs.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from llmgw.adapters.nomad import NomadClient, NomadTimeouts
from llmgw.control.metrics import ControlMetrics
from llmgw.control.observing import ClusterView
from llmgw.control.ports import SystemClock
from llmgw.control.settings import ControlSettings
from llmgw.devcluster.nomad import NodeSpec, NomadServer, NomadStandIn, StandInConfig
from llmgw.devcluster.partition import TcpProxy
from llmgw.settings import NomadConnection


def reconnects(metrics: ControlMetrics) -> float:
    return metrics.registry.get_sample_value("llmgw_control_event_reconnects_total") or 0.0


async def test_a_stalled_stream_is_reopened_and_resynced_within_the_read_timeout(tmp_path: Path) -> None:
    config = StandInConfig(nodes=(NodeSpec(name="n1", gpus=1),), state_dir=tmp_path, event_heartbeat_s=0.2)
    async with NomadServer(NomadStandIn(config)) as server:
        proxy = TcpProxy(server.host, server.port)
        await proxy.start()
        nomad = NomadClient(NomadConnection(address=proxy.url), NomadTimeouts(event_read_s=1.0))
        changed = asyncio.Event()
        metrics = ControlMetrics()
        view = ClusterView(
            nomad, ControlSettings(events_retry=0.1), SystemClock(), metrics, on_change=changed.set
        )
        follower: asyncio.Task[None] | None = None
        try:
            await view.resync("start")
            follower = asyncio.create_task(view.follow_events())
            proxy.freeze()  # half-open: no FIN, no RST, no heartbeat, nothing
            started = asyncio.get_running_loop().time()
            while reconnects(metrics) == 0:
                changed.clear()
                await asyncio.wait_for(changed.wait(), 5)  # the view asks for a resync
            assert asyncio.get_running_loop().time() - started < 3
            proxy.thaw()
            await view.refresh()
            reason = {"reason": "reconnect"}
            assert metrics.registry.get_sample_value("llmgw_control_resyncs_total", reason) == 1
        finally:
            if follower is not None:
                follower.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await follower
            await nomad.close()
            await proxy.stop()
