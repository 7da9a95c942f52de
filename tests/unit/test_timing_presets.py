"""The dev cluster's real-default timing preset is Nomad's and Consul's production defaults."""

from __future__ import annotations

from llmgw.devcluster.cluster import DevClusterConfig
from llmgw.devcluster.consul import ConsulSettings
from llmgw.devcluster.nomad import NodeSpec, StandInConfig
from llmgw.devcluster.timing import NOMAD_NODE_DOWN_AFTER_S, real_defaults


def test_real_defaults_keep_the_topology_and_take_production_clocks() -> None:
    nodes = (NodeSpec(name="gpu-1", gpus=8, gpu_model="H100", fabric="f"),)
    short = DevClusterConfig(
        nomad=StandInConfig(nodes=nodes, heartbeat_grace_s=1.0), consul=ConsulSettings.for_tests()
    )
    real = real_defaults(short)
    assert real.nomad.nodes == nodes and real.nomad.heartbeat_grace_s == NOMAD_NODE_DOWN_AFTER_S == 30.0
    consul = real.consul
    assert consul is not None
    # Consul's session rules (agent/structs, agent/consul/session_ttl.go, state/session.go).
    assert (consul.session_ttl_min, consul.session_ttl_max, consul.session_ttl_multiplier) == (
        10.0,
        86400.0,
        2.0,
    )
    assert (consul.default_lock_delay, consul.max_lock_delay) == (15.0, 60.0)
    # A check runs at most once a second; KV values hold 512 KiB; CE has no namespaces.
    assert consul.min_check_interval == 1.0 and consul.kv_max_value_size == 512 * 1024
    assert consul.enterprise is False
