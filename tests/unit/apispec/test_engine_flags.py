"""The vendored engine flag tables, and argv checked the way each release's parser reads it."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from llmgw.apispec.engine_flags import (
    Risk,
    UnknownImage,
    check_argv,
    ray_start_table,
    release_tables,
    tables_for_image,
)
from llmgw.core.catalog.model import Engine
from llmgw.render import DEFAULT_IMAGES

REPO = Path(__file__).resolve().parents[3]
SHARED_ENGINES = REPO.parent / "shared" / "engines"
TABLES = REPO / "llmgw" / "apispec" / "engines"


def _script() -> ModuleType:
    path = REPO / "scripts" / "engine_flag_tables.py"
    spec = importlib.util.spec_from_file_location("engine_flag_tables", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("engine_flag_tables", module)
    spec.loader.exec_module(module)
    return module


def test_vendored_tables_are_what_the_script_writes_from_shared() -> None:
    if not SHARED_ENGINES.exists():
        pytest.skip(
            f"{SHARED_ENGINES} is not there (shared/ is laid beside the checkout only on project machines)"
        )
    script = _script()
    for engine, document in script.tables_from_shared(SHARED_ENGINES).items():
        text = (TABLES / f"{engine}-flags.json").read_text(encoding="utf-8")
        vendored = json.loads(text)
        assert text == script.render(vendored), f"{engine}-flags.json is not in the script's layout"
        # Every release the audit holds, as the script writes it (a release added from its
        # own source with from-vllm, from-sglang or from-llamacpp may be newer than the audit).
        for release, table in document["releases"].items():
            assert vendored["releases"].get(release) == table, (
                f"llmgw/apispec/engines/{engine}-flags.json {release} drifted: "
                "run scripts/engine_flag_tables.py from-shared"
            )
        for key in ("image_tag_brackets", "ray_start"):
            assert vendored.get(key) == document.get(key), f"{engine} {key} drifted"


def test_the_script_rereads_a_release_from_its_source_without_losing_reviews(tmp_path: Path) -> None:
    # from-llamacpp over the vendored table: the same options, their reviews carried by name.
    script = _script()
    arg_cpp = tmp_path / "arg.cpp"
    arg_cpp.write_text(
        'add_opt(common_arg({"-c", "--ctx-size"}, "N", "context", [](common_params & p, int v) {})'
        '.set_env("LLAMA_ARG_CTX_SIZE"));\n'
        'add_opt(common_arg({"--rpc"}, "SERVERS", "offload", [](common_params & p, std::string v) {}));\n'
        'add_opt(common_arg({"--brand-new"}, "new", [](common_params & p) {}));\n'
    )
    out = tmp_path / "tables"
    out.mkdir()
    (out / "llamacpp-flags.json").write_text((TABLES / "llamacpp-flags.json").read_text())
    script.from_llamacpp(out, "abcdef1234567890", arg_cpp, ["server-cuda-b9999"])
    written = json.loads((out / "llamacpp-flags.json").read_text())["releases"]["abcdef12"]
    risks = {entry["flag"]: entry["risks"] for entry in written["flags"]}
    assert risks == {"--ctx-size": [], "--rpc": ["loads_code", "network"], "--brand-new": None}
    assert written["image_tags"] == ["server-cuda-b9999"]


def test_the_script_reads_llama_cpp_options_the_way_common_arg_cpp_declares_them() -> None:
    # The four constructors of common_arg (common/arg.h): names, [negations], [hint, [hint2]], help, handler.
    arg_cpp = """
    add_opt(common_arg(
        {"-c", "--ctx-size"}, "N",
        string_format("size of the prompt context (default: %d)", params.n_ctx),
        [](common_params & params, int value) { params.n_ctx = value; }
    ).set_env("LLAMA_ARG_CTX_SIZE"));
    add_opt(common_arg(
        {"--kv-unified", "-kvu"}, {"--no-kv-unified"},
        "use a unified KV buffer, (default: " + std::string(true ? "enabled" : "disabled") + ")",
        [](common_params & params, bool value) { params.kv_unified = value; }
    ).set_env("LLAMA_ARG_KV_UNIFIED").set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--lora-scaled"}, "FNAME", "SCALE", "LoRA adapter with its scale",
        [](common_params & params, const std::string & fname, const std::string & scale) {}
    ));
    add_opt(common_arg(
        {"--only-for-cli"}, "only the CLI reads it, {not the server}",
        [](common_params & params) { params.x = ','; }
    ).set_examples({LLAMA_EXAMPLE_MAIN}));
    """
    options = _script().llamacpp_options(arg_cpp)
    assert options == [
        {"flag": "--ctx-size", "aliases": ["-c"], "negations": [], "nargs": 1, "env": "LLAMA_ARG_CTX_SIZE"},
        {
            "flag": "--kv-unified",
            "aliases": ["-kvu"],
            "negations": ["--no-kv-unified"],
            "nargs": 0,
            "env": "LLAMA_ARG_KV_UNIFIED",
        },
        {"flag": "--lora-scaled", "aliases": [], "negations": [], "nargs": 2, "env": None},
    ]


def test_every_vendored_flag_has_been_reviewed_for_risks() -> None:
    unreviewed = [
        f"{engine} {table.release} {spec.flag}"
        for engine in (Engine.VLLM, Engine.SGLANG, Engine.LLAMACPP)
        for table in release_tables(engine).values()
        for spec in table.flags
        if spec.risks is None
    ]
    assert not unreviewed, f"set the risks of these flags in llmgw/apispec/engines/: {unreviewed}"


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG, Engine.LLAMACPP])
def test_every_default_image_has_a_table(engine: Engine) -> None:
    assert tables_for_image(engine, DEFAULT_IMAGES[engine])


def test_an_image_without_a_table_says_how_to_add_one() -> None:
    assert [t.release for t in tables_for_image(Engine.VLLM, "vllm/vllm-openai:v0.10.2")] == ["0.10.2"]
    assert [
        t.release for t in tables_for_image(Engine.LLAMACPP, "ghcr.io/ggml-org/llama.cpp:server-cuda-b6700")
    ] == [
        "4227c9be",
        "49bfddec",
    ]
    with pytest.raises(UnknownImage, match=r"scripts/engine_flag_tables\.py"):
        tables_for_image(Engine.VLLM, "vllm/vllm-openai:v0.9.0")


@pytest.mark.parametrize(
    "argv",
    [
        ["org/model", "--max-model-len", "4096", "--enforce-eager"],
        ["--max_model_len", "4096"],  # FlexibleArgumentParser rewrites underscores
        ["--max-model-len=4096"],
        ["--served-model-name", "a", "b"],  # nargs +
        ["--no-enforce-eager"],  # a BooleanOptionalAction's negation
        ["--speculative-config.method", "ngram"],  # a dotted JSON key of a real flag
        ["--seed", "-1"],  # a negative number is a value
    ],
)
def test_argv_vllm_reads(argv: list[str]) -> None:
    assert check_argv(release_tables(Engine.VLLM)["0.11.0"], argv) == []


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--nnodes", "2"], "has no such flag"),  # neither pinned vLLM has it
        (
            ["--max-model", "4096"],
            "has no such flag",
        ),  # an abbreviation: argparse reads it, llmgw must not write it
        (["--max-model-len"], "takes one value"),
        (["--max-model-len", "--enforce-eager"], "takes one value"),
        (["--enforce-eager=1"], "takes no value"),
        (["--served-model-name"], "takes one or more values"),
        (["org/a", "org/b"], "takes no further positional"),
    ],
)
def test_argv_vllm_refuses(argv: list[str], problem: str) -> None:
    [found] = check_argv(release_tables(Engine.VLLM)["0.11.0"], argv)
    assert problem in found.problem


def test_sglang_has_no_underscore_spelling_and_no_positional() -> None:
    sglang = release_tables(Engine.SGLANG)["0.5.3"]
    assert check_argv(sglang, ["--tp-size", "2", "--nnodes", "2", "--node-rank", "1"]) == []
    assert "has no such flag" in check_argv(sglang, ["--tp_size", "2"])[0].problem
    assert [p.index for p in check_argv(sglang, ["org/model"])] == [0]


def test_llama_cpp_takes_the_next_word_as_the_value_and_has_no_equals_form() -> None:
    llama = release_tables(Engine.LLAMACPP)["4227c9be"]
    assert check_argv(llama, ["--n-gpu-layers", "-1", "--no-slots", "--ctx_size", "4096"]) == []
    assert "has no such flag" in check_argv(llama, ["--ctx-size=4096"])[0].problem
    assert "takes one value" in check_argv(llama, ["--ctx-size"])[0].problem


def test_where_the_audit_and_llama_cpp_disagree_the_source_wins() -> None:
    # The audit read these as switches (a multi-line help text); common/arg.cpp gives each an "N".
    for table in release_tables(Engine.LLAMACPP).values():
        assert check_argv(table, ["--swa-checkpoints", "3", "--cache-reuse", "256"]) == [], table.release
    later = release_tables(Engine.LLAMACPP)["49bfddec"]
    assert check_argv(later, ["--cache-ram", "8192", "--adaptive-target", "0.5"]) == []


def test_ray_start_table_has_the_flags_and_their_arity() -> None:
    ray = ray_start_table()
    assert check_argv(ray, ["--block", "--address", "10.0.0.1:6379", "--num-gpus", "8"]) == []
    assert check_argv(ray, ["--head", "--port", "6379", "--node-ip-address", "10.0.0.1"]) == []
    assert "has no such flag" in check_argv(ray, ["--nnodes", "2"])[0].problem


def test_risk_classes_are_carried() -> None:
    sglang = release_tables(Engine.SGLANG)["0.5.3"]
    spec = sglang.lookup("--oltp-traces-endpoint")
    assert spec is not None and Risk.NETWORK in (spec.risks or ())
    llama = release_tables(Engine.LLAMACPP)["4227c9be"]
    preset = llama.lookup("--embd-bge-small-en-default")
    assert preset is not None and Risk.DOWNLOADS_MODEL in (preset.risks or ())
