"""How the router runs: every timeout, limit and interval, read from flags and env in one place.

Owns: ``RouterSettings`` (frozen; each default commented with its reason), the
flag table derived from its fields (``--upstream-idle-timeout`` and
``LLMGW_ROUTER_UPSTREAM_IDLE_TIMEOUT`` for ``upstream_idle_timeout``), the
precedence flag > env > default, and validation that names the flag to fix.

Must not: import aiohttp or do I/O, so ``llmgw --help`` stays cheap. Where to reach
Consul is ``llmgw.settings.ConsulConnection``, not here.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from llmgw.core.addresses import bad_host_name, is_loopback
from llmgw.flags import Flag, add_flags, parse_bool, parse_host_names, read_flags

ENV_PREFIX = "LLMGW_ROUTER_"


class RouterSettingsError(ValueError):
    """The settings cannot run; the message lists every problem and the flag to fix."""


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True, slots=True)
class RouterSettings:
    # --- listening ---------------------------------------------------------------------------
    host: str = field(default="127.0.0.1", metadata=_help("address to listen on"))
    port: int = field(default=8080, metadata=_help("port to listen on (0: any free port)"))
    # This router's name in Consul (its demand key llmgw/demand/<id>); empty: hostname-port.
    router_id: str = field(
        default="",
        metadata=_help(
            "this router's id in Consul and the shared limits "
            "(none: HOSTNAME-PORT, HOSTNAME-pidPID on port 0)"
        ),
    )
    # aiohttp's default of 128 overflows when hundreds of clients connect at once
    # (a batch job starting): the kernel then drops SYNs and clients stall for a
    # second or more. Linux silently caps it at net.core.somaxconn (4096 today).
    backlog: int = field(default=4096, metadata=_help("listen backlog (pending connections)"))
    # An idle keep-alive connection, and a connection that has not sent a full request
    # head, is closed after this long (aiohttp's default of 3630 s lets a slowloris
    # client hold sockets for an hour: in aiohttp this one timer bounds both).
    keepalive_timeout: float = field(
        default=15.0, metadata=_help("seconds an idle or unfinished request head may hold a connection")
    )
    # Reading a request body slower than this in total is a slow client, not a big prompt.
    body_read_timeout: float = field(default=30.0, metadata=_help("seconds to read a request body"))
    # Request bodies above this are refused with 413 (long prompts and image parts fit).
    max_body_bytes: int = field(default=32 * 1024 * 1024, metadata=_help("largest request body, bytes"))
    # A client that accepts no bytes of its answer for this long is dropped (its
    # upstream cancelled): write backpressure alone would hold the stream forever.
    client_write_timeout: float = field(default=60.0, metadata=_help("seconds a client may stall reading"))
    # On stop: in-flight requests get this long to finish before they are cancelled.
    shutdown_timeout: float = field(default=30.0, metadata=_help("seconds in-flight requests get on stop"))
    # Access logs cost a formatted line per request on the event loop; metrics cover it.
    access_log: bool = field(default=False, metadata=_help("log every request (off the hot path by default)"))
    # Without API keys anyone who reaches the port may use every model: allowed
    # only on a loopback address (development), with a warning.
    no_auth: bool = field(default=False, metadata=_help("serve without API keys (loopback only)"))
    # Without keys nothing else stops a web page in the operator's browser, and a
    # DNS-rebinding page reaches the loopback listener under its own name: so a router
    # without keys answers (every path, /metrics and /health too) only requests whose
    # Host is an IP address, localhost or one of these names (e.g. the name a local
    # Prometheus scrapes it by; the admin API's --admin-allowed-hosts alike).
    allowed_hosts: tuple[str, ...] = field(
        default=(), metadata=_help("comma-separated host names a router without keys answers to")
    )

    # --- upstream engines --------------------------------------------------------------------
    # Engines are on the LAN: a few seconds without a TCP handshake means down.
    upstream_connect_timeout: float = field(default=5.0, metadata=_help("seconds to connect to an engine"))
    # Until the engine's response head. A non-streamed answer arrives whole, so this
    # also bounds a whole non-streamed generation (4k tokens at 20 tokens/s is 200 s).
    upstream_first_byte_timeout: float = field(
        default=300.0, metadata=_help("seconds until an engine answers")
    )
    # Between two chunks of an answer. No total timeout: aiohttp's 300 s default
    # total would cut long generations that are making progress.
    upstream_idle_timeout: float = field(
        default=120.0, metadata=_help("seconds an engine may go silent mid-answer")
    )
    # Connections to all engines together; 0 means no limit. aiohttp's default of
    # 100 would cap concurrent streams per router at 100; the per-model
    # concurrency below is the limit that means something.
    upstream_connection_limit: int = field(default=0, metadata=_help("connections to engines, 0: unlimited"))
    # Pooled idle connections are closed after this long: under uvicorn's 5 s
    # keep-alive (vLLM, SGLang), so the engine rarely closes one under us first.
    upstream_pool_idle: float = field(
        default=4.0, metadata=_help("seconds an idle engine connection is kept")
    )
    # A non-streamed answer larger than this is a broken engine (embeddings of a
    # big batch are a few MiB).
    max_response_bytes: int = field(
        default=64 * 1024 * 1024, metadata=_help("largest non-streamed answer, bytes")
    )

    # --- retries and fallbacks -----------------------------------------------------------------
    # Tries on one model's endpoints (the first included) before its fallbacks;
    # only failures before the first byte reached the client are retried.
    attempts_per_model: int = field(default=3, metadata=_help("tries per model before its fallbacks"))
    # Tries for one request across the model and all its fallbacks.
    attempts_total: int = field(default=6, metadata=_help("tries per request in all"))
    # An endpoint that refused a connection gets requests only when no other endpoint
    # of its model is left, for this long (nginx's fail_timeout): Consul's check takes
    # an interval to notice a dead engine, and meanwhile every other request would
    # spend a try on it. 0 turns this off.
    suspect_for: float = field(
        default=10.0, metadata=_help("seconds an endpoint that refused a connection is tried last")
    )

    # --- loading on demand -------------------------------------------------------------------
    # A non-streamed request for an on-demand model with no replica waits this long
    # for one, then gets 503 model_loading with Retry-After (clients retry).
    load_wait: float = field(default=5.0, metadata=_help("seconds a request waits for a model to load"))
    # A streamed request may wait longer: it is kept alive with SSE comments.
    load_wait_streaming: float = field(
        default=60.0, metadata=_help("seconds a stream waits for a model to load")
    )
    # Spacing of the ": loading model" comments (proxies drop idle connections at 60 s).
    loading_comment_interval: float = field(default=2.0, metadata=_help("seconds between loading comments"))
    # Retry-After of model_loading answers.
    loading_retry_after: int = field(default=10, metadata=_help("Retry-After seconds while a model loads"))
    # Retry-After of no-capacity and upstream failure answers.
    unavailable_retry_after: int = field(default=5, metadata=_help("Retry-After seconds without capacity"))
    # Retry-After of model_unavailable answers for a model Nomad found no place for: the
    # control plane asks Nomad again when capacity changes, or after 30 s doubling.
    unplaceable_retry_after: int = field(
        default=30, metadata=_help("Retry-After seconds for a model the cluster has no place for")
    )
    # The leading control plane rewrites llmgw/unavailable on change and at its first pass
    # after status_refresh (30 s; passes come at least every 30 s), so every 60 s at worst;
    # older than this, the router no longer trusts it and waits for loads as before.
    unavailable_stale_after: float = field(
        default=90.0, metadata=_help("seconds after which llmgw/unavailable is ignored as stale")
    )

    # --- limits --------------------------------------------------------------------------------
    # Requests one router forwards to one model at once; more wait in the model's queue.
    max_concurrency_per_model: int = field(default=1024, metadata=_help("concurrent requests per model"))
    # Requests of one API key this router serves at once (streams included); beyond this
    # the key gets 429 at once: one key holding every slot of a model starves the others
    # (one key held 20 streams). Per router, as the rate limits.
    max_concurrent_per_key: int = field(default=64, metadata=_help("concurrent requests per API key"))
    # Requests waiting for a slot; beyond this a request gets 429 at once.
    max_queue_per_model: int = field(default=1024, metadata=_help("requests queued per model"))
    # A queued request that gets no slot in this long gets 429.
    queue_timeout: float = field(default=30.0, metadata=_help("seconds a request may queue"))
    # Retry-After of queue-full answers.
    queue_retry_after: int = field(default=1, metadata=_help("Retry-After seconds when a queue is full"))

    # A key with a tokens-per-minute limit holds its request's prompt estimate plus
    # max_tokens until the usage comes; a request without max_tokens needs this much
    # left to be admitted, and then holds all the key has left (RateLimiter.admit).
    hold_for_unbounded_answer: int = field(
        default=1024, metadata=_help("tokens a token-limited key needs for an answer without max_tokens")
    )

    # --- limits across routers ----------------------------------------------------------------
    # Where every router's API-key limits and usage are kept (redis://[:password@]host:port/db,
    # rediss:// for TLS). Empty: each router limits on its own, so N routers admit up to N
    # times a key's limits, and no usage is recorded.
    limits_redis_url: str = field(
        default="",
        repr=False,  # it may carry a password
        metadata=_help("Redis URL of the limits every router shares (none: each router limits alone)"),
    )
    # While that Redis does not answer: "local-share" admits on this router's share of each
    # limit (the limit divided by the routers last seen alive), "closed" refuses limited
    # keys' requests with 503 limits_unavailable.
    limits_store_down: str = field(
        default="local-share",
        metadata=_help("while the limits' Redis is unreachable: local-share or closed"),
    )
    # How long a call to that Redis may take before it counts as not answering (and
    # --limits-store-down applies): short, as every limited request waits on it; longer
    # for a Redis across a slow network or on a loaded host.
    limits_redis_timeout: float = field(
        default=0.25, metadata=_help("seconds a call to the limits' Redis may take before it is unreachable")
    )
    # A router whose heartbeat is this old is taken for dead, and what it held is returned.
    limits_heartbeat_ttl: float = field(
        default=5.0, metadata=_help("seconds after which a silent router's token holds are returned")
    )

    # --- Responses API state (/v1/responses with store, previous_response_id) ---------------------
    # A stored response is kept this long (OpenAI keeps them 30 days; here they are
    # Consul KV values every router reads, so a day by default): a follow-up after it
    # gets 404, as for an id never stored.
    responses_retention: float = field(
        default=86400.0, metadata=_help("seconds a stored Responses API response is kept for follow-ups")
    )
    # How often every router deletes the stored responses past their retention.
    responses_sweep_interval: float = field(
        default=600.0, metadata=_help("seconds between sweeps of expired stored Responses API responses")
    )
    # A stored conversation (every turn up to and with the answer) is one Consul KV
    # value, whose limit is 512 KiB: a longer one is refused with a 400 that says so.
    responses_max_bytes: int = field(
        default=256 * 1024,
        metadata=_help("largest stored Responses API conversation, bytes (Consul: under 512 KiB)"),
    )
    # What one API key may keep stored at once (every router's stores together, read
    # from the store's names): past either, a request that would store gets 429
    # insufficient_quota before it runs. Each follow-up stores the whole conversation
    # again, so a 20-turn chain of 10 kB turns keeps about 2 MB; 16 MiB a key keeps
    # Consul's KV (every value in its Raft log and snapshots) small with a few hundred keys.
    responses_max_per_key: int = field(
        default=1000, metadata=_help("stored Responses API responses one API key may keep")
    )
    responses_max_bytes_per_key: int = field(
        default=16 * 1024 * 1024,
        metadata=_help("bytes of stored Responses API responses one API key may keep"),
    )

    # --- guard ---------------------------------------------------------------------------------
    # The judge's whole answer (it is short: "safe" or "unsafe\nS1").
    guard_timeout: float = field(default=10.0, metadata=_help("seconds the guard judge may take"))
    guard_max_tokens: int = field(default=20, metadata=_help("max_tokens asked of the guard judge"))
    # A conversation longer than its judge reads, under a policy with on_too_long: split,
    # is halved (with an overlap) until each piece fits: each piece is one more judge call.
    guard_max_pieces: int = field(
        default=16,
        metadata=_help("most judge calls one request's split screen may take (on_too_long: split)"),
    )

    # A guarded request's body is read whole by the guard (every turn, every field a
    # template renders) and sent on serialized again: past this size it is refused
    # (413) before any of that. A judge reads at most guard_max_pieces pieces of its
    # context: 16 pieces of a 128k-token judge (Llama Guard 3) are about 8 MiB of
    # English text, and under on_too_long: block (the default) one piece, about 512 KiB.
    guard_max_body_bytes: int = field(
        default=8 * 1024 * 1024, metadata=_help("largest request body a guarded model takes, bytes")
    )

    # --- demand reporting ----------------------------------------------------------------------
    # Use is written to Consul in batches this often (wake-ups go at once): the
    # control plane's idle timeouts are minutes, so seconds of delay cost nothing.
    demand_interval: float = field(default=10.0, metadata=_help("seconds between demand reports"))

    def resolved_router_id(self) -> str:
        """The id given, else ``<hostname>-<port>``: unique per machine, stable across restarts
        (so a restarted router replaces its own demand report instead of adding one). On
        port 0 (the kernel's pick, known only once bound) ``<hostname>-pid<pid>``: every
        router of a host on port 0 would otherwise be ``<hostname>-0``, one demand report
        and one heartbeat in the shared limits for all of them."""
        if self.router_id:
            return self.router_id
        if self.port == 0:
            return f"{socket.gethostname()}-pid{os.getpid()}"
        return f"{socket.gethostname()}-{self.port}"

    @property
    def on_loopback(self) -> bool:
        return is_loopback(self.host)

    @classmethod
    def from_env_and_args(
        cls, environ: Mapping[str, str], namespace: argparse.Namespace | None = None
    ) -> RouterSettings:
        """A flag wins over its ``LLMGW_ROUTER_*`` variable, which wins over the default."""
        values, problems = read_flags(_FLAGS, environ, namespace)
        if problems:
            raise RouterSettingsError("; ".join(problems))
        settings = cls(**values)
        problems = validate(settings)
        if problems:
            raise RouterSettingsError("; ".join(problems))
        return settings


def _flag_table() -> tuple[Flag, ...]:
    """One flag per settings field, its help from the field's metadata."""
    parsers: dict[str, Callable[[str], Any]] = {
        "int": int, "float": float, "str": str, "bool": parse_bool, "tuple[str, ...]": parse_host_names,
    }  # fmt: skip
    table = []
    for spec in fields(RouterSettings):
        kind = spec.type if isinstance(spec.type, str) else spec.type.__name__
        table.append(
            Flag(
                field=spec.name,
                flag="--" + spec.name.replace("_", "-"),
                env=ENV_PREFIX + spec.name.upper(),
                parse=parsers[kind],
                help=spec.metadata["help"],
                is_switch=kind == "bool",
            )
        )
    return tuple(table)


_FLAGS = _flag_table()


def add_router_arguments(parser: argparse.ArgumentParser) -> None:
    """Every setting as a flag; absent flags stay absent so env and defaults apply."""
    add_flags(parser, _FLAGS, {spec.name: spec.default for spec in fields(RouterSettings)})


def validate(settings: RouterSettings) -> list[str]:
    """Every reason these settings cannot run, each naming its flag."""
    problems: list[str] = []

    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    if not 0 <= settings.port <= 65535:
        problems.append(f"--port must be 0..65535, got {settings.port}")
    for name in (
        "keepalive_timeout", "body_read_timeout", "client_write_timeout", "upstream_connect_timeout",
        "upstream_first_byte_timeout", "upstream_idle_timeout", "upstream_pool_idle",
        "loading_comment_interval", "queue_timeout", "guard_timeout", "demand_interval",
        "unavailable_stale_after", "responses_retention", "responses_sweep_interval",
        "limits_heartbeat_ttl", "limits_redis_timeout",
    ):  # fmt: skip
        if getattr(settings, name) <= 0:
            problems.append(f"{flag(name)} must be > 0, got {getattr(settings, name)}")
    for name in (
        "shutdown_timeout", "load_wait", "load_wait_streaming", "upstream_connection_limit", "suspect_for",
    ):  # fmt: skip
        if getattr(settings, name) < 0:
            problems.append(f"{flag(name)} must be >= 0, got {getattr(settings, name)}")
    for name in (
        "backlog", "max_body_bytes", "max_response_bytes", "attempts_per_model", "attempts_total",
        "max_concurrency_per_model", "max_concurrent_per_key", "loading_retry_after",
        "unavailable_retry_after", "queue_retry_after",
        "guard_max_tokens", "guard_max_pieces", "guard_max_body_bytes", "unplaceable_retry_after",
        "responses_max_bytes", "responses_max_per_key", "responses_max_bytes_per_key",
    ):  # fmt: skip
        if getattr(settings, name) < 1:
            problems.append(f"{flag(name)} must be >= 1, got {getattr(settings, name)}")
    if settings.limits_store_down not in ("local-share", "closed"):
        problems.append(
            f"--limits-store-down must be local-share or closed, got {settings.limits_store_down!r}"
        )
    schemes = ("redis://", "rediss://", "unix://")
    if settings.limits_redis_url and not settings.limits_redis_url.startswith(schemes):
        problems.append("--limits-redis-url must be a redis://, rediss:// or unix:// URL")
    if settings.hold_for_unbounded_answer < 0:
        problems.append(f"--hold-for-unbounded-answer must be >= 0, got {settings.hold_for_unbounded_answer}")
    if settings.max_queue_per_model < 0:
        problems.append(f"--max-queue-per-model must be >= 0, got {settings.max_queue_per_model}")
    for name in settings.allowed_hosts:
        if bad_host_name(name):
            problems.append(f"--allowed-hosts {name!r} must be a bare host name (no port, no scheme)")
    if settings.no_auth and not settings.on_loopback:
        problems.append(
            f"--no-auth serves every model to anyone who reaches {settings.host}: it is allowed only on "
            "a loopback address (127.0.0.1, ::1); create API keys to listen elsewhere"
        )
    return problems


def with_changes(settings: RouterSettings, **changes: Any) -> RouterSettings:
    """A copy with some fields changed (tests and benchmarks)."""
    return replace(settings, **changes)
