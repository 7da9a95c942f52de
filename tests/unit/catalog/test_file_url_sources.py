"""A llama.cpp file URL is fetched by the Nomad client, as root, on the node: it names a file only."""

from __future__ import annotations

import pytest

from llmgw.core.catalog.sources import FileUrlSource, SourceError, parse_source

GOOD = [
    "https://huggingface.co/org/repo/resolve/main/model-Q4_K_M.gguf",
    "https://huggingface.co/org/repo/resolve/main/model.gguf?download=true",
    "https://files.internal.example:8443/llm/model.gguf",
    "http://10.0.0.5/models/model.gguf",  # a private artifact server is a legitimate choice
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
]


@pytest.mark.parametrize("url", GOOD)
def test_a_plain_file_url_is_a_file_source(url: str) -> None:
    assert parse_source(url) == FileUrlSource(url)


@pytest.mark.parametrize(("url", "named"), REFUSED)
def test_a_url_that_steers_the_fetcher_or_names_the_node_is_refused(url: str, named: str) -> None:
    with pytest.raises(SourceError) as refused:
        parse_source(url)
    assert named in str(refused.value)
