"""Every ``LLMGW_*`` environment variable, and how flags and variables become settings.

One rule: a flag wins over its variable, which wins over the default.

Owns the one table of llmgw's variables: ``VARIABLES`` (each with the form its value
must have), the three families of flag variables (``FLAG_FAMILIES``: the router's, the
admin API's and the simulated engine's tables, one ``Flag`` per setting, each with its
``LLMGW_<FAMILY>_<FIELD>`` variable), and the variables llmgw only writes into the jobs
it renders (``TASK_ENVIRONMENT``). ``tests/unit/test_settings_table.py`` holds the
package's source, this table and ops/README.md to the same names.

A variable is read when the command that uses it runs, never while the parsers are
built: a bad value fails that command only, with ``SettingError`` naming the variable
and the form expected (the CLI prints it and exits 2, as argparse does for a bad flag).
Flags that were not given stay absent from the namespace (``argparse.SUPPRESS``), so
the variable and then the default can apply.
"""

from __future__ import annotations

import argparse
import enum
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from llmgw.core.catalog.images import parse_allowed_images as parse_images
from llmgw.core.catalog.images import parse_trusted_digests as parse_digests
from llmgw.core.catalog.model import Engine
from llmgw.core.catalog.node_shapes import parse_node_gpus
from llmgw.core.catalog.sources import parse_allowed_networks as parse_networks
from llmgw.core.engine_keys import EngineKeys
from llmgw.core.sealing import parse_sealing_keys

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Flag:
    field: str  # the settings field it fills
    flag: str  # "--port"
    env: str  # "LLMGW_ROUTER_PORT"
    parse: Callable[[str], Any]
    help: str
    is_switch: bool = False
    # The namespace attribute; differs from ``field`` when several tables share a parser.
    dest: str = ""

    @property
    def namespace_dest(self) -> str:
        return self.dest or self.field


def parse_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "t", "yes", "y", "on"):
        return True
    if lowered in ("0", "false", "f", "no", "n", "off", ""):
        return False
    raise ValueError(f"expected a boolean (true/false/1/0), got {raw!r}")


def parse_host_names(raw: str) -> tuple[str, ...]:
    """A comma-separated list of host names, lowercase (an allowed-hosts flag)."""
    return tuple(part.strip().lower() for part in raw.split(",") if part.strip())


def _shown(default: Any) -> str:
    if default is None or default == "" or default == ():
        return "none"
    if isinstance(default, enum.Enum):
        return str(default.value)
    return str(default)


def add_flags(parser: argparse.ArgumentParser, flags: Iterable[Flag], defaults: Mapping[str, Any]) -> None:
    """Each flag, its help saying its default and its variable."""
    for spec in flags:
        help_text = f"{spec.help} (default {_shown(defaults.get(spec.field))}; env {spec.env})"
        if spec.is_switch:
            parser.add_argument(spec.flag, dest=spec.namespace_dest, action="store_const", const=True,
                                default=argparse.SUPPRESS, help=help_text)  # fmt: skip
        else:
            parser.add_argument(spec.flag, dest=spec.namespace_dest, type=spec.parse,
                                default=argparse.SUPPRESS, help=help_text)  # fmt: skip


def read_flags(
    flags: Iterable[Flag], environ: Mapping[str, str], namespace: argparse.Namespace | None = None
) -> tuple[dict[str, Any], list[str]]:
    """``(values by field, problems)``: given flags, else non-empty variables; the rest left out."""
    given = vars(namespace) if namespace is not None else {}
    values: dict[str, Any] = {}
    problems: list[str] = []
    for spec in flags:
        if spec.namespace_dest in given:
            values[spec.field] = given[spec.namespace_dest]
        elif environ.get(spec.env, "") != "":
            try:
                values[spec.field] = spec.parse(environ[spec.env])
            except ValueError as exc:
                problems.append(f"{spec.env}={environ[spec.env]!r}: {exc}")
    return values, problems


# --------------------------------------------------------------------------- the variables


class SettingError(ValueError):
    """A variable's value does not have its form; the message names both."""


@dataclass(frozen=True, slots=True)
class Variable(Generic[T]):
    """One ``LLMGW_*`` variable: its name, the form of its value, and how to read it."""

    name: str
    form: str  # what a value must look like, for errors: "a port number, 0 to 65535"
    parse: Callable[[str], T]  # raises ValueError on a value not of the form
    # Set but empty means something (LLMGW_ALLOWED_IMAGES= allows no image); otherwise an
    # empty or blank value is as if the variable were unset.
    empty_counts: bool = False
    # A secret's value is never repeated in a message.
    secret: bool = False

    def raw(self, environ: Mapping[str, str]) -> str | None:
        """The text as set, None when unset (or blank, unless ``empty_counts``)."""
        text = environ.get(self.name)
        if text is None or (not self.empty_counts and not text.strip()):
            return None
        return text

    def read(self, environ: Mapping[str, str]) -> T | None:
        """The parsed value, None when unset; SettingError naming the variable and its form."""
        text = self.raw(environ)
        if text is None:
            return None
        try:
            return self.parse(text)
        except ValueError as exc:
            shown = f"{self.name} (value not shown)" if self.secret else f"{self.name}={text!r}"
            raise SettingError(f"{shown} is not {self.form}: {exc}") from None


def flag_or_variable(given: T | None, variable: Variable[T], environ: Mapping[str, str], default: T) -> T:
    """The flag's value when given (argparse parsed it), else the variable's, else ``default``."""
    if given is not None:
        return given
    value = variable.read(environ)
    return default if value is None else value


def flag_type(variable: Variable[T]) -> Callable[[str], T]:
    """The variable's parse as argparse's ``type=`` for its flag: a bad value says the form expected."""

    def parse(raw: str) -> T:
        try:
            return variable.parse(raw)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{raw!r} is not {variable.form}: {exc}") from None

    return parse


def _whole_number(raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError("not a whole number") from None


def _number(raw: str) -> float:
    try:
        return float(raw.strip())
    except ValueError:
        raise ValueError("not a number") from None


def parse_port(raw: str) -> int:
    port = _whole_number(raw)
    if not 0 <= port <= 65535:
        raise ValueError(f"{port} is outside 0..65535")
    return port


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def parse_log_level(raw: str) -> str:
    level = raw.strip().upper()
    if level not in LOG_LEVELS:
        raise ValueError("not a log level")
    return level


def parse_positive_int(raw: str) -> int:
    number = _whole_number(raw)
    if number < 1:
        raise ValueError(f"{number} is less than 1")
    return number


def parse_count(raw: str) -> int:
    number = _whole_number(raw)
    if number < 0:
        raise ValueError(f"{number} is negative")
    return number


def parse_seconds(raw: str) -> float:
    seconds = _number(raw)
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"{seconds} is not finite and >= 0")
    return seconds


_RATE = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[KMGkmg]?)(?:i?B)?(?:/s)?")
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_rate(text: str) -> int:
    """``50M`` / ``50MB/s`` / ``1.5G`` / ``800k`` -> bytes per second (binary units)."""
    match = _RATE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"invalid rate {text!r}: write e.g. 50M (bytes per second, K/M/G suffixes)")
    rate = int(float(match["number"]) * _UNITS[match["unit"].lower()])
    if rate <= 0:
        raise ValueError(f"invalid rate {text!r}: must be positive")
    return rate


def parse_text(raw: str) -> str:
    return raw.strip()


def parse_runtime_name(raw: str) -> str:
    """A Docker runtime's name as ``docker info`` lists it: one word, no comma (the driver
    fingerprints the runtimes comma-joined in ``driver.docker.runtimes``)."""
    name = raw.strip()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]*", name):
        raise ValueError("letters, digits, '.', '_' and '-' only, starting with a letter or digit")
    return name


def parse_command(raw: str) -> tuple[str, ...]:
    return tuple(shlex.split(raw))


def parse_datacenters(raw: str) -> tuple[str, ...]:
    return tuple(d.strip() for d in raw.split(",") if d.strip())


def parse_key_secret(raw: str) -> EngineKeys:
    return EngineKeys(raw.strip())  # raises EngineKeySecretError (a ValueError) when too short


_SECONDS = "a number of seconds (>= 0)"

# The table, one row per variable, grouped by what reads it: how llmgw runs (serve, dev);
# rendering (serve, render, catalog check); the admin API and its client (serve, ctl; the
# token is environment only, a flag would show in ps); the mirror (llmgw mirror, catalog
# check). What each sets and its default: ops/README.md's Settings table, which
# tests/unit/test_settings_table.py holds to the same names.
# fmt: off
LOG_LEVEL = Variable("LLMGW_LOG_LEVEL", "DEBUG, INFO, WARNING or ERROR", parse_log_level)
EVENT_LOOP = Variable("LLMGW_EVENT_LOOP", "auto, uvloop or asyncio", parse_text)
CONTROL_METRICS_HOST = Variable("LLMGW_CONTROL_METRICS_HOST", "a host address", parse_text)
CONTROL_METRICS_PORT = Variable("LLMGW_CONTROL_METRICS_PORT", "a port number, 0 to 65535", parse_port)
ENGINE_KEY_SECRET = Variable("LLMGW_ENGINE_KEY_SECRET", "a secret of 32+ characters", parse_key_secret,
                             secret=True)
LLAMA_SERVER = Variable("LLMGW_LLAMA_SERVER", "a path to llama-server", parse_text)
DATACENTERS = Variable("LLMGW_DATACENTERS", "comma-separated Nomad datacenters", parse_datacenters)
NODE_POOL = Variable("LLMGW_NODE_POOL", "a Nomad node pool", parse_text)
NODE_COMMAND = Variable("LLMGW_NODE_COMMAND", "a shell-quoted command", parse_command)
TEMPLATES = Variable("LLMGW_TEMPLATES", "a directory", parse_text)
MIRROR_URL = Variable("LLMGW_MIRROR_URL", "the mirror's URL (catalog check: or its store)", parse_text)
MODEL_CACHE_DIR = Variable("LLMGW_MODEL_CACHE_DIR", "a directory on the nodes", parse_text)
MODEL_CACHE_VOLUME = Variable("LLMGW_MODEL_CACHE_VOLUME", "a host volume (empty: none)", parse_text,
                              empty_counts=True)
NVIDIA_RUNTIME = Variable("LLMGW_NVIDIA_RUNTIME", "a Docker runtime name", parse_runtime_name)
HF_TOKEN_VARIABLE = Variable("LLMGW_HF_TOKEN_VARIABLE", "a Nomad Variable path", parse_text)
ALLOWED_IMAGES = Variable("LLMGW_ALLOWED_IMAGES", "image repositories, comma-separated", parse_images,
                          empty_counts=True)
TRUSTED_IMAGE_DIGESTS = Variable("LLMGW_TRUSTED_IMAGE_DIGESTS", "sha256:<64 hex>, comma-separated",
                                 parse_digests)
SOURCE_ALLOWED_NETWORKS = Variable("LLMGW_SOURCE_ALLOWED_NETWORKS", "networks, comma-separated",
                                   parse_networks)
NODE_GPUS = Variable("LLMGW_NODE_GPUS", "MODEL=COUNT or COUNT, comma-separated", parse_node_gpus)
IMAGE_VLLM = Variable("LLMGW_IMAGE_VLLM", "an image reference", parse_text)
IMAGE_SGLANG = Variable("LLMGW_IMAGE_SGLANG", "an image reference", parse_text)
IMAGE_LLAMACPP = Variable("LLMGW_IMAGE_LLAMACPP", "an image reference", parse_text)
IMAGE_LLAMACPP_CPU = Variable("LLMGW_IMAGE_LLAMACPP_CPU", "an image reference", parse_text)
RESPONSES_KEYS = Variable("LLMGW_RESPONSES_KEYS", "ID:BASE64KEY[,ID:BASE64KEY...] (32-byte keys)",
                          parse_sealing_keys, secret=True)
ADMIN_TOKEN = Variable("LLMGW_ADMIN_TOKEN", "a secret without outer spaces", str,
                       empty_counts=True, secret=True)
ADMIN_URL = Variable("LLMGW_ADMIN_URL", "http(s)://HOST:PORT", parse_text)
ACTOR = Variable("LLMGW_ACTOR", "a name", parse_text)
MIRROR_STORE = Variable("LLMGW_MIRROR_STORE", "a directory or s3://BUCKET/PREFIX", parse_text)
MIRROR_HF_ENDPOINT = Variable("LLMGW_MIRROR_HF_ENDPOINT", "an http(s) URL", parse_text)
MIRROR_CONCURRENCY = Variable("LLMGW_MIRROR_CONCURRENCY", "a whole number >= 1", parse_positive_int)
MIRROR_BANDWIDTH_LIMIT = Variable("LLMGW_MIRROR_BANDWIDTH_LIMIT", "a rate such as 50M (bytes/s)", parse_rate)
MIRROR_CONNECT_TIMEOUT = Variable("LLMGW_MIRROR_CONNECT_TIMEOUT", _SECONDS, parse_seconds)
MIRROR_READ_TIMEOUT = Variable("LLMGW_MIRROR_READ_TIMEOUT", _SECONDS, parse_seconds)
MIRROR_RETRIES = Variable("LLMGW_MIRROR_RETRIES", "a whole number >= 0", parse_count)
MIRROR_BACKOFF_INITIAL = Variable("LLMGW_MIRROR_BACKOFF_INITIAL", _SECONDS, parse_seconds)
MIRROR_BACKOFF_MAX = Variable("LLMGW_MIRROR_BACKOFF_MAX", _SECONDS, parse_seconds)
MIRROR_LOCK_WAIT = Variable("LLMGW_MIRROR_LOCK_WAIT", _SECONDS, parse_seconds)
# fmt: on
IMAGES: Mapping[Engine, Variable[str]] = MappingProxyType(
    {Engine.VLLM: IMAGE_VLLM, Engine.SGLANG: IMAGE_SGLANG, Engine.LLAMACPP: IMAGE_LLAMACPP}
)
# The image of a profile that asks for no GPU, for engines with a CPU build.
CPU_IMAGES: Mapping[Engine, Variable[str]] = MappingProxyType({Engine.LLAMACPP: IMAGE_LLAMACPP_CPU})

VARIABLES: tuple[Variable[Any], ...] = (
    LOG_LEVEL, EVENT_LOOP, CONTROL_METRICS_HOST, CONTROL_METRICS_PORT, ENGINE_KEY_SECRET, RESPONSES_KEYS,
    LLAMA_SERVER,
    DATACENTERS, NODE_POOL, NODE_COMMAND, TEMPLATES, MIRROR_URL, MODEL_CACHE_DIR, MODEL_CACHE_VOLUME,
    NVIDIA_RUNTIME, HF_TOKEN_VARIABLE, ALLOWED_IMAGES, TRUSTED_IMAGE_DIGESTS, SOURCE_ALLOWED_NETWORKS,
    *IMAGES.values(), *CPU_IMAGES.values(), NODE_GPUS,
    ADMIN_TOKEN, ADMIN_URL, ACTOR,
    MIRROR_STORE, MIRROR_HF_ENDPOINT, MIRROR_CONCURRENCY, MIRROR_BANDWIDTH_LIMIT, MIRROR_CONNECT_TIMEOUT,
    MIRROR_READ_TIMEOUT, MIRROR_RETRIES, MIRROR_BACKOFF_INITIAL, MIRROR_BACKOFF_MAX, MIRROR_LOCK_WAIT,
)  # fmt: skip

# Settings with a flag each, read by ``read_flags`` from the table beside their settings:
# the prefix, and where that table is (one ``Flag`` per field of the settings class).
FLAG_FAMILIES: Mapping[str, str] = MappingProxyType(
    {
        "LLMGW_ROUTER_": "llmgw.gateway.settings (RouterSettings: serve, dev)",
        "LLMGW_ADMIN_": "llmgw.admin.settings (AdminSettings: serve)",
        "LLMGW_SIM_": "llmgw.sim.settings (SimSettings: llmgw sim)",
    }
)

# Variables llmgw writes into the jobs it renders, for the engines (not settings of llmgw's).
TASK_ENVIRONMENT: Mapping[str, str] = MappingProxyType(
    {
        "LLMGW_HEAD_ADDR": "a multi-node replica's head address, from its Consul template",
        "LLMGW_HEAD_IP": "a multi-node replica's head IP (vLLM's --master-addr), same template",
        "LLMGW_HEAD_PORT": "a multi-node replica's head port (vLLM's --master-port), same template",
    }
)
