"""The event loop the long-running commands (``llmgw serve``, ``llmgw dev``) run on.

uvloop (libuv, in C) when it is installed, which it is wherever llmgw's
dependencies are (Linux and macOS). About a quarter of the Python the router
runs per request is asyncio's own loop machinery; uvloop does that part in C,
which saves the router a few percent of CPU (``llmgw/gateway/DESIGN.md`` has
the same-run figures). ``asyncio`` stays one flag away, for a platform without
uvloop or to rule the loop out when chasing a problem.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
from collections.abc import Callable, Coroutine, Mapping
from enum import StrEnum
from typing import Any, TypeVar

from llmgw.flags import EVENT_LOOP, flag_or_variable

T = TypeVar("T")


class EventLoop(StrEnum):
    AUTO = "auto"  # uvloop if it is installed, else asyncio's
    UVLOOP = "uvloop"
    ASYNCIO = "asyncio"


class EventLoopError(Exception):
    """The loop asked for is not one, or uvloop was asked for and is not installed."""


def add_event_loop_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--event-loop",
        choices=[choice.value for choice in EventLoop],
        help=f"auto: uvloop when installed (it is with llmgw's dependencies), else asyncio's own "
        f"(default ${EVENT_LOOP.name} or auto)",
    )


def resolve(
    choice: str | None, *, uvloop_installed: bool | None = None, environ: Mapping[str, str] = os.environ
) -> EventLoop:
    """The loop ``choice`` (``--event-loop``'s value, else LLMGW_EVENT_LOOP's) means here: never AUTO."""
    chosen = flag_or_variable(choice, EVENT_LOOP, environ, EventLoop.AUTO.value)
    try:
        wanted = EventLoop(chosen)
    except ValueError:
        # argparse checks a flag's value against its choices but not a variable's.
        names = ", ".join(loop.value for loop in EventLoop)
        raise EventLoopError(f"{EVENT_LOOP.name}={chosen!r} is not one of {names}") from None
    installed = uvloop_installed
    if installed is None:
        installed = importlib.util.find_spec("uvloop") is not None
    if wanted is EventLoop.AUTO:
        return EventLoop.UVLOOP if installed else EventLoop.ASYNCIO
    if wanted is EventLoop.UVLOOP and not installed:
        raise EventLoopError("--event-loop uvloop: uvloop is not installed (pip install uvloop)")
    return wanted


def _factory(loop: EventLoop) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if loop is EventLoop.UVLOOP:
        import uvloop

        return uvloop.new_event_loop
    return None


def run(main: Coroutine[Any, Any, T], loop: EventLoop) -> T:
    """``asyncio.run(main)`` on ``loop`` (one ``resolve`` returned)."""
    with asyncio.Runner(loop_factory=_factory(loop)) as runner:
        return runner.run(main)


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio``, for the start-up log line."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"
