"""The apply protocol against a recorded fake of the catalog store: which compare-and-set
the admin API asks for, when it retries, and when it never writes at all."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

from llmgw.adapters.consul import CatalogConflict
from llmgw.admin import AdminDeps, AdminListener, AdminSettings, start_admin
from llmgw.core.catalog import SecurityPolicy
from llmgw.core.records import ApiKeyRecord, CatalogVersion
from llmgw.render import Renderer, RenderSettings

if TYPE_CHECKING:
    from conftest import Client, Texts


@dataclass
class RecordedCatalogs:
    """A catalog store in memory that records every apply; ``sneak_in`` is written by
    "another pipeline" just before the next apply compares."""

    versions: list[CatalogVersion] = field(default_factory=list)
    applies: list[tuple[int, int | None, str]] = field(default_factory=list)  # (version, expected, by)
    sneak_in: list[str] = field(default_factory=list)

    async def current(self) -> CatalogVersion | None:
        return self.versions[-1] if self.versions else None

    async def apply(self, new: CatalogVersion, expected_version: int | None) -> CatalogVersion:
        self.applies.append((new.version, expected_version, new.applied_by))
        if self.sneak_in:
            text = self.sneak_in.pop(0)
            self.versions.append(CatalogVersion.of(len(self.versions) + 1, text, "someone else", 1.0))
        actual = self.versions[-1].version if self.versions else None
        if actual != expected_version:
            raise CatalogConflict(expected_version, actual)
        self.versions.append(new)
        return new

    async def history(self, limit: int = 20) -> Sequence[CatalogVersion]:
        return list(reversed(self.versions))[:limit]


class NoKeys:
    async def create(self, name: str, **limits: object) -> object:
        raise AssertionError("not used")

    async def list(self) -> Mapping[str, ApiKeyRecord]:
        return {}

    async def revoke(self, key_id: str) -> ApiKeyRecord:
        raise AssertionError("not used")


class NoStatus:
    async def read(self) -> None:
        return None


@pytest.fixture
def recorded() -> RecordedCatalogs:
    return RecordedCatalogs()


@pytest.fixture
async def fake_admin(
    recorded: RecordedCatalogs, shipped_policy: SecurityPolicy, texts: Texts
) -> AsyncIterator[AdminListener]:
    deps = AdminDeps(
        catalogs=recorded,
        keys=NoKeys(),
        status=NoStatus(),
        policy=shipped_policy,
        renderer=Renderer(RenderSettings(), shipped_policy),
        wall_clock=lambda: 1_700_000_000.0,
    )
    listener = await start_admin(AdminSettings(port=0, token=texts.token), deps)
    yield listener
    await listener.stop()


async def test_a_lost_race_without_if_match_is_tried_again_on_the_new_version(
    fake_admin: AdminListener,
    client_for: Callable[[AdminListener], Client],
    recorded: RecordedCatalogs,
    texts: Texts,
) -> None:
    client = client_for(fake_admin)
    assert (await client.call("PUT", "/admin/v1/catalog", {"catalog": texts.good})).status == 200
    recorded.sneak_in.append(texts.good.replace("the chat model", "theirs"))
    reply = await client.call(
        "PUT", "/admin/v1/catalog", {"catalog": texts.next}, headers={"X-Llmgw-Actor": "ci"}
    )
    assert reply.status == 200 and reply.body["version"] == 3
    # The diff returned is against what it replaced: their version 2.
    assert reply.body["base"]["version"] == 2
    assert recorded.applies == [
        (1, None, "unnamed via admin-token"),
        (2, 1, "ci via admin-token"),  # lost to "someone else"
        (3, 2, "ci via admin-token"),
    ]


async def test_a_lost_race_with_if_match_is_412_and_not_retried(
    fake_admin: AdminListener,
    client_for: Callable[[AdminListener], Client],
    recorded: RecordedCatalogs,
    texts: Texts,
) -> None:
    client = client_for(fake_admin)
    first = await client.call("PUT", "/admin/v1/catalog", {"catalog": texts.good})
    recorded.sneak_in.append(texts.good.replace("the chat model", "theirs"))
    reply = await client.call(
        "PUT", "/admin/v1/catalog", {"catalog": texts.next}, headers={"If-Match": first.headers["ETag"]}
    )
    assert reply.status == 412
    assert [a[:2] for a in recorded.applies] == [(1, None), (2, 1)]
    assert recorded.versions[-1].applied_by == "someone else"


async def test_invalid_or_stale_never_reaches_the_store(
    fake_admin: AdminListener,
    client_for: Callable[[AdminListener], Client],
    recorded: RecordedCatalogs,
    texts: Texts,
) -> None:
    client = client_for(fake_admin)
    assert (await client.call("PUT", "/admin/v1/catalog", {"catalog": texts.bad})).status == 422
    stale = await client.call(
        "PUT", "/admin/v1/catalog", {"catalog": texts.good}, headers={"If-Match": '"00"'}
    )
    assert stale.status == 412
    assert recorded.applies == []
