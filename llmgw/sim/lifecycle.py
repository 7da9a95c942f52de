"""How a simulated engine process comes up and goes down.

Owns: the loaded flag (set once the simulated weight loading is over) and the
stop request: who asked the process to end, with which exit code. The first
stop request wins; later ones (the shutdown that follows a lost peer, say) do
not overwrite its code.

Must not: touch the server or the process; `server.py` waits on `stopped()`
and does the shutting down.
"""

from __future__ import annotations

import asyncio
import logging

from llmgw.sim.settings import ExitCode

log = logging.getLogger("llmgw.sim")


class Lifecycle:
    def __init__(self) -> None:
        self._stopped = asyncio.Event()
        self._exit_code: ExitCode | None = None
        self.reason = ""
        self.loaded = False

    @property
    def stopping(self) -> bool:
        return self._exit_code is not None

    @property
    def exit_code(self) -> ExitCode | None:
        return self._exit_code

    def stop(self, code: ExitCode, reason: str) -> None:
        if self._exit_code is not None:
            return
        self._exit_code = code
        self.reason = reason
        level = logging.INFO if code is ExitCode.OK else logging.ERROR
        log.log(level, "stopping exit_code=%d reason=%r", int(code), reason)
        self._stopped.set()

    async def stopped(self) -> ExitCode:
        await self._stopped.wait()
        assert self._exit_code is not None  # set before the event, by stop()
        return self._exit_code

    async def stopped_within(self, seconds: float) -> bool:
        """Sleep up to `seconds`, waking early (True) if a stop is requested."""
        try:
            await asyncio.wait_for(self._stopped.wait(), seconds)
        except TimeoutError:
            return False
        return True
