"""YAML that tries to hurt the loader: every attempt is refused quickly, with a position."""

from __future__ import annotations

from llmgw.core.catalog import SecurityPolicy
from llmgw.core.catalog.yaml_source import ReadLimits, read_yaml
from llmgw.core.diagnostics import Diagnostic, Severity, printable
from llmgw.render import Renderer, RenderSettings, ReplicaRequest

from .conftest import Load, only, where


def test_duplicate_keys_are_errors_not_last_wins(load: Load) -> None:
    result = load("""
        models:
          m:
            profiles: [{engine: sim}]
            scaling: {min: 1, max: 1}
            scaling: {min: 0, max: 0}
        """)
    diagnostic = only(result)
    assert where(diagnostic) == (5, "models.m.scaling")
    assert 'duplicate key "scaling" (first defined at line 4)' in diagnostic.message


def test_duplicate_model_names(load: Load) -> None:
    result = load("""
        models:
          m: {profiles: [{engine: sim}]}
          m: {profiles: [{engine: vllm, source: org/m}]}
        """)
    assert where(only(result)) == (3, "models.m")


def _billion_laughs(levels: int) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels):
        refs = ", ".join([f"*a{level - 1}"] * 9)
        lines.append(f"a{level}: &a{level} [{refs}]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_without_expanding_it(load: Load) -> None:
    # 9**10 = 3.5 billion strings if expanded; refused by counting, in microseconds.
    result = load(_billion_laughs(10))
    diagnostic = only(result)
    assert "alias bomb" in diagnostic.message
    assert diagnostic.position is not None


def test_small_legitimate_aliases_and_merge_keys_still_work(load: Load) -> None:
    result = load("""
        x-profiles:  # top-level x-* keys hold anchors, as in docker compose files
          vllm: &vllm
            engine: vllm
            source: org/m
        models:
          a: {profiles: [*vllm]}
          b:
            profiles:
              - <<: *vllm
                tp: 2
        """)
    assert result.catalog is not None, [d.format() for d in result.diagnostics]
    assert result.catalog.models["a"].profiles[0].source == "org/m"
    assert result.catalog.models["b"].profiles[0].tp == 2
    assert result.catalog.models["b"].profiles[0].source == "org/m"


def test_recursive_alias_is_refused() -> None:
    result = read_yaml("a: &a\n  - *a\n", filename="c.yaml")
    assert "recursive alias" in result.diagnostics[0].message


def test_object_constructing_tags_are_refused(load: Load) -> None:
    result = load("""
        models:
          m: !!python/object/apply:os.system ["touch /tmp/pwned"]
        """)
    diagnostic = only(result)
    assert "YAML tag tag:yaml.org,2002:python/object/apply:os.system is not allowed" in diagnostic.message
    assert where(diagnostic) == (2, "models.m")


def test_huge_file_is_refused_before_parsing() -> None:
    text = "models: {}\n" + "# padding\n" * 10
    result = read_yaml(text, filename="c.yaml", limits=ReadLimits(max_bytes=64))
    assert result.data is None
    assert "the limit is 64" in result.diagnostics[0].message


def test_default_limit_refuses_a_very_large_upload() -> None:
    text = "models: {}\n" + "#" * (17 * 1024 * 1024)
    result = read_yaml(text, filename="c.yaml")
    assert "bytes; the limit is" in result.diagnostics[0].message


def test_deep_nesting_is_refused() -> None:
    text = "a: " + "[" * 100 + "]" * 100 + "\n"
    result = read_yaml(text, filename="c.yaml")
    assert "nests deeper than 64" in result.diagnostics[0].message


def test_syntax_error_points_at_the_line(load: Load) -> None:
    result = load("""
        models:
          m: {profiles: [{engine: sim}]
        aliases: {}
        """)
    diagnostic = only(result)
    assert diagnostic.message.startswith("YAML syntax:")
    assert diagnostic.position is not None and diagnostic.position.line == 3


def test_multiple_documents_are_refused(load: Load) -> None:
    result = load("models: {}\n---\nmodels: {}\n")
    assert only(result).message.startswith("YAML syntax:")


def test_dates_and_yes_stay_the_text_written(load: Load) -> None:
    result = load("""
        models:
          yes:
            description: 2024-01-01
            profiles: [{engine: sim}]
        """)
    assert result.catalog is not None
    assert result.catalog.models["yes"].description == "2024-01-01"


def test_a_replica_shape_too_large_to_render_is_refused(load: Load) -> None:
    # One task group per node: nodes 10000000 would make the admin preview and the control
    # plane render gigabytes of HCL. Refused as a shape error, before anything renders.
    result = load("""
        models:
          m:
            profiles: [{engine: sim, tp: 10000000, nodes: 10000000}]
        """)
    messages = sorted(d.message for d in result.errors)
    assert messages == ["must be at most 1024, got 10000000", "must be at most 64, got 10000000"]
    assert all(d.position is not None for d in result.errors)
    for key, value in (("pp", 1025), ("gpus_per_node", 65)):
        refused = load(f"""
            models:
              m:
                profiles: [{{engine: sim, {key}: {value}}}]
            """)
        assert where(only(refused))[1] == f"models.m.profiles[0].{key}"


def test_the_largest_allowed_replica_still_renders(load: Load, shipped_policy: SecurityPolicy) -> None:
    result = load("""
        models:
          m:
            profiles: [{engine: sim, tp: 64, nodes: 64}]
        """)
    assert result.catalog is not None
    renderer = Renderer(RenderSettings(), shipped_policy)
    rendered = renderer.render(result.catalog, ReplicaRequest("m", 0, "0", "f"), catalog_hash="h")
    assert len(renderer.check(rendered, model="m")["TaskGroups"]) == 64


def test_a_diagnostics_text_form_escapes_what_a_terminal_would_obey() -> None:
    # Keys, values and the file name are the catalog's: ESC, BEL, C1 controls, DEL,
    # bidi overrides, line breaks and lone surrogates are shown as escapes, nothing else is.
    hostile = Diagnostic(
        Severity.ERROR,
        ("models", "m\x1b]0;pwned\x07", "profiles", 0, "x\n"),
        'unknown key "\u202e\x9b\x7f\ud800" in modèle',
        file="c\x1b[2J.yaml",
    )
    assert hostile.format() == (
        'c\\x1b[2J.yaml:1:1: error: models["m\\x1b]0;pwned\\x07"].profiles[0]["x\\x0a"]: '
        'unknown key "\\u202e\\x9b\\x7f\\ud800" in modèle'
    )
    assert hostile.as_dict()["path"] == 'models["m\x1b]0;pwned\x07"].profiles[0]["x\n"]'
    assert hostile.as_dict()["message"] == hostile.message
    assert printable("plain text, späce and 模型") == "plain text, späce and 模型"
