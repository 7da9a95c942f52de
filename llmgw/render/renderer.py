"""Rendering a replica into a Nomad job, and refusing a job that is not what llmgw must submit.

Owns the jinja2 environment (``StrictUndefined``: a missing variable is an
error, not an empty string; the operator's template folder before the bundled
one), the spec hash (what would run, so "changed?" is a string compare), and the
check every rendered job passes before anything is submitted: it parses with
the Nomad-strict jobspec parser, matches Nomad's API fields key-exact, and still
has what llmgw routes to and adopts by.
"""

from __future__ import annotations

import fnmatch
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from llmgw import __version__
from llmgw.apispec import check_document
from llmgw.apispec.jobspec import JobspecError, parse_jobspec
from llmgw.bundled import bundled_path
from llmgw.core import conventions as c
from llmgw.core.catalog import Catalog, SecurityPolicy, check_profile
from llmgw.core.catalog.security import PROCESS_ALTERING_ENV
from llmgw.render.context import (
    FABRIC_SLOT,
    REPLICA_SLOT,
    VERSION_SLOT,
    RenderError,
    ReplicaRequest,
    build_context,
    job_id_for,
)
from llmgw.render.hcl import hcl_attributes, hcl_bool, hcl_list, hcl_number, hcl_object, hcl_string
from llmgw.render.settings import RenderSettings

_CATALOG_HASH_SLOT = "@@llmgw-catalog-hash@@"
_SPEC_HASH_SLOT = "@@llmgw-spec-hash@@"


@dataclass(frozen=True, slots=True)
class RenderedJob:
    job_id: str
    hcl: str
    # sha256 of the job as rendered with the replica id, fabric, catalog hash and
    # spec hash left out: the same for every replica of a profile, and changed
    # exactly when what would run changes.
    spec_hash: str
    template: str


class Renderer:
    def __init__(self, settings: RenderSettings, policy: SecurityPolicy) -> None:
        self.settings = settings
        self.policy = policy
        loaders: list[jinja2.BaseLoader] = []
        if settings.templates_dir is not None:
            loaders.append(jinja2.FileSystemLoader(str(settings.templates_dir)))
        loaders.append(jinja2.FileSystemLoader(str(bundled_path("templates"))))
        self._env = jinja2.Environment(
            loader=jinja2.ChoiceLoader(loaders),
            undefined=jinja2.StrictUndefined,
            autoescape=False,  # noqa: S701 - HCL, not HTML: the hcl filters escape every value
            keep_trailing_newline=True,
        )
        self._env.filters.update(
            hcl=hcl_string,
            hcl_list=hcl_list,
            hcl_object=hcl_object,
            hcl_attributes=hcl_attributes,
            hcl_number=hcl_number,
            hcl_bool=hcl_bool,
        )

    def template_name(self, engine: str) -> str:
        return f"{engine}.nomad.hcl.j2"

    def render(self, catalog: Catalog, request: ReplicaRequest, *, catalog_hash: str) -> RenderedJob:
        """The HCL of one replica. Raises RenderError with what to change."""
        model = catalog.models.get(request.model)
        if model is not None and 0 <= request.profile_index < len(model.profiles):
            profile = model.profiles[request.profile_index]
            violations = check_profile(self.policy, profile.engine, profile.args, profile.env)
            if violations:
                raise RenderError(
                    f"model {request.model!r} profile {request.profile_index}: "
                    + "; ".join(v.message for v in violations)
                )
            name = self.template_name(profile.engine.value)
        else:
            name = "sim.nomad.hcl.j2"  # build_context reports the unknown model or profile
        # One render with slots where the replica id, the fabric and the volatile
        # meta go. Its hash is the spec hash: equal for every replica of a profile,
        # changed exactly when what runs changes (not by an unrelated catalog edit
        # or an llmgw upgrade that renders the same job). Then the slots are filled;
        # the fabric (node meta, not llmgw's) is escaped like any value.
        job_id = job_id_for(request.model, request.replica_id)
        slotted = ReplicaRequest(
            request.model,
            request.profile_index,
            REPLICA_SLOT,
            FABRIC_SLOT if request.fabric is not None else None,
        )
        stable = self._render_text(
            name, catalog, slotted, catalog_hash=_CATALOG_HASH_SLOT, spec_hash=_SPEC_HASH_SLOT
        )
        spec_hash = hashlib.sha256(stable.encode("utf-8")).hexdigest()
        text = (
            stable.replace(_CATALOG_HASH_SLOT, catalog_hash)
            .replace(_SPEC_HASH_SLOT, spec_hash)
            .replace(REPLICA_SLOT, request.replica_id)
            .replace(VERSION_SLOT, __version__)
            .replace(FABRIC_SLOT, hcl_string(request.fabric or "")[1:-1])
        )
        return RenderedJob(job_id, text, spec_hash, name)

    def _render_text(
        self, name: str, catalog: Catalog, request: ReplicaRequest, *, catalog_hash: str, spec_hash: str
    ) -> str:
        context = build_context(
            catalog, request, self.settings, template=name, catalog_hash=catalog_hash, spec_hash=spec_hash
        )
        try:
            template = self._env.get_template(name)
            return template.render(context)
        except jinja2.UndefinedError as exc:
            raise RenderError(f"template {name}: {exc.message}") from exc
        except jinja2.TemplateSyntaxError as exc:
            raise RenderError(f"template {exc.filename or name}:{exc.lineno}: {exc.message}") from exc
        except (TypeError, ValueError) as exc:
            raise RenderError(f"template {name}: {exc}") from exc

    def check(self, rendered: RenderedJob, *, model: str) -> dict[str, Any]:
        """Parse as Nomad would and refuse what llmgw must not submit; returns the job JSON."""
        try:
            job = parse_jobspec(rendered.hcl, filename=f"{rendered.job_id}.nomad.hcl")
        except JobspecError as exc:
            problems = "\n".join(str(d) for d in exc.diagnostics)
            raise RenderError(
                f"template {rendered.template} rendered HCL Nomad would refuse:\n{problems}"
            ) from exc
        return check_job(job, job_id=rendered.job_id, model=model, spec_hash=rendered.spec_hash)


# Group settings Nomad still parses but has ignored since 1.10 (hashicorp/nomad#25284): the
# HTTP API drops them before the server sees the job (``command/agent/job_endpoint.go``,
# ``ApiTgToStructsTG``, Nomad 2.0.5), so the register answers without even a warning. A
# template using one would do nothing on a real cluster. JSON field -> (HCL, what works).
IGNORED_BY_NOMAD: dict[str, tuple[str, str]] = {
    "MaxClientDisconnect": ("max_client_disconnect", "disconnect { lost_after = ... }"),
    "StopAfterClientDisconnect": (
        "stop_after_client_disconnect",
        "disconnect { stop_on_client_after = ... }",
    ),
    "PreventRescheduleOnLost": ("prevent_reschedule_on_lost", "disconnect { replace = false }"),
}


def check_job(job: dict[str, Any], *, job_id: str, model: str, spec_hash: str) -> dict[str, Any]:
    """The pieces llmgw relies on, in a job as Nomad's parser returned it."""
    problems = [f"{p.path}: {p.message}" for p in check_document(job, "Job")]
    if job.get("ID") != job_id:
        problems.append(f"the job id is {job.get('ID')!r}, not {job_id!r}")
    meta = job.get("Meta") or {}
    expected = {
        c.JOB_META_MANAGED_BY: c.MANAGED_BY_VALUE,
        c.JOB_META_MODEL: model,
        c.JOB_META_SPEC_HASH: spec_hash,
    }
    for key, value in expected.items():
        if meta.get(key) != value:
            problems.append(f"job meta {key} must be {value!r} (llmgw adopts jobs by it)")
    reschedule = job.get("Reschedule") or {}
    if reschedule.get("Attempts") != 0 or reschedule.get("Unlimited") is not False:
        problems.append(
            "the job must say reschedule { attempts = 0, unlimited = false }: llmgw rebuilds replicas"
        )
    if (job.get("Update") or {}).get("MaxParallel") != 0:
        problems.append(
            "the job must say update { max_parallel = 0 }: without it Nomad deploys the job, fails "
            "the deployment of a model that loads past its healthy deadline and then never places "
            "a rank still waiting for room"
        )
    engine_services = [
        service
        for group in job.get("TaskGroups") or []
        for service in group.get("Services") or []
        if service.get("Name") == c.ENGINE_SERVICE
    ]
    if len(engine_services) != 1 or (engine_services[0].get("Meta") or {}).get(c.META_MODEL) != model:
        problems.append(
            f"exactly one {c.ENGINE_SERVICE} service with meta {c.META_MODEL} = {model!r} is required"
        )
    for group in job.get("TaskGroups") or []:
        for field, (setting, instead) in IGNORED_BY_NOMAD.items():
            if group.get(field) is not None:
                problems.append(
                    f"group {group.get('Name')}: {setting} is ignored by Nomad 2.0, without a word; "
                    f"say it with {instead}"
                )
        if (group.get("Update") or {}).get("MaxParallel") not in (None, 0):
            problems.append(
                f"group {group.get('Name')}: an update block with max_parallel other than 0 makes "
                "Nomad deploy the job (llmgw never updates a job in place)"
            )
        if (group.get("Disconnect") or {}).get("Replace") is not False:
            problems.append(
                f"group {group.get('Name')}: disconnect {{ replace = false }} is required "
                "(Nomad would replace one lost shard of a replica on its own)"
            )
        for task in group.get("Tasks") or []:
            for name in task.get("Env") or {}:
                if any(fnmatch.fnmatchcase(name.upper(), pattern) for pattern in PROCESS_ALTERING_ENV):
                    problems.append(
                        f"task {task.get('Name')}: env {name} changes what runs; it is never allowed"
                    )
    if problems:
        raise RenderError("the rendered job is not one llmgw may submit:\n" + "\n".join(problems))
    return job


def read_template_dir(path: Path) -> Path:
    if not path.is_dir():
        raise RenderError(f"template folder {path} does not exist")
    return path
