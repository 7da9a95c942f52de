"""Stopping background tasks without swallowing the caller's own cancellation.

The common ``task.cancel(); with suppress(CancelledError): await task`` has a
trap: if the *caller* is cancelled while it waits there, that cancellation is
swallowed too, and the caller carries on as if nothing happened (a control
plane that was told to stop keeps reconciling). ``cancel_and_wait`` collects
the tasks' own cancellations and lets the caller's propagate.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel ``tasks`` and wait until they have finished; errors they end with are dropped."""
    pending = [task for task in tasks if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        # A cancelled child is a result here; a cancellation of this caller still raises.
        await asyncio.gather(*pending, return_exceptions=True)
