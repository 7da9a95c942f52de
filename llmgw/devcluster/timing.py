"""Named timing presets for the dev cluster: the stand-ins on Nomad's and Consul's real defaults.

Owns :func:`real_defaults`: a :class:`DevClusterConfig` whose clocks are those of a
production Nomad and Consul with default settings, for the tests and benchmarks that
must see production timing (a failover, a lost node) rather than ``llmgw dev``'s short
clocks. Each value names the source it follows.

Must not: change anything but timings (nodes, ports and state stay the caller's).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from llmgw.devcluster.cluster import DevClusterConfig
from llmgw.devcluster.consul import ConsulSettings

# Nomad marks a client down when no heartbeat arrived for its heartbeat TTL plus
# heartbeat_grace (nomad/heartbeat.go, resetHeartbeatTimer: the TTL is
# RateScaledInterval(max_heartbeats_per_second, min_heartbeat_ttl, nodes) plus a random
# stagger of up to one TTL, then "ttl + HeartbeatGrace"). With the defaults
# (min_heartbeat_ttl 10 s, heartbeat_grace 10 s) and a cluster of under 500 nodes that is
# 20-30 s after the last heartbeat; the stand-in takes the upper end.
NOMAD_NODE_DOWN_AFTER_S: Final = 30.0


def real_defaults(config: DevClusterConfig | None = None) -> DevClusterConfig:
    """``config`` (or a default one) with Nomad's and Consul's real default timing:

    - Nomad: a failed node is down ``NOMAD_NODE_DOWN_AFTER_S`` after it stops heartbeating;
    - Consul: ``ConsulSettings()``, which is real Consul's throughout: a new check starts
      critical and first runs within one interval (at least 1 s), a session TTL lies in
      [10 s, 24 h] and is enforced at up to 2 x TTL, lock-delay is 15 s by default and
      applied for at most 60 s, blocking waits default to 5 min with wait/16 jitter.
    """
    base = config or DevClusterConfig()
    return replace(
        base,
        nomad=replace(base.nomad, heartbeat_grace_s=NOMAD_NODE_DOWN_AFTER_S),
        consul=ConsulSettings(),
    )
