"""What every `llmgw` command pays before it runs: its parser is built from every command
module, so none of them may import a network stack or the stand-ins to register itself
(`llmgw catalog check` runs in CI pipelines, `llmgw rendezvous wait` on every rank)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("aiohttp", "llmgw.devcluster", "llmgw.gateway.app", "llmgw.control.plane", "jinja2")


def test_building_the_command_line_imports_no_network_stack_and_no_stand_in() -> None:
    probe = (
        "import json, sys, llmgw.cli as cli; cli.build_parser(); "
        f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
