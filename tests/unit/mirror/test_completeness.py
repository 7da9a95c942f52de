"""The completeness rule, check_reference, manifests and gc decisions."""

from __future__ import annotations

import pytest

from llmgw.core.mirror import (
    Manifest,
    ManifestError,
    ManifestFile,
    MirrorIndex,
    PlannedFile,
    RelPath,
    Sha256Hex,
    VersionPlan,
    VersionState,
    assess_version,
    check_reference,
    check_rel_path,
    manifest_from_plan,
    parse_ref,
    plan_gc,
)

REF = parse_ref("llama@v1")


def sha(c: str) -> Sha256Hex:
    return Sha256Hex(c * 64)


SHARDS = [RelPath(f"model-0000{i}-of-00003.safetensors") for i in (1, 2, 3)]
PLAN = VersionPlan(
    ref=REF,
    source="hf:org/llama",
    revision="c" * 40,
    files=(
        PlannedFile(RelPath("config.json"), 5, None),
        PlannedFile(RelPath("model.safetensors.index.json"), 7, None),
        *(PlannedFile(s, 100, sha("a")) for s in SHARDS),
    ),
    index_shards=frozenset(SHARDS),
)


def verified(*paths: str, size: int = 100, digest: str = "a") -> dict[RelPath, ManifestFile]:
    sizes = {"config.json": 5, "model.safetensors.index.json": 7}
    return {
        RelPath(p): ManifestFile(RelPath(p), sizes.get(p, size), sha(digest if p in SHARDS else "b"))
        for p in paths
    }


ALL = ["config.json", "model.safetensors.index.json", *SHARDS]


def test_complete_only_when_every_file_is_verified_and_nothing_downloads() -> None:
    status = assess_version(PLAN, verified(*ALL), downloading=False)
    assert status.state is VersionState.COMPLETE
    assert (status.files_verified, status.files_total, status.bytes_verified) == (5, 5, 312)
    assert assess_version(PLAN, verified(*ALL), downloading=True).state is VersionState.DOWNLOADING


def test_partial_version_is_incomplete_and_check_reference_says_n_of_m() -> None:
    status = assess_version(PLAN, verified("config.json", SHARDS[0]), downloading=False)
    assert status.state is VersionState.INCOMPLETE
    index = MirrorIndex.of([status])
    assert check_reference(REF, index) == "mirror:llama@v1 is not complete: 2 of 5 files"


def test_a_shard_with_the_wrong_hash_or_size_does_not_count() -> None:
    wrong_hash = verified(*ALL) | verified(SHARDS[1], digest="f")
    assert assess_version(PLAN, wrong_hash, downloading=False).files_verified == 4
    wrong_size = verified(*ALL) | verified(SHARDS[2], size=99)
    assert assess_version(PLAN, wrong_size, downloading=False).state is VersionState.INCOMPLETE


def test_a_plan_whose_index_names_an_unplanned_shard_is_never_complete() -> None:
    plan = VersionPlan(REF, "x", None, PLAN.files, PLAN.index_shards | {RelPath("model-extra.safetensors")})
    assert assess_version(plan, verified(*ALL), downloading=False).state is VersionState.INCOMPLETE


def test_check_reference_messages() -> None:
    index = MirrorIndex.of(
        [
            assess_version(PLAN, verified(*ALL), downloading=False),
            assess_version(
                VersionPlan(parse_ref("llama@v2"), "x", None, PLAN.files),
                verified("config.json"),
                downloading=True,
            ),
        ]
    )
    assert check_reference(REF, index) is None
    assert check_reference(parse_ref("llama@v2"), index) == (
        "mirror:llama@v2 is not complete: still downloading, 1 of 5 files"
    )
    unknown = check_reference(parse_ref("llama@v3"), index)
    assert unknown is not None and "unknown mirror version" in unknown and "llama@v1 (complete)" in unknown
    other = check_reference(parse_ref("qwen@v1"), index)
    assert other is not None and "no model named 'qwen'" in other


def test_index_round_trips_through_json() -> None:
    index = MirrorIndex.of([assess_version(PLAN, verified("config.json"), downloading=False)])
    assert MirrorIndex.from_json(index.to_json()) == index
    with pytest.raises(ManifestError):
        MirrorIndex.from_json('{"format": 1, "versions": [{"name": "../x"}]}')


def test_manifest_round_trip_and_determinism() -> None:
    manifest = manifest_from_plan(PLAN, verified(*ALL))
    assert Manifest.from_json(manifest.to_json()) == manifest
    assert manifest.to_json() == manifest_from_plan(PLAN, dict(reversed(verified(*ALL).items()))).to_json()
    assert VersionPlan.from_json(PLAN.to_json()) == PLAN
    with pytest.raises(ManifestError, match="not complete"):
        manifest_from_plan(PLAN, verified("config.json"))


@pytest.mark.parametrize("path", ["../etc/passwd", "/abs", "a//b", ".hidden", "a/./b", "x.part", "", "a\\b"])
def test_unsafe_paths_are_refused(path: str) -> None:
    with pytest.raises(ManifestError):
        check_rel_path(path)


def test_a_manifest_from_the_network_with_a_traversal_path_is_refused() -> None:
    text = manifest_from_plan(PLAN, verified(*ALL)).to_json().replace("config.json", "../../config.json")
    with pytest.raises(ManifestError, match="unsafe file path"):
        Manifest.from_json(text)


def test_gc_keeps_referenced_and_downloading_versions() -> None:
    v1 = assess_version(PLAN, verified(*ALL), downloading=False)
    v2 = assess_version(VersionPlan(parse_ref("llama@v2"), "x", None, PLAN.files), {}, downloading=False)
    v3 = assess_version(VersionPlan(parse_ref("llama@v3"), "x", None, PLAN.files), {}, downloading=True)
    plan = plan_gc(MirrorIndex.of([v1, v2, v3]), [REF, parse_ref("gone@v9")])
    assert [(d.status.ref.version, d.delete, d.reason) for d in plan.decisions] == [
        ("v1", False, "referenced"),
        ("v2", True, "not referenced (incomplete)"),
        ("v3", False, "downloading"),
    ]
    assert plan.unknown_keeps == (parse_ref("gone@v9"),)
