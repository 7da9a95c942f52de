"""HCL2 strings and expressions as jobspec2 evaluates them, seen through a job's meta and region."""

from __future__ import annotations

import pytest

from llmgw.apispec.jobspec import JobspecError, parse_jobspec


def _region(expr: str, prelude: str = "") -> object:
    job = parse_jobspec(f'{prelude}\njob "j" {{\n  region = {expr}\n}}\n')
    return job.get("Region")


def _config(body: str) -> object:
    job = parse_jobspec(
        'job "j" {\n  group "g" {\n    task "t" {\n      driver = "docker"\n      config {\n'
        + body
        + "\n      }\n    }\n  }\n}\n"
    )
    groups = job["TaskGroups"]
    assert isinstance(groups, list)
    return groups[0]["Tasks"][0]["Config"]


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ('"$${x}"', "${x}"),
        ('"%%{x}"', "%{x}"),
        ('"a $ b % c"', "a $ b % c"),
        ('"say \\"hi\\" \\\\ done"', 'say "hi" \\ done'),
        ('"line1\\nline2\\ttab"', "line1\nline2\ttab"),
        ('"\\u00e9t\\u00e9 \\U0001F680"', "été 🚀"),
        ('"ünïcødé ✓"', "ünïcødé ✓"),
        ('"${NOMAD_ALLOC_ID}"', "${NOMAD_ALLOC_ID}"),
        ('"pre-${attr.unique.hostname}-post"', "pre-${attr.unique.hostname}-post"),
        ('"${env["HOME"]}/x"', '${env["HOME"]}/x'),
        (
            '"foo-${attr.network.dev-us-east1-relay-vpc.external-ip.0}"',
            "foo-${attr.network.dev-us-east1-relay-vpc.external-ip.0}",
        ),
        ('"with spaces ${   root.  field[  "FOO"].5  }"', 'with spaces ${   root.  field[  "FOO"].5  }'),
        ("meta.mytest", "${meta.mytest}"),
        ('"${upper("a")}-${NOMAD_PORT_http}"', "A-${NOMAD_PORT_http}"),
        ("1 + 2 * 3", "7"),
        ("7 / 2", "3.5"),
        ('"${1 == 1 ? "yes" : "no"}"', "yes"),
        ('join(",", [for s in ["a", "b"] : upper(s)])', "A,B"),
        ('format("%s-%03d", "gpu", 7)', "gpu-007"),
        ('lookup({ a = "x" }, "b", "dflt")', "dflt"),
        ('"%{ for n in [1, 2] }n${n};%{ endfor }"', "n1;n2;"),
        ('"%{ if true }on%{ else }off%{ endif }"', "on"),
        ("true", "true"),
        ("null", None),
    ],
)
def test_strings_and_expressions(expr: str, expected: object) -> None:
    assert _region(expr) == expected


def test_heredoc_keeps_content_verbatim_except_interpolation() -> None:
    text = (
        'job "j" {\n  meta {\n    script = <<EOT\n#!/bin/sh\necho "$HOME" \\n \'quoted\' {{ .Data }}\n'
        "  indented ${NOMAD_TASK_DIR}\nEOT\n  }\n}\n"
    )
    meta = parse_jobspec(text)["Meta"]
    assert meta == {
        "script": "#!/bin/sh\necho \"$HOME\" \\n 'quoted' {{ .Data }}\n  indented ${NOMAD_TASK_DIR}\n"
    }


def test_flush_heredoc_trims_the_common_indent_only() -> None:
    text = 'job "j" {\n  meta {\n    a = <<-EOT\n      one\n        two\n\n      three\n    EOT\n  }\n}\n'
    assert parse_jobspec(text)["Meta"] == {"a": "one\n  two\n\nthree\n"}


def test_strip_markers_trim_whitespace() -> None:
    assert _region('"a   ${~ "b" ~}   c"') == "abc"


def test_single_interpolation_keeps_the_value_type() -> None:
    job = parse_jobspec(
        'variable "n" {\n  default = 3\n}\njob "j" {\n  group "g" {\n    count = "${var.n}"\n  }\n}\n'
    )
    assert job["TaskGroups"] == [{"Name": "g", "Count": 3}]


def test_variables_passed_in_override_defaults_and_are_typed() -> None:
    text = (
        'variable "dcs" {\n  type = list(string)\n  default = ["dc1"]\n}\n'
        'job "j" {\n  datacenters = var.dcs\n}\n'
    )
    assert parse_jobspec(text)["Datacenters"] == ["dc1"]
    assert parse_jobspec(text, variables={"dcs": ["a", "b"]})["Datacenters"] == ["a", "b"]


def test_undeclared_variable_passed_in_is_an_error() -> None:
    with pytest.raises(JobspecError, match="Undefined variable"):
        parse_jobspec('job "j" {\n}\n', variables={"nope": 1})


def test_locals_may_refer_to_later_locals() -> None:
    text = 'locals {\n  a = "${local.b}-x"\n  b = "y"\n}\njob "j" {\n  region = local.a\n}\n'
    assert parse_jobspec(text)["Region"] == "y-x"


def test_numbers_convert_to_strings_where_strings_are_wanted() -> None:
    job = parse_jobspec('job "j" {\n  meta {\n    n = 2\n    f = 1.5\n    b = true\n  }\n}\n')
    assert job["Meta"] == {"n": "2", "f": "1.5", "b": "true"}


def test_free_form_config_keeps_nested_structure_and_types() -> None:
    config = _config(
        '        image = "x"\n'
        "        count = 3\n"
        "        ratio = 0.5\n"
        "        flag = false\n"
        '        nested = [{ a = 1 }, { b = "two" }]\n'
        '        port_map "http" {\n          container = 8000\n        }\n'
        '        sysctl = {\n          "net.core.somaxconn" = "1024"\n        }\n'
    )
    assert config == {
        "image": "x",
        "count": 3,
        "ratio": 0.5,
        "flag": False,
        "nested": [{"a": 1}, {"b": "two"}],
        "port_map": [{"http": [{"container": 8000}]}],
        "sysctl": [{"net.core.somaxconn": "1024"}],
    }


def test_duration_numbers_are_nanoseconds_as_given() -> None:
    job = parse_jobspec('job "j" {\n  update {\n    stagger = 5000\n    healthy_deadline = "1h30m"\n  }\n}\n')
    assert job["Update"] == {"Stagger": 5000, "HealthyDeadline": 5400 * 1_000_000_000}


def test_one_line_blocks() -> None:
    job = parse_jobspec(
        'job "j" {\n  group "g" {\n    network {\n      port "http" { to = 8080 }\n    }\n  }\n}\n'
    )
    assert job["TaskGroups"] == [
        {"Name": "g", "Networks": [{"DynamicPorts": [{"Label": "http", "To": 8080}]}]}
    ]


def test_a_one_line_block_cannot_hold_a_block() -> None:
    with pytest.raises(JobspecError, match="Invalid single-argument block definition"):
        parse_jobspec('job "j" {\n  group "g" {\n    network { port "http" { to = 8080 } }\n  }\n}\n')


def test_quoted_names_are_not_allowed_in_blocks() -> None:
    with pytest.raises(JobspecError, match="Argument or block definition required"):
        parse_jobspec('job "j" {\n  meta {\n    "a.b" = "c"\n  }\n}\n')


def test_comments_are_ignored() -> None:
    text = '# a\n// b\n/* c\n d */\njob "j" { # e\n  region = "r" // f\n}\n'
    assert parse_jobspec(text)["Region"] == "r"
