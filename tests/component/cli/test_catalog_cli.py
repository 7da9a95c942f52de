"""`llmgw catalog ...` as CI pipelines and editors run it: real process, exit codes, output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "catalog.yaml"
COMPILER_STYLE = re.compile(
    r"^(?P<file>[^:]+):(?P<line>\d+):(?P<col>\d+): (?P<sev>error|warning): (?P<rest>.+)$"
)


# The cluster's allowlists, which `catalog check` reads from its environment.
ALLOWLIST_ENV = (
    "LLMGW_ALLOWED_IMAGES",
    "LLMGW_SOURCE_ALLOWED_NETWORKS",
    "LLMGW_IMAGE_VLLM",
    "LLMGW_NODE_GPUS",
)


def llmgw(*args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ALLOWLIST_ENV}
    return subprocess.run(
        [sys.executable, "-m", "llmgw", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**environ, **env},
    )


def test_example_catalog_is_valid_with_the_shipped_policy() -> None:
    result = llmgw("catalog", "check", str(EXAMPLE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "error" not in result.stdout


def test_invalid_catalog_exits_1_with_every_error_compiler_style(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "models:\n"
        "  m:\n"
        "    profiles: [{engine: vllm, source: org/m, tp: 3, nodes: 2}]\n"
        "    scaling: {min: 2, max: 1}\n"
        "aliases: {a: nope}\n"
    )
    result = llmgw("catalog", "check", str(bad))
    assert result.returncode == 1
    # The notes (what llmgw chose, e.g. a profile's tool-call parser) come with the errors.
    lines = [line for line in result.stdout.splitlines() if ": note: " not in line]
    parsed = [COMPILER_STYLE.match(line) for line in lines]
    assert all(parsed), lines
    assert [(m["line"], m["sev"], m["rest"].split(":")[0]) for m in parsed if m] == [
        ("3", "error", "models.m.profiles[0].nodes"),
        ("4", "error", "models.m.scaling.max"),
        ("5", "error", "aliases.a"),
    ]
    assert all(m["file"] == str(bad) for m in parsed if m)
    assert "3 error(s), 0 warning(s)" in result.stderr


def test_json_format_lists_the_same_diagnostics(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  m:\n    profiles: [{engine: sim}]\n    scalling: {}\n")
    result = llmgw("catalog", "check", "--format", "json", str(bad))
    assert result.returncode == 1
    assert json.loads(result.stdout) == [
        {
            "file": str(bad),
            "line": 4,
            "column": 5,
            "path": "models.m.scalling",
            "severity": "error",
            "message": 'unknown key "scalling" (did you mean "scaling"?)',
        }
    ]


def test_warnings_do_not_fail_the_check() -> None:
    text = "models:\n  q:\n    profiles: [{engine: llamacpp, source: 'https://e.org/q.gguf', tp: 2}]\n"
    result = llmgw("catalog", "check", "-", stdin=text)
    assert result.returncode == 0
    assert result.stdout.startswith("<stdin>:3:")
    assert ": warning: " in result.stdout


def test_several_files_are_checked_in_one_run(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("models: {m: {profiles: [{engine: sim}]}}\n")
    bad.write_text("models: {m: {profiles: [{engine: nope}]}}\n")
    result = llmgw("catalog", "check", str(good), str(bad))
    assert result.returncode == 1
    assert [line.split(":")[0] for line in result.stdout.splitlines()] == [str(bad)]


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert llmgw("catalog", "check").returncode == 2
    missing = llmgw("catalog", "check", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2
    assert (
        missing.stdout
        == f"{tmp_path / 'nope.yaml'}:1:1: error: cannot read the file: No such file or directory\n"
    )
    assert llmgw("catalog", "frobnicate").returncode == 2


def test_an_unreadable_file_is_a_json_diagnostic_and_the_others_are_still_checked(tmp_path: Path) -> None:
    good, missing, typo = tmp_path / "good.yaml", tmp_path / "nonexist.yaml", tmp_path / "typo.yaml"
    good.write_text("models: {m: {profiles: [{engine: sim}]}}\n")
    typo.write_text("models:\n  m:\n    profiles: [{engine: sim}]\n    scalling: {}\n")
    result = llmgw("catalog", "check", "--format", "json", str(good), str(missing), str(typo))
    assert result.returncode == 2  # unreadable wins over invalid, as --help says
    assert json.loads(result.stdout) == [
        {
            "file": str(missing),
            "line": 1,
            "column": 1,
            "path": "",
            "severity": "error",
            "message": "cannot read the file: No such file or directory",
        },
        {
            "file": str(typo),
            "line": 4,
            "column": 5,
            "path": "models.m.scalling",
            "severity": "error",
            "message": 'unknown key "scalling" (did you mean "scaling"?)',
        },
    ]
    text = llmgw("catalog", "check", str(good), str(missing), str(typo))
    assert text.returncode == 2
    assert [line.split(":")[0] for line in text.stdout.splitlines()] == [str(missing), str(typo)]
    assert "2 error(s), 0 warning(s)" in text.stderr
    assert "2 wins over 1" in " ".join(llmgw("catalog", "check", "--help").stdout.split())


# A catalog a hostile pipeline pushes: a key that retitles the terminal (OSC 0 ... BEL),
# a value that clears the screen, a name that reverses what follows it (U+202E), a C1
# control (CSI) and DEL; the file's own name carries a colour change.
HOSTILE_CATALOG = (
    "models:\n"
    "  m:\n"
    '    profiles: [{engine: "sim\\e[2J", "\\e]0;pwned\\a": 1}]\n'
    '  "gpt\u202eexe.evil\\x9b\\x7f":\n'
    "    profiles: [{engine: sim}]\n"
)


def _unprintable(text: str) -> set[str]:
    return {char for char in text if not char.isprintable() and char != "\n"}


def test_a_hostile_catalog_cannot_send_control_characters_to_the_terminal(tmp_path: Path) -> None:
    hostile = tmp_path / "cat\x1b[31m.yaml"
    hostile.write_text(HOSTILE_CATALOG, encoding="utf-8")
    result = llmgw("catalog", "check", str(hostile))
    assert result.returncode == 1
    assert _unprintable(result.stdout + result.stderr) == set()
    # Each is shown as its escape, so the operator sees what the catalog holds.
    assert "cat\\x1b[31m.yaml:3:" in result.stdout
    assert "\\x1b]0;pwned\\x07" in result.stdout
    assert "sim\\x1b[2J" in result.stdout
    assert "gpt\\u202eexe.evil\\x9b\\x7f" in result.stdout

    as_json = llmgw("catalog", "check", "--format", "json", str(hostile))
    assert as_json.returncode == 1
    assert _unprintable(as_json.stdout) == set()  # JSON escapes them itself...
    found = json.loads(as_json.stdout)
    # ... and keeps the exact strings for the program that reads it.
    assert {d["file"] for d in found} == {str(hostile)}
    assert any('unknown key "\x1b]0;pwned\x07"' in d["message"] for d in found), found
    assert any("sim\x1b[2J" in d["message"] for d in found), found
    assert any(d["path"] == 'models["gpt\u202eexe.evil\x9b\x7f"]' for d in found), found


def test_an_image_the_cluster_does_not_allow_fails_the_check_at_its_line(tmp_path: Path) -> None:
    catalog = tmp_path / "c.yaml"
    catalog.write_text(
        "models:\n"
        "  m:\n"
        "    profiles:\n"
        "      - engine: vllm\n"
        "        source: org/m\n"
        "        image: attacker.example/miner:v0.11.0\n"
    )
    result = llmgw("catalog", "check", str(catalog))
    assert result.returncode == 1, result.stdout + result.stderr
    errors = "".join(line for line in result.stdout.splitlines(keepends=True) if ": note: " not in line)
    assert errors.startswith(
        f"{catalog}:6:16: error: models.m.profiles[0].image: image 'attacker.example/miner:v0.11.0' "
        "(attacker.example/miner) is not from a repository this cluster allows ("
    )
    assert "LLMGW_ALLOWED_IMAGES" in result.stdout
    # The cluster's own setting, as `llmgw serve` reads it, lets it through.
    assert llmgw("catalog", "check", str(catalog), LLMGW_ALLOWED_IMAGES="attacker.example/").returncode == 0
    unusable = llmgw("catalog", "check", str(catalog), LLMGW_ALLOWED_IMAGES="x/y:tag")
    assert unusable.returncode == 2
    assert "LLMGW_ALLOWED_IMAGES" in unusable.stderr


def test_a_source_url_into_the_clusters_network_fails_the_check(tmp_path: Path) -> None:
    catalog = tmp_path / "c.yaml"

    def check(source: str, **env: str) -> subprocess.CompletedProcess[str]:
        catalog.write_text(
            f"models:\n  q:\n    profiles:\n      - engine: llamacpp\n        source: '{source}'\n"
        )
        return llmgw("catalog", "check", str(catalog), **env)

    for source in (
        "https://[fd00:ec2::254]/latest/meta-data/iam/security-credentials/",  # AWS IPv6 metadata
        "https://100.100.100.200/latest/meta-data/ram/security-credentials/",  # Alibaba metadata
        "https://10.0.0.5/models/m.gguf",
        "https://[fd12:3456::1]/models/m.gguf",
    ):
        refused = check(source)
        assert refused.returncode == 1, (source, refused.stdout)
        assert refused.stdout.startswith(f"{catalog}:5:17: error: models.q.profiles[0].source: "), (
            refused.stdout
        )
    # A private file server, once the operator allows its network; never the metadata services.
    allow = {"LLMGW_SOURCE_ALLOWED_NETWORKS": "10.0.0.0/8, fd00::/8, 100.64.0.0/10"}
    assert check("https://10.0.0.5/models/m.gguf", **allow).returncode == 0
    assert check("https://[fd12:3456::1]/models/m.gguf", **allow).returncode == 0
    assert check("https://[fd00:ec2::254]/latest/meta-data/", **allow).returncode == 1
    assert check("https://100.100.100.200/latest/meta-data/", **allow).returncode == 1
    unusable = check("https://10.0.0.5/m.gguf", LLMGW_SOURCE_ALLOWED_NETWORKS="10.0.0.5/8")
    assert unusable.returncode == 2
    assert "LLMGW_SOURCE_ALLOWED_NETWORKS" in unusable.stderr


def test_the_catalog_commands_are_described_as_they_are() -> None:
    listed = " ".join(llmgw("--help").stdout.split())
    assert "catalog check catalogs, print their JSON Schema, upgrade legacy spellings" in listed
    assert "describe" not in listed


def test_schema_is_json_schema_the_example_satisfies() -> None:
    result = llmgw("catalog", "schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    example = yaml.safe_load(EXAMPLE.read_text())
    jsonschema.validate({k: v for k, v in example.items() if not k.startswith("x-")}, schema)
    with_typo = {"models": {"m": {"profiles": [{"engine": "sim"}], "scalling": {}}}}
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(with_typo))
    assert errors, "an editor must flag unknown keys too"


def test_upgrade_prints_a_diff_and_writes_only_when_asked(tmp_path: Path) -> None:
    legacy = tmp_path / "c.yaml"
    original = (
        "models:\n  q:  # keep\n    profiles: [{engine: llamacpp, source: 'https://e.org/q.gguf', tp: 2}]\n"
    )
    legacy.write_text(original)
    shown = llmgw("catalog", "upgrade", str(legacy))
    assert shown.returncode == 0
    assert "-    profiles: [{engine: llamacpp, source: 'https://e.org/q.gguf', tp: 2}]" in shown.stdout
    assert (
        "+    profiles: [{engine: llamacpp, source: 'https://e.org/q.gguf', gpus_per_node: 2}]"
        in shown.stdout
    )
    assert legacy.read_text() == original
    written = llmgw("catalog", "upgrade", "--write", str(legacy))
    assert written.returncode == 0
    assert "tp: 2 -> gpus_per_node: 2" in written.stderr
    assert legacy.read_text() == original.replace("tp: 2", "gpus_per_node: 2")
    assert llmgw("catalog", "check", str(legacy)).stdout == ""


def test_a_shape_no_node_holds_fails_the_check_saying_what_to_write(tmp_path: Path) -> None:
    catalog = tmp_path / "c.yaml"
    catalog.write_text(
        "models:\n"
        "  big:\n"
        "    profiles:\n"
        "      - engine: vllm\n"
        "        source: org/m\n"
        "        tp: 12\n"
        "        gpu: {model: H100}\n"
    )
    assert llmgw("catalog", "check", str(catalog)).returncode == 0  # no node shapes: not checked
    result = llmgw("catalog", "check", str(catalog), LLMGW_NODE_GPUS="H100=8,L4=4")
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stdout.splitlines() if ": error: " in line]
    assert errors == [
        f"{catalog}:6:13: error: models.big.profiles[0].tp: tp × pp = 12 × 1 = 12 GPUs puts 12 on one "
        "node, but the largest node with H100 has 8 GPUs (LLMGW_NODE_GPUS=H100=8, L4=4); the engine "
        "runs tp × pp / nodes ranks on each node: write nodes: 2 (6 GPUs on each), or a tp × pp of at most 8"
    ]
    unusable = llmgw("catalog", "check", str(catalog), LLMGW_NODE_GPUS="H100")
    assert (
        unusable.returncode == 2 and "LLMGW_NODE_GPUS" in unusable.stderr and "MODEL=COUNT" in unusable.stderr
    )
