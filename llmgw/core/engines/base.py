"""The values an engine's launch is made of: words, steps, ranks."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from llmgw.core.catalog.images import Release
from llmgw.core.catalog.model import Engine, Role


@dataclass(frozen=True, slots=True)
class Runtime:
    """Text the Nomad client interpolates when the task starts, e.g. ``${NOMAD_PORT_http}``.

    Only llmgw's own code makes these; a catalog string is never one, so the
    renderer escapes every catalog string and writes these verbatim.
    """

    text: str

    def __str__(self) -> str:
        return self.text


# One argv word or env value: catalog text (escaped when rendered) or runtime interpolation.
Word = str | Runtime


def port(label: str) -> Runtime:
    return Runtime(f"${{NOMAD_PORT_{label}}}")


def address(label: str) -> Runtime:
    return Runtime(f"${{NOMAD_ADDR_{label}}}")


def ip(label: str) -> Runtime:
    return Runtime(f"${{NOMAD_IP_{label}}}")


def env_ref(name: str) -> Runtime:
    return Runtime(f"${{{name}}}")


@dataclass(frozen=True, slots=True)
class Step:
    """One process: its argv (the executable first) and the env llmgw gives it."""

    name: str
    argv: tuple[Word, ...]
    env: tuple[tuple[str, Word], ...] = ()


@dataclass(frozen=True, slots=True)
class KeyFromEnv:
    """The engine reads its API key from this variable of its own environment."""

    variable: str


@dataclass(frozen=True, slots=True)
class KeyFromConfigFile:
    """The engine reads its API key from a YAML file of options: ``flag`` names the file.

    The file, ``file_name`` in the task's secrets directory, holds one option,
    ``item: "<key>"``; only its path is on the command line.
    """

    flag: str
    item: str
    file_name: str

    @property
    def path(self) -> Runtime:
        return Runtime(f"${{NOMAD_SECRETS_DIR}}/{self.file_name}")


@dataclass(frozen=True, slots=True)
class LoggingConfigFile:
    """A logging config the engine loads at start from the file ``variable`` names.

    Nomad writes ``text`` to ``file_name`` in the task's own directory (``local/``);
    ``variable`` in the engine's environment holds its path. Not a secret: it says
    which of the engine's records are dropped, so the API key's never reach the logs.
    """

    variable: str
    file_name: str
    text: str

    @property
    def path(self) -> Runtime:
        return Runtime(f"${{NOMAD_TASK_DIR}}/{self.file_name}")


# How rank 0's engine takes its API key: never as a word of its command line, which
# every user of the node reads in /proc/PID/cmdline.
KeyIntake = KeyFromEnv | KeyFromConfigFile


class HeadAddress(StrEnum):
    """How a worker rank learns its head's rendezvous address (rendered from Consul by Nomad)."""

    NONE = "none"  # rank 0, or a single-rank replica
    FILE = "file"  # a file the engine itself polls (the simulator's --head-file)
    ENV = "env"  # an environment variable; a prestart step waits until it is known


@dataclass(frozen=True, slots=True)
class RankLaunch:
    rank: int
    serve: Step  # the engine process of this rank (rank 0's serves the OpenAI API)
    # Ports this rank's group asks Nomad for; rank 0 always has "http".
    ports: tuple[str, ...]
    # The port the rank's rendezvous service advertises, and whether Consul checks it by TCP.
    rendezvous_port: str | None = None
    rendezvous_checked: bool = False
    head_address: HeadAddress = HeadAddress.NONE
    # Rank 0 only: how many other ranks must have registered before serve starts.
    waits_for_ranks: int = 0

    @property
    def serves_api(self) -> bool:
        return self.rank == 0


@dataclass(frozen=True, slots=True)
class Launch:
    engine: Engine
    ranks: tuple[RankLaunch, ...]
    health_path: str
    # The engine runs in a container (vllm, sglang, llama.cpp) or as a plain process (sim).
    containerised: bool
    # The longest a healthy engine takes to answer health_path (seconds): the check's
    # timeout is never shorter, so the engine's own verdict, not a timeout, fails it.
    health_answer_within_s: int = 0
    # Where rank 0's engine reads the API key it requires; None: it requires none.
    key_intake: KeyIntake | None = None
    # The logging config rank 0's engine needs once it holds a key, where the engine
    # would otherwise log the key (SGLang); None: its logs never carry it.
    key_logging: LoggingConfigFile | None = None


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """Where a rank finds the weights: what the engine is told to load."""

    engine_arg: Word
    # A file whose one line is the path to load, written on the node before the engine
    # starts (a llama.cpp mirror version: the GGUF the fetch chose from its manifest, which
    # only the node sees); engine_arg is then the version's directory.
    path_file: Runtime | None = None


@dataclass(frozen=True, slots=True)
class LaunchContext:
    served_name: str  # the name clients send as "model" (the catalog's)
    model: ModelFiles
    # The model's roles: an embedding-only model gets its engine's embedding flags
    # (llmgw.core.catalog.roles).
    roles: tuple[Role, ...] = (Role.CHAT,)
    # How a node runs llmgw itself (the simulator, rendezvous waits, mirror fetches).
    llmgw_command: tuple[Word, ...] = ("llmgw",)
    # Where a worker's head address appears (HeadAddress.ENV: this variable, as host:port,
    # and its two halves in the next two; FILE: this path).
    head_address_env: str = "LLMGW_HEAD_ADDR"
    head_ip_env: str = "LLMGW_HEAD_IP"
    head_port_env: str = "LLMGW_HEAD_PORT"
    head_address_file: Runtime = Runtime("${NOMAD_TASK_DIR}/llmgw-head")
    # In the container, the engine listens on all interfaces of the host network
    # namespace; the simulator binds the address Nomad gave its port.
    container_listen_host: str = "0.0.0.0"  # noqa: S104 - the engine's port is Nomad's to expose
    # Whether rank 0's engine requires an API key of every client: Nomad renders the key
    # from the job's Variable where the engine's ``key_intake`` says it reads it (see
    # llmgw.core.engine_keys).
    requires_api_key: bool = False
    # The engine release the replica's image names (``images.tag_release``), for the flags
    # that differ by release (llama.cpp's --jinja); None: not known (a trusted digest).
    release: Release | None = None
    # How long the control plane waits for the replica to load (its placement and its load
    # timeout, the longer): a multi-node engine's own rendezvous waits as long
    # (SGLang's --dist-timeout, ``sglang.dist_timeout_args``).
    load_wait_s: int | None = None


def numbers(*values: int) -> tuple[str, ...]:
    return tuple(str(v) for v in values)
