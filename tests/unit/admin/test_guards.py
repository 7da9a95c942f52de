"""The admin API's guards as tables: Host, cross-site marks, the token, ETag preconditions."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from llmgw.admin.errors import AdminError
from llmgw.admin.guards import (
    ACTOR_HEADER,
    actor_of,
    cross_site_refusal,
    host_refusal,
    split_host,
    token_matches,
)
from llmgw.admin.handlers import check_preconditions, parse_etags
from llmgw.admin.settings import AdminSettings
from llmgw.core.records import CatalogVersion

OWN = "http://127.0.0.1:8081"


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        ("127.0.0.1:8081", True),
        ("127.0.0.1", True),
        ("[::1]:8081", True),
        ("10.1.2.3:8081", True),  # a listener beyond loopback is reached by its address
        ("localhost:8081", True),
        ("LOCALHOST", True),
        ("admin.internal:8081", False),
        ("attacker.example", False),
        ("localhost.attacker.example", False),
        ("127.0.0.1.nip.io:8081", False),
        ("localhost.", False),
        ("2130706433", False),  # browsers send 127.0.0.1 for this; only a tool would send it
        ("127.0.0.1:80x", False),
        ("[::1", False),
        ("", False),
        (None, False),
    ],
)
def test_host(header: str | None, allowed: bool) -> None:
    assert (host_refusal(header, ()) is None) is allowed


def test_a_configured_name_is_accepted() -> None:
    assert host_refusal("admin.internal:8081", ("admin.internal",)) is None
    assert host_refusal("other.internal:8081", ("admin.internal",)) is not None


def test_split_host() -> None:
    assert split_host("[::1]:8081") == ("::1", "8081")
    assert split_host("example:1") == ("example", "1")
    assert split_host("example") == ("example", None)
    assert split_host("a:b:c") is None


@pytest.mark.parametrize(
    ("origin", "fetch_site", "refused"),
    [
        (None, None, False),  # curl, llmgw ctl
        (None, "none", False),  # typed into the address bar
        (None, "same-origin", False),
        (OWN, None, False),
        ("http://127.0.0.1:8081", "same-origin", False),
        ("http://127.0.0.1:9999", None, True),  # another local service's page
        ("http://localhost:8081", None, True),  # same machine, another origin
        ("https://127.0.0.1:8081", None, True),
        ("https://attacker.example", None, True),
        ("null", None, True),  # sandboxed frames, file:// pages
        (None, "cross-site", True),
        (None, "same-site", True),  # another port of the same host is same-site
        (None, "Cross-Site", True),
        (None, "something-new", True),
    ],
)
def test_cross_site(origin: str | None, fetch_site: str | None, refused: bool) -> None:
    assert (cross_site_refusal(origin, fetch_site, OWN) is not None) is refused


def test_default_ports_compare_equal() -> None:
    assert cross_site_refusal("http://127.0.0.1", None, "http://127.0.0.1") is None
    assert cross_site_refusal("http://127.0.0.1:80", None, "http://127.0.0.1") is None


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("Bearer s3cret-token-of-enough-length-000000", True),
        ("bearer s3cret-token-of-enough-length-000000", True),
        ("Bearer  s3cret-token-of-enough-length-000000 ", True),
        ("Bearer s3cret-token-of-enough-length-00000", False),
        ("Basic s3cret-token-of-enough-length-000000", False),
        ("s3cret-token-of-enough-length-000000", False),
        ("Bearer", False),
        ("", False),
        (None, False),
    ],
)
def test_token(header: str | None, ok: bool) -> None:
    assert token_matches(header, "s3cret-token-of-enough-length-000000") is ok


def test_etags_parse() -> None:
    assert parse_etags(None, "If-Match") is None
    assert parse_etags("*", "If-Match") == ["*"]
    assert parse_etags('"abc"', "If-Match") == ["abc"]
    assert parse_etags('"abc", W/"def" ,"ghi"', "If-Match") == ["abc", "W/def", "ghi"]
    for bad in ("abc", '"abc', '"a" "b"', ""):
        with pytest.raises(AdminError) as caught:
            parse_etags(bad, "If-Match")
        assert caught.value.status == 400


CURRENT = CatalogVersion.of(3, "models: {}\n", "ci via admin-token", 1_700_000_000.0)


@pytest.mark.parametrize(
    ("current", "if_match", "if_none_match", "stale"),
    [
        (CURRENT, None, None, False),
        (CURRENT, [CURRENT.sha256], None, False),
        (CURRENT, ["*"], None, False),
        (CURRENT, ["0" * 64], None, True),
        (CURRENT, ["W/" + CURRENT.sha256], None, True),  # a weak tag never matches
        (CURRENT, ["0" * 64, CURRENT.sha256], None, False),
        (None, [CURRENT.sha256], None, True),
        (None, ["*"], None, True),
        (None, None, ["*"], False),  # "only if there is no catalog yet"
        (CURRENT, None, ["*"], True),
        (CURRENT, None, [CURRENT.sha256], True),
        (CURRENT, None, ["0" * 64], False),
    ],
)
def test_preconditions(
    current: CatalogVersion | None, if_match: list[str] | None, if_none_match: list[str] | None, stale: bool
) -> None:
    if not stale:
        check_preconditions(current, if_match, if_none_match)
        return
    with pytest.raises(AdminError) as caught:
        check_preconditions(current, if_match, if_none_match)
    assert caught.value.status == 412
    assert caught.value.code == "stale_catalog"
    if current is not None:
        assert caught.value.headers["ETag"] == f'"{current.sha256}"'
        assert "version 3" in caught.value.message


@pytest.mark.parametrize(
    ("claimed", "token", "actor"),
    [
        ("ctl", None, "ctl (no token)"),
        (None, None, "unnamed (no token)"),
        ("ci", "s3cret-admin-token-0123456789abcdef", "ci via admin-token"),
        (None, "s3cret-admin-token-0123456789abcdef", "unnamed via admin-token"),
    ],
)
def test_the_actor_reads_as_words(claimed: str | None, token: str | None, actor: str) -> None:
    headers = {} if claimed is None else {ACTOR_HEADER: claimed}
    request = make_mocked_request("PUT", "/admin/v1/catalog", headers=headers)
    assert actor_of(request, AdminSettings(token=token)) == actor
