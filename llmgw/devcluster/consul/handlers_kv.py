"""The KV endpoints (``/v1/kv/:key``): get (single, ``?recurse``, ``?keys``, ``?raw``),
put (``?cas``, ``?flags``, ``?acquire``, ``?release``) and delete (``?recurse``, ``?cas``).

Owns reading KV requests as Consul does (a missing key is 404 with the index
still in the headers, so a client can block until it appears; a put answers
``true`` or ``false``) and calling the store.

Must not: hold rules (the store) or shapes (rendering).
"""

from __future__ import annotations

from aiohttp import web

from llmgw.devcluster.acl.consul_rules import Access
from llmgw.devcluster.consul import rendering
from llmgw.devcluster.consul.decoding import parse_uint
from llmgw.devcluster.consul.http_common import (
    blocking_read,
    json_answer,
    meta_headers,
    now,
    require,
    state_of,
    text_answer,
    visible,
)
from llmgw.devcluster.consul.model import ConsulError


def _key(request: web.Request) -> str:
    return request.match_info.get("key", "")


async def kv_get(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    key = _key(request)
    q = request.query
    if "keys" in q:
        separator = q.get("separator", "")
        index, keys = await blocking_read(request, lambda: state.kv_keys(key, separator))
        # KVS.ListKeys filters each key by key read (without enable_key_list_policy,
        # Consul's default, no list rule is asked for the prefix itself).
        keys = visible(request, keys, lambda acl, k: acl.allows("key", k, Access.READ))
        headers = meta_headers(request, index)
        if not keys and key:
            return web.Response(status=404, headers=headers)
        return json_answer(keys, headers=headers)
    if "recurse" in q:
        index, entries = await blocking_read(request, lambda: state.kv_list(key))
        entries = visible(request, entries, lambda acl, e: acl.allows("key", e.key, Access.READ))
        headers = meta_headers(request, index)
        if not entries:
            return web.Response(status=404, headers=headers)
        return json_answer([rendering.kv_pair(e) for e in entries], headers=headers)
    require(request, "key", key, Access.READ)
    index, entry = await blocking_read(request, lambda: state.kv_get(key))
    headers = meta_headers(request, index)
    if entry is None:
        return web.Response(status=404, headers=headers)
    if "raw" in q:
        return web.Response(body=entry.value or b"", content_type="text/plain", headers=headers)
    return json_answer([rendering.kv_pair(entry)], headers=headers)


async def kv_put(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    key = _key(request)
    require(request, "key", key, Access.WRITE)
    if not key:
        raise ConsulError(400, "Missing key name")
    q = request.query
    if "acquire" in q and "release" in q:
        raise ConsulError(400, "Conflicting flags: acquire=&release=")
    body = await request.read()
    limit = state.settings.kv_max_value_size
    if len(body) > limit:
        return text_answer(
            413,
            f"Request body({len(body)} bytes) too large, max size: {limit} bytes. "
            "See https://developer.hashicorp.com/docs/agent/config/config-files#kv_max_value_size.",
        )
    flags = parse_uint(q["flags"], "flags") if "flags" in q else 0
    cas = parse_uint(q["cas"], "cas value") if "cas" in q else None
    ok = state.kv_put(
        key,
        body,
        flags,
        now(request),
        cas=cas,
        acquire=q.get("acquire") if "acquire" in q else None,
        release=q.get("release") if "release" in q else None,
    )
    return json_answer(ok)


async def kv_delete(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    key = _key(request)
    # KeyWritePrefix for a recursive delete: the prefix's own rule (no deny below it is modelled).
    require(request, "key", key, Access.WRITE)
    q = request.query
    recurse = "recurse" in q
    if not key and not recurse:
        raise ConsulError(400, "Missing key name")
    cas = parse_uint(q["cas"], "cas value") if "cas" in q else None
    return json_answer(state.kv_delete(key, recurse=recurse, cas=cas))
