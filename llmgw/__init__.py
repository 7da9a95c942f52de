"""llmgw: serve many LLMs on a Nomad + Consul GPU cluster.

The package is layered (see ARCHITECTURE.md): ``core`` is pure and does no I/O;
``render`` and ``adapters`` touch one outside thing each; ``control``,
``gateway``, ``devcluster`` and ``sim`` are the long-running programs; ``cli``
wires them to the command line.
"""

__version__ = "0.1.0"
