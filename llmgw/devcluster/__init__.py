"""The dev cluster behind ``llmgw dev`` and the end-to-end tests: Nomad and Consul stand-ins.

``llmgw.devcluster.cluster.DevCluster`` starts both and wires them like a real cluster;
``llmgw.devcluster.nomad`` and ``llmgw.devcluster.consul`` are the two stand-ins, coupled
only through Consul's HTTP API. See DESIGN.md beside this file.

Must not: be imported by llmgw's production paths (control, gateway): they talk to the
stand-ins over HTTP exactly as to real Nomad and Consul.
"""
