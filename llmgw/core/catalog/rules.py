"""The catalog's rules that span keys: names, references, GPU arithmetic, engines, security.

Owns every check that needs more than one key's value, run on a catalog whose
shape is already valid. Each rule yields ``Finding``s (severity, path, message)
and never stops at the first: an operator fixes a whole file in one round.
Positions are attached by the loader, which knows the source map.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from llmgw.core.catalog.allowlists import ClusterAllowlists, allowlist_refusals
from llmgw.core.catalog.model import (
    ENGINES_SPANNING_NODES,
    Catalog,
    Engine,
    Model,
    Profile,
    Role,
    Scaling,
    ScalingMode,
)
from llmgw.core.catalog.node_shapes import NodeGpus, shape_refusal
from llmgw.core.catalog.roles import mixed_roles_problem, role_contradictions
from llmgw.core.catalog.security import SecurityPolicy, check_args, check_env
from llmgw.core.catalog.sources import (
    FileUrlSource,
    RepositorySource,
    SourceError,
    parse_source,
)
from llmgw.core.catalog.tool_calling import parser_refusals, tool_calling_note
from llmgw.core.diagnostics import Severity, YamlPath
from llmgw.core.names import NAME_PATTERN, is_valid_name

_POLICY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True, slots=True)
class Finding:
    severity: Severity
    path: YamlPath
    message: str
    # Point at the key rather than its value (unknown names, misplaced keys).
    at_key: bool = False


def error(path: YamlPath, message: str, *, at_key: bool = False) -> Finding:
    return Finding(Severity.ERROR, path, message, at_key)


def warning(path: YamlPath, message: str, *, at_key: bool = False) -> Finding:
    return Finding(Severity.WARNING, path, message, at_key)


def check_catalog(
    catalog: Catalog,
    policy: SecurityPolicy,
    *,
    unvalidated_models: frozenset[str] = frozenset(),
    allowlists: ClusterAllowlists | None = None,
) -> list[Finding]:
    """Every rule over the parts of the catalog whose shape is valid.

    ``unvalidated_models`` are declared but failed their shape check (already
    reported): references to them are not "unknown", and rules that need their
    contents skip them. With ``allowlists``, each profile is also checked against
    the operator's (``llmgw.core.catalog.allowlists``).
    """
    findings: list[Finding] = []
    findings += _check_names(catalog, unvalidated_models)
    for name, model in catalog.models.items():
        findings += _check_model(("models", name), model, policy, allowlists)
    findings += _check_aliases(catalog, unvalidated_models)
    findings += _check_fallbacks(catalog, unvalidated_models)
    findings += _check_guard_policies(catalog, unvalidated_models)
    if not catalog.models and not unvalidated_models:
        findings.append(warning(("models",), "the catalog declares no models"))
    return findings


def _did_you_mean(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1)
    return f' (did you mean "{close[0]}"?)' if close else ""


def _check_names(catalog: Catalog, unvalidated: frozenset[str]) -> Iterator[Finding]:
    for section, names in (("models", [*catalog.models, *unvalidated]), ("aliases", list(catalog.aliases))):
        for name in names:
            if not is_valid_name(name):
                yield error(
                    (section, name),
                    f'"{name}" is not a valid name: it must match {NAME_PATTERN}',
                    at_key=True,
                )
    for name in catalog.guard_policies:
        if not _POLICY_NAME.fullmatch(name):
            yield error(
                ("guard_policies", name),
                f'"{name}" is not a valid policy name: it must match {_POLICY_NAME.pattern}',
                at_key=True,
            )


def _check_model(
    path: YamlPath, model: Model, policy: SecurityPolicy, allowlists: ClusterAllowlists | None
) -> Iterator[Finding]:
    seen_roles: set[Role] = set()
    for index, role in enumerate(model.roles):
        if role in seen_roles:
            yield error((*path, "roles", index), f"role {role} is listed twice")
        seen_roles.add(role)
    yield from _check_node_shapes(path, model, allowlists.node_gpus if allowlists is not None else ())
    for index, profile in enumerate(model.profiles):
        yield from check_profile_rules((*path, "profiles", index), profile, policy, allowlists, model.roles)
        yield from _check_roles((*path, "profiles", index), model, profile)
        note = tool_calling_note(profile, model.roles)
        if note is not None:
            yield Finding(Severity.NOTE, (*path, "profiles", index, "engine"), note)
    if model.scaling is not None:
        yield from _check_scaling((*path, "scaling"), model.scaling)


def check_profile_rules(
    path: YamlPath,
    profile: Profile,
    policy: SecurityPolicy,
    allowlists: ClusterAllowlists | None = None,
    roles: Sequence[Role] = (Role.CHAT,),
) -> Iterator[Finding]:
    """The rules of one profile (also run on the valid profiles of a model whose shape failed)."""
    yield from _check_source(path, profile)
    yield from _check_shape(path, profile)
    engine = profile.engine
    if engine is not Engine.SIM:
        for key in ("simulate_gpus", "sim"):
            if getattr(profile, key) is not None:
                yield error((*path, key), f"{key} applies to engine sim only, not {engine}", at_key=True)
    elif profile.image is not None:
        yield error((*path, "image"), "engine sim runs llmgw's own simulator; it takes no image", at_key=True)
    yield from check_profile_policy(path, profile, policy)
    if allowlists is not None:
        for key, refusal in allowlist_refusals(profile, allowlists, roles):
            yield error((*path, key), refusal)
    if allowlists is None or allowlists.engines is None:
        # Without the cluster's engines, what any release would refuse (llama.cpp's and the
        # sim's parsers); the renderer checks the rest against the image's release.
        for key, refusal in parser_refusals(profile, roles, None, {}):
            yield error((*path, key), refusal)


def check_profile_policy(path: YamlPath, profile: Profile, policy: SecurityPolicy) -> Iterator[Finding]:
    """The security policy over a profile's args and env: it needs only its engine, args
    and env, so it also runs on a profile whose other keys have the wrong shape."""
    for violation in check_args(policy, profile.engine, profile.args):
        yield error((*path, "args", violation.index if violation.index is not None else 0), violation.message)
    for violation in check_env(policy, profile.engine, profile.env):
        yield error((*path, "env", violation.subject), violation.message, at_key=True)


def _check_node_shapes(path: YamlPath, model: Model, shapes: Sequence[NodeGpus]) -> Iterator[Finding]:
    """A profile no node can hold: an error when no profile of the model fits, else a warning
    (profiles are in order of preference, and a portable one may name GPUs this cluster lacks)."""
    refusals = [(index, shape_refusal(profile, shapes)) for index, profile in enumerate(model.profiles)]
    none_fits = all(refusal is not None for _, refusal in refusals)
    for index, refusal in refusals:
        if refusal is not None:
            key, why = refusal
            if none_fits:
                yield error((*path, "profiles", index, key), why)
            else:
                yield warning((*path, "profiles", index, key), f"never placed on this cluster: {why}")


def _check_roles(path: YamlPath, model: Model, profile: Profile) -> Iterator[Finding]:
    """Args that start the engine for another role than the model's, and roles one engine cannot mix."""
    problem = mixed_roles_problem(profile.engine, model.roles)
    if problem is not None:
        yield warning((*path, "engine"), problem)
    for index, message in role_contradictions(profile.engine, model.roles, profile.args):
        yield warning((*path, "args", index), message)


def _check_source(path: YamlPath, profile: Profile) -> Iterator[Finding]:
    engine = profile.engine
    if profile.source is None:
        if engine is not Engine.SIM:
            yield error(path, f'missing required key "source" (engine {engine} needs weights to load)')
        return
    try:
        source = parse_source(profile.source)
    except SourceError as exc:
        yield error((*path, "source"), str(exc))
        return
    if isinstance(source, FileUrlSource) and not source.encrypted:
        yield warning(
            (*path, "source"),
            "plain http: the download is not encrypted or authenticated; "
            "prefer https:// or a mirror: source, which verifies checksums",
        )
    if engine in (Engine.VLLM, Engine.SGLANG) and isinstance(source, FileUrlSource):
        yield error(
            (*path, "source"),
            f"engine {engine} loads a model repository: write its repository id "
            "(ORG/NAME) or a mirror:NAME@VERSION source, not the URL of one file",
        )
    if engine is Engine.LLAMACPP and isinstance(source, RepositorySource):
        yield error(
            (*path, "source"),
            "llama.cpp loads one GGUF file: write its URL "
            f"(https://huggingface.co/{source.repo_id}/resolve/main/FILE.gguf) "
            "or a mirror:NAME@VERSION source",
        )


def _check_shape(path: YamlPath, profile: Profile) -> Iterator[Finding]:
    engine = profile.engine
    if engine is Engine.LLAMACPP:
        if profile.pp is not None:
            yield error(
                (*path, "pp"),
                "llama.cpp has no pipeline parallelism across nodes; write "
                "gpus_per_node: N to split the layers across the GPUs of one node",
                at_key=True,
            )
        if profile.nodes is not None and profile.nodes > 1:
            yield error(
                (*path, "nodes"),
                f"llama.cpp runs on one node, not {profile.nodes}; write "
                "gpus_per_node: N for the GPUs of that node",
                at_key=True,
            )
        if profile.gpu is not None and profile.gpus_per_node == 0:
            yield warning(
                (*path, "gpu"),
                "gpus_per_node is 0 (CPU only), so these GPU constraints are ignored",
                at_key=True,
            )
        return
    nodes = profile.node_count
    if nodes > 1 and engine not in ENGINES_SPANNING_NODES:  # pragma: no cover - every such engine is above
        yield error((*path, "nodes"), f"engine {engine} cannot span nodes")
    gpus = profile.tensor_parallel * profile.pipeline_parallel
    shaped_by_parallelism = (profile.tp, profile.pp, profile.nodes) != (None, None, None)
    if profile.gpus_per_node is not None and not shaped_by_parallelism and engine is not Engine.SIM:
        yield error(
            (*path, "gpus_per_node"),
            f"engine {engine} shards a model by tensor and pipeline parallelism: write tp: "
            f"{profile.gpus_per_node} instead (gpus_per_node is derived from tp, pp and nodes)",
            at_key=True,
        )
    elif (
        profile.gpus_per_node is not None
        and shaped_by_parallelism
        and gpus % nodes == 0
        and profile.gpus_per_node != gpus // nodes
    ):
        yield error(
            (*path, "gpus_per_node"),
            f"gpus_per_node is {profile.gpus_per_node}, but tp × pp = "
            f"{profile.tensor_parallel} × {profile.pipeline_parallel} = {gpus} GPUs over "
            f"{nodes} node(s) is {gpus // nodes} per node; remove gpus_per_node "
            "(it is derived) or correct it",
        )
    if gpus % nodes != 0:
        yield error(
            (*path, "nodes"),
            f"tp × pp = {profile.tensor_parallel} × {profile.pipeline_parallel} = {gpus} GPUs "
            f"cannot be spread evenly over {nodes} nodes ({gpus} / {nodes} is not whole)",
        )


def _check_scaling(path: YamlPath, scaling: Scaling) -> Iterator[Finding]:
    if scaling.max < scaling.min:
        yield error((*path, "max"), f"max ({scaling.max}) is below min ({scaling.min})")
        return
    if scaling.idle_timeout is not None and scaling.mode is not ScalingMode.ON_DEMAND:
        yield warning(
            (*path, "idle_timeout"),
            "ignored: only on-demand models (min 0, max > 0) are unloaded when idle",
            at_key=True,
        )
    if scaling.target_in_flight is not None and scaling.max == scaling.min:
        yield warning(
            (*path, "target_in_flight"),
            f"ignored: max equals min ({scaling.min}), so there is nothing to scale",
            at_key=True,
        )


def _check_aliases(catalog: Catalog, unvalidated: frozenset[str]) -> Iterator[Finding]:
    models = [*catalog.models, *unvalidated]
    for alias, target in catalog.aliases.items():
        if alias in models:
            yield error(
                ("aliases", alias),
                f'alias "{alias}" shadows the model of the same name; rename the alias or the model',
                at_key=True,
            )
        if target in models:
            continue
        if target in catalog.aliases:
            yield error(
                ("aliases", alias),
                f'"{target}" is itself an alias (of "{catalog.aliases[target]}"); an alias must name a model',
            )
        else:
            yield error(("aliases", alias), f'unknown model "{target}"{_did_you_mean(target, models)}')


def _check_fallbacks(catalog: Catalog, unvalidated: frozenset[str]) -> Iterator[Finding]:
    models = [*catalog.models, *unvalidated]

    def resolve(name: str) -> str | None:
        return name if name in unvalidated else catalog.resolve(name)

    graph: dict[str, list[str]] = {}
    for name, targets in catalog.fallbacks.items():
        path: YamlPath = ("fallbacks", name)
        if name not in models:
            if name in catalog.aliases:
                yield error(
                    path,
                    f'"{name}" is an alias; give fallbacks to the model it names, "{catalog.aliases[name]}"',
                    at_key=True,
                )
            else:
                yield error(path, f'unknown model "{name}"{_did_you_mean(name, models)}', at_key=True)
            continue
        resolved: list[str] = []
        for index, target in enumerate(targets):
            model = resolve(target)
            if model is None:
                yield error((*path, index), f'unknown model "{target}"{_did_you_mean(target, models)}')
                continue
            if model == name:
                yield error((*path, index), f'"{name}" cannot fall back to itself')
                continue
            if model in resolved:
                yield error((*path, index), f'"{target}" is listed twice')
                continue
            resolved.append(model)
            if name in catalog.models and model in catalog.models:
                ours, theirs = catalog.models[name], catalog.models[model]
                if not set(ours.roles) & set(theirs.roles):
                    yield error(
                        (*path, index),
                        f'"{target}" cannot stand in for "{name}": they share no '
                        f"role ({_roles(theirs)} vs {_roles(ours)})",
                    )
        graph[name] = resolved
    yield from _fallback_cycles(graph)


def _roles(model: Model) -> str:
    return ", ".join(model.roles)


def _fallback_cycles(graph: dict[str, list[str]]) -> Iterator[Finding]:
    """Each cycle once, reported at the edge that closes it."""
    reported: set[frozenset[str]] = set()
    state: dict[str, int] = {}  # 1 visiting, 2 done
    stack: list[str] = []

    def visit(node: str) -> Iterator[Finding]:
        state[node] = 1
        stack.append(node)
        for index, nxt in enumerate(graph.get(node, [])):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                members = frozenset(cycle)
                if members not in reported:
                    reported.add(members)
                    yield error(("fallbacks", node, index), "fallback cycle: " + " -> ".join(cycle))
            elif state.get(nxt) is None:
                yield from visit(nxt)
        stack.pop()
        state[node] = 2

    for start in graph:
        if state.get(start) is None:
            yield from visit(start)


def _check_guard_policies(catalog: Catalog, unvalidated: frozenset[str]) -> Iterator[Finding]:
    models = [*catalog.models, *unvalidated]
    guarded_by: dict[str, str] = {}
    for name, policy in catalog.guard_policies.items():
        path: YamlPath = ("guard_policies", name)
        judge = catalog.resolve(policy.judge)
        if policy.judge in unvalidated:
            pass
        elif judge is None:
            yield error(
                (*path, "judge"), f'unknown model "{policy.judge}"{_did_you_mean(policy.judge, models)}'
            )
        elif Role.GUARD not in catalog.models[judge].roles:
            yield error(
                (*path, "judge"),
                f'"{policy.judge}" cannot judge: it does not have role guard '
                f"(its roles: {_roles(catalog.models[judge])})",
            )
        for index, target in enumerate(policy.models):
            if target in unvalidated:
                continue
            model = catalog.resolve(target)
            if model is None:
                yield error(
                    (*path, "models", index), f'unknown model "{target}"{_did_you_mean(target, models)}'
                )
                continue
            if model == judge:
                yield error((*path, "models", index), f'"{target}" is the judge; it cannot screen itself')
                continue
            if model in guarded_by and guarded_by[model] != name:
                yield error(
                    (*path, "models", index),
                    f'"{target}" is already screened by guard policy "{guarded_by[model]}"; '
                    "a model has one guard policy",
                )
                continue
            guarded_by[model] = name
