"""The Responses API's stored conversations: sealed, owned, counted per key, swept.

Owns ``Conversations``: what a ``store``d response leaves for its follow-ups, kept
in the shared ``ResponseStore`` under its owner's part of the names
(``llmgw.core.responses.StoredName``), sealed with the operator's keys
(``llmgw.core.sealing``: bound to its owner and id, so a value moved or changed
does not open), and within each API key's quota (``responses_max_per_key``,
``responses_max_bytes_per_key``: what every router stored, read from the names,
plus what this router is storing now). A request that would store past its key's
quota is refused before it runs (429 ``insufficient_quota``); an answer whose
conversation came out over it leaves a small record that says so, so its follow-up
is told why. Without keys (``LLMGW_RESPONSES_KEYS`` unset) nothing is stored.

Must not: translate (``llmgw.core.responses``), or know where the store keeps its
values (``ports.ResponseStore``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from llmgw.core import responses
from llmgw.core.responses import StoredConversation, StoredName, StoreUse
from llmgw.core.routing import Refusal
from llmgw.core.sealing import NONCE_BYTES, NotOpened, SealingKeys
from llmgw.gateway.errors import ApiError
from llmgw.gateway.ports import Clock, ResponseStore
from llmgw.gateway.settings import RouterSettings

log = logging.getLogger("llmgw.gateway.conversations")


def previous_not_found(response_id: str) -> Refusal:
    # OpenAI's answer (HTTP 400, code previous_response_not_found), the same for an id
    # never stored, expired, stored by another key, or whose record does not open: a
    # key cannot tell them apart.
    return Refusal(
        400,
        f"Previous response with id '{response_id[:100]}' not found.",
        "invalid_request_error",
        "previous_response_not_found",
        param="previous_response_id",
        retryable=False,
    )


def too_large(size: int, limit: int, param: str) -> Refusal:
    return Refusal(
        400,
        f"The conversation is {size} bytes, over the {limit} bytes this gateway stores for "
        "previous_response_id: send it with store set to false, and the whole conversation in input.",
        "invalid_request_error",
        "conversation_too_large",
        param=param,
        retryable=False,
    )


def _store_unavailable() -> Refusal:
    return Refusal(
        503,
        "The stored responses cannot be read now; retry shortly.",
        "server_error",
        "response_store_unavailable",
        retry_after=5,
    )


def store_off(param: str) -> Refusal:
    return Refusal(
        400,
        "This gateway keeps no stored responses (its operator has set no key to seal them with): "
        "send store set to false, and the whole conversation in input.",
        "invalid_request_error",
        "stored_responses_disabled",
        param=param,
        retryable=False,
    )


def _over_quota(use: StoreUse, settings: RouterSettings, param: str) -> Refusal:
    # OpenAI's quota answer is HTTP 429 of type insufficient_quota; a retry does not
    # help until stored responses expire, so the clients are told not to.
    hours = settings.responses_retention / 3600
    return Refusal(
        429,
        f"This API key keeps {use.count} stored responses of {use.size} bytes, at its quota of "
        f"{settings.responses_max_per_key} responses and {settings.responses_max_bytes_per_key} bytes: "
        f"send store set to false (and the whole conversation in input), or wait until stored "
        f"responses expire ({hours:g} hours after each was made).",
        "insufficient_quota",
        "stored_responses_quota_exceeded",
        param=param,
        retryable=False,
    )


@dataclass(frozen=True, slots=True)
class Reservation:
    """A place in a key's quota this router holds while a response that stores runs."""

    owner: str
    size: int


class Conversations:
    def __init__(
        self, settings: RouterSettings, store: ResponseStore, keys: SealingKeys | None, clock: Clock
    ) -> None:
        self._settings = settings
        self._store = store
        self._keys = keys
        self._clock = clock
        self._pending: dict[str, StoreUse] = {}  # this router's reservations, by owner

    @property
    def keeping(self) -> bool:
        """Whether responses are stored at all (the operator gave keys)."""
        return self._keys is not None

    def _bound(self, owner: str, response_id: str) -> bytes:
        return f"{owner}\x00{response_id}".encode()

    async def _use(self, owner: str) -> StoreUse:
        try:
            names = await self._store.names(responses.owner_part(owner) + "/")
        except Exception:
            log.exception("listing the stored responses of %s failed", owner or "the router")
            raise ApiError(_store_unavailable()) from None
        return responses.use_of(names, owner)

    def _change_pending(self, owner: str, count: int, size: int) -> None:
        use = self._pending.get(owner, StoreUse()).plus(count, size)
        if use.count:
            self._pending[owner] = use
        else:
            self._pending.pop(owner, None)

    async def reserve(self, owner: str, size: int) -> Reservation:
        """A place for one more response of ``size`` bytes (so far) under ``owner``'s
        quota; ``ApiError`` 429 when the key is at it. Taken before the store is read,
        so requests of one key on this router at once see each other."""
        self._change_pending(owner, 1, size)
        try:
            use = (await self._use(owner)).plus(self._pending[owner].count, self._pending[owner].size)
            settings = self._settings
            if use.count > settings.responses_max_per_key or use.size > settings.responses_max_bytes_per_key:
                raise ApiError(_over_quota(use.plus(-1, -size), settings, "store"))
        except BaseException:
            self._change_pending(owner, -1, -size)
            raise
        return Reservation(owner, size)

    def release(self, reservation: Reservation) -> None:
        self._change_pending(reservation.owner, -1, -reservation.size)

    def _seal(self, owner: str, response_id: str, record: StoredConversation) -> bytes:
        assert self._keys is not None  # reserve() is only called when keeping
        return self._keys.seal(
            record.encode(), self._bound(owner, response_id), secrets.token_bytes(NONCE_BYTES)
        )

    async def keep(
        self, reservation: Reservation, response_id: str, messages: tuple[Mapping[str, object], ...]
    ) -> None:
        """Store the conversation ``messages`` as ``response_id``: sealed; a short record
        saying why instead when it is over the size cap or its key's quota. The answer
        has gone to the client: a failure is logged, its follow-up will not find it."""
        owner = reservation.owner
        settings = self._settings
        expires_at = self._clock.wall() + settings.responses_retention
        value = self._seal(owner, response_id, StoredConversation(owner, expires_at, messages))
        if len(value) > settings.responses_max_bytes:
            value = self._seal(
                owner, response_id, StoredConversation(owner, expires_at, (), too_large=len(value))
            )
        try:
            pending = self._pending.get(owner, StoreUse()).plus(-1, -reservation.size)
            use = (await self._use(owner)).plus(pending.count, pending.size)
            if use.size + len(value) > settings.responses_max_bytes_per_key:
                log.info("response %s not kept: its key %s is at its stored bytes quota", response_id, owner)
                value = self._seal(
                    owner, response_id, StoredConversation(owner, expires_at, (), over_quota=True)
                )
            await self._store.put(str(StoredName(owner, response_id, len(value))), value)
        except Exception:
            log.exception("storing response %s failed: a follow-up by its id will not find it", response_id)

    async def load(self, owner: str, response_id: str) -> tuple[dict[str, object], ...]:
        """The turns ``owner``'s stored response ``response_id`` continues; ``ApiError``
        not found (never stored, another key's, expired, not opening), too large,
        over quota, or the store unreachable."""
        if self._keys is None:
            raise ApiError(store_off("previous_response_id"))
        if not responses.is_response_id(response_id):
            raise ApiError(previous_not_found(response_id))
        try:
            names = await self._store.names(responses.lookup_prefix(owner, response_id))
            name = next(
                (n for n in names if (p := responses.parse_stored_name(n)) is not None
                 and p.owner == owner and p.response_id == response_id),
                None,
            )  # fmt: skip
            raw = None if name is None else await self._store.get(name)
        except Exception:
            log.exception("reading stored response %s failed", response_id)
            raise ApiError(_store_unavailable()) from None
        if name is None or raw is None:
            raise ApiError(previous_not_found(response_id))
        try:
            stored = responses.decode_conversation(self._keys.open(raw, self._bound(owner, response_id)))
        except NotOpened as exc:
            log.warning("stored response %s does not open: %s", response_id, exc.reason)
            stored = None
        if stored is None or stored.owner != owner:
            raise ApiError(previous_not_found(response_id))
        if stored.expires_at <= self._clock.wall():
            try:
                await self._store.delete(name)
            except Exception:
                log.warning("deleting expired response %s failed", response_id, exc_info=True)
            raise ApiError(previous_not_found(response_id))
        if stored.too_large:
            raise ApiError(
                too_large(stored.too_large, self._settings.responses_max_bytes, "previous_response_id")
            )
        if stored.over_quota:
            raise ApiError(_over_quota(await self._use(owner), self._settings, "previous_response_id"))
        return tuple(dict(message) for message in stored.messages)

    async def sweep(self) -> None:
        """Delete the stored responses whose retention has passed, every
        ``responses_sweep_interval`` (every router does; a delete is idempotent), until cancelled."""
        while True:
            await asyncio.sleep(self._settings.responses_sweep_interval)
            try:
                expired = responses.expired_names(
                    await self._store.names(), self._clock.wall(), self._settings.responses_retention
                )
                for name in expired:
                    await self._store.delete(name)
            except Exception:
                log.warning("sweeping expired stored responses failed; the next sweep retries", exc_info=True)
            else:
                if expired:
                    log.info("deleted %d expired stored responses", len(expired))
