"""The vendored API tables and the key-exact check, on plain documents."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.apispec import (
    ApiDecodeError,
    HclKind,
    Kind,
    ProblemKind,
    check_document,
    decode_like_nomad,
    go_type,
    struct,
)

APISPEC = Path(__file__).resolve().parents[3] / "llmgw" / "apispec"
SHARED = Path(__file__).resolve().parents[3].parent / "shared"


@pytest.mark.parametrize(
    ("vendored", "shared"),
    [
        ("nomad-api-fields.json", "nomad/api-fields.json"),
        ("consul-api-fields.json", "consul/api-fields.json"),
    ],
)
def test_vendored_tables_equal_shared(vendored: str, shared: str) -> None:
    source = SHARED / shared
    if not source.exists():
        pytest.skip(f"{source} is not there (shared/ is laid beside the checkout only on project machines)")
    assert (APISPEC / vendored).read_bytes() == source.read_bytes(), (
        f"llmgw/apispec/{vendored} drifted from ../shared/{shared}: copy it again"
    )


def test_struct_fields_carry_json_key_go_type_and_hcl_tag() -> None:
    task = struct("Task")
    assert task.fields["KillTimeout"].go_type == "*time.Duration"
    assert task.fields["LogConfig"].hcl is not None
    assert task.fields["LogConfig"].hcl.name == "logs"
    assert task.fields["LogConfig"].hcl.kind is HclKind.BLOCK
    assert task.fields["Name"].hcl is not None and task.fields["Name"].hcl.kind is HclKind.LABEL
    assert task.fields["Identity"].hcl is None
    lifecycle = struct("TaskLifecycle").fields["Hook"].hcl
    assert lifecycle is not None and lifecycle.kind is HclKind.REQUIRED


def test_embedded_struct_fields_are_promoted() -> None:
    consul_reg = struct("AgentCheckRegistration", api="consul")
    assert "ServiceID" in consul_reg.fields
    assert "Interval" in consul_reg.fields  # from the embedded AgentServiceCheck


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("*string", Kind.POINTER),
        ("[]*TaskGroup", Kind.SLICE),
        ("map[string]any", Kind.MAP),
        ("time.Duration", Kind.DURATION),
        ("time.Time", Kind.TIME),
        ("[]byte", Kind.BYTES),
        ("uint8", Kind.INT),
        ("interface{}", Kind.ANY),
        ("ReconcileOption", Kind.STRING),
        ("Job", Kind.STRUCT),
    ],
)
def test_go_types_parse(text: str, kind: Kind) -> None:
    assert go_type(text).kind is kind


def test_a_key_exact_job_has_no_problems() -> None:
    job = {
        "ID": "llm",
        "Name": "llm",
        "Datacenters": ["dc1"],
        "Meta": {"a": "b"},
        "TaskGroups": [
            {
                "Name": "g",
                "Count": 2,
                "Tasks": [
                    {
                        "Name": "t",
                        "Driver": "docker",
                        "KillTimeout": 5_000_000_000,
                        "Config": {"image": "x", "Whatever": [{"nested": True}]},
                        "Resources": {"CPU": 100, "Devices": [{"Name": "nvidia/gpu", "Count": 2}]},
                    }
                ],
                "Volumes": {"models": {"Name": "models", "Type": "host", "Source": "models"}},
            }
        ],
    }
    assert check_document(job, "Job") == []


def test_problems_name_the_path_and_kind() -> None:
    job = {
        "id": "x",
        "TaskGroups": [{"Tasks": [{}, {"Resources": {"Devices": [{"Count": "2"}]}, "KillTimeout": "5s"}]}],
        "Foo": 1,
        "Max_Parallel": 1,
    }
    problems = {(p.path, p.kind) for p in check_document(job, "Job")}
    assert problems == {
        ("Job.id", ProblemKind.MISCASED_KEY),
        ("Job.TaskGroups[0].Tasks[1].Resources.Devices[0].Count", ProblemKind.WRONG_TYPE),
        ("Job.TaskGroups[0].Tasks[1].KillTimeout", ProblemKind.WRONG_TYPE),
        ("Job.Foo", ProblemKind.UNKNOWN_KEY),
        ("Job.Max_Parallel", ProblemKind.UNKNOWN_KEY),
    }


def test_miscased_key_message_gives_the_right_spelling() -> None:
    [problem] = check_document({"taskgroups": []}, "Job")
    assert "'TaskGroups'" in problem.message


def test_map_entries_are_checked_with_their_key_in_the_path() -> None:
    [problem] = check_document({"Meta": {"k": 1}}, "Job")
    assert problem.path == 'Job.Meta["k"]'
    assert problem.kind is ProblemKind.WRONG_TYPE


def test_wrong_type_message_says_what_was_expected_and_what_came() -> None:
    [problem] = check_document({"Meta": {"k": 1}}, "Job")
    assert problem.message == "expected a string, got a number"
    [problem] = check_document({"TaskGroups": "web"}, "Job")
    assert problem.message == "expected an array, got a string"


def test_free_form_config_is_not_descended() -> None:
    assert check_document({"Config": {"AnyThing": {"deep": [1, "x"]}}}, "Task") == []


@pytest.mark.parametrize("value", [1.5, 5.0, "5s", True])
def test_durations_must_be_integer_nanoseconds(value: object) -> None:
    [problem] = check_document({"ShutdownDelay": value}, "Task")
    assert problem.kind is ProblemKind.WRONG_TYPE


def test_integer_ranges_follow_the_go_type() -> None:
    assert check_document({"Weight": 100}, "Affinity") == []
    [problem] = check_document({"Weight": 200}, "Affinity")
    assert "int8" in problem.message


def test_null_is_accepted_like_go_does() -> None:
    assert check_document({"Count": None, "Tasks": None, "Meta": None}, "TaskGroup") == []


def test_consul_documents_are_checked_against_consul_tables() -> None:
    reg = {"ID": "c1", "Name": "n", "ServiceID": "s", "Interval": "10s", "HTTP": "http://x", "Bogus": 1}
    [problem] = check_document(reg, "AgentCheckRegistration", api="consul")
    assert problem.path == "AgentCheckRegistration.Bogus"


def test_decode_like_nomad_folds_case_and_drops_unknown_keys() -> None:
    out = decode_like_nomad(
        {"id": "x", "taskgroups": [{"NAME": "g", "cOUNT": 1, "junk": 2}], "nope": 1}, "Job"
    )
    assert out == {"ID": "x", "TaskGroups": [{"Name": "g", "Count": 1}]}


def test_decode_like_nomad_last_spelling_wins() -> None:
    assert decode_like_nomad({"Name": "a", "name": "b"}, "Job") == {"Name": "b"}


def test_decode_like_nomad_refuses_wrong_types() -> None:
    with pytest.raises(ApiDecodeError) as err:
        decode_like_nomad({"TaskGroups": [{"Count": "2"}]}, "Job")
    assert err.value.problems[0].path == "Job.TaskGroups[0].Count"
