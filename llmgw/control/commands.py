"""The operator's model commands (drain, restart): durable in Consul KV, honoured by any leader.

Owns: the record ``llmgw/commands/<model slug>`` (one ``ModelCommand`` per model, as JSON,
decoded strictly right here since KV content is untrusted), compare-and-set updates of
it (two admin listeners never lose each other's command), the watch every control-plane
instance reads (``ModelCommandStore.watch()``), and ``OperatorCommands``: what the admin
API's ``POST /admin/v1/models/{model}/drain`` and ``/restart`` call. It checks the model
is in the applied catalog, records the command, and says in words what will happen.

A command is done when it is recorded: the leader of the moment (or the next one, after a
failover) reads the record in its next pass, and the planner decides what it means for
replicas (``llmgw.core.planning.commands`` states the rules).

Must not: decide anything about replicas, or talk to Nomad.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from llmgw.adapters.consul import ConsulClient, ConsulError, CorruptRecord, KvEntry, Watch, WatchSettings
from llmgw.control.ports import CatalogText
from llmgw.control.reconciling import CATALOG_FILENAME
from llmgw.core.backoff import BackoffPolicy
from llmgw.core.catalog import Catalog, SecurityPolicy, load_catalog
from llmgw.core.conventions import KV_COMMANDS_PREFIX
from llmgw.core.names import slug
from llmgw.core.planning import ModelCommand, model_key

log = logging.getLogger(__name__)

# Limits on what a record may hold (it is untrusted input, like every KV value).
_MAX_TEXT = 1024
_MAX_INT = 2**53 - 1
_MAX_SECONDS = 1e11


def command_key(model: str) -> str:
    """The record's key: the slug keeps any model name (``org/name``) one key segment."""
    return KV_COMMANDS_PREFIX + slug(model)


# --- the record's JSON --------------------------------------------------------------------------


def encode(command: ModelCommand) -> bytes:
    doc = {
        "model": command.model,
        "restart_generation": command.restart_generation,
        "restarted_by": command.restarted_by,
        "restarted_at": command.restarted_at,
        "drained_key": command.drained_key,
        "drained_by": command.drained_by,
        "drained_at": command.drained_at,
    }
    return json.dumps(doc, sort_keys=True).encode("utf-8")


def decode(entry: KvEntry) -> ModelCommand:
    """The record at ``entry``; CorruptRecord (naming the key) if it is not one llmgw wrote.
    Unknown fields are ignored, so a newer llmgw may add some."""
    try:
        raw = json.loads(entry.value)
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        command = ModelCommand(
            model=_text(raw, "model", nonempty=True),
            restart_generation=_count(raw, "restart_generation"),
            restarted_by=_text(raw, "restarted_by"),
            restarted_at=_seconds(raw, "restarted_at"),
            drained_key=_text(raw, "drained_key"),
            drained_by=_text(raw, "drained_by"),
            drained_at=_seconds(raw, "drained_at"),
        )
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptRecord(f"Consul KV {entry.key!r}: {exc}") from None
    if command_key(command.model) != entry.key:
        raise CorruptRecord(f"Consul KV {entry.key!r}: the record names model {command.model!r}")
    return command


def _text(raw: Mapping[str, Any], name: str, *, nonempty: bool = False) -> str:
    value = raw.get(name, "")
    if not isinstance(value, str) or len(value) > _MAX_TEXT or (nonempty and not value):
        raise ValueError(f"{name} must be a {'non-empty ' if nonempty else ''}string of at most {_MAX_TEXT}")
    return value


def _count(raw: Mapping[str, Any], name: str) -> int:
    value = raw.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_INT:
        raise ValueError(f"{name} must be a whole number from 0 to {_MAX_INT}")
    return value


def _seconds(raw: Mapping[str, Any], name: str) -> float:
    value = raw.get(name, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number of unix seconds")
    if not 0 <= value <= _MAX_SECONDS:
        raise ValueError(f"{name} must be a number of unix seconds")
    return float(value)


# --- the store ------------------------------------------------------------------------------------


class CommandConflict(ConsulError):
    """Other writers kept changing the record; nothing was written. Try again (the admin
    API answers 503, as for any temporary Consul failure)."""

    temporary = True


class ModelCommandStore:
    """Reads, updates (compare-and-set) and watches ``llmgw/commands/``."""

    def __init__(self, client: ConsulClient, *, attempts: int = 10, retry_spread: float = 0.05) -> None:
        self._client = client
        # Compare-and-set rounds before giving up on a record others keep changing; between
        # two rounds a random pause of up to ``retry_spread`` seconds (full jitter, no growth:
        # the rounds are quick), so writers that keep colliding spread out.
        self._attempts = attempts
        self._collision_pause = BackoffPolicy(retry_spread, retry_spread, factor=1.0, jitter=1.0)
        self._rng = random.Random()  # noqa: S311 (jitter, not secrets)

    async def get(self, model: str) -> ModelCommand | None:
        entry, _ = await self._client.kv_get(command_key(model))
        return None if entry is None else decode(entry)

    async def update(
        self, model: str, change: Callable[[ModelCommand], ModelCommand]
    ) -> tuple[ModelCommand | None, ModelCommand]:
        """Apply ``change`` to the record (a fresh one when there is none) with Consul's
        compare-and-set; the record before and after. Nothing is written when nothing changes.
        Raises CorruptRecord for a record llmgw did not write (delete the key to start over)."""
        key = command_key(model)
        for attempt in range(1, self._attempts + 1):
            entry, _ = await self._client.kv_get(key)
            before = None if entry is None else decode(entry)
            after = change(before or ModelCommand(model=model))
            if after == before:
                return before, after
            if await self._client.kv_put(key, encode(after), cas=entry.modify_index if entry else 0):
                return before, after
            await asyncio.sleep(self._collision_pause.delay(attempt, self._rng.random()))
        raise CommandConflict(f"the command record of {model!r} kept changing under this writer; try again")

    async def end_drain(self, model: str, drained_key: str) -> None:
        """Clear the drain of ``model`` if it is still the one recorded under ``drained_key``."""

        def ended(command: ModelCommand) -> ModelCommand:
            return command.drain_ended() if command.drained_key == drained_key else command

        if await self.get(model) is None:
            return  # gone (deleted by hand): nothing to end
        await self.update(model, ended)

    def watch(self, settings: WatchSettings | None = None) -> Watch[Mapping[str, ModelCommand]]:
        """A watch (not yet started) of every readable record, by model name. An unreadable
        one is skipped with one warning while it lasts (its model then has no commands)."""
        settings = settings or WatchSettings()
        warned: dict[str, str] = {}

        async def fetch(index: int, wait: float) -> tuple[Mapping[str, ModelCommand], int]:
            entries, meta = await self._client.kv_list(
                KV_COMMANDS_PREFIX, index=index, wait=wait, stale=settings.stale
            )
            out: dict[str, ModelCommand] = {}
            bad: dict[str, str] = {}
            for entry in entries:
                if entry.key == KV_COMMANDS_PREFIX or "/" in entry.key[len(KV_COMMANDS_PREFIX) :]:
                    continue
                try:
                    command = decode(entry)
                except CorruptRecord as exc:
                    bad[entry.key] = str(exc)
                    if warned.get(entry.key) != str(exc):
                        log.warning("%s (skipped: the model has no operator commands until it is fixed)", exc)
                    continue
                out[command.model] = command
            warned.clear()
            warned.update(bad)
            return out, meta.index

        return Watch(f"kv/{KV_COMMANDS_PREFIX}", fetch, settings)


# --- what the admin API calls ---------------------------------------------------------------------


class CatalogSource(Protocol):
    """``llmgw.adapters.consul.CatalogStore``: the applied catalog, read fresh."""

    async def current(self) -> CatalogText | None: ...


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What the control plane will do, in words, and the replicas it concerns (job ids)."""

    message: str
    replicas: tuple[str, ...] = ()


class OperatorCommands:
    """Drain and restart a model by name (the admin API's ``ModelCommands``, through the
    CLI's wiring). Raises LookupError for a model the applied catalog does not have,
    ``llmgw.adapters.consul.ConsulError`` when Consul cannot be asked."""

    def __init__(
        self,
        store: ModelCommandStore,
        catalogs: CatalogSource,
        policy: SecurityPolicy,
        *,
        replicas: Callable[[str], Sequence[str]] = lambda model: (),
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._catalogs = catalogs
        self._policy = policy
        # The model's replicas (job ids) as this instance's view of Nomad shows them: for
        # the receipt only (a standby's view may lag behind the leader's).
        self._replicas = replicas
        self._clock = wall_clock
        self._loaded: tuple[str, Catalog] | None = None

    async def drain(self, model: str, *, actor: str) -> CommandResult:
        key = await self._model_key(model)
        now = self._clock()
        before, _ = await self._store.update(
            model,
            lambda c: c if c.drains(key) else c.drained(model_key=key, by=actor, at=now),
        )
        replicas = self._running(model)
        if before is not None and before.drains(key):
            return CommandResult(
                f"{model} is already drained (by {before.drained_by}); it runs no replicas until "
                "a restart or a catalog change to it",
                replicas,
            )
        return CommandResult(
            f"draining {model}: routers stop sending it new requests, and each of its "
            f"{len(replicas)} replica(s) stops once its requests are done (or the drain timeout "
            "passes); it runs no replicas until a restart or a catalog change to it",
            replicas,
        )

    async def restart(self, model: str, *, actor: str) -> CommandResult:
        await self._model_key(model)
        now = self._clock()
        before, after = await self._store.update(model, lambda c: c.restarted(by=actor, at=now))
        replicas = self._running(model)
        ended = " The drain ends." if before is not None and before.drain_requested else ""
        if not replicas:
            return CommandResult(
                f"restarting {model} (generation {after.restart_generation}): it has no replicas "
                f"now; they are placed as the catalog asks.{ended}",
            )
        return CommandResult(
            f"restarting {model} (generation {after.restart_generation}): its {len(replicas)} "
            "replica(s) are replaced one at a time, each new one healthy before an old one "
            f"drains.{ended}",
            replicas,
        )

    def _running(self, model: str) -> tuple[str, ...]:
        return tuple(sorted(self._replicas(model)))

    async def _model_key(self, model: str) -> str:
        """The model's key in the applied catalog; LookupError when it has no such model."""
        version = await self._catalogs.current()
        if version is None:
            raise LookupError(f"no model {model!r}: no catalog has been applied")
        if self._loaded is None or self._loaded[0] != version.sha256:
            # Loading a large catalog takes a while: off the event loop the control plane runs on.
            result = await asyncio.to_thread(
                load_catalog, version.text, filename=CATALOG_FILENAME, policy=self._policy
            )
            if result.catalog is None:
                raise LookupError(
                    f"no model {model!r}: the applied catalog (version {version.version}) does not load; "
                    "apply a good one first"
                )
            self._loaded = (version.sha256, result.catalog)
        found = self._loaded[1].models.get(model)
        if found is None:
            raise LookupError(f"no model {model!r} in the applied catalog (version {version.version})")
        return model_key(found)
