"""The event broker behind ``/v1/event/stream``: a bounded buffer of event batches.

Owns: the last ``size`` published batches (one per state index, like Nomad's
``eventBuffer``), where a new subscriber starts (``StartAtClosest``: the batch at the
requested index, else the next newer one, else the newest one; an index older than
the oldest retained batch silently starts at the oldest), and topic filtering exactly
as ``nomad/stream/subscription.go`` does it.

Must not: build events (``state.Store`` does) or write HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass
from typing import Any

Topics = dict[str, list[str]]


@dataclass(frozen=True)
class Batch:
    seq: int  # position in the broker's stream, for readers to resume
    index: int
    events: list[dict[str, Any]]


class SubscriptionDropped(Exception):
    """The reader fell behind past the buffer's end (Nomad: 'event dropped from buffer')."""


class EventBroker:
    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("event buffer size must be at least 1")
        self._buffer: deque[Batch] = deque(maxlen=size)
        self._seq = 0
        self._published = asyncio.Event()
        self._closed = False

    def publish(self, index: int, events: list[dict[str, Any]]) -> None:
        if not events:
            return
        self._seq += 1
        self._buffer.append(Batch(self._seq, index, events))
        self._published.set()
        self._published = asyncio.Event()

    def close(self) -> None:
        self._closed = True
        self._published.set()

    @property
    def closed(self) -> bool:
        return self._closed

    def start_seq(self, index: int) -> int:
        """The sequence number *before* the first batch a subscriber at ``index`` receives."""
        if not self._buffer:
            return self._seq
        if index == 0:
            return self._buffer[0].seq - 1
        for batch in self._buffer:
            if index <= batch.index:
                return batch.seq - 1
        return self._buffer[-1].seq - 1

    def batches_after(self, seq: int) -> list[Batch]:
        if self._buffer and seq < self._buffer[0].seq - 1:
            raise SubscriptionDropped("event dropped from buffer")
        return [b for b in self._buffer if b.seq > seq]

    async def wait(self, seconds: float) -> None:
        published = self._published
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(published.wait(), seconds)


def parse_topics(raw: list[str]) -> Topics:
    """``?topic=`` values as Nomad's parseEventTopics reads them (no topic means everything)."""
    if not raw:
        return {"*": ["*"]}
    topics: Topics = {}
    for item in raw:
        parts = item.split(":")
        if len(parts) == 1:
            key, value = item, "*"
        elif len(parts) == 2:
            key, value = parts
        else:
            raise ValueError(f"Invalid key value pair for topic: {item}")
        topics.setdefault(key, []).append(value)
    return topics


def filter_events(topics: Topics, namespace: str, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Nomad's subscription filter, quirks included (a key list of several values never
    treats "*" as a wildcard, and an event matching two keys is sent twice)."""
    all_keys = topics.get("*", [])
    if namespace == "*" and all_keys == ["*"]:
        return list(events)
    result: list[dict[str, Any]] = []
    for event in events:
        ev_ns = event.get("Namespace") or ""
        if namespace != "*" and ev_ns != "" and ev_ns != namespace:
            continue
        if all_keys == ["*"]:
            result.append(event)
            continue
        keys = list(all_keys) + list(topics.get(str(event.get("Topic")), []))
        if keys == ["*"]:
            result.append(event)
            continue
        for key in keys:
            if event.get("Key") == key or key in (event.get("FilterKeys") or []):
                result.append(event)
    return result
