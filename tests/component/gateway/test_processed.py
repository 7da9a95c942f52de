"""The endpoint book's ``processed`` hook: a test (or anything else) waits until the
router has applied a watched value, instead of sleeping and hoping it has."""

from __future__ import annotations

from llmgw.core.records import CatalogVersion
from llmgw.gateway.context import CONTEXT
from tests.support.waiting import awaited

from .conftest import CATALOG, Cluster, StartRouter, endpoint_for


async def test_waiting_for_a_published_snapshot_returns_once_the_book_routes_by_it(
    cluster: Cluster, start_router: StartRouter
) -> None:
    router = await start_router()
    book = router.app[CONTEXT].book
    engine = cluster.add_endpoint(endpoint_for("sim-chat", 1))  # publishes a new snapshot
    snapshot = cluster.endpoints.latest
    assert snapshot is not None and book.snapshot_index != snapshot.index  # not applied yet
    await awaited(book.wait_processed(cluster.endpoints, cluster.endpoints.generation), "the new snapshot")
    assert book.snapshot_index == snapshot.index
    assert [e.service_id for e in book.endpoints()] == [engine.endpoint.service_id]


async def test_a_value_the_router_refuses_still_counts_as_processed(
    cluster: Cluster, start_router: StartRouter
) -> None:
    router = await start_router()
    context = router.app[CONTEXT]
    before = context.catalogs.catalog
    cluster.catalog.publish(CatalogVersion.of(2, "models: [not, a, mapping]", "test", 1.0))
    # Refused and logged, the previous catalog kept: a waiter is still let go.
    await awaited(context.book.wait_processed(cluster.catalog, cluster.catalog.generation), "the bad catalog")
    assert context.catalogs.catalog is before
    cluster.set_catalog(CATALOG, version=3)
    await cluster.seen_by(router)
    assert context.catalogs.catalog is not before
