"""Rendering replicas into Nomad jobs from the jinja2 templates in ``templates/``.

Public face: ``Renderer(settings, policy).render(catalog, ReplicaRequest(...), catalog_hash=)``
-> ``RenderedJob(job_id, hcl, spec_hash, template)``, ``Renderer.check(rendered, model=)`` -> the
job JSON Nomad's parser gives (or ``RenderError``), ``job_id_for(model, replica_id)``.
"""

from llmgw.render.context import RenderError, ReplicaRequest, job_id_for
from llmgw.render.renderer import RenderedJob, Renderer, check_job
from llmgw.render.settings import DEFAULT_CPU_IMAGES, DEFAULT_IMAGES, RenderSettings

__all__ = [
    "DEFAULT_CPU_IMAGES",
    "DEFAULT_IMAGES",
    "RenderError",
    "RenderSettings",
    "RenderedJob",
    "Renderer",
    "ReplicaRequest",
    "check_job",
    "job_id_for",
]
