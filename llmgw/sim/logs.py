"""Single-line, key=value-ish log records on stderr for the simulated engine.

Owns: the log format (one record per line, tracebacks folded into it, the
rank on every line so interleaved replica logs stay readable).

Must not: configure logging at import time; `server.main` calls `configure`.
"""

from __future__ import annotations

import logging
import sys
import time


class _OneLineFormatter(logging.Formatter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self._rank = rank

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = (
            f"{stamp}.{int(record.msecs):03d}Z level={record.levelname.lower()} "
            f"logger={record.name} rank={self._rank} msg={record.getMessage()}"
        )
        if record.exc_info:
            line += " exc=" + self.formatException(record.exc_info)
        return line.replace("\n", "\\n")


def configure(level: str, rank: int, access_log: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLineFormatter(rank))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log is opt-in (--access-log); its other loggers stay at warning.
    logging.getLogger("aiohttp").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.INFO if access_log else logging.WARNING)
