"""What ``llmgw serve`` runs: the control plane and the router against a real Nomad and Consul.

Connections come from NOMAD_* and CONSUL_HTTP_* as the CLIs read them; the
router's settings from its flags or LLMGW_ROUTER_*; rendering from LLMGW_*.
``--catalog FILE`` applies FILE at start when it differs from the stored one
(a first start, or a deployment that ships its catalog with llmgw); otherwise
the catalog comes from Consul, where `llmgw ctl apply` puts it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from llmgw.adapters.consul import ConsulNamespaceUnsupported
from llmgw.admin import AdminSettings, AdminSettingsError, check_settings
from llmgw.bundled import read_security_policy
from llmgw.cli import EXIT_OK, EXIT_USAGE, event_loop
from llmgw.cli.catalog_cmd import catalog_from_file
from llmgw.cli.serving import Role, Services, ServiceSettings, publish_catalog, wait_for_signal
from llmgw.control import ControlSettings, lost_node_problem
from llmgw.control.metrics_server import MetricsListenerSettings
from llmgw.flags import (
    CONTROL_METRICS_HOST,
    CONTROL_METRICS_PORT,
    ENGINE_KEY_SECRET,
    LOG_LEVEL,
    SettingError,
    flag_or_variable,
)
from llmgw.gateway.settings import RouterSettings, RouterSettingsError
from llmgw.gateway.tracing import TracingUnavailable, tracing_from_environment
from llmgw.render.settings import RenderSettingsError, render_settings_from_env
from llmgw.settings import ConsulConnection, NomadConnection, SettingsError


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def run_serve(args: argparse.Namespace) -> int:
    try:
        configure_logging(flag_or_variable(args.log_level, LOG_LEVEL, os.environ, "INFO"))
        loop = event_loop.resolve(args.event_loop)
        nomad = NomadConnection.from_env(os.environ)
        consul = ConsulConnection.from_env(os.environ)
        router = RouterSettings.from_env_and_args(os.environ, args)
        admin = AdminSettings.from_env_and_args(os.environ, args)
        render = render_settings_from_env(os.environ)
        engine_keys = ENGINE_KEY_SECRET.read(os.environ)
        tracing = tracing_from_environment(os.environ)
        control_metrics = MetricsListenerSettings(
            flag_or_variable(args.control_metrics_host, CONTROL_METRICS_HOST, os.environ, "127.0.0.1"),
            flag_or_variable(args.control_metrics_port, CONTROL_METRICS_PORT, os.environ, 8082),
        )
    except (
        SettingsError, SettingError, RouterSettingsError, AdminSettingsError, RenderSettingsError,
        event_loop.EventLoopError, TracingUnavailable,
    ) as exc:  # fmt: skip
        print(f"llmgw serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.role != Role.ROUTER.value:
        # The admin API starts with the control plane: refuse its settings before anything runs.
        problems = check_settings(admin).problems
        if problems:
            print("llmgw serve: the admin API will not start: " + "; ".join(problems), file=sys.stderr)
            return EXIT_USAGE
        problem = lost_node_problem(ControlSettings(), render.lost_after_s)
        if problem is not None:
            print(f"llmgw serve: the control plane will not start: {problem}", file=sys.stderr)
            return EXIT_USAGE
    policy = read_security_policy(args.policy)
    catalog_text = None
    if args.catalog is not None:
        catalog = catalog_from_file(str(args.catalog), policy, render.allowlists)
        if isinstance(catalog, int):
            return catalog
        catalog_text = args.catalog.read_text(encoding="utf-8")
    settings = ServiceSettings(
        role=Role(args.role),
        nomad=nomad,
        consul=consul,
        policy=policy,
        render=render,
        router=router,
        admin=admin,
        control_metrics=control_metrics,
        engine_keys=engine_keys,
        tracing=tracing,
    )
    return event_loop.run(_run(settings, catalog_text), loop)


async def _run(settings: ServiceSettings, catalog_text: str | None) -> int:
    logging.getLogger("llmgw").info("event loop: %s", event_loop.running_loop_name())
    try:
        async with Services(settings) as services:
            if catalog_text is not None and services.consul is not None:
                applied = await publish_catalog(
                    services.consul, catalog_text, applied_by="llmgw serve --catalog"
                )
                logging.getLogger("llmgw").info(
                    "catalog %s", f"version {applied.version} applied" if applied else "unchanged"
                )
            await wait_for_signal()
    except ConsulNamespaceUnsupported as exc:  # raised at start, before anything runs
        print(f"llmgw serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK
