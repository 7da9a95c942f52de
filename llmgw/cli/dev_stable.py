"""What ``llmgw dev`` keeps the same across restarts of one state folder: the stand-ins'
ports and ACL tokens, the engines' key secret, and the API keys the admin API issued.

Kept in ``stable.json`` in the state folder, readable by this user only (0600, written as
``write_secret`` writes), so the ``export`` lines and the Nomad and Consul addresses a
user set up once keep working after a restart. A port is asked for again only if it is
free now; one another process took gets a new port, said on stderr (the exports change).
Deleting the file, or another ``--state-dir``, draws all of them afresh.

Must not: keep anything a restart must not reuse (the router's ``--port`` is the user's
flag, and ``--port 0`` keeps meaning a port the kernel picks).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from llmgw.adapters.consul import ConsulClient, ConsulError
from llmgw.core.conventions import KV_KEYS_PREFIX
from llmgw.devcluster.cluster import new_acl_token

STABLE_FILE = "stable.json"


@dataclass(frozen=True, slots=True)
class DevStable:
    nomad_token: str
    consul_token: str
    engine_key_secret: str
    nomad_port: int = 0  # 0: none yet, the kernel picks one
    consul_port: int = 0


def load_stable(state_dir: Path) -> DevStable:
    """The folder's stable values, or fresh ones when it has none (or an unreadable file)."""
    try:
        raw = json.loads((state_dir / STABLE_FILE).read_text(encoding="utf-8"))
        stable = DevStable(
            nomad_token=str(raw["nomad_token"]),
            consul_token=str(raw["consul_token"]),
            engine_key_secret=str(raw["engine_key_secret"]),
            nomad_port=int(raw.get("nomad_port", 0)),
            consul_port=int(raw.get("consul_port", 0)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return DevStable(new_acl_token(), new_acl_token(), secrets.token_hex(32))
    return DevStable(
        stable.nomad_token,
        stable.consul_token,
        stable.engine_key_secret,
        _still_free(stable.nomad_port, "Nomad"),
        _still_free(stable.consul_port, "Consul"),
    )


def _still_free(port: int, what: str) -> int:
    if not 0 < port < 65536:
        return 0
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            print(
                f"llmgw dev: {what}'s port {port} of the last run is taken now; it gets a new one "
                "(the export lines change)",
                file=sys.stderr,
            )
            return 0
    return port


def write_secret(path: Path, secret: str) -> None:
    """``secret`` in ``path``, readable and writable by this user only (mode 0600).

    The file is created 0600 under a temporary name before anything is written
    to it, then renamed over ``path``: no other user can open it at any moment,
    and a file an earlier run left (whatever its mode) is replaced, not reused.
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.unlink(missing_ok=True)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(secret)
    os.replace(temporary, path)


def save_stable(state_dir: Path, stable: DevStable) -> None:
    write_secret(state_dir / STABLE_FILE, json.dumps(asdict(stable), indent=2) + "\n")


# --- API keys -------------------------------------------------------------------------------------

# The admin API's keys (llmgw/keys/ in Consul KV: each key's id, limits and the SHA-256 of its
# secret, never the secret) as Consul's own data dir would keep them across a restart.
API_KEYS_FILE = "api-keys.json"


async def restore_api_keys(consul: ConsulClient, state_dir: Path) -> int:
    """Put the keys an earlier run kept back into dev's Consul; how many."""
    try:
        saved = json.loads((state_dir / API_KEYS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    if not isinstance(saved, dict):
        return 0
    restored = 0
    for key, value in saved.items():
        # Only the keys' own prefix: a file edited to name another key puts nothing elsewhere.
        if (
            isinstance(key, str)
            and isinstance(value, str)
            and key.startswith(KV_KEYS_PREFIX)
            and ".." not in key
        ):
            await consul.kv_put(key, value.encode())
            restored += 1
    return restored


async def keep_api_keys(consul: ConsulClient, state_dir: Path) -> None:
    """Write the keys to ``API_KEYS_FILE`` (0600) at every change, until cancelled."""
    index = 0
    while True:
        try:
            entries, meta = await consul.kv_list(KV_KEYS_PREFIX, index=index, wait=300.0)
        except ConsulError:
            await asyncio.sleep(1.0)  # dev's own Consul: back as soon as it answers
            continue
        if meta.index != index:
            text = json.dumps({e.key: e.value.decode() for e in entries}, indent=2, sort_keys=True)
            write_secret(state_dir / API_KEYS_FILE, text + "\n")
        index = meta.index
