"""The KV store through py-consul and plain HTTP: values, flags, CAS, listings, deletes."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

import consul.aio
from aiohttp import ClientSession

from llmgw.devcluster.consul import ConsulStandIn

if TYPE_CHECKING:
    from conftest import KeyExact


async def test_put_get_and_indexes(
    server_client: consul.aio.Consul, standin: ConsulStandIn, http: ClientSession, key_exact: KeyExact
) -> None:
    assert await server_client.kv.put("llmgw/leader", "ctl-1", flags=42) is True
    index, entry = await server_client.kv.get("llmgw/leader")
    assert entry is not None
    assert entry["Value"] == b"ctl-1"
    assert (entry["Flags"], entry["LockIndex"], entry["CreateIndex"]) == (42, 0, entry["ModifyIndex"])
    assert int(index) == entry["ModifyIndex"]
    assert "Session" not in entry

    async with http.get(standin.url + "/v1/kv/llmgw/leader") as resp:
        raw = await resp.json()
    key_exact(raw, "KVPairs")
    assert raw[0]["Value"] == base64.b64encode(b"ctl-1").decode()
    async with http.get(standin.url + "/v1/kv/llmgw/leader?raw") as resp:
        assert await resp.read() == b"ctl-1"

    assert await server_client.kv.put("llmgw/leader", "ctl-2") is True
    _, entry2 = await server_client.kv.get("llmgw/leader")
    assert entry2 is not None
    assert entry2["CreateIndex"] == entry["CreateIndex"]
    assert entry2["ModifyIndex"] > entry["ModifyIndex"]
    assert entry2["Flags"] == 0  # a put without ?flags= writes 0, as Consul does

    async with http.get(standin.url + "/v1/kv/nope") as resp:
        assert resp.status == 404
        assert int(resp.headers["X-Consul-Index"]) >= 1


async def test_empty_value_reads_null(
    server_client: consul.aio.Consul, standin: ConsulStandIn, http: ClientSession
) -> None:
    assert await server_client.kv.put("dir/", None) is True
    async with http.get(standin.url + "/v1/kv/dir/") as resp:
        assert (await resp.json())[0]["Value"] is None


async def test_check_and_set(server_client: consul.aio.Consul) -> None:
    assert await server_client.kv.put("k", "a", cas=0) is True
    assert await server_client.kv.put("k", "b", cas=0) is False  # cas=0: only if absent
    _, entry = await server_client.kv.get("k")
    assert entry is not None
    assert await server_client.kv.put("k", "b", cas=entry["ModifyIndex"] + 1) is False
    assert await server_client.kv.put("k", "b", cas=entry["ModifyIndex"]) is True
    assert await server_client.kv.put("k", "c", cas=entry["ModifyIndex"]) is False  # index moved on
    _, entry = await server_client.kv.get("k")
    assert entry is not None and entry["Value"] == b"b"
    assert await server_client.kv.delete("k", cas=entry["ModifyIndex"] - 1) is False
    assert await server_client.kv.delete("k", cas=entry["ModifyIndex"]) is True
    assert (await server_client.kv.get("k"))[1] is None


async def test_recurse_keys_and_delete_tree(server_client: consul.aio.Consul, key_exact: KeyExact) -> None:
    for key in ("models/a/spec", "models/a/hash", "models/b/spec", "modelsx", "other"):
        assert await server_client.kv.put(key, key)
    index, entries = await server_client.kv.get("models/", recurse=True)
    assert [e["Key"] for e in entries] == ["models/a/hash", "models/a/spec", "models/b/spec"]
    assert int(index) == max(e["ModifyIndex"] for e in entries)
    _, keys = await server_client.kv.get("models/", keys=True)
    assert keys == ["models/a/hash", "models/a/spec", "models/b/spec"]
    _, folders = await server_client.kv.get("models/", keys=True, separator="/")
    assert folders == ["models/a/", "models/b/"]
    assert (await server_client.kv.get("nothing/", recurse=True))[1] is None  # 404

    before, _ = await server_client.kv.get("models/", recurse=True)
    assert await server_client.kv.delete("models/a/", recurse=True) is True
    after, entries = await server_client.kv.get("models/", recurse=True)
    assert [e["Key"] for e in entries] == ["models/b/spec"]
    # The delete's tombstone keeps the prefix's index from going backwards.
    assert int(after) > int(before)
    _, rest = await server_client.kv.get("", recurse=True)
    assert [e["Key"] for e in rest] == ["models/b/spec", "modelsx", "other"]


async def test_kv_errors(standin: ConsulStandIn, http: ClientSession) -> None:
    async with http.put(standin.url + "/v1/kv/x?flags=minus") as resp:
        assert (resp.status, await resp.text()) == (400, "Invalid flags")
    async with http.put(standin.url + "/v1/kv/x?cas=no") as resp:
        assert resp.status == 400
    big = b"x" * (standin.settings.kv_max_value_size + 1)
    async with http.put(standin.url + "/v1/kv/x", data=big) as resp:
        assert resp.status == 413
    async with http.get(standin.url + "/v1/kv/x?dc=elsewhere") as resp:
        assert (resp.status, await resp.text()) == (500, "No path to datacenter")


async def test_a_value_over_kv_max_value_size_is_refused_with_consuls_answer(
    standin: ConsulStandIn, http: ClientSession
) -> None:
    """agent/kvs_endpoint.go (KVSPut): 413 and this text, the limit in bytes."""
    limit = standin.settings.kv_max_value_size
    async with http.put(standin.url + "/v1/kv/x", data=b"x" * (limit + 1)) as resp:
        assert resp.status == 413
        assert await resp.text() == (
            f"Request body({limit + 1} bytes) too large, max size: {limit} bytes. "
            "See https://developer.hashicorp.com/docs/agent/config/config-files#kv_max_value_size."
        )
    async with http.put(standin.url + "/v1/kv/x", data=b"x" * limit) as resp:
        assert resp.status == 200
