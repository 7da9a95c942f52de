"""The sample Nomad job that runs llmgw itself (ops/llmgw.nomad.hcl) is one Nomad would accept."""

from __future__ import annotations

from pathlib import Path

import hcl2
import pytest

from llmgw.apispec import check_document
from llmgw.apispec.jobspec import JobspecError, parse_jobspec

OPS_JOB = Path(__file__).resolve().parents[2] / "ops" / "llmgw.nomad.hcl"


def test_the_ops_job_parses_strictly_and_key_exact() -> None:
    text = OPS_JOB.read_text()
    for canonicalize in (False, True):
        job = parse_jobspec(
            text, filename=OPS_JOB.name, variables={"datacenters": ["dc1"]}, canonicalize=canonicalize
        )
        assert check_document(job, "Job") == []
    assert hcl2.loads(text)  # and an independent HCL2 parser reads it


def test_the_ops_job_needs_its_datacenters_set() -> None:
    # No default: a job registered without it would run wherever Nomad's default says.
    with pytest.raises(JobspecError, match='Unset variable "datacenters"'):
        parse_jobspec(OPS_JOB.read_text(), filename=OPS_JOB.name)


def test_a_variables_file_sets_the_ops_job_and_loses_to_variables_given() -> None:
    text = OPS_JOB.read_text()
    job = parse_jobspec(text, variables_file='datacenters = ["a"]\nadmin_port = 9001\nundeclared = 1\n')
    assert job["Datacenters"] == ["a"]
    control = next(g for g in job["TaskGroups"] if g["Name"] == "control-plane")  # type: ignore[attr-defined]
    assert "9001" in control["Tasks"][0]["Config"]["args"]
    job = parse_jobspec(text, variables={"datacenters": ["b"]}, variables_file='datacenters = ["a"]\n')
    assert job["Datacenters"] == ["b"]
