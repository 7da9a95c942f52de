"""How the mirror itself runs: endpoints, limits, timeouts and retries, read from the environment once.

Owns the runtime settings of ``llmgw mirror`` (not the catalog: that is the
user's contract). Every timeout, retry count and limit is here with its default
and why; command-line flags override a few of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from llmgw import flags

DEFAULT_HUB_ENDPOINT = "https://huggingface.co"


@dataclass(frozen=True)
class MirrorSettings:
    # Where the Hub's API and files are. LLMGW_MIRROR_HF_ENDPOINT wins over the Hub
    # client's own HF_ENDPOINT so the mirror can be pointed elsewhere (a fake hub in
    # tests, a proxy) without changing other tools on the host.
    hub_endpoint: str = DEFAULT_HUB_ENDPOINT
    # Files downloaded at once. A few streams fill a link; dozens only add
    # rate-limit trouble with the Hub's CDN.
    concurrency: int = 4
    # Bytes per second over all downloads of one process; None is no limit.
    bandwidth_limit: int | None = None
    # Bytes read and hashed per step: big enough that hashing dominates overhead.
    chunk_size: int = 1024 * 1024
    # Seconds to open a connection.
    connect_timeout: float = 30.0
    # Seconds without a byte before a connection counts as dropped (and is resumed).
    read_timeout: float = 120.0
    # Tries per file after the first; each resumes where the last stopped.
    retries: int = 5
    # Backoff between tries: doubles from initial up to max seconds.
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    # Seconds between plain progress lines for one file (non-TTY output).
    progress_interval: float = 10.0
    # Seconds a node-side fetch waits for another fetch into the same directory.
    lock_wait: float = 3600.0
    # The largest file read into memory while planning (the safetensors index).
    max_index_bytes: int = 64 * 1024 * 1024

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> MirrorSettings:
        """Defaults, overridden by ``HF_ENDPOINT``/``LLMGW_MIRROR_*`` variables (``ENV_SETTINGS``).
        Raises ``llmgw.flags.SettingError`` (a ValueError) naming a variable and its form."""
        endpoint = flags.MIRROR_HF_ENDPOINT.read(env) or env.get("HF_ENDPOINT") or DEFAULT_HUB_ENDPOINT
        changes: dict[str, object] = {"hub_endpoint": endpoint.rstrip("/")}
        for field_name, variable in ENV_SETTINGS.items():
            value = variable.read(env)
            if value is not None:
                changes[field_name] = value
        return dataclasses.replace(cls(), **changes)  # type: ignore[arg-type]


# Fields read from their LLMGW_MIRROR_* variable (the table in llmgw/flags.py).
ENV_SETTINGS: Mapping[str, flags.Variable[Any]] = MappingProxyType(
    {
        "concurrency": flags.MIRROR_CONCURRENCY,
        "bandwidth_limit": flags.MIRROR_BANDWIDTH_LIMIT,
        "connect_timeout": flags.MIRROR_CONNECT_TIMEOUT,
        "read_timeout": flags.MIRROR_READ_TIMEOUT,
        "retries": flags.MIRROR_RETRIES,
        "backoff_initial": flags.MIRROR_BACKOFF_INITIAL,
        "backoff_max": flags.MIRROR_BACKOFF_MAX,
        "lock_wait": flags.MIRROR_LOCK_WAIT,
    }
)
