"""The consul-template subset, on fixed data (no I/O)."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.devcluster.nomad import template as tmpl


class Data:
    def __init__(self, services: dict[str, list[dict[str, Any]]], keys: dict[str, str]) -> None:
        self.services = services
        self.keys = keys

    def service(self, query: tmpl.ServiceQuery) -> list[dict[str, Any]] | None:
        return [s for s in self.services.get(query.name, []) if not query.tag or query.tag in s["Tags"]]

    def key(self, key: str) -> tuple[bool, str] | None:
        return (key in self.keys, self.keys.get(key, ""))

    def env(self, name: str) -> str:
        return {"NOMAD_ALLOC_ID": "abc"}.get(name, "")


WEB = [
    {"ID": "a", "Name": "web", "Address": "10.0.0.1", "Port": 80, "Tags": ["v1"], "ServiceMeta": {"m": "x"}},
    {"ID": "b", "Name": "web", "Address": "10.0.0.2", "Port": 81, "Tags": ["v2"], "ServiceMeta": {}},
]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('{{ range service "web" }}{{ .Address }}:{{ .Port }},{{ end }}', "10.0.0.1:80,10.0.0.2:81,"),
        ('{{ range service "v2.web" }}{{ .ID }}{{ end }}', "b"),
        ('{{ range service "nothing" }}x{{ else }}empty{{ end }}', "empty"),
        ('{{ with service "web" }}{{ len . }}{{ end }}', "2"),
        ('{{ range $i, $s := service "web" }}{{ $i }}={{ index $s.ServiceMeta "m" }};{{ end }}', "0=x;1=;"),
        ('{{ if eq (len (service "web")) 2 }}two{{ else if gt 3 1 }}no{{ end }}', "two"),
        ('a  {{- " b " -}}  c', "a b c"),
        ('{{ key "cfg/x" }}|{{ keyOrDefault "cfg/y" "dflt" }}|{{ env "NOMAD_ALLOC_ID" }}', "1|dflt|abc"),
        ('{{ range service "web" }}{{ .Tags | join "," }} {{ end }}', "v1 v2 "),
        ("{{/* a comment */}}ok", "ok"),
    ],
)
def test_renders(source: str, expected: str) -> None:
    data = Data({"web": WEB}, {"cfg/x": "1"})
    assert tmpl.render(tmpl.parse(source), data).output == expected


def test_missing_key_is_not_ready_and_unsupported_syntax_is_named() -> None:
    with pytest.raises(tmpl.NotReady):
        tmpl.render(tmpl.parse('{{ key "nope" }}'), Data({}, {}))
    with pytest.raises(tmpl.TemplateError, match="secret"):
        tmpl.render(tmpl.parse('{{ secret "x" }}'), Data({}, {}))
    # consul-template has toUpper; the stand-in has only the functions llmgw calls and
    # answers any other as Go's text/template answers a function it was not given.
    with pytest.raises(tmpl.TemplateError, match=r'^function "toUpper" not defined'):
        tmpl.render(tmpl.parse('{{ toUpper "x" }}'), Data({}, {}))
    with pytest.raises(tmpl.TemplateError, match="define"):
        tmpl.parse('{{ define "x" }}{{ end }}')
    with pytest.raises(tmpl.TemplateError, match="end"):
        tmpl.parse("{{ if true }}x")
