"""Any text written with the hcl filters arrives verbatim, read by two HCL2 parsers."""

from __future__ import annotations

import hcl2
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.apispec.jobspec import parse_jobspec
from llmgw.core.engines import Runtime
from llmgw.render.hcl import hcl_list, hcl_object, hcl_string

texts = st.text(alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=60)
HOSTILE = [
    '"} task "x" { driver = "raw_exec" config { command = "/bin/sh" } } #',
    '${env["HOME"]}',
    "%{ if true }x%{ endif }",
    "$${already}",
    "line\nbreak\r\n\ttab",
    "back\\slash\\",
    "<<EOF\nheredoc\nEOF",
    "\u2028\u2029\u0085 unicode ✓ 模型",
]


def _job_with(value_hcl: str, list_hcl: str) -> str:
    return f"""job "j" {{
  meta = {{ "k" = {value_hcl} }}
  group "g" {{
    task "t" {{
      driver = "raw_exec"
      config {{
        command = "x"
        args    = {list_hcl}
      }}
    }}
  }}
}}
"""


def _round_trip_jobspec(value: str) -> tuple[str, list[str]]:
    job = parse_jobspec(_job_with(hcl_string(value), hcl_list([value, "b"])))
    return job["Meta"]["k"], job["TaskGroups"][0]["Tasks"][0]["Config"]["args"]


def _hcl2_reads(value: str) -> bool:
    """python-hcl2 (8.x) refuses an escaped $${ or %%{ that no "}" follows, which HCL allows."""
    for opener in ("${", "%{"):
        start = value.find(opener)
        while start != -1:
            if "}" not in value[start:]:
                return False
            start = value.find(opener, start + 1)
    return True


def _round_trip_hcl2(value: str) -> str:
    parsed = hcl2.loads(f"x = {hcl_string(value)}\n")
    # python-hcl2 keeps the quotes and HCL's own escapes; decode them as HCL does.
    raw = parsed["x"]
    assert raw.startswith('"') and raw.endswith('"')
    return _unescape_hcl(raw[1:-1])


def _unescape_hcl(body: str) -> str:
    out, i = [], 0
    simple = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}
    while i < len(body):
        char = body[i]
        if char == "\\":
            code = body[i + 1]
            if code == "u":
                out.append(chr(int(body[i + 2 : i + 6], 16)))
                i += 6
                continue
            out.append(simple[code])
            i += 2
            continue
        if body.startswith("$${", i) or body.startswith("%%{", i):
            out.append(body[i + 1 : i + 3])
            i += 3
            continue
        out.append(char)
        i += 1
    return "".join(out)


def test_hostile_strings_arrive_verbatim() -> None:
    for value in HOSTILE:
        meta, args = _round_trip_jobspec(value)
        assert meta == value
        assert args == [value, "b"]
        assert _round_trip_hcl2(value) == value


@settings(max_examples=300, deadline=None)
@given(texts)
def test_any_text_arrives_verbatim(value: str) -> None:
    meta, args = _round_trip_jobspec(value)
    assert meta == value and args == [value, "b"]
    if _hcl2_reads(value):
        assert _round_trip_hcl2(value) == value


def test_runtime_interpolation_is_kept_and_catalog_text_is_not() -> None:
    job = parse_jobspec(_job_with(hcl_string(Runtime("${NOMAD_ALLOC_ID}")), hcl_list(["${NOMAD_ALLOC_ID}"])))
    assert job["Meta"]["k"] == "${NOMAD_ALLOC_ID}"  # llmgw's own: Nomad interpolates it
    assert job["TaskGroups"][0]["Tasks"][0]["Config"]["args"] == ["${NOMAD_ALLOC_ID}"]
    # the same text from a catalog is written as $${...}, which HCL reads back as the literal text
    assert hcl_string("${NOMAD_ALLOC_ID}") == '"$${NOMAD_ALLOC_ID}"'


def test_objects_quote_their_keys() -> None:
    job = parse_jobspec(
        'job "j" {\n  meta = ' + hcl_object({'a" = "b': "x", "${k}": "y"}, 2) + '\n  group "g" {}\n}\n'
    )
    assert job["Meta"] == {'a" = "b': "x", "${k}": "y"}
