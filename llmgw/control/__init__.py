"""The control plane: keeps Nomad's jobs equal to the catalog and to demand (see DESIGN.md).

Public face:

- ``run_control_plane(settings, deps)``: run until cancelled (``llmgw serve``).
- ``ControlPlane(settings, deps)`` with ``start()`` / ``stop()``; ``ControlDeps`` (the ports);
  ``ControlSettings`` (every interval, timeout and backoff of the loops, with the decisions'
  ``PlanningSettings`` inside); ``lost_node_problem`` (the lost-node grace against the jobs'
  ``lost_after``), which ``Services`` checks before a control plane starts.
- ``control_deps(nomad=, renderer=, consul=, instance_id=, policy=)``: the ports from the real
  adapters (``llmgw.control.wiring``; mypy checks there that the adapters fit the ports).
- ``ControlMetrics``: ``llmgw_control_*`` on a registry of its own.
- ``llmgw.control.commands``: the operator's drain and restart of a model, durable in Consul
  KV (``ModelCommandStore``; ``OperatorCommands``, what the admin API's model endpoints call).
- ``llmgw.control.ports``: the Protocols the loops depend on. Their recorded fakes and an
  in-memory Nomad/Consul simulator live in ``tests/support/control.py``, outside the wheel.

The decisions themselves are pure and live in ``llmgw.core.planning``.
"""

from llmgw.control.executing import Executor, LeadershipLost
from llmgw.control.metrics import ControlMetrics
from llmgw.control.observing import ClusterView
from llmgw.control.plane import ControlDeps, ControlPlane, run_control_plane
from llmgw.control.reconciling import CatalogReader, Reconciler, SpecCache, Trigger
from llmgw.control.settings import ControlSettings, ControlSettingsError, lost_node_problem
from llmgw.control.wiring import control_deps

__all__ = [
    "CatalogReader",
    "ClusterView",
    "ControlDeps",
    "ControlMetrics",
    "ControlPlane",
    "ControlSettings",
    "ControlSettingsError",
    "Executor",
    "LeadershipLost",
    "Reconciler",
    "SpecCache",
    "Trigger",
    "control_deps",
    "lost_node_problem",
    "run_control_plane",
]
