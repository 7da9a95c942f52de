"""Benchmark: render 1,000 replicas into Nomad jobs and print the rate.

Target (issue 3): 1,000 renders in under two seconds on the project's 2-core
machine. Prints, from the same run: jinja2 rendering with the spec hash (what
`render` costs), the check every job passes before submission (parse with the
Nomad-strict jobspec parser + key-exact API check), and as a baseline the
plain `str.format` of the same HCL text (what rendering costs at the least).

    python bench/render_rate.py [--replicas 1000]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from llmgw.bundled import read_security_policy
from llmgw.core.catalog import catalog_digest, load_catalog
from llmgw.render import Renderer, RenderSettings, ReplicaRequest

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=1000)
    args = parser.parse_args()
    policy = read_security_policy()
    catalog = load_catalog(
        (REPO / "examples" / "catalog.yaml").read_text(), filename="c", policy=policy
    ).catalog
    assert catalog is not None
    digest = catalog_digest(catalog)
    renderer = Renderer(RenderSettings(), policy)
    requests = []
    for name, model in catalog.models.items():
        for index, profile in enumerate(model.profiles):
            requests.append(ReplicaRequest(name, index, "0", "fabric-a" if profile.node_count > 1 else None))
    work = [
        ReplicaRequest(r.model, r.profile_index, str(i), r.fabric)
        for i, r in zip(range(args.replicas), requests * (args.replicas // len(requests) + 1), strict=False)
    ]

    start = time.perf_counter()
    rendered = [renderer.render(catalog, request, catalog_hash=digest) for request in work]
    render_s = time.perf_counter() - start

    start = time.perf_counter()
    for request, job in zip(work, rendered, strict=True):
        renderer.check(job, model=request.model)
    check_s = time.perf_counter() - start

    template = rendered[0].hcl.replace("{", "{{").replace("}", "}}")
    start = time.perf_counter()
    for _ in work:
        template.format()
    baseline_s = time.perf_counter() - start

    n = len(work)
    lines = sum(job.hcl.count("\n") for job in rendered) / n
    print(f"replicas: {n} ({len(requests)} distinct profiles, {lines:.0f} HCL lines each on average)")
    print(f"baseline str.format of one job text:   {baseline_s * 1000:8.1f} ms  ({n / baseline_s:,.0f}/s)")
    print(f"render (jinja2 + spec hash):            {render_s * 1000:8.1f} ms  ({n / render_s:,.0f}/s)")
    print(f"check (strict parse + API key check):   {check_s * 1000:8.1f} ms  ({n / check_s:,.0f}/s)")
    print(f"target: {n} renders under 2000 ms -> {'met' if render_s < 2.0 else 'NOT met'}")


if __name__ == "__main__":
    main()
