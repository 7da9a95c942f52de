"""How the mirror itself runs: endpoints, limits, timeouts and retries, read from the environment once.

Owns the runtime settings of ``llmgw mirror`` (not the catalog: that is the
user's contract). Every timeout, retry count and limit is here with its default
and why; command-line flags override a few of them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

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
        """Defaults, overridden by ``HF_ENDPOINT``/``LLMGW_MIRROR_*`` variables (see ``ENV_SETTINGS``)."""
        endpoint = env.get("LLMGW_MIRROR_HF_ENDPOINT") or env.get("HF_ENDPOINT") or DEFAULT_HUB_ENDPOINT
        changes: dict[str, object] = {"hub_endpoint": endpoint.rstrip("/")}
        for variable, (name, convert) in ENV_SETTINGS.items():
            if env.get(variable):
                try:
                    changes[name] = convert(env[variable])
                except ValueError:
                    raise ValueError(f"{variable}={env[variable]!r} is not valid for {name}") from None
        return dataclasses.replace(cls(), **changes)  # type: ignore[arg-type]


_RATE = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[KMGkmg]?)(?:i?B)?(?:/s)?")
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_rate(text: str) -> int:
    """``50M`` / ``50MB/s`` / ``1.5G`` / ``800k`` -> bytes per second (binary units)."""
    match = _RATE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"invalid rate {text!r}: write e.g. 50M (bytes per second, K/M/G suffixes)")
    rate = int(float(match["number"]) * _UNITS[match["unit"].lower()])
    if rate <= 0:
        raise ValueError(f"invalid rate {text!r}: must be positive")
    return rate


ENV_SETTINGS: dict[str, tuple[str, Callable[[str], object]]] = {
    "LLMGW_MIRROR_CONCURRENCY": ("concurrency", int),
    "LLMGW_MIRROR_BANDWIDTH_LIMIT": ("bandwidth_limit", parse_rate),
    "LLMGW_MIRROR_CONNECT_TIMEOUT": ("connect_timeout", float),
    "LLMGW_MIRROR_READ_TIMEOUT": ("read_timeout", float),
    "LLMGW_MIRROR_RETRIES": ("retries", int),
    "LLMGW_MIRROR_BACKOFF_INITIAL": ("backoff_initial", float),
    "LLMGW_MIRROR_BACKOFF_MAX": ("backoff_max", float),
    "LLMGW_MIRROR_LOCK_WAIT": ("lock_wait", float),
}
