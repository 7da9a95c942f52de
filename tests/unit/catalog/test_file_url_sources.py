"""A llama.cpp file URL is fetched by the Nomad client, as root, on the node: it names a file only,
and not the node, a cloud metadata service, or (unless the operator allows it) a non-global address."""

from __future__ import annotations

import ipaddress

import pytest

from llmgw.core.catalog import ClusterAllowlists, SecurityPolicy, load_catalog
from llmgw.core.catalog.sources import (
    FileUrlSource,
    SourceError,
    parse_allowed_networks,
    parse_source,
    source_address_refusal,
)
from llmgw.core.diagnostics import format_path
from llmgw.render import Renderer, RenderError, RenderSettings, ReplicaRequest

GOOD = [
    "https://huggingface.co/org/repo/resolve/main/model-Q4_K_M.gguf",
    "https://huggingface.co/org/repo/resolve/main/model.gguf?download=true",
    "https://files.internal.example:8443/llm/model.gguf",
    # A private artifact server is a legitimate choice where the operator allows its network
    # (source_address_refusal); the URL itself is well formed.
    "http://10.0.0.5/models/model.gguf",
    "https://user:secret@files.example/model.gguf",
]

REFUSED = [
    # go-getter options: unpack an archive into the task dir, fetch a checksum elsewhere, rename
    ("https://example.org/m.gguf?archive=tar.gz", "archive"),
    ("https://example.org/m.gguf?download=1&archive=zip", "archive"),
    ("https://example.org/m.gguf?ARCHIVE=zip", "ARCHIVE"),
    ("https://example.org/m.gguf?%61rchive=zip", "archive"),  # percent-encoded name
    ("https://example.org/m.gguf?x=1;archive=zip", "archive"),
    ("https://example.org/m.gguf?checksum=file:https://evil.example/sums", "checksum"),
    ("https://example.org/m.gguf?filename=../../x", "filename"),
    ("https://example.org/archive.tgz//model.gguf", "//"),  # a subdirectory of an archive
    # the node itself and link-local addresses (cloud metadata), however spelt
    ("http://localhost:4646/v1/acl/token/self", "localhost"),
    ("http://LOCALHOST./x", "localhost"),
    ("http://127.0.0.1:8500/v1/kv/?recurse", "127.0.0.1"),
    ("http://127.1/x", "127.1"),
    ("http://169.254.169.254/latest/meta-data/iam/security-credentials/", "169.254.169.254"),
    ("http://2852039166/latest/meta-data/", "2852039166"),
    ("http://0xa9fea9fe/latest/meta-data/", "0xa9fea9fe"),
    ("http://0251.0376.0251.0376/latest/meta-data/", "0251.0376.0251.0376"),
    ("http://169.254.43518/latest/meta-data/", "169.254.43518"),
    ("http://[::1]:4646/v1/jobs", "::1"),
    ("http://[::ffff:169.254.169.254]/latest/", "::ffff:169.254.169.254"),
    ("http://[fe80::1]/x", "fe80::1"),
    ("http://0.0.0.0:8500/v1/kv/", "0.0.0.0"),
    ("http://user@127.0.0.1/x", "127.0.0.1"),
    # control characters and other non-ASCII would reach jobs, logs and terminals as they are
    ("https://\x1b]0;pwned\x07.example/m.gguf", "printable ASCII"),
    ("https://example.org/m\u202egguf.exe", "printable ASCII"),
    ("https://ex\u00e4mple.org/m.gguf", "xn--"),
]


@pytest.mark.parametrize("url", GOOD)
def test_a_plain_file_url_is_a_file_source(url: str) -> None:
    assert parse_source(url) == FileUrlSource(url)


@pytest.mark.parametrize(("url", "named"), REFUSED)
def test_a_url_that_steers_the_fetcher_or_names_the_node_is_refused(url: str, named: str) -> None:
    with pytest.raises(SourceError) as refused:
        parse_source(url)
    assert named in str(refused.value)


# Cloud metadata services, however spelt: refused by every load, whatever the operator allows.
METADATA = [
    ("https://[fd00:ec2::254]/latest/meta-data/iam/security-credentials/", "fd00:ec2::254"),  # AWS IPv6
    ("https://[FD00:EC2:0:0:0:0:0:254]/latest/meta-data/", "fd00:ec2::254"),
    ("https://[fd00:ec2::254%25eth0]/latest/meta-data/", "fd00:ec2::254"),  # with a zone
    ("https://[fd20:ce::254]/computeMetadata/v1/", "fd20:ce::254"),  # Google IPv6
    ("https://100.100.100.200/latest/meta-data/ram/security-credentials/", "100.100.100.200"),  # Alibaba
    ("https://100.100.100.200./latest/meta-data/", "100.100.100.200"),  # an absolute name
    ("https://1684301000/latest/meta-data/", "100.100.100.200"),  # one integer
    ("https://0x646464c8/latest/meta-data/", "100.100.100.200"),
    ("https://0144.0144.0144.0310/latest/meta-data/", "100.100.100.200"),  # octal parts
    ("https://100.100.25800/latest/meta-data/", "100.100.100.200"),  # a.b.c, c 16 bits
    ("https://100.6579400/latest/meta-data/", "100.100.100.200"),  # a.b, b 24 bits
    ("https://[::ffff:100.100.100.200]/latest/meta-data/", "100.100.100.200"),  # IPv4-mapped
    ("https://[::ffff:6464:64c8]/latest/meta-data/", "100.100.100.200"),
    ("https://[::100.100.100.200]/latest/meta-data/", "100.100.100.200"),  # IPv4-compatible
    ("https://[::ffff:0:6464:64c8]/latest/meta-data/", "100.100.100.200"),  # IPv4-translated
    ("https://[64:ff9b::100.100.100.200]/latest/meta-data/", "100.100.100.200"),  # NAT64
    ("https://[2002:6464:64c8::1]/latest/meta-data/", "100.100.100.200"),  # 6to4
    ("http://metadata.google.internal/computeMetadata/v1/", "metadata.google.internal"),
    ("http://METADATA.GOOGLE.INTERNAL./computeMetadata/v1/", "METADATA.GOOGLE.INTERNAL."),
    ("http://metadata/computeMetadata/v1/", "metadata"),
    # link-local (169.254.169.254: AWS, Azure, GCP, OCI...) through the IPv6 forms too
    ("https://[64:ff9b::169.254.169.254]/latest/", "64:ff9b::169.254.169.254"),
    ("https://[::169.254.169.254]/latest/", "::169.254.169.254"),
    ("https://[2002:a9fe:a9fe::]/latest/", "2002:a9fe:a9fe::"),
    ("https://169.254.169.254./latest/", "169.254.169.254."),
    ("https://[::ffff:0:7f00:1]:4646/v1/jobs", "::ffff:0:7f00:1"),  # loopback, IPv4-translated
]


@pytest.mark.parametrize(("url", "named"), METADATA)
def test_a_cloud_metadata_service_is_refused_however_spelt(url: str, named: str) -> None:
    with pytest.raises(SourceError) as refused:
        parse_source(url)
    assert named in str(refused.value)


EVERYWHERE = parse_allowed_networks("0.0.0.0/0, ::/0")


@pytest.mark.parametrize(("url", "named"), METADATA)
def test_allowing_every_network_does_not_open_the_metadata_services(
    test_policy: SecurityPolicy, url: str, named: str
) -> None:
    text = f"models:\n  m:\n    profiles: [{{engine: llamacpp, source: '{url}'}}]\n"
    allowlists = ClusterAllowlists(images=(), source_networks=EVERYWHERE)
    loaded = load_catalog(text, filename="c.yaml", policy=test_policy, allowlists=allowlists)
    assert not loaded.ok
    assert [format_path(d.path) for d in loaded.errors] == ["models.m.profiles[0].source"]


# Not global: refused unless the operator allows the network. (address, the network it is in)
NOT_GLOBAL = [
    ("10.0.0.5", "10.0.0.0/8"),
    ("167772165", "10.0.0.0/8"),  # 10.0.0.5 as one integer
    ("0x0a000005", "10.0.0.0/8"),
    ("012.0.0.5", "10.0.0.0/8"),  # a leading zero is octal to the C resolver
    ("10.5", "10.0.0.0/8"),
    ("10.0.0.5.", "10.0.0.0/8"),
    ("[::ffff:10.0.0.5]", "10.0.0.0/8"),
    ("[::ffff:a00:5]", "10.0.0.0/8"),
    ("[64:ff9b::10.0.0.5]", "10.0.0.0/8"),
    ("[2002:a00:5::1]", "10.0.0.0/8"),
    ("172.16.0.1", "172.16.0.0/12"),
    ("192.168.1.10", "192.168.0.0/16"),
    ("100.64.0.1", "100.64.0.0/10"),  # carrier-grade NAT
    ("100.127.255.254", "100.64.0.0/10"),
    ("0.1.2.3", "0.0.0.0/8"),
    ("192.0.0.170", "192.0.0.0/24"),
    ("198.18.0.1", "198.18.0.0/15"),
    ("203.0.113.7", "203.0.113.0/24"),
    ("240.0.0.1", "240.0.0.0/4"),
    ("255.255.255.255", "240.0.0.0/4"),
    ("[fd12:3456::1]", "fc00::/7"),  # unique-local
    ("[fc00::1]", "fc00::/7"),
    ("[fd00:ec2::253]", "fc00::/7"),  # AWS's DNS resolver, beside its metadata
    ("[fec0::1]", "fec0::/10"),
    ("[2001:db8::1]", "2001:db8::/32"),
    ("[2001::1]", "2001::/23"),  # Teredo
    ("[64:ff9b:1::a00:5]", "64:ff9b:1::/48"),
    ("[100::1]", "100::/64"),
]


@pytest.mark.parametrize(("host", "network"), NOT_GLOBAL)
def test_a_non_global_address_is_refused_by_default(host: str, network: str) -> None:
    source = parse_source(f"https://{host}/models/m.gguf")
    assert isinstance(source, FileUrlSource)
    refusal = source_address_refusal(source, ())
    assert refusal is not None
    assert f"in {network}, not a global address" in refusal
    assert "LLMGW_SOURCE_ALLOWED_NETWORKS" in refusal
    # The operator's network lets it through, however the address is spelt...
    assert source_address_refusal(source, (ipaddress.ip_network(network),)) is None
    # ... and another network does not.
    other = parse_allowed_networks("198.51.100.0/24, 2001:db8:1::/48")
    assert source_address_refusal(source, other) is not None


@pytest.mark.parametrize(
    "url",
    [
        "https://8.8.8.8/m.gguf",
        "https://[2606:4700:4700::1111]/m.gguf",
        "https://[64:ff9b::8.8.8.8]/m.gguf",  # NAT64 of a global address
        "https://huggingface.co/org/repo/resolve/main/m.gguf",  # names are not resolved here
        "https://files.internal.example/m.gguf",
    ],
)
def test_global_addresses_and_names_pass(url: str) -> None:
    source = parse_source(url)
    assert isinstance(source, FileUrlSource)
    assert source_address_refusal(source, ()) is None


def test_the_allowed_networks_setting_is_read_strictly() -> None:
    assert parse_allowed_networks("") == ()
    assert parse_allowed_networks(" 10.20.0.0/16 , fd12:3456::/48,192.0.2.7") == (
        ipaddress.ip_network("10.20.0.0/16"),
        ipaddress.ip_network("fd12:3456::/48"),
        ipaddress.ip_network("192.0.2.7/32"),
    )
    for bad in ("10.20.0.5/16", "files.internal", "10.0.0.0/33", "10.0.0.0/8;rm"):
        with pytest.raises(ValueError, match="is not a network"):
            parse_allowed_networks(bad)


PRIVATE_FILE = "models:\n  q:\n    profiles: [{engine: llamacpp, source: 'https://10.0.0.5/m.gguf'}]\n"


def test_the_doors_and_the_renderer_refuse_a_private_address_with_the_same_words(
    test_policy: SecurityPolicy,
) -> None:
    settings = RenderSettings()
    loaded = load_catalog(PRIVATE_FILE, filename="c.yaml", policy=test_policy, allowlists=settings.allowlists)
    [diagnostic] = loaded.errors
    assert format_path(diagnostic.path) == "models.q.profiles[0].source"
    assert diagnostic.position is not None and (diagnostic.position.line, diagnostic.position.column) == (
        3,
        43,
    )
    # The applied catalog's readers load it without the allowlists; the renderer refuses it.
    applied = load_catalog(PRIVATE_FILE, filename="c.yaml", policy=test_policy).catalog
    assert applied is not None
    with pytest.raises(RenderError) as refused:
        Renderer(settings, test_policy).render(applied, ReplicaRequest("q", 0, "0"), catalog_hash="h")
    assert str(refused.value) == f"model 'q' profile 0: {diagnostic.message}"


def test_an_allowed_private_network_renders_the_artifact(test_policy: SecurityPolicy) -> None:
    settings = RenderSettings(source_allowed_networks=parse_allowed_networks("10.0.0.0/8"))
    loaded = load_catalog(PRIVATE_FILE, filename="c.yaml", policy=test_policy, allowlists=settings.allowlists)
    assert loaded.catalog is not None, loaded.diagnostics
    renderer = Renderer(settings, test_policy)
    job = renderer.check(
        renderer.render(loaded.catalog, ReplicaRequest("q", 0, "0"), catalog_hash="h"), model="q"
    )
    sources = [
        a["GetterSource"] for g in job["TaskGroups"] for t in g["Tasks"] for a in t.get("Artifacts") or []
    ]
    assert sources == ["https://10.0.0.5/m.gguf"]
