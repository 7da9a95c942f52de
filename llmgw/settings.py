"""How llmgw reaches Nomad and Consul: the tools' own environment variables, read in one place.

Operators already have NOMAD_ADDR/NOMAD_TOKEN and CONSUL_HTTP_ADDR/CONSUL_HTTP_TOKEN
set for the ``nomad`` and ``consul`` CLIs; llmgw honours the same variables with
the same meanings and defaults, so pointing llmgw at a cluster needs nothing new.
Each subsystem's own tuning (timeouts, intervals) lives in its package's
settings module; this one is only the connection to the two outside systems.

``from_env`` takes the environment as a mapping so tests pass plain dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from llmgw.core.addresses import url_of
from llmgw.flags import parse_bool

DEFAULT_NOMAD_ADDR = "http://127.0.0.1:4646"


class SettingsError(ValueError):
    """A setting has a value llmgw cannot use; the message names the variable."""


def _truthy(name: str, value: str) -> bool:
    try:
        return parse_bool(value)
    except ValueError:
        raise SettingsError(f"{name}={value!r} is not a boolean (use true or false)") from None


@dataclass(frozen=True, slots=True)
class TlsFiles:
    ca_cert: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    server_name: str | None = None
    # Verification is on unless the operator turns it off explicitly.
    verify: bool = True


def nomad_region(environ: Mapping[str, str]) -> str | None:
    """NOMAD_REGION as the nomad CLI reads it: unset or empty is the agent's own region.
    The connection sends it, and the renderer writes it into every job."""
    return environ.get("NOMAD_REGION") or None


def nomad_namespace(environ: Mapping[str, str]) -> str | None:
    """NOMAD_NAMESPACE as the nomad CLI reads it: unset or empty is ``default``.
    The connection sends it, and the renderer writes it into every job."""
    return environ.get("NOMAD_NAMESPACE") or None


@dataclass(frozen=True, slots=True)
class NomadConnection:
    """NOMAD_ADDR, NOMAD_TOKEN, NOMAD_NAMESPACE, NOMAD_REGION, NOMAD_CACERT,
    NOMAD_CLIENT_CERT, NOMAD_CLIENT_KEY, NOMAD_TLS_SERVER_NAME, NOMAD_SKIP_VERIFY,
    as the nomad CLI reads them (default address http://127.0.0.1:4646)."""

    address: str = DEFAULT_NOMAD_ADDR
    token: str | None = None
    namespace: str | None = None
    region: str | None = None
    tls: TlsFiles = TlsFiles()

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> NomadConnection:
        address = environ.get("NOMAD_ADDR") or DEFAULT_NOMAD_ADDR
        _check_url("NOMAD_ADDR", address)
        return cls(
            address=address.rstrip("/"),
            token=environ.get("NOMAD_TOKEN") or None,
            namespace=nomad_namespace(environ),
            region=nomad_region(environ),
            tls=TlsFiles(
                ca_cert=environ.get("NOMAD_CACERT") or None,
                client_cert=environ.get("NOMAD_CLIENT_CERT") or None,
                client_key=environ.get("NOMAD_CLIENT_KEY") or None,
                server_name=environ.get("NOMAD_TLS_SERVER_NAME") or None,
                verify=not _truthy("NOMAD_SKIP_VERIFY", environ.get("NOMAD_SKIP_VERIFY", "")),
            ),
        )

    def __repr__(self) -> str:  # never print the token
        return f"NomadConnection(address={self.address!r}, token={'set' if self.token else None})"


@dataclass(frozen=True, slots=True)
class ConsulConnection:
    """CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN (or CONSUL_HTTP_TOKEN_FILE), CONSUL_HTTP_SSL,
    CONSUL_HTTP_SSL_VERIFY, CONSUL_CACERT, CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY,
    CONSUL_TLS_SERVER_NAME, CONSUL_NAMESPACE, as the consul CLI reads them
    (default 127.0.0.1:8500; the address may carry its scheme)."""

    scheme: str = "http"
    host: str = "127.0.0.1"
    port: int = 8500
    token: str | None = None
    namespace: str | None = None
    tls: TlsFiles = TlsFiles()

    @property
    def url(self) -> str:
        return url_of(self.scheme, self.host, self.port)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ConsulConnection:
        raw = environ.get("CONSUL_HTTP_ADDR") or "127.0.0.1:8500"
        ssl = _truthy("CONSUL_HTTP_SSL", environ.get("CONSUL_HTTP_SSL", ""))
        if "://" not in raw:
            raw = f"{'https' if ssl else 'http'}://{raw}"
        _check_url("CONSUL_HTTP_ADDR", raw)
        parts = urlsplit(raw)
        if parts.scheme not in ("http", "https"):
            raise SettingsError(
                f"CONSUL_HTTP_ADDR={raw!r}: unix sockets are not supported; use http(s)://HOST:PORT"
            )
        token = environ.get("CONSUL_HTTP_TOKEN") or None
        token_file = environ.get("CONSUL_HTTP_TOKEN_FILE")
        if token is None and token_file:
            try:
                with open(token_file, encoding="utf-8") as handle:
                    token = handle.read().strip() or None
            except OSError as exc:
                raise SettingsError(f"CONSUL_HTTP_TOKEN_FILE={token_file!r}: {exc.strerror}") from exc
        verify = environ.get("CONSUL_HTTP_SSL_VERIFY", "true")
        return cls(
            scheme=parts.scheme,
            host=parts.hostname or "127.0.0.1",
            port=parts.port or (443 if parts.scheme == "https" else 8500),
            token=token,
            namespace=environ.get("CONSUL_NAMESPACE") or None,
            tls=TlsFiles(
                ca_cert=environ.get("CONSUL_CACERT") or None,
                client_cert=environ.get("CONSUL_CLIENT_CERT") or None,
                client_key=environ.get("CONSUL_CLIENT_KEY") or None,
                server_name=environ.get("CONSUL_TLS_SERVER_NAME") or None,
                verify=_truthy("CONSUL_HTTP_SSL_VERIFY", verify),
            ),
        )

    def __repr__(self) -> str:  # never print the token
        return f"ConsulConnection(url={self.url!r}, token={'set' if self.token else None})"


def _check_url(name: str, value: str) -> None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingsError(f"{name}={value!r} is not an http(s) address like http://127.0.0.1:4646")
