"""Building a ``MirrorIndex`` from where the mirror is: its store directory or its HTTP address.

Owns the I/O behind ``llmgw catalog check``'s mirror rule: the catalog checker
calls ``load_index(location)`` once, then the pure
``llmgw.core.mirror.check_reference(ref, index)`` for each ``mirror:`` source.
Must not decide completeness itself (the store and the server apply the core rule).
"""

from __future__ import annotations

import asyncio

import aiohttp
from yarl import URL

from llmgw.core.mirror import ManifestError, MirrorIndex
from llmgw.mirror.errors import MirrorError
from llmgw.mirror.store import open_read_store
from llmgw.mirror.transfer import safe_url

INDEX_PATH = "/v1/mirror/index"
# Seconds to wait for a mirror's index: catalog check must fail fast, not hang.
INDEX_TIMEOUT = 30.0


def index_url(mirror: str) -> str:
    return str(URL(mirror.rstrip("/") + INDEX_PATH))


async def fetch_index(mirror: str, session: aiohttp.ClientSession | None = None) -> MirrorIndex:
    """``GET {mirror}/v1/mirror/index``."""
    url = index_url(mirror)
    own = session is None
    client = session or aiohttp.ClientSession()
    try:
        async with client.get(url, timeout=aiohttp.ClientTimeout(total=INDEX_TIMEOUT)) as resp:
            if resp.status != 200:
                raise MirrorError(f"{safe_url(url)}: HTTP {resp.status}")
            text = await resp.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise MirrorError(f"{safe_url(url)}: {type(exc).__name__}: the mirror is unreachable") from None
    finally:
        if own:
            await client.close()
    try:
        return MirrorIndex.from_json(text)
    except ManifestError as exc:
        raise MirrorError(f"{safe_url(url)}: {exc}") from None


def load_index(location: str) -> MirrorIndex:
    """The index of a mirror at an http(s) URL, or of a store (a directory or s3://BUCKET/PREFIX).

    Not for use inside an event loop.
    """
    if location.startswith(("http://", "https://")):
        return asyncio.run(fetch_index(location))
    return open_read_store(location).index()
