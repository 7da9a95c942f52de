"""What the catalog asks for, prepared for planning: each model's profiles in order of
preference with the spec hash each would run, the GPUs they compete for, and the scaling rule.

Owns: reading the catalog into ``Desired`` once per catalog version, the GPU claim of a
profile (which placements must not be planned from the same snapshot), and which judge
guards which models. Must not: render jobs (the spec hashes come in from
``llmgw.render``, computed by the control loop) or decide counts (``llmgw.core.scaling``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from llmgw.core.catalog.model import Catalog, Profile
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


@dataclass(frozen=True, slots=True)
class ProfileTarget:
    index: int
    spec_hash: str  # what a replica of this profile runs: "changed?" is a compare
    claim: Claim
    nodes: int  # > 1: a multi-node replica, placed on one fabric
    load_timeout: float


@dataclass(frozen=True, slots=True)
class ModelTarget:
    name: str
    profiles: tuple[ProfileTarget, ...]
    policy: ScalingPolicy
    guarded: tuple[str, ...] = ()  # models whose requests this model (a judge) screens

    @property
    def claim(self) -> Claim:
        out: set[str] = set()
        for p in self.profiles:
            out |= p.claim
        return frozenset(out)

    def profile(self, index: int) -> ProfileTarget | None:
        return self.profiles[index] if 0 <= index < len(self.profiles) else None


@dataclass(frozen=True, slots=True)
class Desired:
    catalog_hash: str
    models: Mapping[str, ModelTarget] = field(default_factory=dict)


SpecHasher = Callable[[str, int], str]


def desired_from_catalog(
    catalog: Catalog, catalog_hash: str, spec_hash: SpecHasher, settings: PlanningSettings
) -> Desired:
    """``spec_hash(model, profile_index)``: the renderer's hash of what that profile runs."""
    guarded: dict[str, list[str]] = {}
    for policy in catalog.guard_policies.values():
        guarded.setdefault(policy.judge, []).extend(policy.models)
    models: dict[str, ModelTarget] = {}
    for name, model in catalog.models.items():
        profiles = tuple(
            ProfileTarget(
                index=i,
                spec_hash=spec_hash(name, i),
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
        )
    return Desired(catalog_hash=catalog_hash, models=models)
