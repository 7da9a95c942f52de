"""Choosing what to mirror from a repository listing: what an engine needs, never the whole repository.

Owns the rules: the safetensors set named by ``model.safetensors.index.json``
(or the single ``model.safetensors``) plus config, tokenizer and generation
files; or the GGUF file(s) the user asked for with ``--file`` (a name or glob;
a split GGUF brings all its parts). Must not list or fetch anything: the
listing and the index's text are inputs.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from llmgw.core.mirror.manifest import ManifestError, PlannedFile, RelPath, Sha256Hex, check_rel_path

SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_SINGLE = "model.safetensors"

# Top-level files an engine (transformers' loaders in vLLM/SGLang) reads besides the weights.
SUPPORT_FILES: frozenset[str] = frozenset(
    {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "vocab.txt",
        "merges.txt",
        "chat_template.json",
        "chat_template.jinja",
        "preprocessor_config.json",
        "processor_config.json",
    }
)
# Custom code that ``trust_remote_code`` models import, and tokenizer files with model-specific names.
SUPPORT_PATTERNS: tuple[str, ...] = (
    "configuration_*.py",
    "modeling_*.py",
    "tokenization_*.py",
    "*.tiktoken",
)
_SPLIT_GGUF = re.compile(r"(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf")
_LISTED_MAX = 8


class SelectionError(ValueError):
    """The repository does not hold what an engine needs, or the choice is ambiguous."""


@dataclass(frozen=True, order=True)
class RepoFile:
    """One file of a repository listing; ``sha256`` is the LFS oid when the file is in LFS."""

    path: str
    size: int
    sha256: Sha256Hex | None


@dataclass(frozen=True)
class Selection:
    files: tuple[PlannedFile, ...]
    index_shards: frozenset[RelPath]
    kind: str  # "safetensors" or "gguf": said in progress output


def index_path(listing: Iterable[RepoFile], patterns: Sequence[str] = ()) -> str | None:
    """The safetensors index to read before selecting, when selection will need it."""
    if patterns:
        return None
    return SAFETENSORS_INDEX if any(f.path == SAFETENSORS_INDEX for f in listing) else None


def shards_of_index(index_text: str) -> frozenset[str]:
    """The shard file names the index's ``weight_map`` points at."""
    try:
        doc = json.loads(index_text)
    except ValueError as exc:
        raise SelectionError(f"{SAFETENSORS_INDEX} is not JSON: {exc}") from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise SelectionError(f"{SAFETENSORS_INDEX} has no weight_map")
    shards = set(weight_map.values())
    if not all(isinstance(s, str) for s in shards):
        raise SelectionError(f"{SAFETENSORS_INDEX}: weight_map values must be file names")
    return frozenset(shards)


def select_files(
    listing: Sequence[RepoFile],
    *,
    patterns: Sequence[str] = (),
    index_shards: frozenset[str] | None = None,
) -> Selection:
    """Pick the files to mirror. ``index_shards`` is ``shards_of_index`` of the index ``index_path`` named."""
    by_path = {f.path: f for f in listing}
    if patterns:
        return _select_by_patterns(by_path, patterns)
    if SAFETENSORS_INDEX in by_path:
        if index_shards is None:
            raise SelectionError(f"read {SAFETENSORS_INDEX} first: its weight_map names the shards")
        missing = sorted(s for s in index_shards if s not in by_path)
        if missing:
            raise SelectionError(
                f"{SAFETENSORS_INDEX} names shards the repository does not have: {_listed(missing)}"
            )
        weights = [by_path[SAFETENSORS_INDEX], *(by_path[s] for s in sorted(index_shards))]
        return _with_support(by_path, weights, frozenset(index_shards))
    if SAFETENSORS_SINGLE in by_path:
        return _with_support(by_path, [by_path[SAFETENSORS_SINGLE]], frozenset())
    ggufs = sorted(p for p in by_path if p.endswith(".gguf"))
    if ggufs:
        raise SelectionError(
            f"the repository has {len(ggufs)} GGUF file(s); pick one with --file NAME.gguf: {_listed(ggufs)}"
        )
    if any(p.endswith((".bin", ".pt", ".pth")) for p in by_path):
        raise SelectionError(
            "the repository has no safetensors weights (only pickled .bin/.pt): only safetensors and GGUF "
            "are mirrored"
        )
    raise SelectionError(
        f"the repository has neither {SAFETENSORS_INDEX}, {SAFETENSORS_SINGLE} nor a GGUF file"
    )


def _select_by_patterns(by_path: dict[str, RepoFile], patterns: Sequence[str]) -> Selection:
    chosen: dict[str, RepoFile] = {}
    for pattern in patterns:
        matched = [f for p, f in by_path.items() if fnmatch.fnmatchcase(p, pattern)]
        if not matched:
            candidates = sorted(p for p in by_path if p.endswith(".gguf")) or sorted(by_path)
            raise SelectionError(
                f"--file {pattern} matches no file of the repository; it has {_listed(candidates)}"
            )
        for f in matched:
            chosen[f.path] = f
            for part in _split_parts(f.path, by_path):
                chosen[part.path] = part
    files = sorted(chosen.values())
    if all(f.path.endswith(".gguf") for f in files):
        return Selection(files=_planned(files), index_shards=frozenset(), kind="gguf")
    return _with_support(by_path, files, frozenset())


def _split_parts(path: str, by_path: dict[str, RepoFile]) -> list[RepoFile]:
    """``x-00001-of-00003.gguf`` loads its sibling parts; mirroring one part alone would be useless."""
    match = _SPLIT_GGUF.fullmatch(path)
    if match is None:
        return []
    count = int(match["count"])
    names = [f"{match['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
    missing = [n for n in names if n not in by_path]
    if missing:
        raise SelectionError(f"{path} is part of a split GGUF whose parts are missing: {_listed(missing)}")
    return [by_path[n] for n in names]


def _with_support(by_path: dict[str, RepoFile], weights: list[RepoFile], shards: frozenset[str]) -> Selection:
    support = [
        f
        for p, f in by_path.items()
        if "/" not in p
        and (p in SUPPORT_FILES or any(fnmatch.fnmatchcase(p, pat) for pat in SUPPORT_PATTERNS))
    ]
    if "config.json" not in by_path:
        raise SelectionError(
            "the repository has no config.json: an engine cannot load safetensors without it"
        )
    files = sorted({f.path: f for f in [*weights, *support]}.values())
    try:
        return Selection(
            files=_planned(files),
            index_shards=frozenset(check_rel_path(s) for s in shards),
            kind="safetensors",
        )
    except ManifestError as exc:
        raise SelectionError(str(exc)) from None


def _planned(files: Iterable[RepoFile]) -> tuple[PlannedFile, ...]:
    try:
        return tuple(PlannedFile(path=check_rel_path(f.path), size=f.size, sha256=f.sha256) for f in files)
    except ManifestError as exc:
        raise SelectionError(str(exc)) from None


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_LISTED_MAX])
    return shown + (f" and {len(names) - _LISTED_MAX} more" if len(names) > _LISTED_MAX else "")


def gguf_to_load(paths: Iterable[str]) -> RelPath:
    """The one GGUF file of a version that ``llama-server --model`` must be given.

    A version holds one model: a single ``.gguf`` file, or every part of one split GGUF
    (``X-00001-of-0000N.gguf``), whose first part is the one to name, since llama.cpp
    derives the siblings' names from it (``llama_split_prefix`` in ``src/llama.cpp``:
    the path must end in ``-00001-of-0000N.gguf``). Multimodal projectors
    (``mmproj*.gguf``) are not a model. Raises ``SelectionError`` naming the GGUF files
    when there is none, more than one model, or a split with parts missing.
    """
    ggufs = sorted(p for p in paths if p.endswith(".gguf") and not p.rsplit("/", 1)[-1].startswith("mmproj"))
    models: dict[str, list[str]] = {}
    for path in ggufs:
        match = _SPLIT_GGUF.fullmatch(path)
        key = f"{match['stem']}-of-{match['count']}" if match else path
        models.setdefault(key, []).append(path)
    if not models:
        raise SelectionError(
            "the version holds no GGUF file for llama.cpp to load; mirror one "
            "(llmgw mirror add NAME@VERSION ORG/REPO --file FILE.gguf)"
        )
    if len(models) > 1:
        raise SelectionError(
            f"the version holds {len(models)} GGUF models ({_listed(ggufs)}), so which one llama.cpp "
            "should load is ambiguous; mirror one per version (--file FILE.gguf)"
        )
    [parts] = models.values()
    match = _SPLIT_GGUF.fullmatch(parts[0])
    if match is not None:
        count = int(match["count"])
        expected = [f"{match['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
        missing = [name for name in expected if name not in parts]
        if missing:
            raise SelectionError(
                f"{parts[0]} is part of a split GGUF whose parts are missing: {_listed(missing)}"
            )
        return RelPath(expected[0])
    return RelPath(parts[0])
