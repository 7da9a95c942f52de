"""How the admin API listens: address, token, TLS, limits, read from env and flags in one place.

Owns: ``AdminSettings`` (frozen; each default commented with its reason), the flags
(``--admin-host``...) and their ``LLMGW_ADMIN_*`` variables with the precedence
flag > env > default, and ``check_settings``: the reasons these settings must not run
(a listener beyond loopback without a token, or without TLS unless the operator
said so with ``--admin-insecure-plaintext-beyond-loopback``) and the warnings to log.

The token is read only from ``LLMGW_ADMIN_TOKEN``: a flag would show it to every
user of the node in ``ps``.

Must not: import aiohttp or ssl, read files (the TLS files are opened by
``llmgw.admin.listening`` when the listener starts), or log.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from llmgw.core.addresses import bad_host_name, is_loopback, url_of
from llmgw.flags import ADMIN_TOKEN, ADMIN_URL, Flag, add_flags, parse_bool, parse_host_names, read_flags

ENV_PREFIX = "LLMGW_ADMIN_"
TOKEN_ENV = ADMIN_TOKEN.name
URL_ENV = ADMIN_URL.name
# Next to the router's 8080; the admin API is a separate listener so it can stay on
# loopback while the router serves the network.
DEFAULT_PORT = 8081
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
# A token shorter than this is refused beyond loopback (and warned about on it):
# 128 bits of randomness is what `openssl rand -hex 16` gives.
MIN_TOKEN_CHARS = 32
PLAINTEXT_FLAG = "--admin-insecure-plaintext-beyond-loopback"


class AdminSettingsError(ValueError):
    """The settings must not run; the message lists every reason and the flag to fix."""


@dataclass(frozen=True, slots=True)
class AdminSettings:
    # Loopback by default: the admin API changes what runs on every GPU node.
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    # Bearer token every request must carry; None only on loopback (with a warning).
    token: str | None = field(default=None, repr=False)
    # Who the token stands for in the audit trail (``applied_by``) and the log.
    credential_name: str = "admin-token"
    # PEM files of the listener's certificate (chain) and key: TLS when both are set.
    tls_cert: str | None = None
    tls_key: str | None = None
    # Serve plaintext beyond loopback anyway (the token then crosses the network in
    # clear text): only for a network the operator trusts, e.g. behind a TLS proxy.
    insecure_plaintext_beyond_loopback: bool = False
    # Host names (besides IP addresses and localhost) the admin API answers to, e.g. the
    # name in its TLS certificate. Any other name is refused: a DNS rebinding page
    # reaches a loopback listener only under its own host name.
    allowed_hosts: tuple[str, ...] = ()
    # A catalog is at most 900 KiB (Consul's KV limit is 512 KiB); its JSON escaping
    # can double it. Larger bodies are refused with 413 before they are read.
    max_body_bytes: int = 2 * 1024 * 1024
    # How many versions GET /admin/v1/catalog/history returns when not told.
    history_limit: int = 20
    # Applies without If-Match retry this often when another apply wins the race in
    # between (with If-Match the loser gets 412 at once).
    apply_attempts: int = 3
    # Catalog previews (parse and render, on worker threads) at once: a burst of diffs
    # must not starve the control plane that shares the process.
    preview_concurrency: int = 2
    # Idle keep-alive connections, and unfinished request heads, are closed after this.
    keepalive_timeout: float = 15.0
    # A body that has not arrived whole after this long is a slow client, not a big
    # catalog: 408 (the router's --body-read-timeout, read the same way).
    body_read_timeout: float = 30.0
    # On stop, requests in flight get this long to finish.
    shutdown_timeout: float = 5.0

    @property
    def on_loopback(self) -> bool:
        return is_loopback(self.host)

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None and self.tls_key is not None

    @property
    def url(self) -> str:
        """The URL ``llmgw ctl`` would use to reach this listener."""
        return url_of("https" if self.tls else "http", self.host, self.port)

    @classmethod
    def from_env_and_args(
        cls, environ: Mapping[str, str], namespace: argparse.Namespace | None = None
    ) -> AdminSettings:
        """A flag wins over its ``LLMGW_ADMIN_*`` variable, which wins over the default.
        Raises AdminSettingsError naming every unusable value (not the policy checks:
        ``check_settings`` says whether the result may run)."""
        values, problems = read_flags(_FLAGS, environ, namespace)
        token = ADMIN_TOKEN.raw(environ) or ""
        if token.strip() != token:
            problems.append(f"{TOKEN_ENV} has leading or trailing spaces; remove them")
        elif token:
            values["token"] = token
        if problems:
            raise AdminSettingsError("; ".join(problems))
        return cls(**values)


@dataclass(frozen=True, slots=True)
class SettingsCheck:
    problems: tuple[str, ...]  # any: refuse to start
    warnings: tuple[str, ...]  # log them and start


def check_settings(settings: AdminSettings) -> SettingsCheck:
    """Every reason these settings must not run, and what to warn about if they may."""
    problems: list[str] = []
    warnings: list[str] = []
    if not 0 <= settings.port <= 65535:
        problems.append(f"--admin-port must be 0..65535, got {settings.port}")
    for name in ("max_body_bytes", "history_limit", "apply_attempts", "preview_concurrency"):
        if getattr(settings, name) < 1:
            problems.append(f"--admin-{name.replace('_', '-')} must be >= 1, got {getattr(settings, name)}")
    for name in ("keepalive_timeout", "body_read_timeout", "shutdown_timeout"):
        if getattr(settings, name) <= 0:
            problems.append(f"--admin-{name.replace('_', '-')} must be > 0, got {getattr(settings, name)}")
    if (settings.tls_cert is None) != (settings.tls_key is None):
        problems.append("--admin-tls-cert and --admin-tls-key go together: give both or neither")
    for name in settings.allowed_hosts:
        if bad_host_name(name):
            problems.append(f"--admin-allowed-hosts {name!r} must be a bare host name (no port, no scheme)")
    short = settings.token is not None and len(settings.token) < MIN_TOKEN_CHARS
    if settings.on_loopback:
        if settings.token is None:
            warnings.append(
                f"the admin API on {settings.host} has no token: any local user or process can change "
                f"the catalog and issue API keys; set {TOKEN_ENV}"
            )
        elif short:
            warnings.append(f"{TOKEN_ENV} is shorter than {MIN_TOKEN_CHARS} characters; use a random one")
    else:
        where = f"--admin-host {settings.host} is beyond loopback"
        if settings.token is None:
            problems.append(f"{where}: set {TOKEN_ENV} (a random secret of {MIN_TOKEN_CHARS}+ characters)")
        elif short:
            problems.append(f"{where}: {TOKEN_ENV} must be at least {MIN_TOKEN_CHARS} characters")
        if not settings.tls:
            if settings.insecure_plaintext_beyond_loopback:
                warnings.append(
                    f"{where} without TLS ({PLAINTEXT_FLAG}): the token crosses the network in clear text"
                )
            else:
                problems.append(
                    f"{where}: give --admin-tls-cert and --admin-tls-key, or accept sending the token in "
                    f"clear text with {PLAINTEXT_FLAG}"
                )
    return SettingsCheck(tuple(problems), tuple(warnings))


# --- flags ----------------------------------------------------------------------------------------


def _flag(field: str, parse: Callable[[str], Any], help: str, *, is_switch: bool = False) -> Flag:
    # Prefixed flags and destinations: the admin flags share a parser with the
    # control plane's and the router's own --host and --port.
    return Flag(
        field=field,
        flag="--admin-" + field.replace("_", "-"),
        env=ENV_PREFIX + field.upper(),
        parse=parse,
        help=help,
        is_switch=is_switch,
        dest="admin_" + field,
    )


_FLAGS: tuple[Flag, ...] = (
    _flag("host", str, "address the admin API listens on (beyond loopback needs a token and TLS)"),
    _flag("port", int, "port of the admin API (0: any free port)"),
    _flag("credential_name", str, "who the token stands for in the catalog's audit trail"),
    _flag("tls_cert", str, "PEM certificate (chain) file: serve the admin API over TLS"),
    _flag("tls_key", str, "PEM private key file of --admin-tls-cert"),
    _flag(
        "insecure_plaintext_beyond_loopback",
        parse_bool,
        "serve without TLS on a non-loopback address; the token crosses the network in clear text",
        is_switch=True,
    ),
    _flag("allowed_hosts", parse_host_names, "comma-separated host names accepted in Host (e.g. the cert's)"),
    _flag("max_body_bytes", int, "largest request body, bytes"),
    _flag("history_limit", int, "catalog versions the history shows by default"),
    _flag("apply_attempts", int, "tries of an apply without If-Match that lost a race"),
    _flag("preview_concurrency", int, "catalog previews computed at once"),
    _flag("keepalive_timeout", float, "seconds an idle connection is kept"),
    _flag("body_read_timeout", float, "seconds to read a request body"),
    _flag("shutdown_timeout", float, "seconds requests in flight get on stop"),
)


def add_admin_arguments(parser: argparse.ArgumentParser) -> None:
    """The admin listener's flags (the token is read from LLMGW_ADMIN_TOKEN only)."""
    add_flags(parser, _FLAGS, {f.name: getattr(AdminSettings(), f.name) for f in fields(AdminSettings)})


def with_changes(settings: AdminSettings, **changes: Any) -> AdminSettings:
    """A copy with some fields changed (tests)."""
    return replace(settings, **changes)
