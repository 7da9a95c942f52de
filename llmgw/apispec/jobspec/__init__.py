"""Nomad's HCL2 job parser (jobspec2) as the dev stand-in's ``/v1/jobs/parse`` needs it.

Public face: :func:`parse_jobspec` (HCL text -> the api.Job JSON Nomad returns),
:class:`JobspecError` carrying :class:`Diagnostic` values with file, line and
column. Mirrors jobspec2's decoding from the ``hcl`` tags of :mod:`llmgw.apispec`;
see DESIGN.md for what is mirrored and what is not. Must not do I/O.
"""

from llmgw.apispec.jobspec.diagnostics import Diagnostic, JobspecError
from llmgw.apispec.jobspec.parse import parse_jobspec

__all__ = ["Diagnostic", "JobspecError", "parse_jobspec"]
