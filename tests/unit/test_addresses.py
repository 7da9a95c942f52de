from llmgw.core.addresses import authority, url_of


def test_ipv6_hosts_are_bracketed_and_names_and_ipv4_are_not() -> None:
    assert authority("::1", 8080) == "[::1]:8080"
    assert authority("127.0.0.1", 8080) == "127.0.0.1:8080"
    assert url_of("https", "fe80::1", 443) == "https://[fe80::1]:443"
    assert url_of("http", "localhost", 8500) == "http://localhost:8500"
