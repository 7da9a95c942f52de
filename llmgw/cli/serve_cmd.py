"""``llmgw serve``: the control plane and the router against a real Nomad and Consul.

Connections come from NOMAD_* and CONSUL_HTTP_* as the CLIs read them; the
router's settings from its flags or LLMGW_ROUTER_*; the admin API's from
--admin-* or LLMGW_ADMIN_*; rendering from LLMGW_*. This module only parses;
``serve_run`` runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from llmgw.admin.settings import add_admin_arguments
from llmgw.cli.event_loop import add_event_loop_argument
from llmgw.flags import CONTROL_METRICS_PORT, LOG_LEVEL, flag_type
from llmgw.gateway.settings import add_router_arguments

ROLES = ("all", "control-plane", "router")


def _serve(args: argparse.Namespace) -> int:
    from llmgw.cli.serve_run import run_serve

    return run_serve(args)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the control plane and/or the router against Nomad and Consul (NOMAD_ADDR, ...)",
        description="Run llmgw against a real Nomad and Consul until SIGINT or SIGTERM. The control "
        "plane (one instance leads through a Consul lock; run two or more) keeps one Nomad job per "
        "replica, with the admin API beside it; the router serves the OpenAI API, /health and "
        "/metrics (run one per host behind a load balancer). Nomad and Consul come from NOMAD_ADDR, "
        "NOMAD_TOKEN, NOMAD_NAMESPACE, NOMAD_REGION, NOMAD_CACERT... and CONSUL_HTTP_ADDR, "
        "CONSUL_HTTP_TOKEN(_FILE), CONSUL_CACERT..., as their CLIs read them. The admin API's token "
        "is LLMGW_ADMIN_TOKEN (environment only). The rendered jobs take LLMGW_DATACENTERS "
        "(default *), LLMGW_NODE_POOL, LLMGW_NODE_COMMAND (how nodes run llmgw, default llmgw), "
        "LLMGW_MIRROR_URL, LLMGW_ALLOWED_IMAGES, LLMGW_TRUSTED_IMAGE_DIGESTS, "
        "LLMGW_IMAGE_VLLM/_SGLANG/_LLAMACPP, "
        "LLMGW_MODEL_CACHE_DIR, LLMGW_TEMPLATES and LLMGW_HF_TOKEN_VARIABLE (the Nomad Variable engines "
        "read HF_TOKEN from). With LLMGW_ENGINE_KEY_SECRET (environment only, the same on every "
        "instance) each replica's engine requires its own API key, which routers send. "
        "The control plane serves its own /metrics and "
        "/health on --control-metrics-host/--control-metrics-port. The catalog is the one applied "
        "in Consul (llmgw ctl apply). ops/README.md says how to deploy it. Exit 0 stopped, 1 an "
        "invalid --catalog, 2 usage or settings that cannot run.",
    )
    parser.add_argument(
        "--role",
        choices=ROLES,
        default=ROLES[0],
        help="all: control plane, admin API and router in one process; control-plane: the control "
        "plane and its admin API; router: the router only, which reads Consul and follows Nomad's "
        "allocations too (NOMAD_TOKEN: read-job on llmgw's namespace and node read, see "
        "ops/README.md) (default all)",
    )
    parser.add_argument(
        "--catalog",
        type=Path,
        help="apply this catalog file at start when it differs from the one in Consul (a first start, "
        "or a deployment that ships its catalog); without it the catalog in Consul is used",
    )
    parser.add_argument("--policy", type=Path, help="engine security policy (default: the bundled one)")
    parser.add_argument(
        "--log-level",
        type=flag_type(LOG_LEVEL),
        help="DEBUG, INFO, WARNING or ERROR (default $LLMGW_LOG_LEVEL or INFO)",
    )
    add_event_loop_argument(parser)
    group = parser.add_argument_group("control plane")
    group.add_argument(
        "--control-metrics-host",
        help="address of the control plane's /metrics and /health (default 127.0.0.1; "
        "env LLMGW_CONTROL_METRICS_HOST; 0.0.0.0 for a Prometheus elsewhere)",
    )
    group.add_argument(
        "--control-metrics-port",
        type=flag_type(CONTROL_METRICS_PORT),
        help="port of the control plane's /metrics and /health (default 8082; "
        "env LLMGW_CONTROL_METRICS_PORT)",
    )
    add_router_arguments(parser.add_argument_group("router (flag, else LLMGW_ROUTER_*, else default)"))  # type: ignore[arg-type]
    add_admin_arguments(
        parser.add_argument_group(
            "admin API, beside the control plane (flag, else LLMGW_ADMIN_*, else default)"
        )  # type: ignore[arg-type]
    )
    parser.set_defaults(handler=_serve)
