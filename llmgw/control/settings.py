"""How the control plane's loops run: intervals, timeouts and backoffs, each named, with its default.

Owns ``ControlSettings`` (the loops) holding ``PlanningSettings`` (the decisions' timers,
in ``llmgw.core.planning.settings``). Must not: read the environment or flags (the CLI
builds these values and passes them in) or hold Nomad/Consul connection settings
(``llmgw.settings``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgw.core.backoff import BackoffPolicy
from llmgw.core.planning import PlanningSettings


@dataclass(frozen=True, slots=True)
class ControlSettings:
    planning: PlanningSettings = field(default_factory=PlanningSettings)

    # --- passes ------------------------------------------------------------------------------
    # After a trigger (a Nomad event, a Consul change), wait this long for more before a pass,
    # so a burst (a job's allocations all changing) becomes one pass. Keeps reaction within
    # a second.
    debounce: float = 0.2
    # At least this long between the starts of two passes (demand reports change often).
    min_pass_interval: float = 0.5
    # A pass runs at least this often even when nothing changed and no timer is due:
    # a safety net for a missed trigger.
    idle_pass_interval: float = 30.0
    # A pass that raised (Nomad unreachable...) is retried after this, doubling up to the max.
    pass_retry: float = 1.0
    pass_retry_max: float = 30.0

    # --- observing Nomad -----------------------------------------------------------------------
    # The view of llmgw's jobs, allocations and nodes is rebuilt from list calls this often,
    # whatever the event stream says: it repairs anything an event missed.
    resync_interval: float = 5 * 60.0
    # Reconnecting the event stream after it broke: first delay, doubling up to the max.
    # Every reconnect is followed by a full resync (Nomad silently starts at its oldest
    # retained event when the index we resume from has left its buffer).
    events_retry: float = 1.0
    events_retry_max: float = 30.0
    # The event topics followed.
    event_topics: tuple[str, ...] = ("Job", "Allocation", "Node")

    # --- acting ----------------------------------------------------------------------------------
    # One Nomad or Consul call of the executor may take this long before it counts as failed.
    action_timeout: float = 30.0
    # The engine probe of a draining replica's in-flight requests may take this long.
    probe_timeout: float = 2.0

    # --- status ----------------------------------------------------------------------------------
    # The leader republishes its status at least this often even when nothing changed
    # (so a reader sees it is fresh), and at most once per pass otherwise.
    status_refresh: float = 30.0

    @property
    def pass_backoff(self) -> BackoffPolicy:
        """After a failed pass: one control plane, so no jitter (nothing to spread out)."""
        return BackoffPolicy(self.pass_retry, self.pass_retry_max)

    @property
    def events_backoff(self) -> BackoffPolicy:
        """Reopening Nomad's event stream: one leader follows it, so no jitter either."""
        return BackoffPolicy(self.events_retry, self.events_retry_max)


class ControlSettingsError(ValueError):
    """The control plane's settings cannot be used together; the message says which to change."""


def lost_node_problem(settings: ControlSettings, lost_after_s: float) -> str | None:
    """Why the jobs' ``disconnect { lost_after }`` (``RenderSettings.lost_after_s``) would let
    Nomad replace a shard behind llmgw's back with these settings, or None when they agree.

    When ``lost_after`` runs out, Nomad marks a disconnected allocation lost and places a
    replacement whatever ``replace = false`` and the reschedule policy say
    (``scheduler/reconciler/filters.go``, ``reconcile_cluster.go`` in Nomad 2.0): a lone copy
    of one rank, holding its GPUs and unable to form a replica. llmgw must have stopped the
    replica whole first: after ``node_lost_grace`` and one deregister call (``action_timeout``).
    """
    grace = settings.planning.node_lost_grace
    needed = grace + settings.action_timeout
    if lost_after_s >= needed:
        return None
    return (
        f"the jobs' disconnect lost_after ({lost_after_s:g}s, RenderSettings.lost_after_s) must be at "
        f"least the reconciler's node_lost_grace ({grace:g}s) plus action_timeout "
        f"({settings.action_timeout:g}s), {needed:g}s: when lost_after runs out Nomad replaces a "
        "disconnected shard on its own (whatever replace = false says) before llmgw rebuilds the "
        "replica whole. Raise lost_after_s or lower node_lost_grace"
    )
