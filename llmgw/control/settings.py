"""How the control plane's loops run: intervals, timeouts and backoffs, each named, with its default.

Owns ``ControlSettings`` (the loops) holding ``PlanningSettings`` (the decisions' timers,
in ``llmgw.core.planning.settings``). Must not: read the environment or flags (the CLI
builds these values and passes them in) or hold Nomad/Consul connection settings
(``llmgw.settings``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
