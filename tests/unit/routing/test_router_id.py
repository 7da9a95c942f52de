"""A router's id names it alone: in Consul's demand reports and in the limits routers share."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from llmgw.gateway.settings import RouterSettings


def test_a_given_id_wins_and_a_fixed_port_names_the_router_across_restarts() -> None:
    assert RouterSettings(router_id="edge-1", port=0).resolved_router_id() == "edge-1"
    host = socket.gethostname()
    assert RouterSettings(port=8080).resolved_router_id() == f"{host}-8080"


def test_routers_of_one_host_on_port_0_get_ids_of_their_own() -> None:
    code = (
        "from llmgw.gateway.settings import RouterSettings\n"
        "print(RouterSettings(port=0).resolved_router_id())"
    )
    run = [sys.executable, "-c", code]
    ids = {subprocess.run(run, capture_output=True, text=True, check=True).stdout.strip() for _ in range(2)}
    assert len(ids) == 2, ids
    assert RouterSettings(port=0).resolved_router_id() == f"{socket.gethostname()}-pid{os.getpid()}"
