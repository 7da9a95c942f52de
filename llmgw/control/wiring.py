"""``ControlDeps`` from the real adapters: the one place the control plane meets them by name.

Owns: building the ports from a Nomad client, a renderer and a Consul client. Its real
job is also a check: mypy verifies here that ``NomadClient``, ``Renderer``,
``LeaderElection`` and the Consul watches and stores satisfy ``llmgw.control.ports``, so
a change on either side that breaks the fit fails the type check, not a deployment.

Must not: start anything (``ControlPlane.start`` does) or read settings from the
environment (the CLI passes them in).
"""

from __future__ import annotations

from llmgw.adapters.consul import (
    CatalogStore,
    ConsulClient,
    DemandReader,
    DrainingMarks,
    ElectionSettings,
    LeaderElection,
    StatusPublisher,
    UnavailableStore,
    watch_endpoints,
)
from llmgw.adapters.nomad import NomadClient
from llmgw.control.commands import ModelCommandStore
from llmgw.control.metrics import ControlMetrics
from llmgw.control.plane import ControlDeps
from llmgw.control.ports import InFlightProbe, NoProbe
from llmgw.core.catalog import SecurityPolicy
from llmgw.core.engine_keys import EngineKeys
from llmgw.render import Renderer


def control_deps(
    *,
    nomad: NomadClient,
    renderer: Renderer,
    consul: ConsulClient,
    instance_id: str,
    policy: SecurityPolicy,
    election: ElectionSettings | None = None,
    probe: InFlightProbe | None = None,
    metrics: ControlMetrics | None = None,
    engine_keys: EngineKeys | None = None,
) -> ControlDeps:
    """The ports of one control-plane instance (``instance_id`` names it in the leader lock)."""
    marks = DrainingMarks(consul)
    commands = ModelCommandStore(consul)
    return ControlDeps(
        nomad=nomad,
        renderer=renderer,
        leader=LeaderElection(consul, instance_id, election),
        catalog=CatalogStore(consul).watch(),
        endpoints=watch_endpoints(consul),
        drain_marks=marks.watch(),
        drain_writer=marks,
        # Staleness of reports is judged by the planner (``demand_stale_after``), so the
        # raw watch of every router's report is what it needs.
        demand=DemandReader(consul).watch,
        status=StatusPublisher(consul),
        policy=policy,
        probe=probe or NoProbe(),
        metrics=metrics or ControlMetrics(),
        commands=commands.watch(),
        command_writer=commands,
        engine_keys=engine_keys,
        unavailable=UnavailableStore(consul),
    )
