"""Nomad's HTTP API over a ``NomadStandIn``: same paths, query parameters, headers and JSON.

Owns: the aiohttp app factory, request decoding (lenient like Go, or strict: a key
real Nomad would drop is a 400 naming it), ACL token checking (403 like Nomad when a
token is configured, ``/_dev/`` included), blocking queries (``index``/``wait`` with ``X-Nomad-Index``,
``X-Nomad-KnownLeader``, ``X-Nomad-LastContact``), the event stream, log streaming, and
the dev-only fault endpoints under ``/_dev/`` (a prefix real Nomad does not have).

Must not: hold state or decide anything; every write goes through ``NomadStandIn``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from llmgw.apispec.jobspec import JobspecError, parse_jobspec
from llmgw.devcluster.acl import NomadAcl
from llmgw.devcluster.browsers import refuse_browsers
from llmgw.devcluster.nomad import acl_api
from llmgw.devcluster.nomad.apishape import decode_lenient, fill, strict_problems
from llmgw.devcluster.nomad.authz import register_refusal, route_check, stream_allowed
from llmgw.devcluster.nomad.events import SubscriptionDropped, filter_events, parse_topics
from llmgw.devcluster.nomad.jobcanon import JobInvalid
from llmgw.devcluster.nomad.standin import NOMAD_VERSION, BadRequest, NomadStandIn, NotFound
from llmgw.devcluster.nomad.state import NAMESPACE, now_ns
from llmgw.devcluster.nomad.variables import CasConflict, VariableProblem, parse_policy
from llmgw.http_server import bound_port, listener_log

JSON = dict[str, Any]
STANDIN_KEY = web.AppKey("nomad_standin", NomadStandIn)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_WAIT = re.compile(r"^(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)?$")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _standin(request: web.Request) -> NomadStandIn:
    return request.app[STANDIN_KEY]


def _error(status: int, text: str) -> web.Response:
    # Nomad answers errors with a plain-text body.
    return web.Response(status=status, text=text, content_type="text/plain")


def _json(data: Any, *, index: int | None = None, status: int = 200) -> web.Response:
    headers = {"X-Nomad-KnownLeader": "true", "X-Nomad-LastContact": "0"}
    if index is not None:
        headers["X-Nomad-Index"] = str(index)
    return web.Response(
        status=status, text=json.dumps(data), content_type="application/json", headers=headers
    )


def parse_wait(text: str | None, default: float, maximum: float) -> float:
    if not text:
        return default
    match = _WAIT.match(text.strip())
    if not match:
        raise BadRequest(f"Invalid wait time: {text!r}")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2) or "s"]
    return min(seconds, maximum)


def _bool(request: web.Request, name: str, default: bool = False) -> bool:
    value = request.query.get(name)
    if value is None:
        return default
    if value == "":
        return True
    return value.lower() in ("1", "true", "t", "yes")


async def _block(request: web.Request, index_of: Callable[[], int]) -> int:
    """Nomad's blocking query: with ?index=N, wait until the index passes N or ?wait runs out."""
    standin = _standin(request)
    try:
        min_index = int(request.query.get("index", "0") or 0)
    except ValueError as exc:
        raise BadRequest(f"Invalid index: {exc}") from exc
    if min_index <= 0:
        return max(1, index_of())
    wait = parse_wait(
        request.query.get("wait"), standin.config.blocking_default_wait_s, standin.config.blocking_max_wait_s
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while index_of() <= min_index:
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        await standin.store.wait_change(remaining)
    return max(1, index_of())


async def _body(request: web.Request, struct: str) -> JSON:
    try:
        raw = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"Request body could not be decoded: {exc}") from exc
    if not isinstance(raw, dict):
        raise BadRequest(f"Request body must be a JSON object ({struct})")
    standin = _standin(request)
    if standin.config.strict:
        problems = strict_problems(raw, struct)
        if problems:
            raise BadRequest(
                "strict mode (dev stand-in): real Nomad would silently drop these keys:\n"
                + "\n".join(f"  {p}" for p in problems)
            )
    decoded = decode_lenient(raw, struct)
    return dict(decoded) if isinstance(decoded, dict) else {}


# ---------------------------------------------------------------------------
# Middlewares


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if isinstance(request.match_info.http_exception, web.HTTPNotFound):
        return _unserved(request)
    try:
        return await handler(request)
    except NotFound as exc:
        return _error(404, str(exc))
    except (BadRequest, JobInvalid, VariableProblem) as exc:
        return _error(400, str(exc))
    except Forbidden as exc:
        return _error(403, str(exc))


class Forbidden(Exception):
    """A check inside a handler refused the request's token (Nomad's 403 text is the message)."""


def _denied(request: web.Request, lacked: str) -> None:
    """Record the refusal and raise Nomad's 403 ``Permission denied`` (the text names no rule)."""
    _standin(request).tokens.deny(request.get(WHO, "anonymous"), f"{request.method} {request.path}", lacked)
    raise Forbidden("Permission denied")


def _unserved(request: web.Request) -> web.Response:
    """A path the stand-in has no endpoint for, answered as real Nomad answers a path it
    has no handler for: 404, before and without any ACL check (``handleRootFallthrough``
    in ``command/agent/http.go``). Nomad's body is empty; this one says what is missing."""
    return _error(
        404,
        f"the llmgw dev stand-in does not serve {request.method} {request.path}; it serves the "
        "endpoints llmgw and its tests use (llmgw/devcluster/DESIGN.md lists them)",
    )


# Real Nomad answers these without a token (no ACL check in their handlers).
ACL_FREE_PATHS = frozenset({"/v1/status/leader", "/v1/status/peers", "/v1/agent/health", "/v1/regions"})


def request_token(headers: Mapping[str, str]) -> str:
    """The token as Nomad's ``parseToken`` finds it: ``X-Nomad-Token``, else ``Authorization: Bearer``.

    Nomad reads no ``?token=`` query parameter (Consul does; Nomad does not).
    """
    token = headers.get("X-Nomad-Token", "").strip()
    if token:
        return token
    scheme, _, value = headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.split()[0]
    return ""


ACL = web.RequestKey("nomad_acl", NomadAcl)
WHO = web.RequestKey("nomad_token_name", str)
_ANONYMOUS = NomadAcl()  # the anonymous token: no policy


def acl_of(request: web.Request) -> NomadAcl:
    """The request's token's ACL (management when the stand-in runs with ACLs off)."""
    acl = request.get(ACL)
    return acl if isinstance(acl, NomadAcl) else NomadAcl(management=True)


def acl_middleware(standin: NomadStandIn) -> Any:
    """Resolve the token and make the route's check, as Nomad's RPC handlers do.

    With no token configured ACLs are off and everything is served. An unknown secret is
    ``ACL token not found``; a token (or the anonymous one) without the capability the
    route's RPC checks is ``Permission denied``, both 403 in plain text
    (``command/agent/http.go`` ``wrap``). The dev-only ``/_dev/`` paths and the ACL
    endpoints need a management token: they kill processes and write policies.
    """

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if standin.config.acl_token is None or request.path in ACL_FREE_PATHS:
            return await handler(request)
        sent = request_token(request.headers)
        who = "anonymous"
        if sent:
            identity = standin.tokens.resolve(sent)
            if identity is None:
                standin.tokens.deny("unknown", f"{request.method} {request.path}", "a known token")
                return _error(403, "ACL token not found")
            acl, who = identity.acl, identity.name
        else:
            acl = _ANONYMOUS
        route = request.match_info.route.resource
        pattern = route.canonical if route is not None else request.path
        pattern = pattern.replace("{path:.+}", "{path}")
        namespace = request.query.get("namespace") or NAMESPACE
        if route is not None and not route_check(request.method, pattern)(acl, namespace):
            standin.tokens.deny(who, f"{request.method} {pattern}", "the route's capability")
            return _error(403, "Permission denied")
        request[ACL] = acl
        request[WHO] = who
        return await handler(request)

    return check


# ---------------------------------------------------------------------------
# Jobs


async def jobs_parse(request: web.Request) -> web.Response:
    body = await _body(request, "JobsParseRequest")
    text = body.get("JobHCL")
    if not text:
        return _error(400, "Job spec is empty")
    try:
        job = parse_jobspec(str(text), filename="input.hcl", variables_file=str(body.get("Variables") or ""))
    except JobspecError as exc:
        return _error(400, str(exc))
    if body.get("Canonicalize"):
        from llmgw.devcluster.nomad.jobcanon import canonicalize

        job = canonicalize(job)
    return _json(fill("Job", job))


async def jobs_list(request: web.Request) -> web.Response:
    standin = _standin(request)
    if request.query.get("filter"):
        raise BadRequest("filter expressions are not supported by the dev stand-in")
    index = await _block(request, lambda: standin.store.table_index["jobs"])
    prefix = request.query.get("prefix", "")
    with_meta = _bool(request, "meta")
    stubs = [
        standin.store.job_stub(job, with_meta=with_meta)
        for job in sorted(standin.store.jobs.values(), key=lambda j: j.id)
        if job.id.startswith(prefix)
    ]
    return _json(stubs, index=index)


async def jobs_register(request: web.Request) -> web.Response:
    body = await _body(request, "JobRegisterRequest")
    job = body.get("Job")
    if not isinstance(job, dict):
        raise BadRequest("Job must be specified")
    url_id = request.match_info.get("job_id")
    if url_id is not None and job.get("ID") != url_id:
        raise BadRequest("Job ID does not match name")
    missing = register_refusal(acl_of(request), job)
    if missing is not None:
        _denied(request, missing)
    result = _standin(request).register_job(
        job,
        enforce_index=bool(body.get("EnforceIndex")),
        job_modify_index=int(body.get("JobModifyIndex") or 0),
    )
    return _json(result, index=result["EvalCreateIndex"])


def _job(request: web.Request) -> Any:
    standin = _standin(request)
    job = standin.store.jobs.get(request.match_info["job_id"])
    if job is None:
        raise NotFound("job not found")
    return job


async def job_get(request: web.Request) -> web.Response:
    standin = _standin(request)
    job_id = request.match_info["job_id"]

    def index_of() -> int:
        job = standin.store.jobs.get(job_id)
        return job.modify_index if job else standin.store.table_index["jobs"]

    index = await _block(request, index_of)
    job = _job(request)
    return _json(standin.store.job_json(job), index=index)


async def job_summary(request: web.Request) -> web.Response:
    standin = _standin(request)
    index = await _block(
        request, lambda: max(standin.store.table_index["allocs"], standin.store.table_index["jobs"])
    )
    return _json(standin.store.job_summary(_job(request)), index=index)


async def job_delete(request: web.Request) -> web.Response:
    standin = _standin(request)
    result = standin.deregister_job(request.match_info["job_id"], purge=_bool(request, "purge"))
    return _json(result, index=result["EvalCreateIndex"])


async def job_plan(request: web.Request) -> web.Response:
    body = await _body(request, "JobPlanRequest")
    job = body.get("Job")
    if not isinstance(job, dict):
        raise BadRequest("Job must be specified")
    if job.get("ID") != request.match_info["job_id"]:
        raise BadRequest("Job ID does not match")
    result = _standin(request).plan_job(job, diff=bool(body.get("Diff")))
    return _json(fill("JobPlanResponse", result, own_only=True))


async def job_allocations(request: web.Request) -> web.Response:
    standin = _standin(request)
    job_id = request.match_info["job_id"]
    index = await _block(request, lambda: standin.store.table_index["allocs"])
    job = standin.store.jobs.get(job_id)
    allocs = standin.store.job_allocs(job_id)
    if job is not None and not _bool(request, "all"):
        allocs = [a for a in allocs if int(a.job.get("CreateIndex") or 0) >= job.create_index]
    return _json([standin.store.alloc_stub(a) for a in allocs], index=index)


async def job_evaluations(request: web.Request) -> web.Response:
    standin = _standin(request)
    index = await _block(request, lambda: standin.store.table_index["evals"])
    evals = standin.store.job_evals(request.match_info["job_id"])
    return _json([standin.store.eval_json(e) for e in evals], index=index)


async def job_deployments(request: web.Request) -> web.Response:
    standin = _standin(request)
    index = await _block(request, lambda: standin.store.table_index["deployment"])
    found = standin.store.job_deployments(request.match_info["job_id"])
    return _json([standin.store.deployment_json(d) for d in found], index=index)


# ---------------------------------------------------------------------------
# Allocations and evaluations


class _Indexed(Protocol):
    modify_index: int


async def _block_on_record(request: web.Request, find: Callable[[], _Indexed | None], table: str) -> int:
    """A blocking read of one object: on its ModifyIndex, or on its table's index while
    it does not exist (it may yet be created)."""
    table_index = _standin(request).store.table_index

    def index_of() -> int:
        found = find()
        return found.modify_index if found is not None else table_index[table]

    return await _block(request, index_of)


async def allocations_list(request: web.Request) -> web.Response:
    standin = _standin(request)
    index = await _block(request, lambda: standin.store.table_index["allocs"])
    prefix = request.query.get("prefix", "")
    resources = _bool(request, "resources")
    task_states = _bool(request, "task_states", True)
    out = []
    for alloc in sorted(standin.store.allocs.values(), key=lambda a: a.create_index):
        if not alloc.id.startswith(prefix):
            continue
        stub = standin.store.alloc_stub(alloc, resources=resources)
        if not task_states:
            stub["TaskStates"] = None
        out.append(stub)
    return _json(out, index=index)


async def allocation_get(request: web.Request) -> web.Response:
    standin = _standin(request)
    alloc_id = request.match_info["alloc_id"]
    index = await _block_on_record(request, lambda: standin.store.allocs.get(alloc_id), "allocs")
    alloc = standin.find_alloc(alloc_id)
    return _json(standin.store.alloc_json(alloc), index=index)


async def allocation_stop(request: web.Request) -> web.Response:
    result = _standin(request).stop_alloc(request.match_info["alloc_id"])
    # The api struct has EvalID only (the server's "Index" is in its WriteMeta).
    return _json({"EvalID": result["EvalID"]}, index=result["Index"])


async def evaluations_list(request: web.Request) -> web.Response:
    standin = _standin(request)
    index = await _block(request, lambda: standin.store.table_index["evals"])
    prefix = request.query.get("prefix", "")
    job = request.query.get("job", "")
    status = request.query.get("status", "")
    evals = [
        standin.store.eval_json(e)
        for e in sorted(standin.store.evals.values(), key=lambda e: e.create_index)
        if e.id.startswith(prefix) and (not job or e.job_id == job) and (not status or e.status == status)
    ]
    return _json(evals, index=index)


async def evaluation_get(request: web.Request) -> web.Response:
    standin = _standin(request)
    eval_id = request.match_info["eval_id"]
    index = await _block_on_record(request, lambda: standin.store.evals.get(eval_id), "evals")
    ev = standin.store.evals.get(eval_id)
    if ev is None:
        raise NotFound("eval not found")
    return _json(standin.store.eval_json(ev), index=index)


async def evaluation_allocations(request: web.Request) -> web.Response:
    standin = _standin(request)
    eval_id = request.match_info["eval_id"]
    index = await _block(request, lambda: standin.store.table_index["allocs"])
    allocs = [a for a in standin.store.allocs.values() if a.eval_id == eval_id]
    return _json([standin.store.alloc_stub(a) for a in allocs], index=index)


# ---------------------------------------------------------------------------
# Nodes


async def nodes_list(request: web.Request) -> web.Response:
    standin = _standin(request)
    index = await _block(request, lambda: standin.store.table_index["nodes"])
    prefix = request.query.get("prefix", "")
    resources = _bool(request, "resources")
    nodes = sorted(standin.store.nodes.values(), key=lambda n: n.spec.name)
    return _json(
        [standin.store.node_stub(n, resources=resources) for n in nodes if n.id.startswith(prefix)],
        index=index,
    )


async def node_get(request: web.Request) -> web.Response:
    standin = _standin(request)
    node = standin.node_by_name_or_id(request.match_info["node_id"])
    index = await _block(request, lambda: node.modify_index)
    return _json(standin.store.node_json(node), index=index)


# ---------------------------------------------------------------------------
# Agent, status, regions


async def agent_self(request: web.Request) -> web.Response:
    standin = _standin(request)
    host, _, port = standin.http_addr.partition(":")
    member = fill(
        "AgentMember",
        {
            "Name": "dev-server.global",
            "Addr": host,
            "Port": 4648,
            "Status": "alive",
            "Tags": {"region": standin.config.region, "dc": "dc1", "role": "nomad", "build": NOMAD_VERSION},
            "ProtocolMin": 1,
            "ProtocolMax": 5,
            "ProtocolCur": 2,
            "DelegateMin": 2,
            "DelegateMax": 5,
            "DelegateCur": 4,
        },
    )
    config = {
        "Region": standin.config.region,
        "Datacenter": "dc1",
        "NodeName": "dev-server",
        "Version": {"Version": NOMAD_VERSION, "VersionPrerelease": "", "VersionMetadata": ""},
        "Server": {"Enabled": True},
        "Client": {"Enabled": True},
        "ACL": {"Enabled": standin.config.acl_token is not None},
        "Ports": {"HTTP": int(port or 4646), "RPC": 4647, "Serf": 4648},
        "Consul": {"Address": standin.config.consul_addr or ""},
    }
    stats = {
        "nomad": {"leader": "true", "server": "true", "known_regions": "1", "bootstrap": "true"},
        "client": {"known_servers": "127.0.0.1:4647", "num_allocations": str(len(standin.runners))},
    }
    return _json({"config": config, "member": member, "stats": stats})


async def agent_health(request: web.Request) -> web.Response:
    return _json({"client": {"ok": True, "message": "ok"}, "server": {"ok": True, "message": "ok"}})


async def status_leader(request: web.Request) -> web.Response:
    return _json("127.0.0.1:4647")


async def status_peers(request: web.Request) -> web.Response:
    return _json(["127.0.0.1:4647"])


async def regions(request: web.Request) -> web.Response:
    return _json([_standin(request).config.region])


# ---------------------------------------------------------------------------
# Client filesystem: logs and cat


def _alloc_file(request: web.Request, relative: str) -> Path:
    standin = _standin(request)
    alloc = standin.find_alloc(request.match_info["alloc_id"])
    root = standin.alloc_root(alloc.id).resolve()
    path = (root / relative.lstrip("/")).resolve()
    if root != path and root not in path.parents:
        raise BadRequest("path escapes the allocation directory")
    return path


async def fs_logs(request: web.Request) -> web.StreamResponse:
    standin = _standin(request)
    alloc = standin.find_alloc(request.match_info["alloc_id"])
    task = request.query.get("task", "")
    if not task:
        raise BadRequest("must include task name")
    if task not in alloc.task_states:
        raise BadRequest(f"unknown task name {task!r}")
    log_type = request.query.get("type", "")
    if log_type not in ("stdout", "stderr"):
        raise BadRequest("must include type=stdout or type=stderr")
    plain = _bool(request, "plain")
    follow = _bool(request, "follow")
    origin = request.query.get("origin", "start")
    offset = int(request.query.get("offset", "0") or 0)
    relative = f"alloc/logs/{task}.{log_type}.0"
    path = _alloc_file(request, relative)
    resp = web.StreamResponse(headers={"Content-Type": "text/plain" if plain else "application/json"})
    await resp.prepare(request)
    pos = 0
    if path.exists():
        size = path.stat().st_size
        pos = max(0, size - offset) if origin == "end" else min(offset, size)
    while True:
        data = b""
        if path.exists():
            with path.open("rb") as f:
                f.seek(pos)
                data = f.read()
        if data:
            if plain:
                await resp.write(data)
            else:
                frame = {
                    "Offset": pos + len(data),
                    "Data": base64.b64encode(data).decode(),
                    "File": relative,
                    "FileEvent": "",
                }
                await resp.write(json.dumps(frame).encode())
            pos += len(data)
        current = standin.store.allocs.get(alloc.id)
        if not follow or current is None or current.terminal():
            break
        await asyncio.sleep(0.2)
    await resp.write_eof()
    return resp


async def fs_cat(request: web.Request) -> web.Response:
    path = _alloc_file(request, request.query.get("path", "/"))
    if not path.is_file():
        raise NotFound(f"file not found: {request.query.get('path')}")
    return web.Response(body=path.read_bytes(), content_type="text/plain")


# ---------------------------------------------------------------------------
# Event stream


async def event_stream(request: web.Request) -> web.StreamResponse:
    standin = _standin(request)
    broker = standin.broker
    try:
        topics = parse_topics(request.query.getall("topic", []))
        index = int(request.query.get("index", "0") or 0)
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
    namespace = request.query.get("namespace") or NAMESPACE
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    if not stream_allowed(acl_of(request), namespace, topics):
        _standin(request).tokens.deny(
            request.get(WHO, "anonymous"), "GET /v1/event/stream", f"topics {sorted(topics)}"
        )
        # Nomad 2.0.5 hijacks the connection and writes "200 OK" before the subscription's
        # ACL check (command/agent/event_endpoint.go, EventStream); the RPC's 403 then has
        # nowhere to go, so the client sees 200 and the end of the stream.
        with contextlib.suppress(ConnectionResetError):
            await resp.write_eof()
        return resp
    seq = broker.start_seq(index)
    loop = asyncio.get_running_loop()
    heartbeat = standin.config.event_heartbeat_s
    next_beat = loop.time() + heartbeat
    try:
        # Nomad's JsonStream writes a heartbeat first, to say the subscription is open.
        await resp.write(b"{}\n")
        while not broker.closed:
            try:
                batches = broker.batches_after(seq)
            except SubscriptionDropped:
                break
            for batch in batches:
                seq = batch.seq
                events = filter_events(topics, namespace, batch.events)
                if events:
                    line = json.dumps({"Index": batch.index, "Events": events})
                    await resp.write(line.encode() + b"\n")
            now = loop.time()
            if now >= next_beat:
                await resp.write(b"{}\n")
                next_beat = now + heartbeat
            await broker.wait(max(0.0, next_beat - loop.time()))
    except ConnectionResetError:
        return resp  # the subscriber left: nothing to report, as Nomad logs nothing for it
    with contextlib.suppress(ConnectionResetError):
        await resp.write_eof()
    return resp


# ---------------------------------------------------------------------------
# Variables (command/agent/variable_endpoint.go) and workload ACL policies


def _var_namespace(request: web.Request) -> str:
    return request.query.get("namespace") or NAMESPACE


def _cas(request: web.Request) -> int | None:
    raw = request.query.get("cas")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError as exc:
        raise BadRequest(f"Invalid cas: {exc}") from exc


def _require_variable(request: web.Request, op: str) -> None:
    """``AllowVariableOperation`` for the request's token, on its path and namespace."""
    path = request.match_info["path"].strip("/")
    if not acl_of(request).allow_variable(_var_namespace(request), path, op, None):
        _denied(request, f'variables path "{path}" {op}')


async def variable_get(request: web.Request) -> web.Response:
    _require_variable(request, "read")
    standin = _standin(request)
    found = standin.variables.get(_var_namespace(request), request.match_info["path"])
    if found is None:
        raise NotFound("variable not found")
    return _json(found.json(), index=found.modify_index)


async def variable_put(request: web.Request) -> web.Response:
    _require_variable(request, "write")
    standin = _standin(request)
    body = await _body(request, "Variable")
    path = request.match_info["path"]
    if body.get("Path") and str(body["Path"]).strip("/") != path.strip("/"):
        raise BadRequest("variable path in the body does not match the URL")
    raw_items = body.get("Items")
    items = {str(k): str(v) for k, v in raw_items.items()} if isinstance(raw_items, dict) else {}
    namespace = str(body.get("Namespace") or _var_namespace(request))
    try:
        variable = standin.variables.put(namespace, path, items, now_ns(), cas=_cas(request))
    except CasConflict as conflict:
        return _json(conflict.current.json() if conflict.current else None, status=409)
    return _json(variable.json(), index=variable.modify_index)


async def variable_delete(request: web.Request) -> web.Response:
    _require_variable(request, "destroy")
    standin = _standin(request)
    try:
        standin.variables.delete(_var_namespace(request), request.match_info["path"], cas=_cas(request))
    except CasConflict as conflict:
        return _json(conflict.current.json() if conflict.current else None, status=409)
    return web.Response(status=200, headers={"X-Nomad-Index": str(standin.variables.index)})


async def acl_policy_put(request: web.Request) -> web.Response:
    standin = _standin(request)
    body = await _body(request, "ACLPolicy")
    name = request.match_info["name"]
    if body.get("Name") and body["Name"] != name:
        raise BadRequest("ACL policy name does not match request path")
    if not body.get("JobACL"):
        # A policy for tokens (acl_api.py); the request body is read again there.
        return await acl_api.apply_policy(request, standin)
    standin.variables.put_policy(parse_policy(name, body))
    return web.Response(status=200)


async def acl_token_create(request: web.Request) -> web.Response:
    return await acl_api.create_token(request, _standin(request))


async def acl_policy_get(request: web.Request) -> web.Response:
    standin, name = _standin(request), request.match_info["name"]
    policy = standin.variables.policies.get(name)
    if policy is None and name in standin.token_policies.policies:
        description, rules, _ = standin.token_policies.policies[name]
        return _json({"Name": name, "Description": description, "Rules": rules, "JobACL": None})
    if policy is None:
        raise NotFound("ACL policy not found")
    return _json(policy.json())


async def acl_policy_delete(request: web.Request) -> web.Response:
    _standin(request).variables.policies.pop(request.match_info["name"], None)
    return web.Response(status=200)


# ---------------------------------------------------------------------------
# Dev-only faults (real Nomad has no /_dev/ paths)


async def dev_fail_node(request: web.Request) -> web.Response:
    node = await _standin(request).fail_node(request.match_info["node_id"])
    return _json({"NodeID": node.id, "Name": node.spec.name, "Failed": True})


async def dev_restore_node(request: web.Request) -> web.Response:
    node = await _standin(request).restore_node(request.match_info["node_id"])
    return _json({"NodeID": node.id, "Name": node.spec.name, "Failed": False})


async def dev_crash_task(request: web.Request) -> web.Response:
    pid = await _standin(request).crash_task(request.match_info["alloc_id"], request.query.get("task", ""))
    return _json({"Killed": pid})


async def dev_pids(request: web.Request) -> web.Response:
    return _json(_standin(request).procs.pids)


MAX_REQUEST_BYTES = 64 * 1024 * 1024


def create_app(standin: NomadStandIn) -> web.Application:
    """The Nomad HTTP API app over ``standin`` (which the caller starts and stops)."""
    app = web.Application(
        middlewares=[refuse_browsers, errors_middleware, acl_middleware(standin)],
        # Nomad's agent decodes request bodies with no size limit (command/agent/http.go, decodeBody);
        # aiohttp's 1 MiB default would refuse jobs Nomad takes.
        client_max_size=MAX_REQUEST_BYTES,
    )
    app[STANDIN_KEY] = standin
    r = app.router
    r.add_post("/v1/jobs/parse", jobs_parse)
    r.add_get("/v1/jobs", jobs_list)
    r.add_post("/v1/jobs", jobs_register)
    r.add_put("/v1/jobs", jobs_register)
    r.add_get("/v1/job/{job_id}", job_get)
    r.add_post("/v1/job/{job_id}", jobs_register)
    r.add_put("/v1/job/{job_id}", jobs_register)
    r.add_delete("/v1/job/{job_id}", job_delete)
    r.add_post("/v1/job/{job_id}/plan", job_plan)
    r.add_put("/v1/job/{job_id}/plan", job_plan)
    r.add_get("/v1/job/{job_id}/summary", job_summary)
    r.add_get("/v1/job/{job_id}/allocations", job_allocations)
    r.add_get("/v1/job/{job_id}/evaluations", job_evaluations)
    r.add_get("/v1/job/{job_id}/deployments", job_deployments)
    r.add_get("/v1/allocations", allocations_list)
    r.add_get("/v1/allocation/{alloc_id}", allocation_get)
    r.add_post("/v1/allocation/{alloc_id}/stop", allocation_stop)
    r.add_put("/v1/allocation/{alloc_id}/stop", allocation_stop)
    r.add_get("/v1/evaluations", evaluations_list)
    r.add_get("/v1/evaluation/{eval_id}", evaluation_get)
    r.add_get("/v1/evaluation/{eval_id}/allocations", evaluation_allocations)
    r.add_get("/v1/nodes", nodes_list)
    r.add_get("/v1/node/{node_id}", node_get)
    r.add_get("/v1/agent/self", agent_self)
    r.add_get("/v1/agent/health", agent_health)
    r.add_get("/v1/status/leader", status_leader)
    r.add_get("/v1/status/peers", status_peers)
    r.add_get("/v1/regions", regions)
    r.add_get("/v1/client/fs/logs/{alloc_id}", fs_logs)
    r.add_get("/v1/client/fs/cat/{alloc_id}", fs_cat)
    r.add_get("/v1/event/stream", event_stream)
    r.add_get("/v1/var/{path:.+}", variable_get)
    r.add_put("/v1/var/{path:.+}", variable_put)
    r.add_post("/v1/var/{path:.+}", variable_put)
    r.add_delete("/v1/var/{path:.+}", variable_delete)
    r.add_put("/v1/acl/policy/{name}", acl_policy_put)
    r.add_post("/v1/acl/policy/{name}", acl_policy_put)
    r.add_get("/v1/acl/policy/{name}", acl_policy_get)
    r.add_put("/v1/acl/token", acl_token_create)
    r.add_post("/v1/acl/token", acl_token_create)
    r.add_delete("/v1/acl/policy/{name}", acl_policy_delete)
    r.add_post("/_dev/node/{node_id}/fail", dev_fail_node)
    r.add_post("/_dev/node/{node_id}/restore", dev_restore_node)
    r.add_post("/_dev/alloc/{alloc_id}/crash", dev_crash_task)
    r.add_get("/_dev/pids", dev_pids)
    return app


class NomadServer:
    """A ``NomadStandIn`` served on 127.0.0.1: ``async with NomadServer(config) as s: s.address``."""

    def __init__(self, standin: NomadStandIn, host: str = "127.0.0.1", port: int = 0) -> None:
        self.standin = standin
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    @property
    def address(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        app = create_app(self.standin)
        self._runner = web.AppRunner(
            app,
            handle_signals=False,
            shutdown_timeout=1.0,
            # Malformed requests are logged without their bytes (the ACL token is among them).
            logger=listener_log("llmgw.devcluster.nomad.http"),
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = bound_port(self._runner, self.port)
        self.standin.http_addr = f"{self.host}:{self.port}"
        await self.standin.start()

    async def stop(self) -> None:
        # The stand-in stops first so that streaming responses end and no process outlives it.
        await self.standin.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> NomadServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
