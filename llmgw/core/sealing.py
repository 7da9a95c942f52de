"""Stored conversations sealed at rest: AES-256-GCM under keys the operator holds.

A sealed value is ``llmgw-sealed-1.<key id>.`` then the 12-byte nonce and the
ciphertext with its 16-byte tag (bytes: a Consul KV value takes any).

Owns ``SealingKeys`` (the operator's keys, ``LLMGW_RESPONSES_KEYS``: the first seals
new records, every one opens), the sealed value's form, and the parsing of the
variable. A sealed value names the id of the key that sealed it, so a key can be
rotated: new records go under the new key while the old one still opens the records
sealed before (kept until they expire, ``responses_retention``). Each value is bound
to what it is stored as (its owner's key id and its response id, the associated
data): a value copied under another key or another id does not open.

Must not: draw the nonce (the caller passes 12 random bytes in, as ``backoff`` takes
its jitter draw) or know where values are kept.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

NONCE_BYTES = 12  # GCM's 96-bit nonce: random per value (2^-32 collision bound at 2^32 values per key)
KEY_BYTES = 32  # AES-256
_KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")
_MAGIC = b"llmgw-sealed-1."


class SealingKeysInvalid(ValueError):
    """``LLMGW_RESPONSES_KEYS`` is not of its form; the message never repeats a key."""


class NotOpened(Exception):
    """A stored value that does not open: ``reason`` says why (for the log, never the client)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SealingKey:
    key_id: str
    secret: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class SealingKeys:
    """The operator's keys, the sealing one first."""

    keys: tuple[SealingKey, ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise SealingKeysInvalid("no key given")
        ids = [key.key_id for key in self.keys]
        if len(set(ids)) != len(ids):
            raise SealingKeysInvalid("a key id is given twice")
        for key in self.keys:
            if not _KEY_ID.fullmatch(key.key_id):
                raise SealingKeysInvalid(
                    f"key id {key.key_id[:40]!r} is not 1-32 letters, digits, '_' or '-'"
                )
            if len(key.secret) != KEY_BYTES:
                raise SealingKeysInvalid(f"key {key.key_id!r} is {len(key.secret)} bytes, not {KEY_BYTES}")

    @property
    def sealing_id(self) -> str:
        return self.keys[0].key_id

    def seal(self, plaintext: bytes, bound_to: bytes, nonce: bytes) -> bytes:
        """``plaintext`` sealed with the first key, bound to ``bound_to``."""
        if len(nonce) != NONCE_BYTES:
            raise ValueError(f"a nonce is {NONCE_BYTES} bytes")
        key = self.keys[0]
        sealed = AESGCM(key.secret).encrypt(nonce, plaintext, _associated(key.key_id, bound_to))
        return _MAGIC + key.key_id.encode() + b"." + nonce + sealed

    def open(self, value: bytes, bound_to: bytes) -> bytes:
        """The plaintext of a sealed ``value`` stored as ``bound_to``; ``NotOpened``
        when it is not sealed, names a key not held, or was changed or moved."""
        if not value.startswith(_MAGIC):
            raise NotOpened("not a sealed value (stored before sealing, or written by hand)")
        key_id, dot, raw = value[len(_MAGIC) :].partition(b".")
        if not dot:
            raise NotOpened("not a sealed value")
        key = next((k for k in self.keys if k.key_id.encode() == key_id), None)
        if key is None:
            raise NotOpened(f"sealed with key {key_id[:32].decode(errors='replace')!r}, which is not held")
        if len(raw) < NONCE_BYTES + 16:
            raise NotOpened("too short to be sealed")
        try:
            return AESGCM(key.secret).decrypt(
                raw[:NONCE_BYTES], raw[NONCE_BYTES:], _associated(key.key_id, bound_to)
            )
        except InvalidTag:
            raise NotOpened("it does not authenticate (changed, or moved from another owner or id)") from None


def _associated(key_id: str, bound_to: bytes) -> bytes:
    return key_id.encode() + b"\x00" + bound_to


def parse_sealing_keys(raw: str) -> SealingKeys:
    """``ID:BASE64,ID:BASE64,...``: each a key id and 32 bytes in standard base64
    (``openssl rand -base64 32``); the first seals."""
    keys = []
    for position, part in enumerate(raw.split(","), start=1):
        text = part.strip()
        key_id, colon, encoded = text.partition(":")
        if not colon:
            raise SealingKeysInvalid(f"entry {position} is not ID:BASE64KEY")
        try:
            secret = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise SealingKeysInvalid(f"key {key_id.strip()[:32]!r} is not standard base64") from None
        keys.append(SealingKey(key_id.strip(), secret))
    return SealingKeys(tuple(keys))
