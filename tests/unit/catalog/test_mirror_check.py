"""``mirror:`` sources checked against a mirror's index: an error at each source's own line."""

from __future__ import annotations

from llmgw.core.catalog.mirror_check import check_mirror_sources, find_mirror_sources
from llmgw.core.diagnostics import Severity
from llmgw.core.mirror import MirrorIndex, VersionState, VersionStatus, parse_ref


def version(ref: str, state: VersionState, verified: int, total: int = 3) -> VersionStatus:
    return VersionStatus(
        ref=parse_ref(ref),
        state=state,
        files_total=total,
        files_verified=verified,
        bytes_total=total * 100,
        bytes_verified=verified * 100,
        source="hf:org/llama",
        revision=None,
    )


INDEX = MirrorIndex.of(
    [
        version("llama@v1", VersionState.COMPLETE, 3),
        version("llama@v2", VersionState.INCOMPLETE, 1),
        version("qwen@v1", VersionState.DOWNLOADING, 2),
    ]
)

CATALOG = """\
models:
  chat:
    profiles:
      - engine: vllm
        source: mirror:llama@v1
      - engine: sglang
        source: "mirror:llama@v2"
  coder:
    profiles:
      - {engine: vllm, source: 'mirror:qwen@v1'}
  other:
    profiles:
      - engine: vllm
        source: org/model
      - engine: vllm
        source: mirror:mistral@v3
      - engine: vllm
        source: mirror:llama@v9
"""


def test_each_problem_is_an_error_at_its_source_value() -> None:
    found = check_mirror_sources(CATALOG, INDEX, filename="catalog.yaml")
    assert [d.format() for d in found] == [
        "catalog.yaml:7:17: error: models.chat.profiles[1].source: mirror:llama@v2 is not complete: "
        "1 of 3 files",
        "catalog.yaml:10:32: error: models.coder.profiles[0].source: mirror:qwen@v1 is not complete: "
        "still downloading, 2 of 3 files",
        "catalog.yaml:16:17: error: models.other.profiles[1].source: mirror:mistral@v3: unknown mirror "
        "version; the mirror has no model named 'mistral'",
        "catalog.yaml:18:17: error: models.other.profiles[2].source: mirror:llama@v9: unknown mirror "
        "version; the mirror has llama@v1 (complete), llama@v2 (incomplete)",
    ]
    assert all(d.severity is Severity.ERROR for d in found)


def test_a_complete_version_and_other_kinds_of_source_pass() -> None:
    text = "models:\n  m:\n    profiles: [{engine: vllm, source: 'mirror:llama@v1'}, {engine: sim}]\n"
    assert check_mirror_sources(text, INDEX, filename="c.yaml") == ()


def test_every_use_of_a_version_is_reported_where_it_is_written() -> None:
    text = (
        "x-weights: &weights\n"
        "  source: mirror:llama@v2\n"
        "models:\n"
        "  a:\n"
        "    profiles:\n"
        "      - engine: vllm\n"
        "        source: mirror:llama@v2\n"
        "  b:\n"
        "    profiles:\n"
        "      - <<: *weights\n"
        "        engine: vllm\n"
    )
    found = check_mirror_sources(text, INDEX, filename="c.yaml")
    assert [(d.path, d.position and d.position.line) for d in found] == [
        # Merged from an anchor: the line the value is written on.
        (("models", "b", "profiles", 0, "source"), 2),
        (("models", "a", "profiles", 0, "source"), 7),
    ]


def test_mirror_sources_are_checked_even_when_the_catalog_has_other_errors() -> None:
    text = (
        "models:\n"
        "  a:\n"
        "    profiles:\n"
        "      - engine: vllm\n"
        "        tp: three\n"
        "        source: mirror:llama@v2\n"
        "    scaling: {min: 2, max: 1}\n"
    )
    found = check_mirror_sources(text, INDEX, filename="c.yaml")
    assert [d.message for d in found] == ["mirror:llama@v2 is not complete: 1 of 3 files"]


def test_malformed_or_unreadable_input_is_left_to_the_loader() -> None:
    assert find_mirror_sources("models: [", filename="c.yaml").found == ()
    assert find_mirror_sources("- a list\n", filename="c.yaml").found == ()
    bad = (
        "models:\n  m:\n    profiles:\n"
        "      - {source: 'mirror:no-version'}\n      - {source: 42}\n      - 7\n"
    )
    assert find_mirror_sources(bad, filename="c.yaml").found == ()
    assert check_mirror_sources(bad, INDEX, filename="c.yaml") == ()
