"""The router's decisions: what a client's model name stands for, which endpoint takes a
request, the order fallbacks are tried in, whether a failure may be retried, and what to
answer when nothing serves.

Owns: the rules, as pure functions over catalog values and plain numbers. The
gateway (``llmgw.gateway``) gathers the facts (the endpoint book, the clock, what
happened upstream), asks here, and acts.

Must not: do I/O, read a clock (callers pass ``now`` where time matters), import
asyncio or aiohttp, or hold state between calls.

Whether an endpoint Consul lists may be sent anything at all is ``vouch``: Consul's
health says an engine is ready, Nomad's allocations say it is a real one (an
allocation of an llmgw job, running, at that address) and take it away or hold it
back the moment it stops, fails or loses its node.

The four answers when nothing serves are deliberately different, because clients
(and people) act differently on each:

- ``UNKNOWN`` 404 ``model_not_found``, OpenAI's exact body: a typo never starts a load,
  and a model outside a key's list looks exactly like one that does not exist;
- ``OFF`` 503 that must not be retried: the model is configured off (min 0, max 0,
  or no scaling stanza), waiting will not help;
- ``LOADING`` 503 with ``Retry-After``: an on-demand model is being started, or a
  replica of a running model is starting and none passes yet (``loading_endpoints``,
  and ``placed_replicas``: its allocation placed or running, not registered yet);
- ``NO_CAPACITY`` 503 with ``Retry-After``: a running model has no healthy replica now
  and none is known to be starting (a replica that passed and went critical is not);
- ``UNAVAILABLE`` 503 ``model_unavailable`` at once, no wait: the control plane says it
  cannot serve the model now (Nomad found no place for it: ``Retry-After``; its
  replicas kept failing: ``Retry-After`` until the control plane tries again; an
  operator drained it: not to be retried), and the message says why and since when.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from llmgw.core.catalog import Catalog, Model, Role, ScalingMode
from llmgw.core.catalog.tool_calling import model_calls_tools, needs_tool_calling
from llmgw.core.durations import format_utc
from llmgw.core.names import slug
from llmgw.core.planning import JOB_PREFIX
from llmgw.core.records import Endpoint, Unavailability, UnavailableModel

# --- which API a request came to, and which models may answer it ----------------------------------


class Api(StrEnum):
    CHAT = "chat.completions"
    COMPLETIONS = "completions"
    EMBEDDINGS = "embeddings"
    RESPONSES = "responses"
    MESSAGES = "messages"  # Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens)


# A guard model (Llama Guard) is a chat model with a classifier's template: the router
# calls it through chat completions, and so may an operator testing it.
_API_ROLES: Mapping[Api, frozenset[Role]] = {
    Api.CHAT: frozenset({Role.CHAT, Role.GUARD}),
    Api.COMPLETIONS: frozenset({Role.COMPLETION}),
    Api.EMBEDDINGS: frozenset({Role.EMBEDDING}),
    Api.RESPONSES: frozenset({Role.CHAT}),  # translated to chat completions (llmgw.core.responses)
    Api.MESSAGES: frozenset({Role.CHAT}),
}


def serves_api(model: Model, api: Api) -> bool:
    return not _API_ROLES[api].isdisjoint(model.roles)


def resolve(catalog: Catalog, requested: str, allowed: Collection[str] | None = None) -> str | None:
    """The model a client's name stands for, or None when it is unknown *to this client*.

    ``allowed`` is an API key's model list (None: every model). A name passes if the
    key lists it or the model it resolves to, so a key may be granted an alias alone.
    Not allowed and not existing give the same None: the caller cannot tell them apart,
    and neither can the client.
    """
    model = catalog.resolve(requested)
    if model is None:
        return None
    if allowed is not None and requested not in allowed and model not in allowed:
        return None
    return model


def fallback_chain(
    catalog: Catalog, model: str, api: Api, allowed: Collection[str] | None = None
) -> tuple[str, ...]:
    """The model, then the models that may stand in for it, in the order they are tried.

    Breadth first: the model's own list in the operator's order, then each of
    those models' fallbacks, and so on; aliases resolved, each model once, models
    that cannot answer this API skipped. The catalog's rules refuse cycles; the
    ``seen`` set makes this terminate even on a catalog that skipped them.

    ``allowed`` is the API key's model list, as for ``resolve``: a fallback the key
    may not use is left out, like one that cannot answer the API, so a key granted
    one model is never answered by another it was not granted.
    """
    permitted = None if allowed is None else {catalog.resolve(name) for name in allowed}
    chain = [model]
    seen = {model}
    index = 0
    while index < len(chain):
        for name in catalog.fallbacks.get(chain[index], ()):
            target = catalog.resolve(name)
            if target is None or target in seen:
                continue
            seen.add(target)
            if serves_api(catalog.models[target], api) and (permitted is None or target in permitted):
                chain.append(target)
        index += 1
    return tuple(chain)


def tools_refusal(
    catalog: Catalog, requested: str, chain: Sequence[str], body: Mapping[str, object]
) -> Refusal | None:
    """The 400 for a request that needs tool calling (``tool_calling.needs_tool_calling``)
    of a model that cannot call tools (``tool_calling.model_calls_tools``), naming the name
    the client used; None when it can, or the request needs none. Every API's body says it
    the same way (chat completions', Responses' and Messages' ``tools`` and ``tool_choice``),
    so the client's body is read before any translation."""
    if not needs_tool_calling(body) or _calls_tools(catalog, chain[0]):
        return None
    return Refusal(
        status=400,
        message=f"The model `{requested}` cannot call tools (its catalog entry has no tool-call parser): "
        "send the request without tools, or use a model that can call them.",
        type="invalid_request_error",
        code="tools_not_supported",
        param="tools",
        retryable=False,
    )


def tool_calling_chain(catalog: Catalog, chain: Sequence[str], body: Mapping[str, object]) -> tuple[str, ...]:
    """The chain a request walks: for one that needs tool calling, without the fallbacks
    that cannot call tools (their engine would answer it 400 or 500, or tool markup as text)."""
    if not needs_tool_calling(body):
        return tuple(chain)
    return tuple(name for index, name in enumerate(chain) if index == 0 or _calls_tools(catalog, name))


def _calls_tools(catalog: Catalog, name: str) -> bool:
    model = catalog.models[name]
    return model_calls_tools(model.profiles, model.roles)


# --- a model's state, and the plan for one request ------------------------------------------------


class ModelState(StrEnum):
    SERVING = "serving"  # at least one healthy endpoint that is not draining
    STARTABLE = "startable"  # on demand with nothing healthy: a request wakes it
    LOADING = "loading"  # should run, nothing healthy, a replica is starting (see ``model_state``)
    NO_CAPACITY = "no-capacity"  # should run (min >= 1) but nothing healthy now, nothing starting
    UNAVAILABLE = "unavailable"  # the control plane cannot serve it now: unplaceable, or drained
    OFF = "off"  # min 0, max 0: deliberately off
    UNSET = "unset"  # no scaling stanza: known, never started


def model_state(
    model: Model, usable_endpoints: int, unavailable: bool = False, starting_replicas: int = 0
) -> ModelState:
    """Endpoints that still serve win over the configuration: a model just switched
    off keeps answering on its last replicas until the control plane stops them.
    The configuration wins over the control plane's word (``unavailable``: it listed
    the model in ``llmgw/unavailable``, see ``records.unavailable_now``): off is the
    more lasting answer. The control plane's word wins over a replica starting
    (``starting_replicas``: those of ``loading_endpoints``, registered and not passing
    yet, plus those of ``placed_replicas``, placed or running and not registered yet):
    it knows what a router cannot, that the model's replicas keep failing, that it was
    drained, or that no place is left for more.
    An on-demand model stays ``STARTABLE`` while its replica starts: it is waited for,
    and its wake kept up, as from its first request."""
    if usable_endpoints > 0:
        return ModelState.SERVING
    mode = model.scaling_mode
    if mode is ScalingMode.OFF:
        return ModelState.OFF
    if mode is ScalingMode.UNSET:
        return ModelState.UNSET
    if unavailable:
        return ModelState.UNAVAILABLE
    if mode is ScalingMode.ON_DEMAND:
        return ModelState.STARTABLE
    if starting_replicas > 0:
        return ModelState.LOADING
    return ModelState.NO_CAPACITY


def loading_endpoints(
    previous: Collection[str] | None, endpoints: Iterable[Endpoint], loading: Collection[str]
) -> frozenset[str]:
    """The service ids of the endpoints in a new snapshot (``endpoints``) that count as a
    replica starting: registered, never passing yet, and seen to arrive.

    ``previous`` is the service ids of the snapshot before (None: this is the first
    one), ``loading`` the set this returned for it. An endpoint counts when it was
    absent from the previous snapshot and is not passing (Nomad registers a replica's
    service as its allocation starts, and the engine's check fails until its weights
    are loaded), and keeps counting until it passes or leaves. One that passed and went
    critical again is a crash (or a hang), not a load: it does not count, and
    neither does one already there and not passing in a router's first snapshot,
    whose history it cannot know. Consul's and Nomad's views of the moment cannot
    tell a load from a crash (both are a running allocation whose check fails);
    only this history can, so the answer when it is missing is the older one,
    ``no_healthy_replica``. A task Nomad restarts after a crash keeps its group's
    registration (a crash, as above); an allocation restarted whole (``nomad alloc
    restart``: ``PreTaskRestart`` in ``client/allocrunner/group_service_hook.go``) is
    deregistered and registered again (a new arrival): it is loading again."""
    fresh: set[str] = set()
    for endpoint in endpoints:
        if endpoint.passing:
            continue
        key = endpoint.service_id
        if key in loading or (previous is not None and key not in previous):
            fresh.add(key)
    return frozenset(fresh)


@dataclass(frozen=True, slots=True)
class RoutePlan:
    """What to do with a request, given the states of its fallback chain now."""

    order: tuple[str, ...]  # models to try now, in order: those SERVING
    wake: tuple[str, ...]  # on-demand models to signal demand for at once
    wait_for: str | None  # nothing in `order` served: wait for this one to load


def plan_route(chain: Sequence[str], states: Mapping[str, ModelState]) -> RoutePlan:
    """The requested model (``chain[0]``) is woken whenever it is on demand and not
    running, even if a fallback answers this request: the next request should find it.
    A fallback is woken only when nothing in the chain serves (then the request waits
    for the first startable model in the chain). An ``UNAVAILABLE`` model is neither
    tried, woken nor waited for: the control plane said no load is coming. A
    ``LOADING`` model is waited for as a startable one is, in the chain's order, but
    never woken: its replica is already starting."""
    order = tuple(m for m in chain if states[m] is ModelState.SERVING)
    coming = [m for m in chain if states[m] in (ModelState.STARTABLE, ModelState.LOADING)]
    wake: list[str] = []
    if chain and states[chain[0]] is ModelState.STARTABLE:
        wake.append(chain[0])
    wait_for = None
    if coming:
        wait_for = coming[0]
        if wait_for not in wake and not order and states[wait_for] is ModelState.STARTABLE:
            wake.append(wait_for)
    return RoutePlan(order=order, wake=tuple(wake), wait_for=wait_for)


def answers(plan: RoutePlan) -> bool:
    """A request on ``plan`` reaches an engine: a model of its chain serves now, or
    one is woken and waited for. Else the router refuses it at once (503)."""
    return bool(plan.order) or plan.wait_for is not None


# --- choosing an endpoint -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Candidate:
    """An endpoint of one model as the router sees it at this instant."""

    key: str  # the endpoint's Consul service id
    in_flight: int  # requests this router has outstanding on it
    usable: bool  # passing its checks and not draining
    # It refused this router's connection a moment ago (``marks_suspect``), before
    # Consul's check has caught up with it.
    suspect: bool = False
    # The conversations (keys of requests with history) this router sent it last in the
    # last ``CONVERSATION_SECONDS``, the request's own left out: how many it holds, which
    # the count mid-turn (``in_flight``) swings around. None: not counted.
    load: int | None = None


def choose_endpoint(candidates: Iterable[Candidate], avoid: Collection[str], turn: int) -> str | None:
    """Least outstanding requests among the usable endpoints not in ``avoid``,
    suspects only when nothing else is left.

    Ties go round-robin by ``turn`` (a counter the caller advances per choice), so
    an idle model's replicas share the first requests instead of the first one in
    the list taking all of them. ``candidates`` must come in a stable order.

    Suspects go last because an endpoint that refuses connections has nothing
    outstanding, so least-outstanding would otherwise send it every other request
    until its health check fails, each one spending a try. They are still chosen
    when no other endpoint is left: Consul says they pass, and a blip should not
    take a model down (nginx's ``max_fails``/``fail_timeout`` does the same).
    """
    least: tuple[bool, int] | None = None
    tied: list[str] = []
    for candidate in candidates:
        if not candidate.usable or candidate.key in avoid:
            continue
        rank = (candidate.suspect, candidate.in_flight)
        if least is None or rank < least:
            least = rank
            tied = [candidate.key]
        elif rank == least:
            tied.append(candidate.key)
    if not tied:
        return None
    return tied[turn % len(tied)]


# --- prefix affinity: the same conversation to the same replica, from every router -----------------

# How far above the mean outstanding load a replica may go and still take a request of
# a key the router already has requests of in flight (a burst: a hot prefix, one
# client's key sent many times at once): the ``c`` of Mirrokni, Thorup and
# Zadimoghaddam's "Consistent Hashing with Bounded Loads" (2018), KubeAI's
# ``meanLoadFactor`` (internal/loadbalancer/balance_chwbl.go, ``chwblLoadOK``;
# ``meanLoadPercentage``'s default 125 in api/k8s/v1/model_types.go).
AFFINITY_LOAD_FACTOR = 1.25
# The same for a conversation's lone turn (none of its key in flight, as an agent waits
# for each answer): loose, because its conversation is balanced by the share below, and
# a tight bound on this instant's count would move a turn away whenever its owner's
# count peaks (a conversation is outstanding while answered, not while its tool runs),
# each time to a replica that has none of it cached.
TURN_LOAD_FACTOR = 3.0
# How far above the mean number of conversations a replica may hold (``Candidate.load``)
# and keep the one at hand: each conversation's own threshold between the two, drawn
# from a hash of its key and the replica, so that a replica over its share gives away
# the same few conversations on every turn (they move once, and are cached where they
# go) rather than whichever turn comes when it is busy.
AFFINITY_SHARE = (1.3, 1.9)
# How long a router counts a conversation on the replica it last sent it to
# (``Candidate.load``): a few of an agent's turns (a turn and its tool call take
# seconds to a minute), so one that pauses still counts, and one that ended soon stops.
CONVERSATION_SECONDS = 60.0
# Leading content hashed for a key, at most: enough to tell conversations apart, and a
# bound on the work of a request with a huge first turn.
_KEY_CONTENT_CHARS = 64 * 1024


class RouteOutcome(StrEnum):
    """How ``choose_by_prefix`` chose (the ``llmgw_routing_decisions_total`` label)."""

    AFFINITY = "affinity"  # the replica that owns the request's prefix
    OVERFLOW = "overflow"  # its owner was over its share or the bound: the next in the key's order
    NO_HISTORY = "no-history"  # a conversation's first turn: nothing cached to follow, least outstanding
    NO_KEY = "no-key"  # no prefix to follow (or affinity off), or every replica over: least outstanding


@dataclass(frozen=True, slots=True)
class Choice:
    key: str | None  # the endpoint's service id; None: nothing is left to try
    outcome: RouteOutcome


def affinity_key(api: Api, body: Mapping[str, object], explicit: str | None = None) -> str | None:
    """A key that stays the same over one conversation's turns, or None.

    The client's own when it sends one: ``explicit`` (the Responses API's
    ``prompt_cache_key``, which its translation to chat does not carry), chat
    completions' ``prompt_cache_key`` (OpenAI's "used to cache responses for similar
    requests", openai-python ``CompletionCreateParams``), the Messages API's
    ``metadata.user_id`` (Claude Code puts its session there). Else a hash of the
    leading content, which an agent resends unchanged on every turn while the rest
    grows: the system (and developer) messages and the first user turn (a Messages
    request's ``system`` too). That is what every engine keeps cached first (their
    caches are prefix trees of blocks), so the replica that answered the first turn
    holds it for the next.

    A blake2b digest, not Python's ``hash``: every router (another process) must
    compute the same key."""
    if explicit:
        return _digest("key", explicit)
    if api is Api.MESSAGES:
        metadata = body.get("metadata")
        user = metadata.get("user_id") if isinstance(metadata, Mapping) else None
        if isinstance(user, str) and user:
            return _digest("key", user)
    elif api is Api.CHAT:
        given = body.get("prompt_cache_key")
        if isinstance(given, str) and given:
            return _digest("key", given)
    else:
        return None
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    leading: list[object] = []
    if api is Api.MESSAGES and body.get("system") is not None:
        leading.append(body.get("system"))
    for message in messages:
        leading.append(message.get("content") if isinstance(message, Mapping) else message)
        if isinstance(message, Mapping) and message.get("role") == "user":
            break
    else:
        return None  # no user turn: nothing a conversation keeps
    text = json.dumps(leading, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)
    return _digest("prefix", text[:_KEY_CONTENT_CHARS])


def has_history(api: Api, body: Mapping[str, object]) -> bool:
    """The request carries an earlier answer (an ``assistant`` message, in chat
    completions or the Messages API): its conversation has been served before, so some
    replica holds more than its first turn. A first turn (or a one-off prompt) has
    nothing cached anywhere but maybe a shared system prompt, which every replica that
    serves the model soon holds: it gains nothing from its owner and goes where the
    load is least (``choose_by_prefix``)."""
    if api not in (Api.CHAT, Api.MESSAGES):
        return False
    messages = body.get("messages")
    if not isinstance(messages, list):
        return False
    return any(isinstance(m, Mapping) and m.get("role") == "assistant" for m in messages)


def _digest(kind: str, text: str) -> str:
    data = text.encode("utf-8", "surrogatepass")
    return kind + ":" + hashlib.blake2b(data, digest_size=16).hexdigest()


def rendezvous_order(key: str, replicas: Iterable[str]) -> list[str]:
    """``replicas`` in ``key``'s order of preference: highest random weight first
    (Thaler and Ravishankar's rendezvous hashing). Every router computes the same order
    from the same ids; a replica that joins takes only the keys it now ranks first on
    (1/n of them), one that leaves gives away only its own, each to its next in line."""
    return sorted(replicas, key=lambda replica: _weight(key, replica), reverse=True)


def _weight(key: str, replica: str) -> bytes:
    return hashlib.blake2b(f"{key}\x00{replica}".encode("utf-8", "surrogatepass"), digest_size=8).digest()


def load_bound(outstanding: int, replicas: int, factor: float = AFFINITY_LOAD_FACTOR) -> int:
    """The most requests one of ``replicas`` may have outstanding, this one included, and
    still be given a request by its prefix: ``ceil(factor * (outstanding + 1) / replicas)``,
    the mean with the new request counted, as KubeAI's ``chwblLoadOK`` counts it. Never
    below 1 (an idle model takes its first requests by prefix)."""
    return max(1, math.ceil(factor * (outstanding + 1) / replicas))


def choose_by_prefix(
    candidates: Iterable[Candidate],
    avoid: Collection[str],
    key: str | None,
    turn: int,
    factor: float = AFFINITY_LOAD_FACTOR,
    *,
    history: bool = True,
    concurrent: int = 1,
    share: tuple[float, float] = AFFINITY_SHARE,
    turn_factor: float = TURN_LOAD_FACTOR,
) -> Choice:
    """Consistent hashing with bounded loads over rendezvous hashing: the first endpoint
    in ``key``'s ``rendezvous_order`` that is within its share and under the bound.

    - **The share** (when the candidates carry ``load``, the conversations each holds):
      the endpoint's conversations with this one within ``t`` times the mean (this one
      counted once), where ``t`` lies between ``share``'s two ends by a hash of the key
      and the endpoint. Rendezvous hashing alone gives some replicas half as many
      conversations again as the mean (a binomial draw): such an owner keeps those of
      high ``t`` and gives away the same ones of low ``t`` on every turn, each to the
      next in its order, where it stays and is cached. ``in_flight`` would not do: an
      agent's conversation is outstanding while answered and not while its tool runs,
      so a bound on it moves a different turn of every conversation whenever the count
      peaks, each to a replica that has none of it.
    - **The bound** on this instant's outstanding requests, with this one:
      ``load_bound`` of the usable endpoints' total, with ``factor`` when the router
      has other requests of this key in flight (``concurrent``: a burst of one prefix,
      a hot key; a caller that does not count them gets this one), else the looser
      ``turn_factor``. A burst fills its owner to the
      bound and spills to the next in its own order (which then caches it too), never
      pinning one replica.

    No key, or no usable endpoint outside ``avoid`` that is not a suspect, or every one
    over: ``choose_endpoint``'s least outstanding (suspects last, as there). A first
    turn (``history`` False, see ``has_history``) goes there too (``NO_HISTORY``): it
    has nothing cached to follow, and the replica its key owns has no more of it than
    any other, so it only balances the load (a workload of one-off prompts is routed
    as by least outstanding). The state is the router's own counts only (its
    outstanding requests, the conversations it sent each endpoint lately), so routers
    share nothing: each sees every conversation every few turns, so their counts of
    conversations agree, and so do their choices; where one is busier it spills as
    the others would.

    Chosen over SGLang's router's ``cache_aware`` policy (sgl-router
    src/policies/cache_aware.rs: a radix tree per router of the prompts it sent each
    worker, shortest queue once ``max - min > balance_abs_threshold`` and ``max >
    min * balance_rel_threshold``): its tree is each router's own, so routers that
    do not share it disagree (the issue's 0.66 hit rate with 8 gateways)."""
    listed = list(candidates)
    if key is not None and not history:
        chosen = choose_endpoint(listed, avoid, turn)
        return Choice(chosen, RouteOutcome.NO_HISTORY if chosen is not None else RouteOutcome.NO_KEY)
    if key is not None:
        eligible = {c.key: c for c in listed if c.usable and not c.suspect and c.key not in avoid}
        if eligible:
            outstanding = sum(c.in_flight for c in eligible.values())
            bound = load_bound(outstanding, len(eligible), factor if concurrent > 0 else turn_factor)
            held = [c.load for c in eligible.values() if c.load is not None]
            mean = (sum(held) + 1) / len(eligible) if len(held) == len(eligible) else None
            low, high = share
            for rank, replica in enumerate(rendezvous_order(key, eligible)):
                candidate = eligible[replica]
                if candidate.in_flight + 1 > bound:
                    continue
                if mean is not None and candidate.load is not None:
                    threshold = low + (high - low) * _unit(key, replica)
                    if candidate.load + 1 > max(1.0, threshold * mean):
                        continue
                return Choice(replica, RouteOutcome.AFFINITY if rank == 0 else RouteOutcome.OVERFLOW)
    return Choice(choose_endpoint(listed, avoid, turn), RouteOutcome.NO_KEY)


def _unit(key: str, replica: str) -> float:
    """A number in [0, 1) of ``key`` and ``replica``, the same in every router."""
    digest = hashlib.blake2b(f"share\x00{key}\x00{replica}".encode("utf-8", "surrogatepass"), digest_size=8)
    return int.from_bytes(digest.digest(), "big") / 2**64


# --- whether Nomad vouches for an endpoint ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AllocationFact:
    """What Nomad says of one allocation of an llmgw job, as far as routing needs it."""

    alloc_id: str
    job_id: str
    node_id: str
    client_status: str  # Nomad's ClientStatus: pending, running, complete, failed, lost, unknown
    desired_run: bool  # DesiredStatus is "run" (not "stop" or "evict")
    # (host IP, port) of every port Nomad allocated it: where Nomad registers its services.
    addresses: frozenset[tuple[str, int]]
    group: str = ""  # its task group (``ENGINE_GROUP`` registers the engine); "" when Nomad did not say


@dataclass(frozen=True, slots=True)
class NomadView:
    """The allocations of llmgw's jobs and the nodes that are gone, as of Nomad's ``index``."""

    allocations: Mapping[str, AllocationFact]  # by allocation id
    nodes_gone: frozenset[str]  # ids of nodes down, disconnected or deregistered
    index: int


class Vouch(StrEnum):
    """Nomad's word on one Consul endpoint. Only ``ROUTE`` is sent new requests."""

    ROUTE = "route"  # a running allocation of its job, at its address, on a live node
    STOPPING = "stopping"  # its allocation is told to stop: no new requests from now on
    GONE = "gone"  # its allocation stopped, failed, was lost, or its node is down or disconnected
    STARTING = "starting"  # its allocation is not running yet (or is restarting its task)
    UNMATCHED = "unmatched"  # no allocation of an llmgw job matches it: forged or stale, ignored
    UNVERIFIED = "unverified"  # Nomad's view is missing or stale: a new endpoint waits


_GONE_STATUSES = frozenset({"complete", "failed", "lost", "unknown"})


def canonical_address(address: str) -> str:
    """An IP address in one spelling (``::1`` and ``0:0::1`` are the same host); a name as
    given, lower-cased."""
    try:
        return ipaddress.ip_address(address).compressed
    except ValueError:
        return address.lower()


def named_consistently(endpoint: Endpoint) -> bool:
    """The registration's names agree with each other: its slug is its model's, and its
    job is a replica job of that model (``llmgw-<slug>-<replica>``)."""
    return (
        bool(endpoint.alloc_id)
        and endpoint.model_slug == slug(endpoint.model)
        and endpoint.replica.startswith(f"{JOB_PREFIX}{endpoint.model_slug}-")
    )


def vouch(endpoint: Endpoint, view: NomadView | None, *, current: bool) -> Vouch:
    """Whether Nomad vouches for ``endpoint``, a Consul registration of the engine service.

    Consul's catalog is written by whatever holds a token that may register the
    service; Nomad's allocations are what the control plane started. So an endpoint
    is routable only when Nomad shows an allocation with the registration's
    allocation id (``nomad_alloc_id`` in its meta), of the job the registration names,
    with a port at the registration's address and port (Nomad registers a service at
    its port's host IP and value), running, told to run, on a node that is not gone.

    ``current`` is False while Nomad cannot be reached: the last view still takes
    away (a failed allocation stays failed) and still vouches for what it knew, but
    an endpoint it does not know waits (``UNVERIFIED``) instead of being ignored as
    forged: no allocation can start without Nomad anyway.
    """
    if not named_consistently(endpoint):
        return Vouch.UNMATCHED
    if view is None:
        return Vouch.UNVERIFIED
    fact = view.allocations.get(endpoint.alloc_id)
    if fact is None or not _registered_for(endpoint, fact):
        return Vouch.UNMATCHED if current else Vouch.UNVERIFIED
    if fact.node_id in view.nodes_gone or fact.client_status in _GONE_STATUSES:
        return Vouch.GONE
    if not fact.desired_run:
        return Vouch.STOPPING
    if fact.client_status != "running":
        return Vouch.STARTING
    return Vouch.ROUTE


def _registered_for(endpoint: Endpoint, fact: AllocationFact) -> bool:
    """``endpoint`` is a registration Nomad would make for ``fact``'s allocation: its id,
    its job, one of its ports."""
    return (
        fact.alloc_id == endpoint.alloc_id
        and fact.job_id == endpoint.replica
        and (canonical_address(endpoint.address), endpoint.port) in fact.addresses
    )


# The task group of a replica job that serves the API and registers the engine service:
# the renderer names a replica's groups ``rank-<n>`` (``llmgw.render.context``), and only
# rank 0 has an ``llmgw-engine`` service; the other ranks' allocations never register one.
ENGINE_GROUP = "rank-0"
_PLACED_STATUSES = frozenset({"pending", "running"})


def job_model_slug(job_id: str) -> str | None:
    """The model slug in a replica job's id (``llmgw-<slug>-<replica id>``; a replica id
    has no ``-``), or None for a job llmgw does not name so."""
    if not job_id.startswith(JOB_PREFIX):
        return None
    model_slug, dash, replica_id = job_id[len(JOB_PREFIX) :].rpartition("-")
    return model_slug if dash and model_slug and replica_id else None


def placed_replicas(
    view: NomadView, endpoints: Iterable[Endpoint], draining: Collection[str] = ()
) -> Mapping[str, int]:
    """By model slug, the replicas being placed or started that Consul does not list yet:
    allocations of a replica job's ``ENGINE_GROUP``, told to run, ``pending`` or
    ``running``, on a node that is not gone, of a replica not draining, with no
    registration among ``endpoints`` (Consul's snapshot) that Nomad would have made
    for them.

    Nomad registers a group's services in the allocation runner's ``Prerun``, before
    any task starts (``client/allocrunner/group_service_hook.go``), and sends them to
    Consul asynchronously (``command/agent/consul/service_client.go``: ``commit`` queues
    the operations, the sync loop registers them and retries a failure). So between
    placement and that registration the allocation is ``pending`` (tasks not started)
    or already ``running`` (a sync delayed or retried), and nothing in Consul says a
    replica is coming. Once its registration arrives, ``loading_endpoints`` takes over.
    A failed, lost, complete or stopping allocation is no replica coming, nor is one
    Nomad's view cannot place on a live node. Unlike a registration, an allocation
    carries its own history: pending or running, never a crash (a task that exited
    makes it ``failed`` once its restarts are spent, and a task restarting inside it
    keeps its group's registration), so a router's first view counts it too."""
    allocations = view.allocations
    registered = {
        e.alloc_id for e in endpoints if (a := allocations.get(e.alloc_id)) and _registered_for(e, a)
    }
    placed: dict[str, int] = {}
    for fact in allocations.values():
        if (
            fact.group != ENGINE_GROUP
            or not fact.desired_run
            or fact.client_status not in _PLACED_STATUSES
            or fact.node_id in view.nodes_gone
            or fact.alloc_id in registered
            or fact.job_id in draining
        ):
            continue
        model_slug = job_model_slug(fact.job_id)
        if model_slug is not None:
            placed[model_slug] = placed.get(model_slug, 0) + 1
    return placed


# --- retrying -----------------------------------------------------------------------------------


class Failure(StrEnum):
    """How an attempt failed before its response reached the client."""

    CONNECT = "connect"  # refused, unreachable, connect timeout: the engine never saw it
    STALE_CONNECTION = "stale-connection"  # a pooled (reused) keep-alive connection closed before any answer
    UNAVAILABLE = "unavailable"  # the engine answered 502 or 503
    FIRST_BYTE_TIMEOUT = "first-byte-timeout"  # accepted, then silent: it may still be working


class NextStep(StrEnum):
    SAME_ENDPOINT = "same-endpoint"  # on a fresh connection
    OTHER_ENDPOINT = "other-endpoint"  # of the same model
    NEXT_MODEL = "next-model"  # the model's tries are used up: its fallbacks
    GIVE_UP = "give-up"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    # Tries on one model's endpoints (the first included) before its fallbacks.
    attempts_per_model: int = 3
    # Tries for one request across every model of its chain.
    attempts_total: int = 6


def after_failure(
    failure: Failure,
    *,
    client_has_bytes: bool,
    attempts_on_model: int,
    attempts_total: int,
    policy: RetryPolicy,
) -> NextStep:
    """What follows a failed attempt. Nothing is retried once a byte of the answer
    has reached the client (it would see two beginnings). A timeout waiting for the
    first byte is not retried either: the engine may still be generating, and a
    retry would double the load exactly when an engine is overloaded."""
    if client_has_bytes or failure is Failure.FIRST_BYTE_TIMEOUT:
        return NextStep.GIVE_UP
    if attempts_total >= policy.attempts_total:
        return NextStep.GIVE_UP
    if failure is Failure.STALE_CONNECTION:
        # The engine is fine, the pooled connection was not: same endpoint, new
        # connection, whatever the model's tries (the pool's leftover is not the
        # model's failure). It cannot repeat: a fresh connection is never stale.
        return NextStep.SAME_ENDPOINT
    if attempts_on_model >= policy.attempts_per_model:
        return NextStep.NEXT_MODEL
    return NextStep.OTHER_ENDPOINT


RETRYABLE_STATUSES = frozenset({502, 503})


def marks_suspect(failure: Failure) -> bool:
    """Whether a failed attempt makes its endpoint a suspect for a while: only when
    the engine could not be reached. A stale pooled connection says nothing about
    the engine, and a 502/503 comes from an engine that is there and answering."""
    return failure is Failure.CONNECT


# --- what to answer when nothing serves -----------------------------------------------------------


class Unserved(StrEnum):
    UNKNOWN = "unknown"
    WRONG_API = "wrong-api"
    OFF = "off"
    UNSET = "unset"
    LOADING = "loading"
    NO_CAPACITY = "no-capacity"
    UNAVAILABLE = "unavailable"
    UPSTREAM_FAILED = "upstream-failed"
    TIMEOUT = "timeout"


def unserved_reason(requested: ModelState, *, waited_for: str | None, failures: int) -> Unserved:
    """Why a request for a known model found nobody to answer it. ``waited_for`` is the
    model the request was still waiting for when it gave up (None when nothing in its
    chain could load any more, even if it waited earlier)."""
    if failures:
        return Unserved.UPSTREAM_FAILED
    if requested is ModelState.UNAVAILABLE and waited_for is None:
        return Unserved.UNAVAILABLE
    if waited_for is not None:
        return Unserved.LOADING
    if requested is ModelState.OFF:
        return Unserved.OFF
    if requested is ModelState.UNSET:
        return Unserved.UNSET
    if requested in (ModelState.STARTABLE, ModelState.LOADING):
        return Unserved.LOADING
    return Unserved.NO_CAPACITY


@dataclass(frozen=True, slots=True)
class Refusal:
    """An OpenAI-shaped error answer: the HTTP status and the ``error`` object's fields."""

    status: int
    message: str
    type: str
    code: str | None
    param: str | None = None
    retry_after: int | None = None  # seconds, for a Retry-After header
    retryable: bool = True  # False adds x-should-retry: false (the openai clients honour it)

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def model_not_found(requested: str) -> Refusal:
    # OpenAI's exact wording and shape.
    return Refusal(
        status=404,
        message=f"The model `{requested}` does not exist or you do not have access to it.",
        type="invalid_request_error",
        code="model_not_found",
        retryable=False,
    )


def refusal_for(
    reason: Unserved,
    requested: str,
    *,
    retry_after: int,
    api: Api = Api.CHAT,
    waited_for: str | None = None,
    unavailable: UnavailableModel | None = None,
) -> Refusal:
    """The answer for each reason; messages say what the client can do next.
    ``unavailable`` is the control plane's word on the requested model (for ``UNAVAILABLE``)."""
    if reason is Unserved.UNKNOWN:
        return model_not_found(requested)
    if reason is Unserved.WRONG_API:
        return Refusal(
            status=400,
            message=f"The model `{requested}` does not support the {api} API.",
            type="invalid_request_error",
            code="model_not_supported",
            param="model",
            retryable=False,
        )
    if reason in (Unserved.OFF, Unserved.UNSET):
        why = "scaling min 0, max 0" if reason is Unserved.OFF else "it has no scaling stanza"
        return Refusal(
            status=503,
            message=f"The model `{requested}` is configured off ({why}); "
            "ask the operator to give it replicas in the catalog.",
            type="server_error",
            code="model_off",
            retryable=False,
        )
    if reason is Unserved.LOADING:
        which = f"`{requested}`" if waited_for in (None, requested) else f"`{requested}` (via `{waited_for}`)"
        return Refusal(
            status=503,
            message=f"The model {which} is loading; retry in {retry_after} seconds.",
            type="server_error",
            code="model_loading",
            retry_after=retry_after,
        )
    if reason is Unserved.NO_CAPACITY:
        return Refusal(
            status=503,
            message=f"The model `{requested}` has no healthy replica right now; "
            f"retry in {retry_after} seconds.",
            type="server_error",
            code="no_healthy_replica",
            retry_after=retry_after,
        )
    if reason is Unserved.UNAVAILABLE:
        return _unavailable(requested, unavailable, retry_after)
    if reason is Unserved.TIMEOUT:
        return Refusal(
            status=504,
            message=f"The model `{requested}` did not start answering in time.",
            type="server_error",
            code="upstream_timeout",
        )
    return Refusal(
        status=502,
        message=f"Every replica tried for `{requested}` failed before answering; "
        f"retry in {retry_after} seconds.",
        type="server_error",
        code="upstream_unavailable",
        retry_after=retry_after,
    )


def _unavailable(requested: str, why: UnavailableModel | None, retry_after: int) -> Refusal:
    which = f"`{requested}`" if why is None or why.model == requested else f"`{requested}` (`{why.model}`)"
    since = "" if why is None else " since " + format_utc(why.since)
    if why is not None and why.why is Unavailability.DRAINED:
        drained = why.reason or "an operator drained it"
        return Refusal(
            status=503,
            message=f"The model {which} cannot be served now: {drained}{since}. "
            "It serves again after an operator restarts it or changes it in the catalog.",
            type="server_error",
            code="model_unavailable",
            retryable=False,
        )
    if why is not None and why.why is Unavailability.FAILING:
        again = f" at {format_utc(why.until)}" if why.until is not None else ""
        return Refusal(
            status=503,
            message=f"The model {which} cannot be served now: its replicas kept failing "
            f"({why.reason}){since}. The control plane tries again{again}; retry in {retry_after} "
            "seconds or ask the operator.",
            type="server_error",
            code="model_unavailable",
            retry_after=retry_after,
        )
    detail = f": the cluster has no place for it ({why.reason}){since}" if why is not None else ""
    return Refusal(
        status=503,
        message=f"The model {which} cannot be served now{detail}. "
        f"The control plane tries again when the cluster's capacity changes; retry in {retry_after} seconds "
        "or ask the operator.",
        type="server_error",
        code="model_unavailable",
        retry_after=retry_after,
        # No place now says nothing of when there will be one: a client's own retries (the
        # openai and anthropic SDKs sleep Retry-After, twice) would only wait for the same
        # answer. Without the control plane's word, a retry may find a replica.
        retryable=why is None,
    )
