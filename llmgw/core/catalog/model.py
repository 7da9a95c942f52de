"""The catalog's schema: what an operator may write, as frozen pydantic models.

Owns the shape of every key (types, bounds, unknown keys refused) and the
derived facts everyone else asks for (GPUs per node, is the model simulated,
what does its scaling mean). It does not check rules that span keys (fallback
cycles, GPU arithmetic, the security policy): those are in ``rules`` and run
after the shape is known to be right.

Field names are a contract with operators and CI pipelines: add fields, never
rename them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictBool,
    StrictInt,
    StrictStr,
    WithJsonSchema,
)

from llmgw.core.durations import DURATION_HINT, format_duration, parse_duration


class Engine(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    LLAMACPP = "llamacpp"
    SIM = "sim"


class Role(StrEnum):
    CHAT = "chat"
    COMPLETION = "completion"
    EMBEDDING = "embedding"
    GUARD = "guard"


class ScalingMode(StrEnum):
    UNSET = "unset"  # no scaling stanza: known to the router, never started
    OFF = "off"  # min 0, max 0: configured and deliberately off
    ON_DEMAND = "on-demand"  # min 0, max > 0: loaded by a request, unloaded when idle
    KEEP_RUNNING = "keep-running"  # min >= 1


class GuardErrorPolicy(StrEnum):
    BLOCK = "block"  # judge unavailable: refuse the request (fail closed)
    ALLOW = "allow"  # judge unavailable: let the request through (fail open)


class GuardTooLongPolicy(StrEnum):
    BLOCK = "block"  # longer than the judge reads: refuse the request
    SPLIT = "split"  # judge it in overlapping pieces, each of which must be safe


# A llama.cpp profile without gpus_per_node runs on one GPU (0 means CPU only).
DEFAULT_LLAMACPP_GPUS = 1

# Upper bounds of a replica's shape. A rendered job holds one task group per node, so
# without a bound one catalog line (nodes: 10000000) made the admin API's preview and
# the control plane render gigabytes of HCL. Far above any real replica: the largest
# deployments span 18-32 nodes of 4-8 GPUs (a GB200 NVL72 rack is 18 nodes of 4).
MAX_NODES = 64
MAX_GPUS_PER_NODE = 64
MAX_PARALLEL = 1024

ENGINES_SPANNING_NODES = frozenset({Engine.VLLM, Engine.SGLANG, Engine.SIM})
ENGINES_WITH_PARALLELISM = frozenset({Engine.VLLM, Engine.SGLANG, Engine.SIM})


def _duration_schema(description: str) -> WithJsonSchema:
    return WithJsonSchema(
        {
            "description": description,
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": r"^\d+[smh]$"},
            ],
        }
    )


def _scalar_text(value: object) -> object:
    """Args and env values are strings; numbers are accepted as the text they stand for.

    Booleans are refused rather than turned into "True": YAML reads ``on``,
    ``yes`` and ``true`` as booleans, and the engine would get a different word
    than the one the operator wrote.
    """
    if isinstance(value, bool):
        raise ValueError("YAML reads this as a boolean; write it in quotes to pass it as text")
    if isinstance(value, int | float):
        return str(value)
    return value


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("contains a NUL character, which no process argument or environment can carry")
    return value


def _no_interpolation(value: object) -> object:
    """Refuse ``${``: the Nomad client substitutes ``${NAME}`` in a task's args, env and
    constraints at run time (there is no escape for it), so a catalog value with it
    could read the task's environment (NOMAD_TOKEN, secrets paths) into an engine's flags.
    And refuse ``@@``: the renderer fills its slots (``@@replica@@``, ``@@fabric@@``...)
    after escaping, so catalog text holding one would be changed after it was escaped
    (``$@@fabric@@`` with a fabric starting with ``{`` would become ``${``)."""
    if isinstance(value, str) and "${" in value:
        raise ValueError(
            "contains ${, which Nomad would replace at run time; llmgw passes catalog text verbatim"
        )
    if isinstance(value, str) and "@@" in value:
        raise ValueError("contains @@, which llmgw's renderer reserves for its own placeholders")
    return value


CatalogText = Annotated[StrictStr, BeforeValidator(_no_interpolation)]


Seconds = Annotated[
    int,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
    _duration_schema(DURATION_HINT),
]
ArgText = Annotated[
    StrictStr,
    BeforeValidator(_no_interpolation),
    BeforeValidator(_scalar_text),
    BeforeValidator(lambda v: _no_nul(v) if isinstance(v, str) else v),
    WithJsonSchema({"type": ["string", "number"]}),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=False)


class GpuSpec(_Strict):
    """Constraints on the GPUs a replica lands on (Nomad device constraints)."""

    model: CatalogText | None = Field(
        None,
        description="GPU model, matched as a whole word in the name the NVIDIA device plugin reports, "
        'any case: "H100" places on "NVIDIA H100 80GB HBM3"',
    )
    memory_gb: StrictInt | None = Field(None, gt=0, description="minimum memory per GPU, in GB")


class Resources(_Strict):
    """CPU and memory Nomad reserves for the engine task (not the GPUs)."""

    cpu_mhz: StrictInt | None = Field(None, gt=0)
    memory_mb: StrictInt | None = Field(None, gt=0)


class SimOptions(_Strict):
    """How the simulated engine behaves (engine: sim only)."""

    tokens_per_second: float | None = Field(None, gt=0)
    load_seconds: float | None = Field(None, ge=0)


class Profile(_Strict):
    """One way to run a model; a model lists them in order of preference."""

    engine: Engine
    source: CatalogText | None = Field(
        None,
        description="Hugging Face repository id, https URL of a file, or mirror:NAME@VERSION "
        "(optional for engine sim)",
    )
    tp: StrictInt | None = Field(
        None, ge=1, le=MAX_PARALLEL, description="tensor parallel size (vllm, sglang, sim)"
    )
    pp: StrictInt | None = Field(
        None, ge=1, le=MAX_PARALLEL, description="pipeline parallel size (vllm, sglang, sim)"
    )
    nodes: StrictInt | None = Field(
        None, ge=1, le=MAX_NODES, description="nodes per replica (vllm, sglang, sim)"
    )
    gpus_per_node: StrictInt | None = Field(
        None,
        ge=0,
        le=MAX_GPUS_PER_NODE,
        description="GPUs per node; the width of a llama.cpp profile (0: CPU only)",
    )
    gpu: GpuSpec | None = None
    args: tuple[ArgText, ...] = Field((), description="extra engine arguments, checked by policies/")
    env: dict[StrictStr, ArgText] = Field(
        default_factory=dict, description="extra engine environment, checked by policies/"
    )
    image: CatalogText | None = Field(None, description="container image overriding the engine's default")
    resources: Resources | None = None
    load_timeout: Seconds | None = Field(
        None,
        description="how long the replica may take to become healthy once its engine or its model fetch "
        "starts, the download of its weights included (default per engine)",
    )
    tool_call_parser: CatalogText | None = Field(
        None,
        description="vllm, sglang: the engine release's tool-call parser for the model's format "
        "(--tool-call-parser; default by the source's model family, see `llmgw catalog check`); "
        '"none": the model cannot call tools, and a request with tools is answered 400',
    )
    reasoning_parser: CatalogText | None = Field(
        None,
        description="vllm, sglang: the release's reasoning parser (--reasoning-parser); llamacpp: "
        '--reasoning-format; default by model family; "none": the model does not reason',
    )
    simulate_gpus: StrictBool | None = Field(
        None,
        description="engine sim: ask Nomad for the GPUs of the simulated shape (default true); "
        "false runs it on any node",
    )
    sim: SimOptions | None = None

    @property
    def tensor_parallel(self) -> int:
        return self.tp or 1

    @property
    def pipeline_parallel(self) -> int:
        return self.pp or 1

    @property
    def node_count(self) -> int:
        return self.nodes or 1

    @property
    def total_gpus(self) -> int:
        """GPUs one replica holds, across all its nodes."""
        return self.gpus_per_replica_node * self.node_count

    @property
    def gpus_per_replica_node(self) -> int:
        """GPUs each node of a replica holds (the Nomad device count of each group)."""
        if self.gpus_per_node is not None:
            return self.gpus_per_node
        if self.engine is Engine.LLAMACPP:
            return DEFAULT_LLAMACPP_GPUS
        return self.tensor_parallel * self.pipeline_parallel // self.node_count

    @property
    def requests_gpus(self) -> bool:
        if self.engine is Engine.SIM and self.simulate_gpus is False:
            return False
        return self.gpus_per_replica_node > 0


class Scaling(_Strict):
    """How many replicas: bounds, load on demand, idle unload, scale on load."""

    min: StrictInt = Field(ge=0, description="replicas kept running; 0 allows unloading")
    max: StrictInt = Field(ge=0, description="most replicas; 0 with min 0 means off")
    idle_timeout: Seconds | None = Field(
        None, description="on-demand models: unload after this long without use (default 15m)"
    )
    target_in_flight: float | None = Field(
        None, gt=0, description="scale up when in-flight requests per replica stay above this"
    )
    scale_window: Seconds | None = Field(
        None, description="how long load must stay above/below target before scaling (default 2m)"
    )

    @property
    def mode(self) -> ScalingMode:
        if self.max == 0:
            return ScalingMode.OFF
        if self.min == 0:
            return ScalingMode.ON_DEMAND
        return ScalingMode.KEEP_RUNNING


DEFAULT_IDLE_TIMEOUT_SECONDS = 15 * 60
DEFAULT_SCALE_WINDOW_SECONDS = 2 * 60


class Routing(_Strict):
    """How the routers choose among a model's replicas."""

    prefix_affinity: StrictBool = Field(
        True,
        description="chat models: send a conversation's later turns to the replica that has it "
        "cached (keyed by its system prompt and first turn, or the client's prompt_cache_key), "
        "unless that replica holds more than its share of conversations or of the requests in "
        "flight; a first turn goes by least outstanding requests (default true); false: every "
        "request by least outstanding requests",
    )


class Model(_Strict):
    description: StrictStr = ""
    roles: tuple[Role, ...] = Field((Role.CHAT,), min_length=1)
    profiles: tuple[Profile, ...] = Field(min_length=1)
    scaling: Scaling | None = None
    routing: Routing | None = None

    @property
    def prefix_affinity(self) -> bool:
        return self.routing is None or self.routing.prefix_affinity

    @property
    def is_simulated(self) -> bool:
        return all(p.engine is Engine.SIM for p in self.profiles)

    @property
    def scaling_mode(self) -> ScalingMode:
        return self.scaling.mode if self.scaling else ScalingMode.UNSET

    @property
    def idle_timeout_seconds(self) -> int:
        if self.scaling and self.scaling.idle_timeout is not None:
            return self.scaling.idle_timeout
        return DEFAULT_IDLE_TIMEOUT_SECONDS


class GuardPolicy(_Strict):
    judge: StrictStr = Field(description="the model (role guard) that screens requests")
    models: tuple[StrictStr, ...] = Field(min_length=1, description="the models whose requests it screens")
    on_error: GuardErrorPolicy = Field(
        GuardErrorPolicy.BLOCK,
        description="when the judge is unavailable (no replica, a timeout, a failed connection, an "
        "HTTP 5xx): block (default) or allow. A judge's 4xx answer is not unavailability: it refused "
        "the input the client chose, and the request is blocked whatever this says",
    )
    on_too_long: GuardTooLongPolicy = Field(
        GuardTooLongPolicy.BLOCK,
        description="when the judge answers that the conversation is longer than its context: block "
        "(default; the client gets 400 context_length_exceeded) or split (the judge reads it in "
        "overlapping pieces, as many as the router's --guard-max-pieces, and each must be safe)",
    )
    judge_reads_images: StrictBool = Field(
        False,
        description="the judge screens images too (Llama Guard 4, Llama Guard 3 Vision): image parts go "
        "to it with the text. Otherwise a request with an image for a model it screens is refused, "
        "since an image can carry what the text screen would have blocked",
    )


class Catalog(_Strict):
    models: dict[StrictStr, Model] = Field(default_factory=dict)
    aliases: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    fallbacks: dict[StrictStr, tuple[StrictStr, ...]] = Field(default_factory=dict)
    guard_policies: dict[StrictStr, GuardPolicy] = Field(default_factory=dict)

    def resolve(self, name: str) -> str | None:
        """The model a client's name stands for: a model name or an alias, else None."""
        if name in self.models:
            return name
        return self.aliases.get(name)

    def guard_policy_for(self, model: str) -> tuple[str, GuardPolicy] | None:
        for name, policy in self.guard_policies.items():
            if model in policy.models:
                return name, policy
        return None


def json_schema() -> dict[str, Any]:
    schema = Catalog.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "llmgw catalog"
    return schema


# Literal re-exported for the rules' messages
EngineName = Literal["vllm", "sglang", "llamacpp", "sim"]
