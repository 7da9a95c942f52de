"""Each catalog rule, with a catalog that breaks only that rule: the line, the path and the message."""

from __future__ import annotations

import pytest

from llmgw.core.catalog import Engine, ScalingMode

from .conftest import Load, only, where

# (id, catalog text, expected line, expected path, words the message must contain)
BROKEN_CATALOGS = [
    (
        "unknown top-level key",
        """
        models: {}
        alias: {a: b}
        """,
        2,
        "alias",
        'unknown key "alias" (did you mean "aliases"?)',
    ),
    (
        "unknown model key (typo)",
        """
        models:
          m:
            profiles: [{engine: sim}]
            scalling: {min: 1, max: 1}
        """,
        4,
        "models.m.scalling",
        'unknown key "scalling" (did you mean "scaling"?)',
    ),
    (
        "unknown profile key",
        """
        models:
          m:
            profiles:
              - engine: sim
                tensor_parallel: 2
        """,
        5,
        "models.m.profiles[0].tensor_parallel",
        'unknown key "tensor_parallel"',
    ),
    (
        "bad model name",
        """
        models:
          "bad name!":
            profiles: [{engine: sim}]
        """,
        2,
        'models["bad name!"]',
        "is not a valid name",
    ),
    (
        "name too long",
        f"""
        models:
          {"a" * 129}:
            profiles: [{{engine: sim}}]
        """,
        2,
        f"models.{'a' * 129}",
        "is not a valid name",
    ),
    (
        "bad alias name",
        """
        models:
          m: {profiles: [{engine: sim}]}
        aliases:
          -m: m
        """,
        4,
        'aliases["-m"]',
        "is not a valid name",
    ),
    (
        "unknown engine",
        """
        models:
          m:
            profiles:
              - engine: tgi
        """,
        4,
        "models.m.profiles[0].engine",
        '"tgi" is not one of: vllm, sglang, llamacpp, sim',
    ),
    (
        "unknown role",
        """
        models:
          m:
            roles: [chat, rerank]
            profiles: [{engine: sim}]
        """,
        3,
        "models.m.roles[1]",
        '"rerank" is not one of',
    ),
    (
        "duplicate role",
        """
        models:
          m:
            roles: [chat, chat]
            profiles: [{engine: sim}]
        """,
        3,
        "models.m.roles[1]",
        "role chat is listed twice",
    ),
    (
        "no profiles",
        """
        models:
          m:
            profiles: []
        """,
        3,
        "models.m.profiles",
        "must have at least 1 item",
    ),
    (
        "profiles missing",
        """
        models:
          m:
            description: nothing to run
        """,
        3,
        "models.m",
        'missing required key "profiles"',
    ),
    (
        "tp is text",
        """
        models:
          m:
            profiles:
              - {engine: vllm, source: org/m, tp: "2"}
        """,
        4,
        "models.m.profiles[0].tp",
        'expected an integer, got text "2"',
    ),
    (
        "tp zero",
        """
        models:
          m:
            profiles:
              - {engine: vllm, source: org/m, tp: 0}
        """,
        4,
        "models.m.profiles[0].tp",
        "must be at least 1, got 0",
    ),
    (
        "source missing for a real engine",
        """
        models:
          m:
            profiles:
              - engine: vllm
                tp: 1
        """,
        4,
        "models.m.profiles[0]",
        'missing required key "source"',
    ),
    (
        "local path source",
        """
        models:
          m:
            profiles:
              - engine: vllm
                source: /models/llama
        """,
        5,
        "models.m.profiles[0].source",
        "local paths are not allowed",
    ),
    (
        "file URL given to vllm",
        """
        models:
          m:
            profiles:
              - engine: vllm
                source: https://example.org/m.gguf
        """,
        5,
        "models.m.profiles[0].source",
        "loads a model repository",
    ),
    (
        "repository given to llama.cpp",
        """
        models:
          m:
            profiles:
              - engine: llamacpp
                source: Qwen/Qwen2.5-7B-Instruct-GGUF
        """,
        5,
        "models.m.profiles[0].source",
        "llama.cpp loads one GGUF file",
    ),
    (
        "bad mirror reference",
        """
        models:
          m:
            profiles:
              - engine: vllm
                source: "mirror:llama"
        """,
        5,
        "models.m.profiles[0].source",
        "mirror:NAME@VERSION",
    ),
    (
        "ftp source",
        """
        models:
          m:
            profiles:
              - engine: llamacpp
                source: ftp://example.org/m.gguf
        """,
        5,
        "models.m.profiles[0].source",
        "ftp:// sources are not supported",
    ),
    (
        "GPUs do not divide over nodes",
        """
        models:
          m:
            profiles:
              - engine: vllm
                source: org/m
                tp: 3
                pp: 2
                nodes: 4
        """,
        8,
        "models.m.profiles[0].nodes",
        "tp × pp = 3 × 2 = 6 GPUs cannot be spread evenly over 4 nodes (6 / 4 is not whole)",
    ),
    (
        "gpus_per_node contradicts tp",
        """
        models:
          m:
            profiles:
              - engine: sglang
                source: org/m
                tp: 8
                nodes: 2
                gpus_per_node: 8
        """,
        8,
        "models.m.profiles[0].gpus_per_node",
        "is 4 per node",
    ),
    (
        "llama.cpp with pp",
        """
        models:
          m:
            profiles:
              - engine: llamacpp
                source: https://example.org/m.gguf
                pp: 2
        """,
        6,
        "models.m.profiles[0].pp",
        "write gpus_per_node: N",
    ),
    (
        "llama.cpp across nodes",
        """
        models:
          m:
            profiles:
              - engine: llamacpp
                source: https://example.org/m.gguf
                nodes: 2
        """,
        6,
        "models.m.profiles[0].nodes",
        "llama.cpp runs on one node, not 2; write gpus_per_node",
    ),
    (
        "llama.cpp with tp and gpus_per_node",
        """
        models:
          m:
            profiles:
              - engine: llamacpp
                source: https://example.org/m.gguf
                tp: 2
                gpus_per_node: 2
        """,
        6,
        "models.m.profiles[0].tp",
        "remove tp",
    ),
    (
        "sim options on a real engine",
        """
        models:
          m:
            profiles:
              - engine: vllm
                source: org/m
                sim: {tokens_per_second: 5}
        """,
        6,
        "models.m.profiles[0].sim",
        "applies to engine sim only",
    ),
    (
        "image on sim",
        """
        models:
          m:
            profiles:
              - engine: sim
                image: example/evil:latest
        """,
        5,
        "models.m.profiles[0].image",
        "takes no image",
    ),
    (
        "max below min",
        """
        models:
          m:
            profiles: [{engine: sim}]
            scaling: {min: 3, max: 2}
        """,
        4,
        "models.m.scaling.max",
        "max (2) is below min (3)",
    ),
    (
        "max missing",
        """
        models:
          m:
            profiles: [{engine: sim}]
            scaling: {min: 1}
        """,
        4,
        "models.m.scaling",
        'missing required key "max" (max is never filled in for you',
    ),
    (
        "negative min",
        """
        models:
          m:
            profiles: [{engine: sim}]
            scaling: {min: -1, max: 2}
        """,
        4,
        "models.m.scaling.min",
        "must be at least 0",
    ),
    (
        "bad duration",
        """
        models:
          m:
            profiles: [{engine: sim}]
            scaling: {min: 0, max: 1, idle_timeout: 15 minutes}
        """,
        4,
        "models.m.scaling.idle_timeout",
        "expected a duration like 30s, 15m, 2h",
    ),
    (
        "alias to unknown model",
        """
        models:
          llama: {profiles: [{engine: sim}]}
        aliases:
          gpt-4o: lama
        """,
        4,
        'aliases["gpt-4o"]',
        'unknown model "lama" (did you mean "llama"?)',
    ),
    (
        "alias shadows a model",
        """
        models:
          a: {profiles: [{engine: sim}]}
          b: {profiles: [{engine: sim}]}
        aliases:
          a: b
        """,
        5,
        "aliases.a",
        'alias "a" shadows the model of the same name',
    ),
    (
        "alias of an alias",
        """
        models:
          a: {profiles: [{engine: sim}]}
        aliases:
          b: a
          c: b
        """,
        5,
        "aliases.c",
        '"b" is itself an alias (of "a"); an alias must name a model',
    ),
    (
        "fallback from an unknown model",
        """
        models:
          a: {profiles: [{engine: sim}]}
        fallbacks:
          zz: [a]
        """,
        4,
        "fallbacks.zz",
        'unknown model "zz"',
    ),
    (
        "fallback to an unknown model",
        """
        models:
          a: {profiles: [{engine: sim}]}
        fallbacks:
          a: [b]
        """,
        4,
        "fallbacks.a[0]",
        'unknown model "b"',
    ),
    (
        "fallback to itself",
        """
        models:
          a: {profiles: [{engine: sim}]}
        fallbacks:
          a: [a]
        """,
        4,
        "fallbacks.a[0]",
        '"a" cannot fall back to itself',
    ),
    (
        "fallback cycle",
        """
        models:
          a: {profiles: [{engine: sim}]}
          b: {profiles: [{engine: sim}]}
          c: {profiles: [{engine: sim}]}
        fallbacks:
          a: [b]
          b: [c]
          c: [a]
        """,
        8,
        "fallbacks.c[0]",
        "fallback cycle: a -> b -> c -> a",
    ),
    (
        "fallback across roles",
        """
        models:
          chat: {profiles: [{engine: sim}]}
          embed: {roles: [embedding], profiles: [{engine: sim}]}
        fallbacks:
          chat: [embed]
        """,
        5,
        "fallbacks.chat[0]",
        '"embed" cannot stand in for "chat": they share no role',
    ),
    (
        "judge without role guard",
        """
        models:
          a: {profiles: [{engine: sim}]}
          j: {profiles: [{engine: sim}]}
        guard_policies:
          default: {judge: j, models: [a]}
        """,
        5,
        "guard_policies.default.judge",
        '"j" cannot judge: it does not have role guard',
    ),
    (
        "guarded model unknown",
        """
        models:
          j: {roles: [guard], profiles: [{engine: sim}]}
        guard_policies:
          default: {judge: j, models: [nope]}
        """,
        4,
        "guard_policies.default.models[0]",
        'unknown model "nope"',
    ),
    (
        "guard judge unknown",
        """
        models:
          a: {profiles: [{engine: sim}]}
        guard_policies:
          default: {judge: llama-guard, models: [a]}
        """,
        4,
        "guard_policies.default.judge",
        'unknown model "llama-guard"',
    ),
    (
        "model in two guard policies",
        """
        models:
          a: {profiles: [{engine: sim}]}
          j: {roles: [guard], profiles: [{engine: sim}]}
        guard_policies:
          one: {judge: j, models: [a]}
          two: {judge: j, models: [a]}
        """,
        6,
        "guard_policies.two.models[0]",
        'already screened by guard policy "one"',
    ),
    (
        "guard on_error unknown",
        """
        models:
          a: {profiles: [{engine: sim}]}
          j: {roles: [guard], profiles: [{engine: sim}]}
        guard_policies:
          one: {judge: j, models: [a], on_error: ignore}
        """,
        5,
        "guard_policies.one.on_error",
        '"ignore" is not one of: block, allow',
    ),
    (
        "refused env by allowlist",
        """
        models:
          m:
            profiles:
              - engine: vllm
                source: org/m
                env: {MY_SETTING: "1"}
        """,
        6,
        "models.m.profiles[0].env.MY_SETTING",
        "not in the allowlist",
    ),
    (
        "refused env LD_PRELOAD",
        """
        models:
          m:
            profiles:
              - engine: vllm
                source: org/m
                env:
                  LD_PRELOAD: /tmp/evil.so
        """,
        7,
        "models.m.profiles[0].env.LD_PRELOAD",
        "environment variable LD_PRELOAD is refused",
    ),
    (
        "refused env within an allowed family",
        """
        models:
          m:
            profiles:
              - engine: vllm
                source: org/m
                env:
                  NCCL_NET_PLUGIN: evil
        """,
        7,
        "models.m.profiles[0].env.NCCL_NET_PLUGIN",
        "loads a plugin",
    ),
    (
        "refused arg",
        """
        models:
          m:
            profiles:
              - engine: vllm
                source: org/m
                args: ["--max-model-len", "4096", "--trust-remote-code"]
        """,
        6,
        "models.m.profiles[0].args[2]",
        "argument --trust-remote-code is refused: runs code",
    ),
    (
        "owned arg",
        """
        models:
          m:
            profiles:
              - engine: vllm
                source: org/m
                args:
                  - --port=9000
        """,
        7,
        "models.m.profiles[0].args[0]",
        "llmgw sets it itself",
    ),
    (
        "boolean arg",
        """
        models:
          m:
            profiles:
              - engine: vllm
                source: org/m
                args: ["--enforce-eager", on]
        """,
        6,
        "models.m.profiles[0].args[1]",
        "YAML reads this as a boolean; write it in quotes",
    ),
    (
        "NUL in an env value",
        """
        models:
          m:
            profiles:
              - engine: vllm
                source: org/m
                env: {NCCL_DEBUG: "INFO\\0"}
        """,
        6,
        "models.m.profiles[0].env.NCCL_DEBUG",
        "NUL character",
    ),
    (
        "catalog is a list",
        """
        - models
        """,
        1,
        "",
        "the catalog must be a mapping",
    ),
]


@pytest.mark.parametrize(
    ("text", "line", "path", "message"),
    [case[1:] for case in BROKEN_CATALOGS],
    ids=[case[0] for case in BROKEN_CATALOGS],
)
def test_each_rule_reports_its_line_path_and_message(
    load: Load, text: str, line: int, path: str, message: str
) -> None:
    result = load(text)
    assert not result.ok
    diagnostic = only(result)
    assert where(diagnostic) == (line, path)
    assert message in diagnostic.message, diagnostic.format()


def test_every_error_is_reported_in_one_run(load: Load) -> None:
    result = load("""
        models:
          a:
            profiles: [{engine: vllm, source: org/a, tp: 3, nodes: 2}]
            scalling: {}
          b:
            profiles: [{engine: vllm, source: org/b, env: {LD_PRELOAD: x}}]
        aliases: {c: nope}
        fallbacks: {b: [zz]}
        """)
    paths = [where(d)[1] for d in result.errors]
    assert paths == [
        "models.a.profiles[0].nodes",
        "models.a.scalling",
        "models.b.profiles[0].env.LD_PRELOAD",
        "aliases.c",
        "fallbacks.b[0]",
    ]


def test_formats_compiler_style(load: Load) -> None:
    result = load("""
        models:
          m:
            profiles: [{engine: sim}]
            scaling: {min: 2, max: 1}
        """)
    assert only(result).format() == (
        "catalog.yaml:4:28: error: models.m.scaling.max: max (1) is below min (2)"
    )
    assert only(result).as_dict() == {
        "file": "catalog.yaml",
        "line": 4,
        "column": 28,
        "path": "models.m.scaling.max",
        "severity": "error",
        "message": "max (1) is below min (2)",
    }


@pytest.mark.parametrize(
    ("scaling", "mode"),
    [
        ("", ScalingMode.UNSET),
        ("scaling: {min: 0, max: 0}", ScalingMode.OFF),
        ("scaling: {min: 0, max: 3}", ScalingMode.ON_DEMAND),
        ("scaling: {min: 1, max: 3}", ScalingMode.KEEP_RUNNING),
    ],
)
def test_scaling_modes(load: Load, scaling: str, mode: ScalingMode) -> None:
    result = load(f"""
        models:
          m:
            profiles: [{{engine: sim}}]
            {scaling}
        """)
    assert result.catalog is not None, [d.format() for d in result.diagnostics]
    assert result.catalog.models["m"].scaling_mode is mode


def test_durations_accept_units_and_seconds(load: Load) -> None:
    result = load("""
        models:
          a: {profiles: [{engine: sim}], scaling: {min: 0, max: 1, idle_timeout: 2h}}
          b: {profiles: [{engine: sim}], scaling: {min: 0, max: 1, idle_timeout: 90}}
          c: {profiles: [{engine: sim}], scaling: {min: 0, max: 1}}
        """)
    assert result.catalog is not None
    timeouts = {name: m.idle_timeout_seconds for name, m in result.catalog.models.items()}
    assert timeouts == {"a": 7200, "b": 90, "c": 15 * 60}


def test_idle_timeout_on_a_kept_running_model_is_a_warning(load: Load) -> None:
    result = load("""
        models:
          m:
            profiles: [{engine: sim}]
            scaling: {min: 1, max: 1, idle_timeout: 5m}
        """)
    assert result.ok
    assert where(only(result, "warning")) == (4, "models.m.scaling.idle_timeout")


def test_gpu_arithmetic(load: Load) -> None:
    result = load("""
        models:
          two-node:
            profiles: [{engine: sglang, source: org/m, tp: 16, nodes: 2}]
          gguf:
            profiles: [{engine: llamacpp, source: "https://example.org/m.gguf", gpus_per_node: 2}]
          gguf-default:
            profiles: [{engine: llamacpp, source: "https://example.org/m.gguf"}]
          cpu:
            profiles: [{engine: llamacpp, source: "https://example.org/m.gguf", gpus_per_node: 0}]
        """)
    assert result.catalog is not None
    shapes = {
        name: (
            m.profiles[0].node_count,
            m.profiles[0].gpus_per_replica_node,
            m.profiles[0].total_gpus,
            m.profiles[0].requests_gpus,
        )
        for name, m in result.catalog.models.items()
    }
    assert shapes == {
        "two-node": (2, 8, 16, True),
        "gguf": (1, 2, 2, True),
        "gguf-default": (1, 1, 1, True),
        "cpu": (1, 0, 0, False),
    }


def test_llamacpp_legacy_tp_is_read_as_gpus_per_node_with_a_warning(load: Load) -> None:
    result = load("""
        models:
          m:
            profiles:
              - engine: llamacpp
                source: https://example.org/m.gguf
                tp: 2
        """)
    assert result.catalog is not None
    assert result.catalog.models["m"].profiles[0].gpus_per_node == 2
    warning = only(result, "warning")
    assert where(warning) == (6, "models.m.profiles[0].gpus_per_node")
    assert "tp: 2 is read as gpus_per_node: 2" in warning.message


@pytest.mark.parametrize(
    "url",
    [
        "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct",
        "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/",
        "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/tree/main",
    ],
)
def test_repository_page_url_is_read_as_repository_id(load: Load, url: str) -> None:
    result = load(f"""
        models:
          m:
            profiles:
              - engine: vllm
                source: {url}
        """)
    assert result.catalog is not None
    assert result.catalog.models["m"].profiles[0].source == "meta-llama/Llama-3.1-8B-Instruct"
    warning = only(result, "warning")
    assert where(warning) == (5, "models.m.profiles[0].source")
    assert "read as the repository id meta-llama/Llama-3.1-8B-Instruct" in warning.message


def test_a_model_is_simulated_only_when_every_profile_is_sim(load: Load) -> None:
    result = load("""
        models:
          sim-only: {profiles: [{engine: sim}, {engine: sim, tp: 2}]}
          mixed: {profiles: [{engine: vllm, source: org/m}, {engine: sim}]}
        """)
    assert result.catalog is not None
    assert result.catalog.models["sim-only"].is_simulated
    assert not result.catalog.models["mixed"].is_simulated
    assert result.catalog.models["mixed"].profiles[1].engine is Engine.SIM


def test_numbers_in_args_and_env_arrive_as_the_text_written(load: Load) -> None:
    result = load("""
        models:
          m:
            profiles:
              - engine: vllm
                source: org/m
                args: ["--max-model-len", 16384, "--gpu-memory-utilization", 0.9]
                env: {OMP_NUM_THREADS: 8}
        """)
    assert result.catalog is not None
    profile = result.catalog.models["m"].profiles[0]
    assert profile.args == ("--max-model-len", "16384", "--gpu-memory-utilization", "0.9")
    assert profile.env == {"OMP_NUM_THREADS": "8"}


def test_aliases_and_fallbacks_resolve(load: Load) -> None:
    result = load("""
        models:
          big: {profiles: [{engine: sim}]}
          small: {profiles: [{engine: sim}]}
        aliases: {gpt-4o: big, mini: small}
        fallbacks: {big: [mini]}
        """)
    assert result.catalog is not None
    assert result.catalog.resolve("gpt-4o") == "big"
    assert result.catalog.resolve("big") == "big"
    assert result.catalog.resolve("gpt-5") is None


def test_empty_catalog_is_valid_with_a_warning(load: Load) -> None:
    result = load("")
    assert result.ok
    assert "declares no models" in only(result, "warning").message


def test_vllm_shape_is_written_as_tp_not_gpus_per_node(load: Load) -> None:
    result = load("""
        models:
          m:
            profiles:
              - engine: vllm
                source: org/m
                gpus_per_node: 4
        """)
    diagnostic = only(result)
    assert where(diagnostic) == (6, "models.m.profiles[0].gpus_per_node")
    assert "write tp: 4 instead" in diagnostic.message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("args", '["--x", "${NOMAD_TOKEN}"]'),
        ("env", '{NCCL_DEBUG: "${NOMAD_SECRETS_DIR}"}'),
        ("source", '"https://e.org/${attr.unique.hostname}.gguf"'),
        ("gpu", '{model: "${node.unique.name}"}'),
    ],
)
def test_nomad_runtime_interpolation_is_refused_in_catalog_values(load: Load, key: str, value: str) -> None:
    result = load(f"""
        models:
          m:
            profiles:
              - engine: llamacpp
                {key}: {value}
        """)
    assert any("Nomad would replace at run time" in d.message for d in result.errors), result.diagnostics


def test_a_trailing_newline_does_not_slip_a_name_past_its_pattern(load: Load) -> None:
    # re's $ matches before a final newline: "NCCL_CONF_FILE\n" matched the env name
    # pattern, then escaped the *_FILE deny pattern (fnmatch anchors at the very end)
    # while still starting with the allowed NCCL_ prefix.
    result = load("""
        models:
          m:
            profiles:
              - engine: vllm
                source: org/m
                env: {"NCCL_CONF_FILE\\n": /tmp/x}
            roles: [chat]
          j: {roles: [guard], profiles: [{engine: sim}]}
        guard_policies:
          "default\\n": {judge: j, models: [m]}
        """)
    messages = sorted(d.message for d in result.errors)
    assert len(messages) == 2, messages
    assert "not a valid policy name" in messages[0]
    assert "not a valid environment variable name" in messages[1]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("args", '["--x", "$@@fabric@@"]'),
        ("args", '["@@replica@@x"]'),
        ("env", '{NCCL_DEBUG: "@@llmgw-spec-hash@@"}'),
        ("source", '"https://e.org/@@version@@.gguf"'),
        ("gpu", '{model: "@@fabric@@"}'),
        ("image", '"ghcr.io/ggml-org/llama.cpp:@@version@@"'),
    ],
)
def test_a_catalog_value_cannot_hold_a_renderer_placeholder(load: Load, key: str, value: str) -> None:
    # The renderer fills @@...@@ slots after escaping: catalog text holding one would be
    # rewritten after it was escaped ("$@@fabric@@" and a fabric "{x}" give "${x}").
    result = load(f"""
        models:
          m:
            profiles:
              - engine: llamacpp
                {key}: {value}
        """)
    assert any("@@" in d.message and "reserves" in d.message for d in result.errors), result.diagnostics
