"""What the catalog asks for, prepared for planning: each model's profiles in order of
preference with the spec hash each would run, the GPUs they compete for, and the scaling rule.

Owns: reading the catalog into ``Desired`` once per catalog version, the GPU claim of a
profile (which placements must not be planned from the same snapshot), and which judge
guards which models. Must not: render jobs (the spec hash a running replica should have
comes from ``llmgw.render`` through the ``SpecOracle`` the control loop passes in) or
decide counts (``llmgw.core.scaling``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from llmgw.core.catalog.model import Catalog, Model, Profile
from llmgw.core.planning.commands import ModelCommand
from llmgw.core.planning.settings import PlanningSettings
from llmgw.core.scaling import ScalingPolicy

# A profile's GPU claim: the GPU model names it may land on, or ANY_GPU when it does not
# say (it may then take any card). An empty claim asks for no GPU at all.
ANY_GPU = "*"
Claim = frozenset[str]


def profile_claim(profile: Profile) -> Claim:
    if not profile.requests_gpus:
        return frozenset()
    if profile.gpu is not None and profile.gpu.model:
        return frozenset({profile.gpu.model.lower()})
    return frozenset({ANY_GPU})


def claims_conflict(a: Claim, b: Claim) -> bool:
    """Could two placements be offered the same cards by plans from one snapshot?"""
    if not a or not b:
        return False
    return ANY_GPU in a or ANY_GPU in b or not a.isdisjoint(b)


class SpecOracle(Protocol):
    """The spec hash the renderer gives this replica now (None: it cannot render it now).

    Compared with the ``llmgw_spec_hash`` meta of the running job: different means the
    catalog or the templates changed what the replica would run, and it rolls.
    """

    def __call__(self, model: str, profile_index: int, replica_id: str, fabric: str | None) -> str | None: ...


@dataclass(frozen=True, slots=True)
class ProfileTarget:
    index: int
    key: str  # a hash of the profile as the catalog writes it: changes when the operator edits it
    claim: Claim
    nodes: int  # > 1: a multi-node replica, placed on one fabric
    load_timeout: float


@dataclass(frozen=True, slots=True)
class ModelTarget:
    name: str
    profiles: tuple[ProfileTarget, ...]
    policy: ScalingPolicy
    guarded: tuple[str, ...] = ()  # models whose requests this model (a judge) screens
    # A hash of the model as the catalog has it (``model_key``): an operator's drain holds
    # while it is unchanged.
    key: str = ""

    @property
    def claim(self) -> Claim:
        out: set[str] = set()
        for p in self.profiles:
            out |= p.claim
        return frozenset(out)

    def profile(self, index: int) -> ProfileTarget | None:
        return self.profiles[index] if 0 <= index < len(self.profiles) else None


def _same_spec(model: str, profile_index: int, replica_id: str, fabric: str | None) -> str | None:
    return None


@dataclass(frozen=True, slots=True)
class Desired:
    catalog_hash: str
    models: Mapping[str, ModelTarget] = field(default_factory=dict)
    # None from the oracle, or no oracle: the running spec is taken as current (never rolls).
    expected_spec: SpecOracle = _same_spec
    # The operator's drain and restart commands by model name (Consul KV, read every pass).
    commands: Mapping[str, ModelCommand] = field(default_factory=dict)


def profile_key(model: Model, index: int) -> str:
    text = model.profiles[index].model_dump_json(exclude_defaults=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def model_key(model: Model) -> str:
    """A hash of everything the catalog says about the model (keys sorted, so reordering a
    mapping in the YAML is no change). The admin API's drain records it, the planner compares."""
    text = json.dumps(model.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def desired_from_catalog(
    catalog: Catalog, catalog_hash: str, expected_spec: SpecOracle, settings: PlanningSettings
) -> Desired:
    """The catalog, read for planning; ``expected_spec`` answers "what would this replica run now"."""
    guarded: dict[str, list[str]] = {}
    for policy in catalog.guard_policies.values():
        guarded.setdefault(policy.judge, []).extend(policy.models)
    models: dict[str, ModelTarget] = {}
    for name, model in catalog.models.items():
        profiles = tuple(
            ProfileTarget(
                index=i,
                key=profile_key(model, i),
                claim=profile_claim(p),
                nodes=p.node_count,
                load_timeout=settings.load_timeout(p.engine, p.load_timeout),
            )
            for i, p in enumerate(model.profiles)
        )
        models[name] = ModelTarget(
            name=name,
            profiles=profiles,
            policy=ScalingPolicy.of(model, settings.default_target_in_flight),
            guarded=tuple(sorted(set(guarded.get(name, ())))),
            key=model_key(model),
        )
    return Desired(catalog_hash=catalog_hash, models=models, expected_spec=expected_spec)
