import pytest

from llmgw.core.addresses import authority, bad_host_name, host_of_header, is_allowed_host, url_of


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
