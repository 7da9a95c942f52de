"""The sample Nomad job that runs llmgw itself (ops/llmgw.nomad.hcl) is one Nomad would accept."""

from __future__ import annotations

from pathlib import Path

import hcl2

from llmgw.apispec import check_document
from llmgw.apispec.jobspec import parse_jobspec

OPS_JOB = Path(__file__).resolve().parents[2] / "ops" / "llmgw.nomad.hcl"


def test_the_ops_job_parses_strictly_and_key_exact() -> None:
    text = OPS_JOB.read_text()
    for canonicalize in (False, True):
        job = parse_jobspec(text, filename=OPS_JOB.name, canonicalize=canonicalize)
        assert check_document(job, "Job") == []
    assert hcl2.loads(text)  # and an independent HCL2 parser reads it
