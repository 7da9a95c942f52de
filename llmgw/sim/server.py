"""Running the simulated engine as a process: `python -m llmgw.sim` and `llmgw sim`.

Owns: the command-line entry (`main`, `run_from_namespace`), the start
policy check, binding (port 0 allowed: the bound address is printed on
stdout as ``llmgw-sim listening host=H port=P``), signal handling, and the
graceful shutdown that turns the lifecycle's stop into the exit code.

Must not: hold engine state or answer requests; that is `app.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence

from aiohttp import web

from llmgw.http_server import listener_log
from llmgw.sim import logs, startup_policy
from llmgw.sim.app import STATE, SimDeps, create_app
from llmgw.sim.settings import (
    ExitCode,
    SettingsError,
    SimSettings,
    add_sim_arguments,
    settings_from_namespace,
)

log = logging.getLogger("llmgw.sim")

LISTENING_PREFIX = "llmgw-sim listening"

# aiohttp's own last-resort wait for handlers after our drain (app.on_shutdown) has run.
_RUNNER_SHUTDOWN_BACKSTOP = 2.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m llmgw.sim",
        description="A simulated OpenAI-compatible LLM engine (vLLM-like, no GPU).",
    )
    add_sim_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    namespace = build_parser().parse_args(args)
    return run_from_namespace(namespace, os.environ, args)


def run_from_namespace(namespace: argparse.Namespace, environ: Mapping[str, str], argv: Sequence[str]) -> int:
    """Settings from flags and env, the start policy, then serve until stopped; returns the exit code."""
    try:
        settings = settings_from_namespace(namespace, environ)
    except SettingsError as exc:
        print(f"llmgw sim: invalid settings: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    logs.configure(settings.log_level, settings.rank, settings.access_log)
    reasons = startup_policy.refusals(settings, argv, environ)
    if reasons:
        for reason in reasons:
            log.error("start refused by the engine security policy: %s", reason)
        return ExitCode.REFUSED
    return int(asyncio.run(serve(settings)))


async def serve(settings: SimSettings, deps: SimDeps | None = None) -> ExitCode:
    """Serve until SIGTERM/SIGINT (exit 0) or a fatal event (its code); shut down gracefully."""
    app = create_app(settings, deps)
    lifecycle = app[STATE].lifecycle
    runner = web.AppRunner(
        app,
        handle_signals=False,
        access_log=logging.getLogger("aiohttp.access") if settings.access_log else None,
        handler_cancellation=True,  # a client that leaves cancels its generation at once
        shutdown_timeout=_RUNNER_SHUTDOWN_BACKSTOP,
        # Malformed requests are logged without their bytes (a prompt is among them).
        logger=listener_log("llmgw.sim.http"),
    )
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    try:
        await site.start()
    except OSError as exc:
        log.error("cannot listen host=%s port=%d error=%s", settings.host, settings.port, exc)
        await runner.cleanup()
        return ExitCode.REFUSED
    host, port = _bound(runner, settings)
    print(f"{LISTENING_PREFIX} host={host} port={port}", flush=True)
    log.info("listening host=%s port=%d rank=%d", host, port, settings.rank)

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, lifecycle.stop, ExitCode.OK, signal.Signals(signum).name)
    try:
        code = await lifecycle.stopped()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await runner.cleanup()
    log.info("stopped exit_code=%d reason=%r", int(code), lifecycle.reason)
    return code


def _bound(runner: web.AppRunner, settings: SimSettings) -> tuple[str, int]:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return str(address[0]), int(address[1])
    return settings.host, settings.port
