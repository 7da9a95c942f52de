"""Moved to ``llmgw.apispec.jobspec`` (the renderer checks jobs with it too); kept for old imports."""

from llmgw.apispec.jobspec import Diagnostic, JobspecError, parse_jobspec

__all__ = ["Diagnostic", "JobspecError", "parse_jobspec"]
