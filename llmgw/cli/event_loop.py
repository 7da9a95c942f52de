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
from collections.abc import Callable, Coroutine
from enum import StrEnum
from typing import Any, TypeVar

T = TypeVar("T")

ENV = "LLMGW_EVENT_LOOP"


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
        default=os.environ.get(ENV, EventLoop.AUTO.value),
        help=f"auto: uvloop when installed (it is with llmgw's dependencies), else asyncio's own "
        f"(default ${ENV} or auto)",
    )


def resolve(choice: str, *, uvloop_installed: bool | None = None) -> EventLoop:
    """The loop ``choice`` (``--event-loop``'s value) means here: never AUTO."""
    try:
        wanted = EventLoop(choice)
    except ValueError:
        # argparse checks a flag's value against its choices but not a default from the environment.
        names = ", ".join(loop.value for loop in EventLoop)
        raise EventLoopError(f"--event-loop/{ENV} must be one of {names}; got {choice!r}") from None
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
