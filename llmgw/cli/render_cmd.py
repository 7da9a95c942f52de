"""``llmgw render``: the Nomad jobs llmgw would submit, as files an operator can read and review.

``--check`` compares with a folder of rendered jobs (the golden files in
``jobspecs/``) and says how to refresh them; ``--plan`` asks Nomad's scheduler
(NOMAD_ADDR) whether each job would place, and answers in words, with whatever
Nomad warns about in the job.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from llmgw.cli import EXIT_OK, EXIT_REJECTED, EXIT_UNREACHABLE, EXIT_USAGE

if TYPE_CHECKING:  # imported where used: every llmgw command builds this parser
    from llmgw.core.catalog import Catalog
    from llmgw.render import Renderer, ReplicaRequest

DEFAULT_FABRIC = "fabric-a"
REFRESH_HINT = "llmgw render examples/catalog.yaml --out jobspecs --all-profiles"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "render",
        help="render catalog models into Nomad jobs (HCL or JSON)",
        description="Render replica 0 of each model's first profile into the Nomad job llmgw would "
        "submit (one job per replica, one task group per node of a multi-node replica), and check it "
        "as llmgw does before submitting. Without --out the jobs are printed; --check compares with "
        "the files already in --out; --plan asks Nomad whether each would place. Engine images a "
        "catalog names must come from LLMGW_ALLOWED_IMAGES (default: the default engine images' "
        "repositories) and, like LLMGW_IMAGE_*, name a release at or above the engine's minimum "
        "or a digest in LLMGW_TRUSTED_IMAGE_DIGESTS. LLMGW_DATACENTERS, LLMGW_NODE_POOL, "
        "LLMGW_NODE_COMMAND, NOMAD_NAMESPACE and "
        "NOMAD_REGION are applied by `llmgw serve` only: here the jobs have their defaults. Exit 0 "
        "done, 1 an invalid catalog, a refused job, stale files (--check) or a job that does not "
        "place (--plan), 2 usage, 3 Nomad cannot be reached (--plan).",
    )
    parser.add_argument("catalog", metavar="CATALOG", help="catalog YAML file (- for standard input)")
    parser.add_argument(
        "--out",
        type=Path,
        help="write one file per job into this folder (with --check: the folder compared, default jobspecs)",
    )
    parser.add_argument("--model", action="append", default=[], help="only this model (repeatable)")
    parser.add_argument("--profile", type=int, help="this profile index instead of the first")
    parser.add_argument("--all-profiles", action="store_true", help="every profile of every model")
    parser.add_argument("--replica", default="0", help="replica id, the job id's last part (default 0)")
    parser.add_argument(
        "--fabric",
        default=DEFAULT_FABRIC,
        help=f"node meta llmgw_fabric a multi-node replica is pinned to (default {DEFAULT_FABRIC})",
    )
    parser.add_argument(
        "--format", choices=("hcl", "json"), default="hcl", help="json: the job as Nomad's parser returns it"
    )
    parser.add_argument(
        "--templates",
        type=Path,
        help="folder of templates overriding the bundled ones (default $LLMGW_TEMPLATES)",
    )
    parser.add_argument(
        "--mirror-url",
        help="the mirror nodes fetch mirror:NAME@VERSION sources from (default $LLMGW_MIRROR_URL)",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when files in --out are stale")
    parser.add_argument(
        "--plan",
        action="store_true",
        help="ask Nomad whether each job places, say why not in words, and show what Nomad warns about "
        "(NOMAD_ADDR, NOMAD_TOKEN...)",
    )
    parser.add_argument("--policy", type=Path, help="engine security policy (default: the bundled one)")
    parser.set_defaults(handler=_render)


@dataclass(frozen=True, slots=True)
class RenderedFile:
    name: str
    text: str
    request: ReplicaRequest
    hcl: str


def _requests(catalog: Catalog, args: argparse.Namespace) -> list[tuple[ReplicaRequest, str]]:
    from llmgw.render import RenderError, ReplicaRequest

    models = args.model or list(catalog.models)
    out: list[tuple[ReplicaRequest, str]] = []
    for model in models:
        if model not in catalog.models:
            raise RenderError(f"the catalog has no model {model!r}")
        profiles = catalog.models[model].profiles
        indexes = range(len(profiles)) if args.all_profiles else [args.profile or 0]
        for index in indexes:
            fabric = args.fabric if 0 <= index < len(profiles) and profiles[index].node_count > 1 else None
            suffix = "" if index == 0 else f".profile-{index}"
            out.append((ReplicaRequest(model, index, args.replica, fabric), suffix))
    return out


def render_files(
    catalog: Catalog, renderer: Renderer, args: argparse.Namespace, *, catalog_hash: str
) -> list[RenderedFile]:
    """The jobs of ``args``' replicas; ``catalog_hash`` is ``catalog_file_hash`` of the file's text."""
    files = []
    for request, suffix in _requests(catalog, args):
        rendered = renderer.render(catalog, request, catalog_hash=catalog_hash)
        job = renderer.check(rendered, model=request.model)
        if args.format == "json":
            text = json.dumps({"Job": job}, indent=2, sort_keys=True) + "\n"
            name = f"{rendered.job_id}{suffix}.json"
        else:
            text, name = rendered.hcl, f"{rendered.job_id}{suffix}.nomad.hcl"
        files.append(RenderedFile(name, text, request, rendered.hcl))
    return files


def catalog_file_hash(text: str) -> str:
    """The ``llmgw_catalog_hash`` llmgw puts in a job for this catalog text.

    The control plane stamps its jobs with the sha256 of the catalog version's text
    (``CatalogVersion.sha256``, what `llmgw ctl apply` sends: the file as read), not of
    the parsed catalog, so ``render`` hashes the file's text the same way.
    """
    from llmgw.core.records import catalog_sha256

    return catalog_sha256(text)


def _render(args: argparse.Namespace) -> int:
    from llmgw.bundled import read_security_policy
    from llmgw.cli.catalog_cmd import read_catalog_text
    from llmgw.core.catalog import load_catalog
    from llmgw.render import Renderer, RenderError

    policy = read_security_policy(args.policy)
    read = read_catalog_text(args.catalog)
    if read is None:
        return EXIT_USAGE
    filename, text = read
    loaded = load_catalog(text, filename=filename, policy=policy)
    for diagnostic in loaded.diagnostics:
        print(diagnostic.format(), file=sys.stderr)
    if loaded.catalog is None:
        return EXIT_REJECTED
    from llmgw.render.settings import RenderSettingsError, render_settings_from_env

    try:
        # The same cluster settings serve renders with (LLMGW_*, NOMAD_NAMESPACE, NOMAD_REGION).
        settings = render_settings_from_env(os.environ)
    except RenderSettingsError as exc:
        print(f"llmgw render: {exc}", file=sys.stderr)
        return EXIT_USAGE
    settings = replace(
        settings,
        templates_dir=args.templates or settings.templates_dir,
        mirror_url=args.mirror_url or settings.mirror_url,
    )
    try:
        files = render_files(
            loaded.catalog, Renderer(settings, policy), args, catalog_hash=catalog_file_hash(text)
        )
    except RenderError as exc:
        print(f"llmgw render: {exc}", file=sys.stderr)
        return EXIT_REJECTED
    if args.check:
        return _check(files, args.out or Path("jobspecs"))
    if args.plan:
        return asyncio.run(_plan(files))
    if args.out is None:
        sys.stdout.write("".join(f.text for f in files))
        return EXIT_OK
    args.out.mkdir(parents=True, exist_ok=True)
    for rendered in files:
        (args.out / rendered.name).write_text(rendered.text, encoding="utf-8")
        print(f"wrote {args.out / rendered.name}", file=sys.stderr)
    return EXIT_OK


def _check(files: list[RenderedFile], folder: Path) -> int:
    expected = {f.name: f.text for f in files}
    problems = []
    for name, text in sorted(expected.items()):
        path = folder / name
        if not path.exists():
            problems.append(f"{path}: missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{path}: stale (the templates or the catalog changed)")
    suffix = ".json" if files and files[0].name.endswith(".json") else ".nomad.hcl"
    for path in sorted(folder.glob(f"*{suffix}")):
        if path.name not in expected:
            problems.append(f"{path}: no longer rendered")
    for problem in problems:
        print(problem)
    if problems:
        print(f"refresh with: {REFRESH_HINT}", file=sys.stderr)
        return EXIT_REJECTED
    print(f"{folder}: {len(files)} job(s) up to date", file=sys.stderr)
    return EXIT_OK


async def _plan(files: list[RenderedFile]) -> int:
    from llmgw.adapters.nomad import NomadClient, NomadError
    from llmgw.settings import NomadConnection

    connection = NomadConnection.from_env(os.environ)
    placed = True
    async with NomadClient(connection) as nomad:
        for rendered in files:
            try:
                job = await nomad.parse_hcl(rendered.hcl)
                outcome = await nomad.plan(job)
            except NomadError as exc:
                if exc.status is None:
                    # No answer says nothing about the job: the other jobs would get none either.
                    print(
                        f"llmgw render: cannot ask Nomad whether the jobs place: {exc} "
                        "(is NOMAD_ADDR the cluster's address, and is Nomad up?)",
                        file=sys.stderr,
                    )
                    return EXIT_UNREACHABLE
                print(f"{rendered.name}: Nomad refused it: {exc}")
                placed = False
                continue
            print(f"{rendered.name}: {outcome.explanation}")
            for warning in outcome.warnings:
                print(f"{rendered.name}: Nomad warns: {warning}")
            placed = placed and outcome.feasible
    return EXIT_OK if placed else EXIT_REJECTED
