"""The api package's Canonicalize defaults, for ``/v1/jobs/parse`` with ``Canonicalize: true``.

Owns filling the defaults that ``api.Job.Canonicalize`` (and the TaskGroup, Task,
Resources, ... Canonicalize methods it calls) sets, for the fields llmgw's
templates use. DESIGN.md lists which; everything else is left as parsed.
Must not: change a value the jobspec set.
"""

from __future__ import annotations

Doc = dict[str, object]


def canonicalize_job(job: Doc) -> None:
    """Fill Canonicalize defaults into ``job`` in place."""
    job.setdefault("ID", "")
    job.setdefault("Name", job["ID"])
