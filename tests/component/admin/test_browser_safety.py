"""What a hostile web page could send to the admin listener is refused, and nothing changes.

Each request below is one a page in an operator's browser can make (or, for the
rebound Host, a DNS rebinding page): a cross-site Origin, a Sec-Fetch-Site mark, a
``text/plain`` or form body (no CORS preflight needed), a DELETE without a content
type. They are sent to a listener WITHOUT a token (the loopback dev setup, where the
browser checks are the only defence) and to one with a token (carrying it, as if the
page had guessed it). After each, the catalog and the keys are read back unchanged;
then the same requests made the way ``llmgw ctl`` and curl make them succeed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from llmgw.admin import AdminListener
from llmgw.core.records import catalog_sha256

if TYPE_CHECKING:
    from conftest import Client, StartAdmin, Stores, Texts

CHANGED = "models: {}\n"


@dataclass(frozen=True)
class Hostile:
    name: str
    method: str
    path: str
    headers: dict[str, str]
    body: Any = None  # JSON-encoded
    raw: bytes | str | None = None  # sent as is (with its own content type)
    content_type: str | None = "application/json"
    status: int = 403


def hostile_requests(key_id: str) -> list[Hostile]:
    catalog = {"catalog": CHANGED}
    return [
        Hostile(
            "cross-site Origin", "PUT", "/admin/v1/catalog", {"Origin": "https://attacker.example"}, catalog
        ),
        Hostile("Origin null", "PUT", "/admin/v1/catalog", {"Origin": "null"}, catalog),
        Hostile(
            "another local port", "POST", "/admin/v1/keys", {"Origin": "http://127.0.0.1:9"}, {"name": "x"}
        ),
        Hostile(
            "Sec-Fetch-Site cross-site",
            "POST",
            "/admin/v1/keys",
            {"Sec-Fetch-Site": "cross-site"},
            {"name": "x"},
        ),
        Hostile(
            "Sec-Fetch-Site same-site", "DELETE", f"/admin/v1/keys/{key_id}", {"Sec-Fetch-Site": "same-site"}
        ),
        Hostile(
            "text/plain JSON",
            "PUT",
            "/admin/v1/catalog",
            {},
            raw='{"catalog": "models: {}\\n"}',
            content_type="text/plain",
            status=415,
        ),
        Hostile(
            "form post",
            "POST",
            "/admin/v1/keys",
            {},
            raw="name=attacker",
            content_type="application/x-www-form-urlencoded",
            status=415,
        ),
        Hostile(
            "multipart form",
            "POST",
            "/admin/v1/models/chat/drain",
            {},
            raw=b'--b\r\nContent-Disposition: form-data; name="x"\r\n\r\n1\r\n--b--\r\n',
            content_type="multipart/form-data; boundary=b",
            status=415,
        ),
        Hostile(
            "DELETE without a content type",
            "DELETE",
            f"/admin/v1/keys/{key_id}",
            {},
            content_type=None,
            status=415,
        ),
        Hostile(
            "POST without a content type",
            "POST",
            "/admin/v1/models/chat/drain",
            {},
            content_type=None,
            status=415,
        ),
        Hostile(
            "JSON in another charset",
            "PUT",
            "/admin/v1/catalog",
            {},
            catalog,
            content_type="application/json; charset=utf-16",
            status=415,
        ),
        Hostile(
            "rebound Host", "PUT", "/admin/v1/catalog", {"Host": "attacker.example"}, catalog, status=421
        ),
        Hostile(
            "rebound Host, a read", "GET", "/admin/v1/keys", {"Host": "attacker.example:8081"}, status=421
        ),
        Hostile("cross-site read", "GET", "/admin/v1/catalog", {"Sec-Fetch-Site": "cross-site"}),
        Hostile(
            "cross-site diff", "POST", "/admin/v1/catalog/diff", {"Origin": "http://localhost:3000"}, catalog
        ),
    ]


@pytest.fixture(params=["no token", "token"])
async def guarded(
    request: pytest.FixtureRequest,
    start: StartAdmin,
    stores: Stores,
    models: Any,
    client_for: Callable[[AdminListener], Client],
) -> Client:
    if request.param == "no token":
        client = client_for(await start(stores, models, token=None))
        client.token = None
    else:
        client = client_for(await start(stores, models))
    return client


async def test_every_hostile_request_is_refused_and_nothing_changes(
    guarded: Client, stores: Stores, models: Any, texts: Texts
) -> None:
    applied = await guarded.call("PUT", "/admin/v1/catalog", {"catalog": texts.good})
    assert applied.status == 200
    created = await guarded.call("POST", "/admin/v1/keys", {"name": "team-a"})
    key_id = created.body["key"]["id"]
    before_keys = await stores.keys.list()

    for hostile in hostile_requests(key_id):
        reply = await guarded.call(
            hostile.method,
            hostile.path,
            hostile.body,
            headers=hostile.headers,
            raw=hostile.raw,
            content_type=hostile.content_type,
        )
        assert reply.status == hostile.status, (hostile.name, reply.status, reply.body)
        assert set(reply.body["error"]) == {"message", "type", "code"}, hostile.name
        assert "Access-Control-Allow-Origin" not in reply.headers
        current = await stores.catalogs.current()
        assert current is not None and current.sha256 == catalog_sha256(texts.good), hostile.name
        assert await stores.keys.list() == before_keys, hostile.name
        assert models.calls == [], hostile.name
    assert [v.version for v in await stores.catalogs.history()] == [1]


async def test_the_same_requests_made_like_curl_succeed(guarded: Client, stores: Stores, models: Any) -> None:
    created = await guarded.call("POST", "/admin/v1/keys", {"name": "team-a"})
    assert created.status == 201
    key_id = created.body["key"]["id"]
    own_origin = guarded.url  # a same-origin request (as the listener's own page would send) is fine
    assert (
        await guarded.call("PUT", "/admin/v1/catalog", {"catalog": CHANGED}, headers={"Origin": own_origin})
    ).status == 200
    assert (
        await guarded.call("GET", "/admin/v1/catalog", headers={"Sec-Fetch-Site": "same-origin"})
    ).status == 200
    assert (await guarded.call("POST", "/admin/v1/catalog/diff", {"catalog": CHANGED})).status == 200
    assert (await guarded.call("POST", "/admin/v1/models/chat/drain")).status == 202
    assert (await guarded.call("DELETE", f"/admin/v1/keys/{key_id}")).status == 200
    port = guarded.url.rsplit(":", 1)[1]
    assert (await guarded.call("GET", "/admin/v1/keys", headers={"Host": f"localhost:{port}"})).status == 200
    assert (await stores.keys.list())[key_id].revoked
    assert models.calls == [
        ("drain", "chat", "unnamed via admin-token" if guarded.token else "unnamed (no token)")
    ]


async def test_options_preflights_are_never_approved(guarded: Client) -> None:
    reply = await guarded.call(
        "OPTIONS",
        "/admin/v1/catalog",
        headers={
            "Origin": "https://attacker.example",
            "Access-Control-Request-Method": "PUT",
            "Access-Control-Request-Headers": "content-type",
        },
        content_type=None,
    )
    assert reply.status == 403
    assert not any(h.lower().startswith("access-control-") for h in reply.headers)
