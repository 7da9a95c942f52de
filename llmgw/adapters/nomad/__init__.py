"""Nomad as llmgw uses it: parse, plan, register, deregister, read jobs, allocs and nodes, follow events.

A thin async client of llmgw's own on aiohttp (see DESIGN.md for why not python-nomad).
"""

from llmgw.adapters.nomad.allocations import AllocationWatch, AllocationWatchSettings
from llmgw.adapters.nomad.client import EventBatch, NomadClient, NomadError, NomadTimeouts, Page, Registered
from llmgw.adapters.nomad.plans import PlanOutcome, explain_plan, split_warnings

__all__ = [
    "AllocationWatch",
    "AllocationWatchSettings",
    "EventBatch",
    "NomadClient",
    "NomadError",
    "NomadTimeouts",
    "Page",
    "PlanOutcome",
    "Registered",
    "explain_plan",
    "split_warnings",
]
