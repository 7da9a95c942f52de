"""How the Consul stand-in behaves: every timing, limit and identity it uses, in one value.

Owns :class:`ConsulSettings`. The defaults are real Consul's (so ``llmgw dev`` sees
what production sees); :meth:`ConsulSettings.for_tests` shrinks the clocks so a test
can watch a check flip or a session expire in a fraction of a second.

Must not: read the environment or flags (the CLI builds a value of this type).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True, slots=True)
class ConsulSettings:
    """Identity, clocks and limits of one stand-in cluster."""

    datacenter: str = "dc1"
    # The node whose agent answers on the stand-in's main address (llmgw's
    # CONSUL_HTTP_ADDR): a Consul server, listed in the catalog like a real one.
    server_node: str = "consul-server-1"
    server_address: str = "127.0.0.1"
    # What /v1/agent/self reports as Config.Version.
    version: str = "1.20.1"

    # ACLs: None accepts and ignores every token (ACLs disabled). A string turns
    # on default-deny: only this token may read or write; no token reads empty
    # filtered lists and gets 403 elsewhere; another token gets 403 "ACL not found".
    acl_token: str | None = field(default=None, repr=False)  # repr: never print a secret

    # False answers as Consul CE (Community Edition) does: a request naming a
    # namespace (``?ns=`` or ``X-Consul-Namespace``) is a 400 (agent/http_ce.go,
    # parseEntMeta). True accepts and ignores namespaces, as Enterprise with only
    # the namespace asked for would.
    enterprise: bool = False

    # Blocking queries: Consul waits 5 min without ?wait= (default_query_time "300s"),
    # caps ?wait= at 10 min (max_query_time "600s"; both agent/config/default.go at
    # 4ae4941, applied in QueryOptions.BlockingTimeout, agent/structs/structs.go at
    # 3c56d01, hashicorp/consul), and adds up to wait/16 of random extra time
    # (JitterFraction). 0 disables the jitter. Nomad's cap is 5 min; Consul's is 10.
    default_wait: float = 300.0
    max_wait: float = 600.0
    jitter_fraction: int = 16

    # Checks: Consul raises any interval below 1 s to 1 s (checks.MinInterval),
    # times an HTTP or TCP check out after 10 s unless told, keeps the last 4 KiB
    # of a response body as Output, and sends a change of Output alone (same
    # status) to the catalog at most every 5 min (check_update_interval).
    min_check_interval: float = 1.0
    default_check_timeout: float = 10.0
    check_output_max: int = 4096
    check_update_interval: float = 300.0
    # DeregisterCriticalServiceAfter: the agent's reaper runs every 30 s and
    # Consul's documented minimum timeout is 1 min.
    check_reap_interval: float = 30.0
    min_deregister_critical_after: float = 60.0

    # Sessions: TTL must lie in [10 s, 24 h]; the servers invalidate a session
    # not renewed within TTL x 2 (agent/consul/session_ttl.go, createSessionTimer:
    # ttl * structs.SessionTTLMultiplier); lock-delay defaults to 15 s and is cut to
    # 60 s when applied (agent/consul/state/session.go: "Enforce the max lock delay",
    # structs.MaxLockDelay), whatever the session asked for.
    session_ttl_min: float = 10.0
    session_ttl_max: float = 86400.0
    session_ttl_multiplier: float = 2.0
    default_lock_delay: float = 15.0
    max_lock_delay: float = 60.0

    # An agent answers a service or check registration once its local state has it,
    # then syncs it to the servers' catalog in the background (agent/local/state.go:
    # every change calls TriggerSyncChanges; agent/ae/ae.go runs the partial sync: a
    # Catalog.Register RPC and a Raft commit). A session tied to a check that has not
    # landed yet is refused, as the servers validate against the catalog
    # (agent/consul/state/session.go, validateSessionChecksTxn). This is how long the
    # stand-in's sync takes: a LAN round trip and a commit, tens of milliseconds.
    catalog_sync_delay: float = 0.05

    # KV: Consul refuses values over 512 KiB (kv_max_value_size).
    kv_max_value_size: int = 512 * 1024

    # How long stop() lets in-flight requests finish before cutting them.
    shutdown_timeout: float = 1.0

    @classmethod
    def for_tests(cls, **overrides: object) -> ConsulSettings:
        """Real behaviour on short clocks: checks every 50 ms may count, sessions
        may live 200 ms, waits have no jitter, lock-delay is 100 ms."""
        quick = cls(
            default_wait=5.0,
            jitter_fraction=0,
            min_check_interval=0.02,
            default_check_timeout=1.0,
            check_update_interval=0.5,
            check_reap_interval=0.05,
            min_deregister_critical_after=0.1,
            session_ttl_min=0.05,
            default_lock_delay=0.1,
            shutdown_timeout=0.5,
        )
        return replace(quick, **overrides)  # type: ignore[arg-type]
