import ipaddress

import pytest

from llmgw.core.addresses import (
    authority,
    bad_host_name,
    host_of_header,
    is_allowed_host,
    is_ip_or_localhost,
    url_of,
)


def test_ipv6_hosts_are_bracketed_and_names_and_ipv4_are_not() -> None:
    assert authority("::1", 8080) == "[::1]:8080"
    assert authority("127.0.0.1", 8080) == "127.0.0.1:8080"
    assert url_of("https", "fe80::1", 443) == "https://[fe80::1]:443"
    assert url_of("http", "localhost", 8500) == "http://localhost:8500"


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        ("127.0.0.1:8080", True),
        ("127.0.0.1", True),
        ("[::1]:8080", True),
        ("LOCALHOST:8080", True),
        ("prometheus.internal:8080", True),  # listed below
        ("attacker.example:8080", False),  # a DNS-rebinding page's own name
        ("127.0.0.1.attacker.example", False),
        ("localhost.attacker.example:80", False),
        ("[::1:8080", False),  # a bracket left open
        ("", False),
    ],
)
def test_the_hosts_a_listener_answers_to(header: str, allowed: bool) -> None:
    host = host_of_header(header)
    assert (host is not None and is_allowed_host(host, ("prometheus.internal",))) is allowed


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("router.lan", False),
        ("router.lan:8080", True),
        ("http://router.lan", True),
        ("", True),
        (".lan", True),
    ],
)
def test_allowed_host_names_are_bare(name: str, bad: bool) -> None:
    assert bad_host_name(name) is bad


def _ipaddress_takes(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize(
    "host",
    [
        "0.0.0.0", "127.0.0.1", "255.255.255.255", "10.20.30.40", "1.2.3.4",
        "256.1.1.1", "1.2.3.256", "01.2.3.4", "1.2.3.04", "00.0.0.0",  # out of range, leading zeros
        "1.2.3", "1.2.3.4.5", "1..2.3", ".1.2.3.4", "1.2.3.4.",
        "1.2.3.4\n", " 1.2.3.4", "1.2.3.4 ", "1.2.3.4:80",  # what a loose pattern lets by
        "１.２.３.４", "١.٢.٣.٤", "1.2.3.٤",  # digits that are not ASCII
        "0x7f.0.0.1", "2130706433", "127.1", "::1", "::ffff:127.0.0.1", "fe80::1%eth0",
        "localhost", "LocalHost", "example.com", "",
    ],
)  # fmt: skip
def test_ip_or_localhost_answers_as_ipaddress_does(host: str) -> None:
    # The dotted-quad shortcut may only say sooner what ipaddress says.
    assert is_ip_or_localhost(host) is (host.lower() == "localhost" or _ipaddress_takes(host))


def test_the_dotted_quad_shortcut_agrees_with_ipaddress_on_every_octet_form() -> None:
    octets = [str(n) for n in range(300)] + ["00", "01", "007", "0255", "-1", "+1", "1_0", "٣"]
    for octet in octets:
        for host in (f"{octet}.0.0.1", f"1.2.3.{octet}", f"10.{octet}.{octet}.9"):
            assert is_ip_or_localhost(host) is _ipaddress_takes(host), host
