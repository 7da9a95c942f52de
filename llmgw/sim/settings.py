"""The simulated engine's runtime settings: one frozen value, read from flags and env in one place.

Owns: the `SimSettings` / `FaultSettings` values, their defaults (each commented),
the flag table shared by `python -m llmgw.sim` and `llmgw sim`, the
``LLMGW_SIM_*`` environment fallback (flags win; the key also from vLLM's ``VLLM_API_KEY``),
validation, and the exit codes.

Must not: import aiohttp or anything that does I/O, so `llmgw --help` stays cheap.
"""

from __future__ import annotations

import argparse
import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llmgw.flags import Flag, add_flags, parse_bool, read_flags

ENV_PREFIX = "LLMGW_SIM_"
# Where the sim reads its API key when --api-key is not given: vLLM's variable.
API_KEY_ENV = "VLLM_API_KEY"


class ExitCode(enum.IntEnum):
    """Why the process ended; distinct non-zero codes so tests and logs can tell causes apart."""

    OK = 0
    REFUSED = 1  # the settings or the start policy refused to start
    USAGE = 2  # argparse's own code for a malformed command line
    CRASH_FAULT = 3  # an injected crash (flag, env or POST /sim/fault)
    PEER_LOST = 4  # a joined worker left (head) or the head went away (worker)
    JOIN_TIMEOUT = 5  # the replica did not assemble within --join-timeout


class FailStatus(enum.IntEnum):
    INTERNAL_ERROR = 500
    SERVICE_UNAVAILABLE = 503


@dataclass(frozen=True)
class FaultSettings:
    """Faults present from start-up; `POST /sim/fault` changes them at runtime."""

    # Serve this many API requests, then exit with CRASH_FAULT when the next one arrives.
    crash_after_requests: int | None = None
    # Accept connections but answer neither the API nor /health.
    hang: bool = False
    # Fraction of API requests answered with `fail_status` instead of being served.
    fail_rate: float = 0.0
    fail_status: FailStatus = FailStatus.INTERNAL_ERROR
    # Extra delay before the first token, on top of the token pacing.
    first_token_delay: float = 0.0
    # Seed of the random draw behind fail_rate, so a run is reproducible.
    fault_seed: int = 0


@dataclass(frozen=True)
class SimSettings:
    host: str = "127.0.0.1"
    # 0 asks the OS for a free port; the bound port is printed on stdout.
    port: int = 8000
    # The weights path or HF id the engine pretends to load; only logged.
    model: str = "llmgw/sim-greek"
    # The name clients must send as `model`; defaults to `model` like vLLM.
    served_model_name: str | None = None
    # Decode speed of each sequence, in tokens per second.
    token_rate: float = 50.0
    # max_tokens when the request gives none (OpenAI's completions default).
    default_max_tokens: int = 16
    # Prompt plus completion tokens allowed per request, as vLLM's --max-model-len.
    max_model_len: int = 4096
    # Sequences decoded at once; later requests wait (vLLM's --max-num-seqs).
    max_num_seqs: int = 256
    # Length of the vectors /v1/embeddings returns.
    embedding_dim: int = 384
    # Answer chat completions as a Llama Guard judge does instead of in Greek: "unsafe"
    # when the conversation contains this phrase (any case, any spacing), else "safe".
    # The sim judges nothing else: it is a guard policy's stand-in, for demos and tests.
    judge_unsafe_phrase: str | None = None
    # Answer chat completions as vLLM with --reasoning-parser does: the first this many
    # tokens (at most max_tokens) are reasoning, sent in the message's (a stream: each
    # delta's) ``reasoning_content``; the rest is the content. 0: no reasoning, as vLLM
    # without a reasoning parser. Text completions and a judge's verdict never reason.
    reasoning_tokens: int = 0
    # End every chat answer (chat completions, Messages) after this many tokens with a
    # stop, as a model that reaches its end-of-sequence token (finish_reason "stop",
    # stop_reason "end_turn"), when max_tokens allows more: an agent treats an answer cut
    # at max_tokens as a failure. 0: run to max_tokens, ending with "length".
    answer_tokens: int = 0
    # Answer a chat turn (chat completions, Messages) with one tool call, as vLLM's tool
    # parser returns it, when the request offers a tool of one of these names (the first
    # offered, in this order) and its last message is not a tool's result: (name, the
    # call's arguments as JSON text). After the result comes back the model answers text,
    # so an agent's loop ends. Empty: never call a tool.
    tool_calls: tuple[tuple[str, str], ...] = ()
    # The prefix cache (``prefix_cache``): KV held for this many tokens, in blocks of
    # --block-size (vLLM 0.34.0's default 64), least recently used evicted first.
    kv_cache_tokens: int = 262144
    block_size: int = 64
    # Seconds of prefill per prompt token not read from the cache (0: prefill is free,
    # as before the cache was modelled); decode is --token-rate.
    prefill_token_time: float = 0.0
    # Put usage.prompt_tokens_details.cached_tokens in answers, as vLLM does only with
    # --enable-prompt-tokens-details.
    enable_prompt_tokens_details: bool = False
    # Seconds of simulated weight loading before /health turns 200.
    load_time: float = 1.0
    # On SIGTERM/SIGINT, in-flight requests get this long to finish before they are cancelled.
    shutdown_timeout: float = 10.0
    access_log: bool = False
    log_level: str = "INFO"
    # Multi-rank replica: rank 0 is the head and serves the API; ranks >= 1 are workers.
    rank: int = 0
    world_size: int = 1
    # The head's HOST:PORT, given directly or through a file a Nomad template writes.
    head: str | None = None
    head_file: Path | None = None
    # How long a replica may take to assemble (head: all workers joined; worker: joined the head).
    join_timeout: float = 120.0
    # The head writes a heartbeat line this often on each rendezvous stream.
    heartbeat_interval: float = 1.0
    # A worker that hears nothing from its head for this long treats it as gone.
    heartbeat_timeout: float = 5.0
    # A worker retries joining with exponential backoff between these bounds.
    join_backoff_initial: float = 0.1
    join_backoff_max: float = 2.0
    # How often a worker rereads --head-file while it is missing or empty.
    head_file_poll_interval: float = 0.25
    # As vLLM's --api-key: every /v1/* request must carry "Authorization: Bearer <key>";
    # /health, /metrics and the rest stay open. None serves without a key.
    api_key: str | None = field(default=None, repr=False)  # repr: never print a secret
    faults: FaultSettings = field(default_factory=FaultSettings)

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model

    @property
    def is_head(self) -> bool:
        return self.rank == 0


def parse_tool_calls(raw: str) -> tuple[tuple[str, str], ...]:
    """``{"NAME": {ARGUMENTS}, ...}`` as (name, arguments as JSON text) pairs, in order."""
    if not raw.strip():
        return ()
    try:
        calls = json.loads(raw)
    except ValueError:
        raise ValueError(
            'expected a JSON object of tool names to their arguments, e.g. {"Bash": {"command": "echo hi"}}'
        ) from None
    if not isinstance(calls, dict) or not calls:
        raise ValueError(
            'expected a non-empty JSON object of tool names to their arguments, e.g. {"Bash": {}}'
        )
    for name, arguments in calls.items():
        if not name.strip():
            raise ValueError("a tool name must not be empty")
        if not isinstance(arguments, dict):
            raise ValueError(
                f"the arguments of tool {name!r} must be a JSON object (a function's arguments are)"
            )
    # As vLLM's tool parsers write a call's arguments (json.dumps, ensure_ascii=False).
    return tuple((name, json.dumps(arguments, ensure_ascii=False)) for name, arguments in calls.items())


def _optional_int(raw: str) -> int | None:
    return None if raw.strip().lower() in ("", "none") else int(raw)


def _flag(
    flag: str,
    field: str,
    parse: Callable[[str], Any],
    help: str,
    *,
    is_switch: bool = False,
    is_fault: bool = False,
) -> Flag:
    spec = Flag(field, flag, ENV_PREFIX + field.upper(), parse, help, is_switch)
    if is_fault:
        _FAULT_FIELDS.add(field)
    return spec


_FAULT_FIELDS: set[str] = set()

_FLAGS: tuple[Flag, ...] = (
    _flag("--host", "host", str, "address to listen on"),
    _flag("--port", "port", int, "port to listen on (0: any free port, printed on stdout)"),
    _flag("--model", "model", str, "weights path or HF id to pretend to load (only logged)"),
    _flag("--served-model-name", "served_model_name", str, "model name clients must send"),
    _flag("--token-rate", "token_rate", float, "tokens per second per sequence"),
    _flag("--default-max-tokens", "default_max_tokens", int, "max_tokens when a request gives none"),
    _flag("--max-model-len", "max_model_len", int, "prompt + completion token limit"),
    _flag("--max-num-seqs", "max_num_seqs", int, "sequences decoded at once; more wait"),
    _flag("--embedding-dim", "embedding_dim", int, "dimension of embedding vectors"),
    _flag(
        "--judge-unsafe-phrase",
        "judge_unsafe_phrase",
        str,
        'answer as a guard judge: "unsafe" for a conversation containing this phrase, else "safe"',
    ),
    _flag(
        "--reasoning-tokens",
        "reasoning_tokens",
        int,
        "answer chat completions with this many tokens of reasoning first, in reasoning_content "
        "(as vLLM's --reasoning-parser); 0: none",
    ),
    _flag(
        "--answer-tokens",
        "answer_tokens",
        int,
        "end each chat answer after this many tokens with a stop (as a model's end-of-sequence "
        "token) when max_tokens allows more; 0: run to max_tokens",
    ),
    _flag(
        "--tool-calls",
        "tool_calls",
        parse_tool_calls,
        "answer a chat turn that offers one of these tools with a call to it, as JSON "
        '{"NAME": {ARGUMENTS}} (the first offered; a turn after a tool result answers text)',
    ),
    _flag("--kv-cache-tokens", "kv_cache_tokens", int, "tokens of KV the prefix cache holds (LRU)"),
    _flag("--block-size", "block_size", int, "tokens per KV block (vLLM 0.34.0's default 64)"),
    _flag(
        "--prefill-token-time",
        "prefill_token_time",
        float,
        "seconds of prefill per prompt token not in the prefix cache (0: free)",
    ),
    _flag(
        "--enable-prompt-tokens-details",
        "enable_prompt_tokens_details",
        parse_bool,
        "report usage.prompt_tokens_details.cached_tokens (as vLLM's flag of that name)",
        is_switch=True,
    ),
    _flag("--load-time", "load_time", float, "seconds of simulated weight loading"),
    _flag("--shutdown-timeout", "shutdown_timeout", float, "seconds in-flight requests get on shutdown"),
    _flag("--access-log", "access_log", parse_bool, "log every request", is_switch=True),
    _flag("--log-level", "log_level", str, "DEBUG, INFO, WARNING or ERROR"),
    _flag("--rank", "rank", int, "rank of this process in its replica (0 is the head)"),
    _flag("--world-size", "world_size", int, "number of ranks in the replica"),
    _flag("--head", "head", str, "HOST:PORT of the head (rank 0), for workers"),
    # Without it (and LLMGW_SIM_API_KEY), vLLM's own VLLM_API_KEY: a rendered job gives the
    # sim its key exactly as it gives vLLM's (llmgw.core.engines.sim.KEY_INTAKE).
    _flag(
        "--api-key",
        "api_key",
        lambda raw: raw or None,
        f"key every /v1/* request must send as Authorization: Bearer (as vLLM's --api-key; "
        f"also read from {API_KEY_ENV})",
    ),
    _flag("--head-file", "head_file", Path, "file holding the head's HOST:PORT (polled; may start empty)"),
    _flag("--join-timeout", "join_timeout", float, "seconds for the replica to assemble"),
    _flag("--heartbeat-interval", "heartbeat_interval", float, "seconds between head heartbeats"),
    _flag("--heartbeat-timeout", "heartbeat_timeout", float, "seconds of head silence a worker tolerates"),
    _flag(
        "--crash-after-requests",
        "crash_after_requests",
        _optional_int,
        "fault: exit non-zero when request N+1 arrives",
        is_fault=True,
    ),
    _flag(
        "--hang", "hang", parse_bool, "fault: never answer the API or /health", is_switch=True, is_fault=True
    ),
    _flag("--fail-rate", "fail_rate", float, "fault: fraction of requests that fail", is_fault=True),
    _flag(
        "--fail-status",
        "fail_status",
        lambda raw: FailStatus(int(raw)),
        "fault: status of failed requests (500 or 503)",
        is_fault=True,
    ),
    _flag(
        "--first-token-delay",
        "first_token_delay",
        float,
        "fault: extra seconds before the first token",
        is_fault=True,
    ),
    _flag("--fault-seed", "fault_seed", int, "seed of the fail-rate draw", is_fault=True),
)


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every sim flag to `parser`; absent flags stay absent so env and defaults can apply."""
    add_flags(parser, _FLAGS, {**vars(SimSettings()), **vars(FaultSettings())})


class SettingsError(ValueError):
    """The settings cannot be used; the message lists every problem."""


def settings_from_namespace(namespace: argparse.Namespace, environ: Mapping[str, str]) -> SimSettings:
    """Build settings: a flag wins over its ``LLMGW_SIM_*`` variable, which wins over the default
    (for the key, over ``VLLM_API_KEY``, as vLLM reads it)."""
    given, problems = read_flags(_FLAGS, environ, namespace)
    if given.get("api_key") is None and environ.get(API_KEY_ENV):
        given["api_key"] = environ[API_KEY_ENV]
    if problems:
        raise SettingsError("; ".join(problems))
    values = {k: v for k, v in given.items() if k not in _FAULT_FIELDS}
    fault_values = {k: v for k, v in given.items() if k in _FAULT_FIELDS}
    settings = SimSettings(**values, faults=FaultSettings(**fault_values))
    problems = validate(settings)
    if problems:
        raise SettingsError("; ".join(problems))
    return settings


def validate(settings: SimSettings) -> list[str]:
    """Every reason the settings cannot run, each saying which flag to fix."""
    problems: list[str] = []
    if not 0 <= settings.port <= 65535:
        problems.append(f"--port must be 0..65535, got {settings.port}")
    if settings.token_rate <= 0:
        problems.append(f"--token-rate must be > 0 tokens/s, got {settings.token_rate}")
    if settings.kv_cache_tokens < 0:
        problems.append(f"--kv-cache-tokens must be >= 0, got {settings.kv_cache_tokens}")
    if settings.prefill_token_time < 0:
        problems.append(f"--prefill-token-time must be >= 0 s, got {settings.prefill_token_time}")
    for name in (
        "default_max_tokens", "max_model_len", "max_num_seqs", "embedding_dim", "world_size", "block_size",
    ):  # fmt: skip
        if getattr(settings, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be >= 1, got {getattr(settings, name)}")
    for name in (
        "load_time",
        "shutdown_timeout",
        "join_timeout",
        "join_backoff_initial",
    ):
        if getattr(settings, name) < 0:
            problems.append(f"--{name.replace('_', '-')} must be >= 0, got {getattr(settings, name)}")
    for name in ("heartbeat_interval", "heartbeat_timeout", "join_backoff_max", "head_file_poll_interval"):
        if getattr(settings, name) <= 0:
            problems.append(f"--{name.replace('_', '-')} must be > 0, got {getattr(settings, name)}")
    if settings.join_backoff_max < settings.join_backoff_initial:
        problems.append(
            f"join_backoff_max must be at least join_backoff_initial ({settings.join_backoff_initial}), "
            f"got {settings.join_backoff_max}"
        )
    if settings.heartbeat_timeout <= settings.heartbeat_interval:
        problems.append("--heartbeat-timeout must exceed --heartbeat-interval, or every worker would leave")
    if not 0 <= settings.rank < settings.world_size:
        problems.append(f"--rank must be in 0..{settings.world_size - 1} (--world-size), got {settings.rank}")
    if settings.rank >= 1:
        if settings.head is None and settings.head_file is None:
            problems.append(f"rank {settings.rank} is a worker: give --head HOST:PORT or --head-file PATH")
        if settings.head is not None and parse_host_port(settings.head) is None:
            problems.append(f"--head must be HOST:PORT, got {settings.head!r}")
    if settings.reasoning_tokens < 0:
        problems.append(f"--reasoning-tokens must be >= 0, got {settings.reasoning_tokens}")
    if settings.answer_tokens < 0:
        problems.append(f"--answer-tokens must be >= 0, got {settings.answer_tokens}")
    if settings.judge_unsafe_phrase is not None and not settings.judge_unsafe_phrase.split():
        problems.append("--judge-unsafe-phrase must have a word in it: an empty phrase would flag everything")
    if settings.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        problems.append(f"--log-level must be DEBUG, INFO, WARNING or ERROR, got {settings.log_level!r}")
    faults = settings.faults
    if faults.crash_after_requests is not None and faults.crash_after_requests < 0:
        problems.append(f"--crash-after-requests must be >= 0, got {faults.crash_after_requests}")
    if not 0.0 <= faults.fail_rate <= 1.0:
        problems.append(f"--fail-rate must be within 0..1, got {faults.fail_rate}")
    if faults.first_token_delay < 0:
        problems.append(f"--first-token-delay must be >= 0, got {faults.first_token_delay}")
    return problems


def parse_host_port(text: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (IPv6 as ``[::1]:PORT``) or None when it is not one."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit():
        return None
    port = int(port_text)
    if not 0 < port <= 65535:
        return None
    return host.strip("[]"), port


def with_faults(settings: SimSettings, **changes: Any) -> SimSettings:
    """A copy of `settings` with some fault fields changed (for tests and benchmarks)."""
    return replace(settings, faults=replace(settings.faults, **changes))


def flag_names() -> tuple[str, ...]:
    """Every flag the sim accepts, for the start policy and documentation."""
    return tuple(spec.flag for spec in _FLAGS)


def flag_destinations() -> tuple[tuple[str, str, bool], ...]:
    """(flag, settings field, is a fault field) per flag, so a test can hold the table to the fields."""
    return tuple((spec.flag, spec.field, spec.field in _FAULT_FIELDS) for spec in _FLAGS)
