"""Jobspecs jobspec2 refuses: each error names the file, line and column and says what is wrong."""

from __future__ import annotations

import pytest

from llmgw.apispec.jobspec import Diagnostic, JobspecError, parse_jobspec


def _errors(text: str) -> list[Diagnostic]:
    with pytest.raises(JobspecError) as err:
        parse_jobspec(text, filename="input.hcl")
    return err.value.diagnostics


def _one(text: str) -> Diagnostic:
    diags = _errors(text)
    assert len(diags) == 1, [str(d) for d in diags]
    return diags[0]


# (name, jobspec, line, column, summary, detail fragment)
CASES = [
    (
        "unknown attribute",
        'job "j" {\n  group "g" {\n    task "t" {\n      driver = "docker"\n      foo = 1\n    }\n  }\n}\n',
        5,
        7,
        "Unsupported argument",
        'An argument named "foo" is not expected here.',
    ),
    (
        "misspelt attribute gets a suggestion",
        'job "j" {\n  group "g" {\n    coutn = 2\n  }\n}\n',
        3,
        5,
        "Unsupported argument",
        'Did you mean "count"?',
    ),
    (
        "unknown block",
        'job "j" {\n  group "g" {\n    task "t" {\n      resource {\n        cpu = 1\n      }\n'
        "    }\n  }\n}\n",
        4,
        7,
        "Unsupported block type",
        'Blocks of type "resource" are not expected here. Did you mean "resources"?',
    ),
    (
        "block where an attribute is expected",
        'job "j" {\n  group "g" {\n    count {\n    }\n  }\n}\n',
        3,
        5,
        "Unsupported block type",
        'Did you mean to define argument "count"?',
    ),
    (
        "attribute where a block is expected",
        'job "j" {\n  group "g" {\n    task "t" {\n      resources = { cpu = 100 }\n    }\n  }\n}\n',
        4,
        7,
        "Unsupported argument",
        'Did you mean to define a block of type "resources"?',
    ),
    (
        "bad duration",
        'job "j" {\n  group "g" {\n    task "t" {\n      kill_timeout = "30 seconds"\n    }\n  }\n}\n',
        4,
        22,
        "Unsuitable value type",
        'Unsuitable duration value: time: unknown unit " seconds" in duration "30 seconds"',
    ),
    (
        "duration without a unit",
        'job "j" {\n  update {\n    min_healthy_time = "30"\n  }\n}\n',
        3,
        24,
        "Unsuitable value type",
        'time: missing unit in duration "30"',
    ),
    (
        "duration of the wrong type",
        'job "j" {\n  update {\n    healthy_deadline = true\n  }\n}\n',
        3,
        24,
        "Unsuitable value type",
        "expected a string but found bool",
    ),
    (
        "duplicate attribute",
        'job "j" {\n  group "g" {\n    count = 1\n    count = 2\n  }\n}\n',
        4,
        5,
        "Attribute redefined",
        'The argument "count" was already set at input.hcl:3,5.',
    ),
    (
        "missing block label",
        'job "j" {\n  group {\n  }\n}\n',
        2,
        9,
        "Missing name for group",
        "All group blocks must have 1 labels (name).",
    ),
    (
        "extra block label",
        'job "j" {\n  update "u" {\n  }\n}\n',
        2,
        10,
        "Extraneous label for update",
        "No labels are expected for update blocks.",
    ),
    (
        "missing required argument",
        'job "j" {\n  group "g" {\n    task "t" {\n      lifecycle {\n        sidecar = true\n      }\n'
        "    }\n  }\n}\n",
        4,
        17,
        "Missing required argument",
        'The argument "hook" is required, but no definition was found.',
    ),
    (
        "duplicate single block",
        'job "j" {\n  group "g" {\n    restart {\n    }\n    restart {\n    }\n  }\n}\n',
        5,
        5,
        "Duplicate restart block",
        "Only one restart block is allowed. Another was defined at input.hcl:3,5.",
    ),
    (
        "string where a number is needed",
        'job "j" {\n  group "g" {\n    count = "two"\n  }\n}\n',
        3,
        13,
        "Unsuitable value type",
        "Unsuitable value: a number is required",
    ),
    (
        "list where a string is needed",
        'job "j" {\n  region = ["a"]\n}\n',
        2,
        12,
        "Unsuitable value type",
        "Unsuitable value: string required",
    ),
    (
        "count out of range for uint64",
        'job "j" {\n  group "g" {\n    task "t" {\n      resources {\n        device "nvidia/gpu" {\n'
        "          count = -1\n        }\n      }\n    }\n  }\n}\n",
        6,
        19,
        "Unsuitable value type",
        "value must be a whole number, between 0 and 18446744073709551615",
    ),
    (
        "meta given as attribute and block",
        'job "j" {\n  meta = { a = "1" }\n  meta {\n    b = "2"\n  }\n}\n',
        3,
        3,
        "Duplicate meta block",
        "meta may not be defined more than once.",
    ),
    (
        "env entries must be strings",
        'job "j" {\n  group "g" {\n    task "t" {\n      env = ["a"]\n    }\n  }\n}\n',
        4,
        13,
        "Unsuitable value type",
        "map of string required",
    ),
    (
        "unknown top-level block",
        'jobs "j" {\n}\n',
        1,
        1,
        "Unsupported block type",
        'Blocks of type "jobs" are not expected here.',
    ),
    (
        "task scaling label",
        'job "j" {\n  group "g" {\n    task "t" {\n      scaling "gpu" {\n        max = 2\n      }\n'
        "    }\n  }\n}\n",
        4,
        15,
        "Invalid scaling policy name",
        'scaling policy name must be "cpu" or "mem"',
    ),
    (
        "group scaling needs max",
        'job "j" {\n  group "g" {\n    scaling {\n      min = 1\n    }\n  }\n}\n',
        3,
        13,
        "Missing required argument",
        'The argument "max" is required',
    ),
    (
        "unknown function",
        'job "j" {\n  region = nosuch("a")\n}\n',
        2,
        12,
        "Call to unknown function",
        'There is no function named "nosuch".',
    ),
    (
        # Real Nomad has lower(); the stand-in's table holds only what llmgw calls, so it
        # answers as HCL answers any name its table lacks.
        "a function llmgw does not call",
        'job "j" {\n  region = lower("A")\n}\n',
        2,
        12,
        "Call to unknown function",
        'There is no function named "lower".',
    ),
    (
        "a filesystem function, disabled on the parse endpoint",
        'job "j" {\n  region = file("/etc/passwd")\n}\n',
        2,
        12,
        "Error in function call",
        'Call to function "file" failed: filesystem function disabled.',
    ),
    (
        "attribute of an undeclared variable",
        'job "j" {\n  region = var.nope\n}\n',
        2,
        15,
        "Unsupported attribute",
        'This object does not have an attribute named "nope".',
    ),
    (
        "unset variable",
        'variable "dc" {}\njob "j" {\n  datacenters = [var.dc]\n}\n',
        1,
        1,
        'Unset variable "dc"',
        "A used variable must be set or have a default value",
    ),
]


@pytest.mark.parametrize(
    ("text", "line", "column", "summary", "detail"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_decode_errors_carry_position_and_hcl_wording(
    text: str, line: int, column: int, summary: str, detail: str
) -> None:
    d = _one(text)
    assert (d.line, d.column, d.summary) == (line, column, summary), str(d)
    assert detail in d.detail
    assert str(d).startswith(f"input.hcl:{line}:{column}: {summary}")


SYNTAX = [
    ("unterminated string", 'job "j" {\n  region = "abc\n}\n', 2, 16, "Invalid multi-line string"),
    ("invalid escape", 'job "j" {\n  region = "a\\qb"\n}\n', 2, 14, "Invalid escape sequence"),
    ("single quotes", "job \"j\" {\n  region = 'a'\n}\n", 2, 12, "Invalid character"),
    (
        "shell default inside an interpolation",
        'job "j" {\n  group "g" {\n    task "t" {\n      template {\n'
        "        data = <<EOF\nHOST=${HOSTNAME:-x}\nEOF\n"
        "      }\n    }\n  }\n}\n",
        6,
        16,
        "Extra characters after interpolation expression",
    ),
    ("unclosed block", 'job "j" {\n  group "g" {\n', 2, 13, "Unclosed configuration block"),
    (
        "missing newline after argument",
        'job "j" {\n  region = "a" type = "b"\n}\n',
        2,
        16,
        "Missing newline after argument",
    ),
    ("template in a block label", 'job "j-${x}" {\n}\n', 1, 5, "Invalid string literal"),
    (
        "unterminated heredoc",
        'job "j" {\n  meta {\n    a = <<EOF\nnever closed\n  }\n}\n',
        3,
        9,
        "Unterminated template string",
    ),
    ("missing equals in object", 'job "j" {\n  meta = { a "b" }\n}\n', 2, 14, "Missing key/value separator"),
]


@pytest.mark.parametrize(
    ("text", "line", "column", "summary"), [c[1:] for c in SYNTAX], ids=[c[0] for c in SYNTAX]
)
def test_syntax_errors_carry_position(text: str, line: int, column: int, summary: str) -> None:
    d = _one(text)
    assert (d.line, d.column, d.summary) == (line, column, summary), str(d)


def test_every_problem_is_reported_not_just_the_first() -> None:
    diags = _errors('job "j" {\n  foo = 1\n  group "g" {\n    bar = 2\n    baz {}\n  }\n}\n')
    assert [(d.line, d.column) for d in diags] == [(2, 3), (4, 5), (5, 5)]


def test_missing_job_block() -> None:
    d = _one("variables {\n  a = 1\n}\n")
    assert d.summary == "Missing job block"


def test_nomad_text_uses_hcl_range_format() -> None:
    d = _one('job "j" {\n  foo = 1\n}\n')
    assert (
        d.nomad_text() == 'input.hcl:2,3: Unsupported argument; An argument named "foo" is not expected here.'
    )
