"""llmgw's one adapter to Consul: everything the router and the control plane read or write there.

Public face (see DESIGN.md beside this file):

- :class:`ConsulClient` - the HTTP client over one aiohttp session, from a
  :class:`llmgw.settings.ConsulConnection` (address, token, TLS, namespace).
- :class:`Watch` - the latest value of one blocking query (``latest``,
  ``wait_changed``, ``values()``, ``healthy``, ``last_error``, ``last_success_at``).
- :func:`watch_endpoints` - every ``llmgw-engine`` instance with its status, as
  :class:`llmgw.core.records.EndpointSnapshot` values.
- KV stores: :class:`DemandPublisher` / :class:`DemandReader`, :class:`DrainingMarks`,
  :class:`ApiKeyStore`, :class:`CatalogStore`, :class:`StatusPublisher`,
  :class:`UnavailableStore`, :class:`ResponseKV` (the Responses API's stored conversations).
- :class:`LeaderElection` - the control plane's leader lock (:class:`Term`).
- Settings: :class:`ClientSettings`, :class:`WatchSettings`, :class:`ElectionSettings`.
- Errors: :class:`ConsulError` (``temporary`` says whether to retry) and its kinds.

Must not: be imported by ``llmgw.core``; hold routing or reconciling decisions.
"""

from llmgw.adapters.consul.api_keys import ApiKeyConflict, ApiKeyNotFound, ApiKeyStore, IssuedKey
from llmgw.adapters.consul.catalog import CatalogConflict, CatalogStore
from llmgw.adapters.consul.client import (
    ConsulClient,
    ConsulError,
    ConsulNamespaceUnsupported,
    ConsulProtocolError,
    ConsulRejected,
    ConsulUnavailable,
    KvEntry,
    QueryMeta,
)
from llmgw.adapters.consul.demand import DemandPublisher, DemandReader
from llmgw.adapters.consul.draining import DrainingMarks
from llmgw.adapters.consul.election import LeaderElection, Term
from llmgw.adapters.consul.endpoints import parse_endpoint, watch_endpoints
from llmgw.adapters.consul.kv import CorruptRecord
from llmgw.adapters.consul.responses import ResponseKV
from llmgw.adapters.consul.settings import (
    ClientSettings,
    ConsulSettingsError,
    ElectionSettings,
    WatchSettings,
)
from llmgw.adapters.consul.status import StatusDocument, StatusPublisher
from llmgw.adapters.consul.unavailable import UnavailableStore
from llmgw.adapters.consul.watch import Watch, WatchStatus
from llmgw.adapters.watched import WatchClosed

__all__ = [
    "ApiKeyConflict",
    "ApiKeyNotFound",
    "ApiKeyStore",
    "CatalogConflict",
    "CatalogStore",
    "ClientSettings",
    "ConsulClient",
    "ConsulError",
    "ConsulNamespaceUnsupported",
    "ConsulProtocolError",
    "ConsulRejected",
    "ConsulSettingsError",
    "ConsulUnavailable",
    "CorruptRecord",
    "DemandPublisher",
    "DemandReader",
    "DrainingMarks",
    "ElectionSettings",
    "IssuedKey",
    "KvEntry",
    "LeaderElection",
    "QueryMeta",
    "ResponseKV",
    "StatusDocument",
    "StatusPublisher",
    "Term",
    "UnavailableStore",
    "Watch",
    "WatchClosed",
    "WatchSettings",
    "WatchStatus",
    "parse_endpoint",
    "watch_endpoints",
]
