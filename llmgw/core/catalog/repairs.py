"""Legacy spellings the catalog still reads, each with a warning and a written repair.

Catalogs written before a rule existed must keep working: a llama.cpp profile's
``tp: N`` is read as ``gpus_per_node: N``; a Hugging Face repository page URL
given to vllm or sglang is read as the repository id. Each reading is a
``Repair``: the loader applies it to the data before validation, and
``llmgw catalog upgrade`` writes the same repair back into the operator's file.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from llmgw.core.catalog.rules import Finding, error, warning
from llmgw.core.catalog.sources import repository_id_of_page_url
from llmgw.core.catalog.yaml_source import SourceMap
from llmgw.core.diagnostics import YamlPath


class RepairKind(StrEnum):
    RENAME_KEY = "rename-key"
    REPLACE_VALUE = "replace-value"


@dataclass(frozen=True, slots=True)
class Repair:
    kind: RepairKind
    # RENAME_KEY: the mapping holding the key; REPLACE_VALUE: the value's own path.
    path: YamlPath
    old: str
    new: str
    description: str


_REPOSITORY_ENGINES = ("vllm", "sglang", "sim")


def apply_repairs(data: dict[str, Any], source_map: SourceMap) -> tuple[list[Repair], list[Finding]]:
    """Rewrite legacy spellings in ``data`` in place; return what was done and its warnings."""
    repairs: list[Repair] = []
    findings: list[Finding] = []
    models = data.get("models")
    if not isinstance(models, dict):
        return repairs, findings
    for model_name, model in models.items():
        profiles = model.get("profiles") if isinstance(model, dict) else None
        if not isinstance(profiles, list):
            continue
        for index, profile in enumerate(profiles):
            if not isinstance(profile, dict):
                continue
            path: YamlPath = ("models", model_name, "profiles", index)
            engine = profile.get("engine")
            if engine == "llamacpp" and "tp" in profile:
                _repair_llamacpp_tp(profile, path, source_map, repairs, findings)
            source = profile.get("source")
            if engine in _REPOSITORY_ENGINES and isinstance(source, str):
                repo = repository_id_of_page_url(source)
                if repo is not None:
                    profile["source"] = repo
                    description = f"source {source} -> {repo}"
                    repairs.append(
                        Repair(RepairKind.REPLACE_VALUE, (*path, "source"), source, repo, description)
                    )
                    findings.append(
                        warning(
                            (*path, "source"),
                            f"{source} is a repository page; read as the repository id {repo} "
                            "(run llmgw catalog upgrade to write it)",
                        )
                    )
    return repairs, findings


def _repair_llamacpp_tp(
    profile: dict[str, Any],
    path: YamlPath,
    source_map: SourceMap,
    repairs: list[Repair],
    findings: list[Finding],
) -> None:
    tp = profile["tp"]
    if "gpus_per_node" in profile:
        findings.append(
            error(
                (*path, "tp"),
                "llama.cpp has no tensor parallelism and gpus_per_node is already set; remove tp",
                at_key=True,
            )
        )
        return
    profile["gpus_per_node"] = profile.pop("tp")
    old, new = (*path, "tp"), (*path, "gpus_per_node")
    source_map.rename(old, new)
    repairs.append(
        Repair(RepairKind.RENAME_KEY, path, "tp", "gpus_per_node", f"tp: {tp} -> gpus_per_node: {tp}")
    )
    findings.append(
        warning(
            new,
            f"llama.cpp splits layers across the GPUs of one node; tp: {tp} is read as "
            f"gpus_per_node: {tp} (run llmgw catalog upgrade to write it)",
            at_key=True,
        )
    )
