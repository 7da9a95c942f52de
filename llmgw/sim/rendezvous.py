"""Assembling a multi-rank replica, the way NCCL/Ray groups live and die together.

Owns both ends of the rendezvous:

- head (rank 0): `WorkerBook` (which worker ranks are connected) and
  `serve_rendezvous`, the long-lived ``GET /sim/rendezvous?rank=R&world_size=W``
  stream a worker holds open. A joined worker whose stream breaks stops the
  head with PEER_LOST.
- worker (rank >= 1): `WorkerLink` and `join_head`, which finds the head
  (``--head`` or the ``--head-file`` a Nomad template writes), retries with
  backoff until ``--join-timeout``, then holds the stream; when the head goes
  away (end of stream, reset, or silence longer than ``--heartbeat-timeout``)
  it stops the worker with PEER_LOST.

Protocol: the head answers 200 with ``application/x-ndjson`` lines:
``{"event": "welcome", ...}`` at once, ``{"event": "heartbeat", ...}`` every
``--heartbeat-interval``, and ``{"event": "shutdown"}`` when it stops on
purpose. 400 means the worker is misconfigured (rank or world size; not
retried), 409 that its rank is already taken (retried: the old holder's
departure takes the head down anyway), 503 that the head is stopping.

Must not: exit the process; it reports through `Lifecycle.stop`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from llmgw.core.backoff import BackoffPolicy
from llmgw.sim.lifecycle import Lifecycle
from llmgw.sim.openai_api import ApiError
from llmgw.sim.settings import ExitCode, SimSettings, parse_host_port

log = logging.getLogger("llmgw.sim")

RENDEZVOUS_PATH = "/sim/rendezvous"
_NDJSON = "application/x-ndjson"


class WorkerBook:
    """Head side: the worker ranks connected now."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._joined: set[int] = set()

    @property
    def joined(self) -> int:
        return len(self._joined)

    @property
    def complete(self) -> bool:
        return len(self._joined) == self.world_size - 1

    def __contains__(self, rank: int) -> bool:
        return rank in self._joined

    def join(self, rank: int) -> None:
        self._joined.add(rank)

    def leave(self, rank: int) -> None:
        self._joined.discard(rank)


def _line(event: str, **fields: object) -> bytes:
    return json.dumps({"event": event, **fields}, separators=(",", ":")).encode("utf-8") + b"\n"


def _query_int(request: web.Request, name: str) -> int:
    raw = request.query.get(name, "")
    try:
        return int(raw)
    except ValueError:
        raise ApiError(400, f"query parameter {name!r} must be an integer, got {raw!r}", param=name) from None


async def serve_rendezvous(
    request: web.Request, settings: SimSettings, book: WorkerBook, lifecycle: Lifecycle
) -> web.StreamResponse:
    """Hold one worker's stream open for the life of the replica."""
    if not settings.is_head:
        raise ApiError(400, f"this process is rank {settings.rank}; join rank 0 instead", param="rank")
    rank = _query_int(request, "rank")
    world_size = _query_int(request, "world_size")
    if world_size != settings.world_size:
        raise ApiError(
            400,
            f"world size mismatch: the head has --world-size {settings.world_size}, the worker {world_size}",
            param="world_size",
        )
    if not 1 <= rank < world_size:
        raise ApiError(400, f"worker rank must be in 1..{world_size - 1}, got {rank}", param="rank")
    if rank in book:
        raise ApiError(409, f"rank {rank} has already joined this replica", param="rank", code="rank_taken")
    if lifecycle.stopping:
        raise ApiError(503, "the head is stopping")

    response = web.StreamResponse(headers={"Content-Type": _NDJSON, "Cache-Control": "no-cache"})
    await response.prepare(request)
    book.join(rank)
    log.info("worker joined rank=%d joined=%d/%d", rank, book.joined, settings.world_size - 1)
    try:
        await response.write(_line("welcome", rank=rank, world_size=world_size, model=settings.served_name))
        while not await lifecycle.stopped_within(settings.heartbeat_interval):
            await response.write(_line("heartbeat", joined=book.joined))
        await response.write(_line("shutdown"))
    except (asyncio.CancelledError, ConnectionResetError):
        # The stream broke: with handler cancellation we are cancelled, without it the
        # next heartbeat write fails. Either way the replica has lost a rank.
        if not lifecycle.stopping:
            lifecycle.stop(ExitCode.PEER_LOST, f"worker rank {rank} left the replica")
        raise
    finally:
        book.leave(rank)
    return response


@dataclass
class WorkerLink:
    """Worker side: whether this worker is part of its replica now, and through which head."""

    joined: bool = False
    head: str | None = None


def read_head_file(path: Path) -> str | None:
    """The first non-empty line of a template-rendered file, or None while it is missing or empty."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        return None
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return None


def _head_address(settings: SimSettings) -> str | None:
    if settings.head is not None:
        return settings.head
    assert settings.head_file is not None  # validate() requires one of the two for a worker
    address = read_head_file(settings.head_file)
    if address is not None and parse_host_port(address) is None:
        log.warning("head file holds no HOST:PORT path=%s content=%r", settings.head_file, address)
        return None
    return address


def _url(address: str, settings: SimSettings) -> str:
    parsed = parse_host_port(address)
    assert parsed is not None  # checked by validate() or _head_address()
    host, port = parsed
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{RENDEZVOUS_PATH}?rank={settings.rank}&world_size={settings.world_size}"


async def join_head(settings: SimSettings, link: WorkerLink, lifecycle: Lifecycle) -> None:
    """Run for the worker's whole life; every way it ends is reported through `lifecycle`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.join_timeout
    # One worker per rank joins one head: nothing to spread out, so no jitter.
    join_backoff = BackoffPolicy(settings.join_backoff_initial, settings.join_backoff_max)
    failed_joins = 0
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=settings.heartbeat_timeout, sock_read=settings.heartbeat_timeout
    )
    waiting_logged = False
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while True:
            address = _head_address(settings)
            if address is None:
                if not waiting_logged:
                    log.info("waiting for the head address path=%s", settings.head_file)
                    waiting_logged = True
                retry_in = settings.head_file_poll_interval
            else:
                link.head = address
                outcome = await _hold(session, _url(address, settings), link)
                if outcome is not None:
                    lifecycle.stop(*outcome)
                    return
                failed_joins += 1
                retry_in = join_backoff.step(failed_joins)
            remaining = deadline - loop.time()
            if remaining <= 0:
                lifecycle.stop(
                    ExitCode.JOIN_TIMEOUT,
                    f"rank {settings.rank} could not join the head {link.head or '(no address yet)'} "
                    f"within --join-timeout {settings.join_timeout}s",
                )
                return
            await asyncio.sleep(min(retry_in, remaining))


async def _hold(session: aiohttp.ClientSession, url: str, link: WorkerLink) -> tuple[ExitCode, str] | None:
    """One attempt: join and hold the stream. None means "not joined, try again"."""
    try:
        async with session.get(url) as response:
            if response.status == 400:
                return ExitCode.REFUSED, f"the head refused this worker: {await response.text()}"
            if response.status != 200:
                log.info("join refused, retrying status=%d url=%s", response.status, url)
                return None
            welcome = await response.content.readline()
            if not welcome:
                return None
            link.joined = True
            log.info("joined the head url=%s", url)
            while await response.content.readline():
                pass  # heartbeats; silence beyond sock_read raises instead
            return ExitCode.PEER_LOST, "the head closed the rendezvous stream"
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        if link.joined:
            return ExitCode.PEER_LOST, f"lost the head: {type(exc).__name__}: {exc}"
        log.debug("join attempt failed url=%s error=%s", url, exc)
        return None
    finally:
        link.joined = False
