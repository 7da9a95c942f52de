"""The seam where the engine security policy will refuse a forbidden start.

Owns: `refusals(settings, argv, environ)`, called by `server.main` after the
settings are parsed and before anything is served. Today it refuses nothing.

The lead fills it from ``policies/engine-security.yaml`` (checked by
``llmgw.core.catalog.security``): flags and environment variables the
policy forbids for an engine make the start fail with ExitCode.REFUSED and
one logged line per reason. It must stay a pure check: no I/O besides what it
is given, no exit; the caller decides what a refusal does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmgw.sim.settings import SimSettings


def refusals(settings: SimSettings, argv: Sequence[str], environ: Mapping[str, str]) -> tuple[str, ...]:
    """Every reason to refuse this start, each saying what to change; empty allows it."""
    del settings, argv, environ  # the policy is not implemented yet: see the module docstring
    return ()
