"""What ``llmgw dev`` runs: the whole of llmgw on one machine, on stand-ins for Nomad and Consul.

``llmgw dev`` starts the stand-ins (4 nodes x 8 simulated GPUs unless told
otherwise), applies the catalog, and runs the same control plane and router
``llmgw serve`` runs, against them. Ctrl-C stops everything and leaves no
process behind. The fault subcommands act on a running ``llmgw dev`` through
the stand-ins' dev-only endpoints (found through ``.llmgw-dev/dev.json``).

The stand-ins run with ACLs on, as a production cluster does: anything that can
reach loopback could otherwise run a command through Nomad or redirect prompts
through Consul. Their tokens are in ``nomad.token`` and ``consul.token`` in the
state folder while it runs, readable by this user only; the banner's ``export``
lines read them from there (the secrets are never printed), and the fault
subcommands send them. The tokens, the stand-ins' ports and the engines' key secret
stay the same across restarts of one state folder (``dev_stable``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shlex
import shutil
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from llmgw.adapters.consul import ConsulClient
from llmgw.admin import AdminSettings
from llmgw.bundled import bundled_path, read_security_policy
from llmgw.cancellation import cancel_and_wait
from llmgw.cli import EXIT_OK, EXIT_REJECTED, EXIT_USAGE, event_loop
from llmgw.cli.catalog_cmd import catalog_from_file
from llmgw.cli.dev_cmd import EXIT_NOT_RUNNING, FAULT_TIMEOUT
from llmgw.cli.dev_stable import keep_api_keys, load_stable, restore_api_keys, save_stable, write_secret
from llmgw.cli.output import SHORT_ID
from llmgw.cli.serve_run import configure_logging
from llmgw.cli.serving import Role, Services, ServiceSettings, publish_catalog, wait_for_signal
from llmgw.control import ControlSettings
from llmgw.control.metrics_server import MetricsListenerSettings
from llmgw.core import routing
from llmgw.core.catalog import Catalog, Engine, GuardErrorPolicy, Model, ScalingMode
from llmgw.core.catalog import Role as ModelRole
from llmgw.core.catalog.node_shapes import NodeGpus
from llmgw.core.conventions import CONTROL_METRICS_SERVICE, JOB_META_MODEL, ROUTER_SERVICE, SERVICE_TAG
from llmgw.core.engine_keys import EngineKeys
from llmgw.core.planning import PlanningSettings
from llmgw.devcluster.cluster import DevCluster, DevClusterConfig
from llmgw.devcluster.consul import ConsulSettings
from llmgw.devcluster.nomad import NodeSpec, StandInConfig, config_from_yaml
from llmgw.devcluster.nomad.config import DockerPlugin
from llmgw.flags import ENGINE_KEY_SECRET, LLAMA_SERVER, LOG_LEVEL, SettingError, flag_or_variable
from llmgw.gateway.ports import process_sealing_keys
from llmgw.gateway.settings import RouterSettings
from llmgw.render import RenderSettings
from llmgw.settings import ConsulConnection, NomadConnection

# In the state folder, while llmgw dev runs: the stand-ins' ACL tokens (NOMAD_TOKEN, CONSUL_HTTP_TOKEN).
NOMAD_TOKEN_FILE = "nomad.token"  # noqa: S105 (a file name, not a token)
CONSUL_TOKEN_FILE = "consul.token"  # noqa: S105 (a file name, not a token)


def _port(address: str) -> int:
    return URL(address if "://" in address else f"http://{address}").port or 0


def local_llama_server(environ: Mapping[str, str] = os.environ) -> str | None:
    """The llama-server dev's nodes run for llama.cpp's images: $LLMGW_LLAMA_SERVER, else PATH's."""
    # Else the first llama-server on PATH; scripts/build-llama-server builds one.
    named = LLAMA_SERVER.read(environ)
    if named:
        return named
    return shutil.which("llama-server", path=environ.get("PATH"))


def cpu_docker(llama_server: str | None) -> DockerPlugin:
    """A CPU node's docker plugin: host paths allowed (the mirror's model cache), no NVIDIA runtime."""
    return DockerPlugin(volumes_enabled=True, llama_server=llama_server)


def wants_cpu_node(catalog: Catalog) -> bool:
    """Whether a llama.cpp profile of the catalog runs without GPUs (``gpus_per_node: 0``)."""
    return any(
        profile.engine is Engine.LLAMACPP and profile.gpus_per_node == 0
        for model in catalog.models.values()
        for profile in model.profiles
    )


def dev_nodes(
    args: argparse.Namespace, *, cpu_nodes: int = 0, llama_server: str | None = None
) -> tuple[NodeSpec, ...]:
    # One fabric, so a two-node replica fits anywhere and can be rebuilt on any two nodes.
    gpu = tuple(
        NodeSpec(name=f"gpu-{i}", gpus=args.gpus, gpu_model=args.gpu_model, fabric="fabric-a")
        for i in range(1, args.nodes + 1)
    )
    # A laptop's CPU for llama.cpp profiles without GPUs: llama.cpp's server image runs there
    # as the local llama-server (or fails its pull, as on a node without the image).
    cpu = tuple(
        NodeSpec(name=f"cpu-{i}", gpus=0, fabric="fabric-a", docker=cpu_docker(llama_server))
        for i in range(1, cpu_nodes + 1)
    )
    return gpu + cpu


def artifact_files(pairs: list[str]) -> dict[str, str]:
    """``--artifact URL=FILE`` pairs: the local copies the stand-in's nodes use for those URLs."""
    files: dict[str, str] = {}
    for pair in pairs:
        url, sep, file = pair.partition("=")
        if not sep or not url or not file:
            raise ValueError(f"--artifact {pair!r}: write URL=FILE (the source URL, then the local file)")
        path = Path(file).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"--artifact {pair!r}: {path} is not a file")
        files[url] = str(path)
    return files


def dev_render_settings() -> RenderSettings:
    return RenderSettings(
        # The stand-in's nodes run llmgw with the interpreter that runs the stand-in.
        llmgw_command=("${attr.driver.raw_exec.python}", "-m", "llmgw"),
        # Quick to notice, but a loaded laptop must not fail a healthy engine's check.
        check_interval_s=1,
        check_timeout_s=3,
        kill_timeout_s=5,
        shutdown_delay_s=1,
        # Past the control plane's node_lost_grace (15 s) and action_timeout (30 s): llmgw
        # stops a lost replica before Nomad would replace one shard of it alone.
        lost_after_s=60,
    )


def node_gpus_of(nodes: Sequence[NodeSpec]) -> tuple[NodeGpus, ...]:
    """The most GPUs one stand-in node has, per GPU model (a CPU node's 0 included)."""
    largest: dict[str, int] = {}
    for node in nodes:
        largest[node.gpu_model] = max(largest.get(node.gpu_model, 0), node.gpus)
    return tuple(NodeGpus(model, count) for model, count in sorted(largest.items()))


def dev_control_settings() -> ControlSettings:
    # Timings for a demo: a failed node's replicas come back within a minute.
    planning = replace(
        PlanningSettings(),
        node_lost_grace=15.0,
        backoff_base=3.0,
        backoff_max=60.0,
        drain_timeout=30.0,
        placement_timeout=120.0,
        health_lost_timeout=30.0,
        load_timeouts={**PlanningSettings().load_timeouts, Engine.SIM: 60.0},
    )
    return ControlSettings(planning=planning)


def _runs_on_dev(model: Model, *, llama_server: bool) -> bool:
    """The stand-ins start it: a sim profile, or with a local llama-server a llama.cpp
    profile without GPUs (the CPU node runs it; nothing else runs without GPUs and
    docker), and a scaling stanza that is not off."""
    if model.scaling_mode in (ScalingMode.OFF, ScalingMode.UNSET):
        return False
    return any(
        profile.engine is Engine.SIM
        or (llama_server and profile.engine is Engine.LLAMACPP and profile.gpus_per_node == 0)
        for profile in model.profiles
    )


def answering_model(catalog: Catalog, *, llama_server: bool = False) -> str | None:
    """The chat model the banner's ``curl`` example names: one of ``catalog`` that
    answers on llmgw dev, or None when none does. It runs there itself, and every
    guard policy that screens it (or a model of its fallback chain) has a judge that
    runs there too, or lets requests through when its judge is down (``on_error:
    allow``): else it answers 503 guard_unavailable. Models kept running come before
    those loaded on the first request; then the catalog's order."""
    candidates: list[tuple[bool, str]] = []
    for name, model in catalog.models.items():
        if ModelRole.CHAT not in model.roles or not _runs_on_dev(model, llama_server=llama_server):
            continue
        chain = routing.fallback_chain(catalog, name, routing.Api.CHAT)
        screened = [found[1] for m in chain if (found := catalog.guard_policy_for(m)) is not None]
        if all(_judge_answers(catalog, policy.judge, llama_server=llama_server)
               or policy.on_error is GuardErrorPolicy.ALLOW
               for policy in screened):  # fmt: skip
            candidates.append((model.scaling_mode is not ScalingMode.KEEP_RUNNING, name))
    return min(candidates, key=lambda candidate: candidate[0])[1] if candidates else None


def _judge_answers(catalog: Catalog, judge: str, *, llama_server: bool) -> bool:
    resolved = catalog.resolve(judge)
    return resolved is not None and _runs_on_dev(catalog.models[resolved], llama_server=llama_server)


def run_dev(args: argparse.Namespace) -> int:
    try:
        configure_logging(flag_or_variable(args.log_level, LOG_LEVEL, os.environ, "WARNING"))
        loop = event_loop.resolve(args.event_loop)
    except (SettingError, event_loop.EventLoopError) as exc:
        print(f"llmgw dev: {exc}", file=sys.stderr)
        return EXIT_USAGE
    policy = read_security_policy()
    catalog_path = args.catalog or bundled_path("examples") / "catalog.yaml"
    catalog = catalog_from_file(str(catalog_path), policy)
    if isinstance(catalog, int):
        return catalog
    llama_server = local_llama_server()
    if args.cluster is not None:
        try:
            nomad_config = config_from_yaml(args.cluster.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            print(f"llmgw dev: --cluster {args.cluster}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    else:
        cpu_nodes = 1 if wants_cpu_node(catalog) else 0
        nomad_config = StandInConfig(nodes=dev_nodes(args, cpu_nodes=cpu_nodes, llama_server=llama_server))
    try:
        nomad_config = replace(nomad_config, artifact_files=artifact_files(args.artifact or []))
    except ValueError as exc:
        print(f"llmgw dev: {exc}", file=sys.stderr)
        return EXIT_USAGE
    text = catalog_path.read_text(encoding="utf-8")
    args.state_dir = args.state_dir.resolve()
    args.state_dir.mkdir(parents=True, exist_ok=True)
    # A CPU node runs a local llama-server only when llmgw dev lays out the nodes itself.
    hint = answering_model(catalog, llama_server=args.cluster is None and llama_server is not None)
    return event_loop.run(_dev(args, nomad_config, text, str(catalog_path), policy, hint), loop)


async def _dev(
    args: argparse.Namespace,
    nomad_config: StandInConfig,
    catalog_text: str,
    catalog_name: str,
    policy: Any,
    hint: str | None,
) -> int:
    state_dir: Path = args.state_dir
    logging.getLogger("llmgw").info("event loop: %s", event_loop.running_loop_name())
    try:
        # Set: the secret a second router needs to reach dev's engines (llmgw serve --role
        # router with the same LLMGW_ENGINE_KEY_SECRET); unset: the one kept in the state dir.
        chosen_secret = ENGINE_KEY_SECRET.read(os.environ)
    except SettingError as exc:
        print(f"llmgw dev: {exc}", file=sys.stderr)
        return EXIT_USAGE
    stable = load_stable(state_dir)
    config = DevClusterConfig(
        nomad=replace(nomad_config, acl_token=stable.nomad_token),
        consul=ConsulSettings(acl_token=stable.consul_token),
        state_dir=state_dir / "nomad",
        nomad_port=stable.nomad_port,
        consul_port=stable.consul_port,
    )
    async with DevCluster(config) as cluster:
        save_stable(
            state_dir,
            replace(stable, nomad_port=_port(cluster.nomad_addr), consul_port=_port(cluster.consul_addr)),
        )

        # The control plane and the router each run with a token of exactly their ops/acl
        # policy, never the management token (which is the operator's, in the token files).
        def consul_as(who: str) -> ConsulConnection:
            return ConsulConnection.from_env(
                {"CONSUL_HTTP_ADDR": cluster.consul_addr, "CONSUL_HTTP_TOKEN": cluster.consul_tokens[who]}
            )

        settings = ServiceSettings(
            role=Role.ALL,
            nomad=NomadConnection(address=cluster.nomad_addr, token=cluster.nomad_tokens["control-plane"]),
            consul=consul_as("control-plane"),
            router_nomad=NomadConnection(address=cluster.nomad_addr, token=cluster.nomad_tokens["router"]),
            router_consul=consul_as("router"),
            policy=policy,
            # Every replica's engine requires its own key, as in a cluster with
            # LLMGW_ENGINE_KEY_SECRET set: the control plane and the router share this one.
            # Its nodes' shapes, as an operator states a cluster's (LLMGW_NODE_GPUS): `llmgw ctl
            # apply` refuses a shape none of them can hold.
            render=replace(
                dev_render_settings(), engine_api_keys=True, node_gpus=node_gpus_of(nomad_config.nodes)
            ),
            engine_keys=chosen_secret or EngineKeys(stable.engine_key_secret),
            # Stored responses sealed as with LLMGW_RESPONSES_KEYS set, with a key of this
            # run: dev's Consul lives and dies with it.
            response_keys=process_sealing_keys(),
            control=dev_control_settings(),
            # LLMGW_ROUTER_* tune the router as for serve; dev listens on loopback without
            # keys unless asked to check them (the keys the admin API issues, in Consul KV).
            router=replace(
                RouterSettings.from_env_and_args(os.environ),
                host="127.0.0.1",
                port=args.port,
                no_auth=not args.api_keys,
            ),
            admin=AdminSettings(host="127.0.0.1", port=args.admin_port),
            control_metrics=MetricsListenerSettings("127.0.0.1", args.metrics_port),
            instance_id="llmgw-dev",
        )
        # The catalog is in Consul before anything reads it (no "nothing published yet" at start).
        async with ConsulClient(settings.consul) as consul:
            await publish_catalog(consul, catalog_text, applied_by="llmgw dev")
            await restore_api_keys(consul, state_dir)
        try:
            services = await Services(settings).__aenter__()
        except OSError as exc:
            print(f"llmgw dev: cannot listen: {exc.strerror or exc} (choose other ports with --port, "
                  "--admin-port, --metrics-port)", file=sys.stderr)  # fmt: skip
            return EXIT_USAGE
        try:
            assert services.router is not None and services.admin is not None
            assert services.control_metrics is not None
            router_url = services.router.url
            # On a cluster Nomad registers these from the llmgw job's service blocks, with
            # its agents' Consul token: here too (ops/acl/consul-nomad-agent.policy.hcl).
            await _register_own_services(consul_as("nomad-agent"), router_url, services.control_metrics.url)
            state = {
                "pid": os.getpid(),
                "nomad_addr": cluster.nomad_addr,
                "consul_addr": cluster.consul_addr,
                "router_url": router_url,
                "admin_url": services.admin.url,
            }
            # Written once llmgw dev is up, removed when it stops, with dev.json: a second
            # llmgw dev that fails to start in this folder leaves the running one's alone.
            write_secret(state_dir / NOMAD_TOKEN_FILE, cluster.nomad_token)
            write_secret(state_dir / CONSUL_TOKEN_FILE, cluster.consul_token)
            (state_dir / "dev.json").write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
            _banner(
                nomad_config,
                catalog_name,
                router_url,
                services.admin.url,
                services.control_metrics.url,
                cluster.nomad_addr,
                cluster.consul_addr,
                state_dir,
                hint,
                api_keys=args.api_keys,
                shared_secret=chosen_secret is not None,
            )
            async with ConsulClient(settings.consul) as keys_consul:
                keeper = asyncio.create_task(keep_api_keys(keys_consul, state_dir), name="dev:api-keys")
                try:
                    await wait_for_signal()
                finally:
                    await cancel_and_wait(keeper)
        finally:
            print("\nllmgw dev: stopping (router, control plane, every task)...", file=sys.stderr)
            for name in ("dev.json", NOMAD_TOKEN_FILE, CONSUL_TOKEN_FILE):
                (state_dir / name).unlink(missing_ok=True)
            await services.__aexit__(None, None, None)
    print("llmgw dev: stopped", file=sys.stderr)
    return EXIT_OK


# llmgw's own processes in Consul, as ops/llmgw.nomad.hcl's service blocks register them on
# a cluster, so a Prometheus pointed at the stand-in (ops/prometheus/prometheus.yml) finds
# their /metrics. The agent's checks probe /health; the stand-in drops both at its stop.
_OWN_SERVICES = ((ROUTER_SERVICE, "llmgw-dev-router"), (CONTROL_METRICS_SERVICE, "llmgw-dev-control-metrics"))


async def _register_own_services(consul: ConsulConnection, router_url: str, metrics_url: str) -> None:
    async with ConsulClient(consul) as client:
        for (name, service_id), url in zip(_OWN_SERVICES, (router_url, metrics_url), strict=True):
            address = URL(url)
            await client.agent_service_register(
                {
                    "ID": service_id,
                    "Name": name,
                    "Address": address.host,
                    "Port": address.port,
                    "Tags": [SERVICE_TAG],
                    "Check": {"HTTP": f"{url}/health", "Interval": "10s", "Timeout": "2s"},
                }
            )


def _banner(
    config: StandInConfig,
    catalog: str,
    router: str,
    admin: str,
    metrics: str,
    nomad: str,
    consul: str,
    state_dir: Path,
    hint: str | None,
    *,
    api_keys: bool = False,
    shared_secret: bool = False,
) -> None:
    nodes = config.nodes
    gpus = {f"{n.gpus} x {n.gpu_model}" for n in nodes if n.gpus} or {"no"}
    consul_hostport = consul.split("://", 1)[-1]
    nomad_token_file = shlex.quote(str(state_dir / NOMAD_TOKEN_FILE))
    consul_token_file = shlex.quote(str(state_dir / CONSUL_TOKEN_FILE))
    print(
        f"""
llmgw dev is running: {len(nodes)} nodes ({", ".join(sorted(gpus))} simulated GPUs), catalog {catalog}

  OpenAI base URL   {router}/v1      {_key_note(admin, api_keys)}
  chat page         {router}/
{_try_line(router, hint, api_keys)}

  admin API         {admin}     (llmgw ctl --admin-url {admin} status)
  control plane     {metrics}/metrics   (router metrics: {router}/metrics)

  export NOMAD_ADDR={nomad}
  export NOMAD_TOKEN=$(cat {nomad_token_file})
  export CONSUL_HTTP_ADDR={consul_hostport}
  export CONSUL_HTTP_TOKEN=$(cat {consul_token_file})
{_more_routers_line(shared_secret)}
  faults            llmgw dev fail-node gpu-1 | restore-node gpu-1 | crash ALLOC | consul-outage 10
                    | slow-checks gpu-1 5     (llmgw dev FAULT --help)
Ctrl-C stops everything.
""",
        flush=True,
    )


def _more_routers_line(shared_secret: bool) -> str:
    if not shared_secret:
        return (
            "  more routers      start llmgw dev with LLMGW_ENGINE_KEY_SECRET (32+ characters) set, and\n"
            "                    each router you attach with the same secret reaches its engines\n"
        )
    return (
        "  more routers      with the exports above and the same LLMGW_ENGINE_KEY_SECRET:\n"
        f"                    llmgw serve --role router --port {_free_port()}"
        "   (LLMGW_ROUTER_LIMITS_REDIS_URL\n"
        "                    on each, the same Redis, and a key's limits hold across them)\n"
    )


def _free_port() -> int:
    """A loopback port free as the banner is printed, for the command a user copies (a
    fixed number would be one of dev's own, 8081 its admin API's); the router binds it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _key_note(admin: str, api_keys: bool) -> str:
    if not api_keys:
        return "(no API key in dev)"
    return f"(API keys: llmgw ctl --admin-url {admin} keys create NAME)"


def _try_line(router: str, hint: str | None, api_keys: bool = False) -> str:
    if hint is None:
        return (
            "  try               (no chat model of this catalog answers on llmgw dev: only engine sim\n"
            "                    profiles run here, and a guarded model's judge must run too)"
        )
    body = json.dumps({"model": hint, "messages": [{"role": "user", "content": "hello"}]})
    key = ' -H "Authorization: Bearer $OPENAI_API_KEY"' if api_keys else ""
    return (
        f"  try               curl {router}/v1/chat/completions -H 'Content-Type: application/json'{key} \\\n"
        f"                      -d {shlex.quote(body)}"
    )


def run_fault(args: argparse.Namespace) -> int:
    state_file = args.state_dir / "dev.json"
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        print(
            f"llmgw dev {args.fault}: no running llmgw dev found ({state_file} is missing)", file=sys.stderr
        )
        return EXIT_NOT_RUNNING
    tokens: list[str] = []
    for name in (NOMAD_TOKEN_FILE, CONSUL_TOKEN_FILE):
        try:
            tokens.append((args.state_dir / name).read_text(encoding="utf-8").strip())
        except OSError as exc:
            print(f"llmgw dev {args.fault}: cannot read the stand-ins' token in {args.state_dir / name} "
                  f"({exc.strerror}): is llmgw dev running from this folder?", file=sys.stderr)  # fmt: skip
            return EXIT_NOT_RUNNING
    try:
        message = asyncio.run(_apply_fault(args, state, *tokens))
    except aiohttp.ClientConnectionError:
        print(f"llmgw dev {args.fault}: no running llmgw dev answers ({state_file} is left from one that "
              "stopped)", file=sys.stderr)  # fmt: skip
        return EXIT_NOT_RUNNING
    except TimeoutError:
        print(f"llmgw dev {args.fault}: the stand-ins did not answer in {FAULT_TIMEOUT:g}s", file=sys.stderr)
        return EXIT_NOT_RUNNING
    except (aiohttp.ClientError, LookupError) as exc:
        # Refused: a stand-in's error answer (its 500s say "unknown node" too, as Consul's do).
        print(f"llmgw dev {args.fault}: {exc}", file=sys.stderr)
        return EXIT_REJECTED
    print(message)
    return EXIT_OK


@dataclass(frozen=True, slots=True)
class StandingAlloc:
    """An allocation ``llmgw dev crash`` may name: by id, replica (its job) or model."""

    alloc_id: str
    job_id: str
    model: str
    group: str
    node: str
    running: bool  # Nomad wants it running and it has not ended

    def describe(self) -> str:
        return f"{self.alloc_id[:SHORT_ID]} ({self.job_id}, group {self.group} on {self.node})"


def _standing(raw: Mapping[str, Any], models: Mapping[str, str]) -> StandingAlloc:
    job_id = str(raw["JobID"])
    return StandingAlloc(
        alloc_id=str(raw["ID"]),
        job_id=job_id,
        model=models.get(job_id, ""),
        group=str(raw.get("TaskGroup", "")),
        node=str(raw.get("NodeName") or raw.get("NodeID", "")),
        running=raw.get("DesiredStatus", "run") == "run"
        and raw.get("ClientStatus") in ("pending", "running"),
    )


def choose_allocation(name: str, allocs: list[StandingAlloc]) -> StandingAlloc:
    """The one allocation ``name`` means: an allocation id or a prefix of it (as Nomad's CLI
    takes one, any allocation), else a replica (its job id, as `llmgw status` shows it) or a
    model, whose running allocations are the candidates. ``LookupError`` when none or
    several match, naming the candidates so the next try can name one."""
    by_id = [a for a in allocs if a.alloc_id == name] or [a for a in allocs if a.alloc_id.startswith(name)]
    if not by_id:
        by_id = [a for a in allocs if a.running and name in (a.job_id, a.model)]
    if len(by_id) == 1:
        return by_id[0]
    if not by_id:
        replicas = sorted({a.job_id for a in allocs if a.running})
        known = f" (running replicas: {', '.join(replicas)})" if replicas else " (nothing runs)"
        raise LookupError(f"no allocation, replica or model {name!r}{known}")
    listed = "; ".join(a.describe() for a in sorted(by_id, key=lambda a: (a.job_id, a.group, a.alloc_id)))
    raise LookupError(f"{name!r} matches {len(by_id)} allocations, name one by its id: {listed}")


async def _refused(response: aiohttp.ClientResponse) -> None:
    """A stand-in's error answer, in its words (``LookupError``: exit 1)."""
    if response.status >= 400:
        text = (await response.text()).strip()
        raise LookupError(f"the stand-in at {response.url.origin()} answered {response.status}: {text[:200]}")


async def _apply_fault(
    args: argparse.Namespace, state: dict[str, Any], nomad_token: str, consul_token: str
) -> str:
    nomad, consul = state["nomad_addr"], state["consul_addr"]
    # The tokens as Nomad's and Consul's own clients send them.
    as_nomad = {"X-Nomad-Token": nomad_token}
    as_consul = {"X-Consul-Token": consul_token}
    timeout = aiohttp.ClientTimeout(total=FAULT_TIMEOUT)
    async with aiohttp.ClientSession(raise_for_status=_refused, timeout=timeout) as http:

        async def node_id(name: str) -> str:
            async with http.get(f"{nomad}/v1/nodes", headers=as_nomad) as response:
                for node in await response.json():
                    if name in (node["Name"], node["ID"]) or node["ID"].startswith(name):
                        return str(node["ID"])
            raise LookupError(f"no node {name!r}")

        match args.fault:
            case "fail-node":
                await http.post(f"{nomad}/_dev/node/{await node_id(args.node)}/fail", headers=as_nomad)
                return f"node {args.node} failed: its processes are killed and its heartbeat stopped"
            case "restore-node":
                await http.post(f"{nomad}/_dev/node/{await node_id(args.node)}/restore", headers=as_nomad)
                return f"node {args.node} restored (empty)"
            case "crash":
                async with http.get(f"{nomad}/v1/allocations", headers=as_nomad) as response:
                    allocs = await response.json()
                models: dict[str, str] = {}
                for job_id in sorted({str(a["JobID"]) for a in allocs}):
                    async with http.get(f"{nomad}/v1/job/{job_id}", headers=as_nomad) as response:
                        meta = (await response.json()).get("Meta") or {}
                    models[job_id] = str(meta.get(JOB_META_MODEL, ""))
                chosen = choose_allocation(args.alloc, [_standing(a, models) for a in allocs])
                await http.post(
                    f"{nomad}/_dev/alloc/{chosen.alloc_id}/crash",
                    params={"task": args.task},
                    headers=as_nomad,
                )
                return f"task {args.task} of allocation {chosen.describe()} killed"
            case "consul-outage":
                await http.put(
                    f"{consul}/_dev/outage",
                    params={"mode": args.mode, "duration": f"{args.seconds}s"},
                    headers=as_consul,
                )
                return f"Consul stops answering ({args.mode}) for {args.seconds:g}s"
            case "slow-checks":
                await http.put(
                    f"{consul}/_dev/nodes/{args.node}/check-latency",
                    params={"delay": f"{args.seconds}s"},
                    headers=as_consul,
                )
                if args.seconds == 0:
                    return f"health checks of {args.node} are no longer delayed"
                return f"health checks of {args.node} delayed by {args.seconds:g}s"
    raise LookupError(f"unknown fault {args.fault}")
