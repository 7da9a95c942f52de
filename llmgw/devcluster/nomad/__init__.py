"""The Nomad stand-in behind ``llmgw dev``: Nomad's HTTP API over simulated nodes and real processes.

Public face:

* ``StandInConfig`` / ``NodeSpec`` / ``config_from_yaml`` — the simulated cluster and its timings;
* ``NomadStandIn`` — state, scheduler, clients, faults (``fail_node``, ``restore_node``, ``crash_task``);
* ``create_app(standin)`` — the aiohttp app speaking Nomad's HTTP API;
* ``NomadServer`` — the two together on a loopback port.

See ``llmgw/devcluster/DESIGN.md`` for what is mirrored from real Nomad and what is not.
"""

from llmgw.devcluster.nomad.config import NodeSpec, StandInConfig, config_from_yaml, default_nodes
from llmgw.devcluster.nomad.http_api import NomadServer, create_app
from llmgw.devcluster.nomad.standin import NomadStandIn

__all__ = [
    "NodeSpec",
    "NomadServer",
    "NomadStandIn",
    "StandInConfig",
    "config_from_yaml",
    "create_app",
    "default_nodes",
]
