"""The narrow interfaces the admin API depends on, and the bundle of them it is built with.

Owns: the Protocols and ``AdminDeps``. The real implementations are the Consul adapter's
``CatalogStore``, ``ApiKeyStore`` and ``StatusPublisher`` (``llmgw.adapters.consul``),
``llmgw.render.Renderer``, and the control plane's model commands; they satisfy these
structurally. Unit tests use recorded fakes (``tests/unit/admin/fakes.py``).

Errors the stores raise are the Consul adapter's own, and the handlers translate them:
``CatalogConflict`` (another apply won: 412, or a retry without If-Match),
``ApiKeyNotFound`` (404), ``ConsulError`` (503 when ``temporary``, else 502),
``CorruptRecord`` (502: KV holds something llmgw did not write).

Must not: grow methods the handlers do not call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from llmgw.core.catalog import Catalog, ClusterAllowlists, SecurityPolicy
from llmgw.core.records import ApiKeyRecord, CatalogVersion, KeyUsage
from llmgw.render import RenderSettings, ReplicaRequest


class CatalogStorePort(Protocol):
    """``llmgw.adapters.consul.CatalogStore``: the applied catalog, compare-and-set, history."""

    async def current(self) -> CatalogVersion | None: ...

    async def apply(self, new: CatalogVersion, expected_version: int | None) -> CatalogVersion:
        """Raises CatalogConflict when the current version is not ``expected_version``."""
        ...

    async def history(self, limit: int = 20) -> Sequence[CatalogVersion]: ...


class IssuedKeyLike(Protocol):
    """``llmgw.adapters.consul.IssuedKey``: the stored record and the secret, shown once."""

    @property
    def record(self) -> ApiKeyRecord: ...
    @property
    def secret(self) -> str: ...


class ApiKeyStorePort(Protocol):
    """``llmgw.adapters.consul.ApiKeyStore``. ``revoke`` and ``set_budget`` raise ApiKeyNotFound."""

    async def create(
        self,
        name: str,
        *,
        models: tuple[str, ...] | None = None,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        token_budget: int | None = None,
        budget_period: str | None = None,
    ) -> IssuedKeyLike: ...

    async def list(self) -> Mapping[str, ApiKeyRecord]: ...

    async def revoke(self, key_id: str) -> ApiKeyRecord: ...

    async def set_budget(
        self, key_id: str, token_budget: int | None, budget_period: str | None
    ) -> ApiKeyRecord:
        """Raises ApiKeyNotFound, or ValueError for a budget ``core.budgets`` refuses."""
        ...


class StatusDocumentLike(Protocol):
    @property
    def text(self) -> str: ...  # a JSON object, as the leader wrote it
    @property
    def modify_index(self) -> int: ...


class StatusSource(Protocol):
    """``llmgw.adapters.consul.StatusPublisher``: the leader's last published status."""

    async def read(self) -> StatusDocumentLike | None: ...


class RenderedLike(Protocol):
    @property
    def spec_hash(self) -> str: ...


class SpecRenderer(Protocol):
    """``llmgw.render.Renderer``, configured as the control plane's (same settings and
    templates), so the diff's spec hashes are the ones the reconciler compares.
    Raises ``llmgw.render.RenderError`` when a replica cannot be rendered."""

    def render(self, catalog: Catalog, request: ReplicaRequest, *, catalog_hash: str) -> RenderedLike: ...


@dataclass(frozen=True, slots=True)
class CommandReceipt:
    """What the control plane says it will do about a model command."""

    message: str  # in words, for the operator
    replicas: tuple[str, ...] = ()  # the job ids the command concerns


class ModelCommands(Protocol):
    """Operator commands the control plane carries out (it owns every decision about replicas).

    ``drain``: routers stop sending new requests to every replica of the model; each
    replica stops once its requests are done (or the drain timeout passes); the model
    runs no replicas until ``restart`` or a catalog apply that changes it.
    ``restart``: replace every replica of the model one at a time, as a roll does, and
    end a drain. Both return at once; the leader's status shows the progress.
    Raise ``LookupError`` for a model the control plane does not know.
    """

    async def drain(self, model: str, *, actor: str) -> CommandReceipt: ...

    async def restart(self, model: str, *, actor: str) -> CommandReceipt: ...


class UsageSource(Protocol):
    """``llmgw.adapters.redis.RedisLimitStore``: each key's usage as the routers counted it.
    Raises ``LimitStoreUnreachable`` when its store does not answer."""

    async def usage(self, key_id: str) -> list[KeyUsage]: ...

    async def budget_used(self, key_id: str, window_start: int) -> int:
        """Tokens used (settled, plus what open requests hold) in the budget period
        that began at ``window_start``."""
        ...


@dataclass(frozen=True, slots=True)
class AdminDeps:
    catalogs: CatalogStorePort
    keys: ApiKeyStorePort
    status: StatusSource
    # The engine security policy the control plane renders with: an apply is checked against it.
    policy: SecurityPolicy
    renderer: SpecRenderer
    # The images and source networks the control plane renders with (its RenderSettings'
    # allowlists): a diff or apply naming others is refused, as the renderer would.
    allowlists: ClusterAllowlists = field(default_factory=lambda: RenderSettings().allowlists)
    # None: the drain and restart endpoints answer 501 (no control plane behind this listener).
    models: ModelCommands | None = None
    # The keys' usage (routers count it with --limits-redis-url); None: the usage endpoint answers 501.
    usage: UsageSource | None = None
    # Wall time of each applied version (``applied_at``) and of the log.
    wall_clock: Callable[[], float] = field(default=time.time)
