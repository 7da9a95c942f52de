"""The Consul stand-in behind ``llmgw dev`` and the test suite.

It answers Consul's HTTP API (agent, health, catalog, KV, session, status) the way
real Consul does, for the parts llmgw and Nomad use: the same paths, key-exact
JSON, blocking queries with Consul's index rules, HTTP/TCP/TTL checks that really
run, sessions that really expire. See DESIGN.md beside this file.

Public face:

- :class:`ConsulStandIn` - a cluster on 127.0.0.1: ``url`` (the server agent),
  ``add_node(name, address) -> agent URL``, ``agent_url(node)``, faults
  (``start_outage``, ``fail_node``, ``slow_node_checks``, ...), ``start``/``stop``.
- :func:`create_consul_app` - the aiohttp app of one agent over a :class:`ConsulState`.
- :class:`ConsulSettings` - clocks and limits (real Consul's by default;
  ``ConsulSettings.for_tests()`` for fast tests).
- :class:`OutageMode` - how an outage fault fails requests.

Must not: be imported by llmgw's production code paths (gateway, control); they
talk to it only over HTTP, exactly as to a real Consul.
"""

from llmgw.devcluster.consul.app import create_consul_app
from llmgw.devcluster.consul.model import HealthStatus, OutageMode
from llmgw.devcluster.consul.settings import ConsulSettings
from llmgw.devcluster.consul.standin import ConsulStandIn
from llmgw.devcluster.consul.state import ConsulState

__all__ = [
    "ConsulSettings",
    "ConsulStandIn",
    "ConsulState",
    "HealthStatus",
    "OutageMode",
    "create_consul_app",
]
