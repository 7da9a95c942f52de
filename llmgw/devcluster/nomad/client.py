"""The simulated Nomad client: runs an allocation's tasks as real processes (``raw_exec``).

Owns: the alloc directory (``alloc/``, ``alloc/logs/<task>.stdout.0``,
``<task>/local``, ``<task>/secrets``), task lifecycle hooks (prestart tasks to
completion or as sidecars, main tasks, poststop tasks), ``template`` rendering and
re-rendering with ``change_mode``, Consul service registration (group services before
tasks start, task services once a task runs; deregistration first on stop, then
``shutdown_delay``, then ``kill_signal`` / ``kill_timeout`` / SIGKILL), the ``restart``
policy, and the TaskStates with Nomad's task event types.

Every state change is reported through ``ClientHost.report`` (an AllocationUpdated
write); the server side (scheduler, evaluations) reacts there.

Must not: place allocations or decide rescheduling.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from llmgw.apispec.jobspec.goduration import DurationError, format_go_duration, parse_go_duration
from llmgw.cancellation import cancel_and_wait
from llmgw.devcluster.acl.identity import sign_identity
from llmgw.devcluster.nomad import docker
from llmgw.devcluster.nomad import template as tmpl
from llmgw.devcluster.nomad.config import DockerPlugin, StandInConfig
from llmgw.devcluster.nomad.consul_http import ConsulAgent, ConsulError, Registration, registration
from llmgw.devcluster.nomad.processes import ProcessTable, signal_number
from llmgw.devcluster.nomad.state import AllocRecord, Store, TaskStateRecord, now_ns
from llmgw.devcluster.nomad.taskenv import TaskEnv, build_env
from llmgw.devcluster.nomad.variables import Variables, Workload

JSON = dict[str, Any]
NS = 1_000_000_000
log = logging.getLogger(__name__)

# What ``_run_once`` returns for a start the driver failed recoverably (an image pull past
# its timeout): the restart policy decides, as for an exit. An exit code is never negative.
START_FAILED = -1


@dataclass(frozen=True)
class _PullFailure:
    """The docker driver's pull error, and whether the task runner may try again."""

    message: str
    recoverable: bool


class ClientHost(Protocol):
    """What an alloc runner needs from the stand-in."""

    store: Store
    procs: ProcessTable
    config: StandInConfig
    variables: Variables
    pulled_images: set[tuple[str, str]]  # (node id, image) each node's Docker daemon has

    def consul_for(self, node_id: str) -> ConsulAgent | None: ...
    def alloc_root(self, alloc_id: str) -> Path: ...
    def node_values(self, node_id: str) -> dict[str, str]: ...
    def report(self, alloc: AllocRecord) -> None: ...


def task_event(kind: str, message: str = "", **extra: Any) -> JSON:
    event: JSON = {"Type": kind, "Time": now_ns(), "DisplayMessage": message, "Details": {}}
    if message:
        event["Details"] = {"message": message}
    event.update(extra)
    return event


def client_status(states: dict[str, TaskStateRecord]) -> tuple[str, str]:
    """Nomad's getClientStatus (``client/allocrunner/alloc_runner.go``, v2.0.6-dev): failed
    wins, then running (a task running makes the allocation running, though another is
    still pending, e.g. restarting), then pending, then complete."""
    pending = running = dead = failed = False
    for ts in states.values():
        if ts.state == "running":
            running = True
        elif ts.state == "pending":
            pending = True
        elif ts.state == "dead":
            if ts.failed:
                failed = True
            else:
                dead = True
    if failed:
        return "failed", "Failed tasks"
    if running:
        return "running", "Tasks are running"
    if pending:
        return "pending", "No tasks have started"
    if dead:
        return "complete", "All tasks have completed"
    return "pending", ""


def _group(job: JSON, name: str) -> JSON:
    for group in job.get("TaskGroups") or []:
        if group.get("Name") == name:
            return dict(group)
    raise KeyError(name)


def _hook(task: JSON) -> tuple[str, bool]:
    lifecycle = task.get("Lifecycle") or {}
    return str(lifecycle.get("Hook") or ""), bool(lifecycle.get("Sidecar"))


def parse_env_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines of an ``env = true`` template (comments and ``export`` allowed)."""
    env: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[7:].strip()
        if "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        env[key.strip()] = value
    return env


class _ConsulData:
    """The DataSource templates render against: fetched Consul answers plus the task env."""

    def __init__(
        self,
        env: dict[str, str],
        variable: Callable[[str, str | None], dict[str, str] | None] | None = None,
    ) -> None:
        self.env_vars = env
        self._variable = variable
        self.services: dict[tmpl.ServiceQuery, list[JSON]] = {}
        self.keys: dict[str, tuple[bool, str]] = {}
        self.indexes: dict[tmpl.Dependency, int] = {}

    def service(self, query: tmpl.ServiceQuery) -> list[JSON] | None:
        return self.services.get(query)

    def key(self, key: str) -> tuple[bool, str] | None:
        return self.keys.get(key)

    def env(self, name: str) -> str:
        return self.env_vars.get(name, os.environ.get(name, ""))

    def variable(self, path: str, namespace: str | None) -> dict[str, str] | None:
        if self._variable is None:
            raise tmpl.VariableDenied(f"nomadVar {path!r}: this task has no workload identity")
        return self._variable(path, namespace)


async def fetch_dependency(
    agent: ConsulAgent | None, data: _ConsulData, dep: tmpl.Dependency, *, index: int = 0, wait_s: float = 0
) -> int:
    """Fetch one dependency into ``data``; returns Consul's index for the next blocking call."""
    if isinstance(dep, tmpl.VarQuery):
        return 0  # read in process when the template renders: nothing to fetch
    if agent is None:
        if isinstance(dep, tmpl.ServiceQuery):
            data.services[dep] = []
        else:
            data.keys[dep.key] = (False, "")
        if wait_s:
            await asyncio.sleep(wait_s)
        return 0
    if isinstance(dep, tmpl.ServiceQuery):
        entries, new_index = await agent.health_service(
            dep.name, tag=dep.tag, passing=not dep.any_status, index=index, wait_s=wait_s
        )
        data.services[dep] = sorted(
            (tmpl.service_record(e) for e in entries), key=lambda r: (r["Node"], r["ID"])
        )
    else:
        value, new_index = await agent.kv_get(dep.key, index=index, wait_s=wait_s)
        data.keys[dep.key] = (value is not None, value or "")
    data.indexes[dep] = new_index
    return new_index


@dataclass
class _Template:
    spec: JSON
    nodes: list[tmpl.Node]
    destination: Path
    rendered: str | None = None
    used: set[tmpl.Dependency] = field(default_factory=set)


class TaskRunner:
    """One task of an allocation: its process, restarts, templates and services."""

    def __init__(self, alloc_runner: AllocRunner, task: JSON) -> None:
        self.ar = alloc_runner
        self.task = task
        self.name = str(task["Name"])
        self.state: TaskStateRecord = alloc_runner.alloc.task_states.setdefault(self.name, TaskStateRecord())
        self.proc: asyncio.subprocess.Process | None = None
        self.kill_requested = asyncio.Event()
        self.restart_requested = asyncio.Event()
        self.done = asyncio.Event()
        self.templates: list[_Template] = []
        self.data: _ConsulData | None = None
        self.template_consul: ConsulAgent | None = None  # the node's agent, with the task's token
        self.registrations: list[Registration] = []
        self.restart_times: list[int] = []
        self.env: TaskEnv | None = None
        self.kill_reason = ""

    @property
    def task_dir(self) -> Path:
        return self.ar.root / self.name

    def event(self, kind: str, message: str = "", **extra: Any) -> None:
        self.state.events.append(task_event(kind, message, **extra))
        if len(self.state.events) > 10:  # Nomad keeps the last 10 task events
            del self.state.events[:-10]

    def set_state(self, state: str, *, failed: bool | None = None) -> None:
        self.state.state = state
        if failed is not None:
            self.state.failed = failed
        now = now_ns()
        if state == "running":
            self.state.started_at = now
        if state == "dead":
            self.state.finished_at = now
        self.ar.report()

    # -- setup ----------------------------------------------------------

    def _build_env(self, template_env: dict[str, str] | None = None) -> TaskEnv:
        alloc = self.ar.alloc_doc()
        node = self.ar.host.store.nodes[self.ar.alloc.node_id]
        return build_env(
            alloc=alloc,
            job=self.ar.alloc.job,
            group=self.ar.group,
            task=self.task,
            alloc_dir=str(self.ar.root / "alloc"),
            task_dir=str(self.task_dir),
            region=self.ar.host.store.region,
            datacenter=node.spec.datacenter,
            node=self.ar.host.node_values(node.id),
            extra=template_env,
        )

    def _prepare_templates(self, env: TaskEnv) -> None:
        self.templates = []
        for spec in self.task.get("Templates") or []:
            source = str(spec.get("EmbeddedTmpl") or "")
            if not source and spec.get("SourcePath"):
                path = Path(env.interpolate(str(spec["SourcePath"])))
                if not path.is_absolute():
                    path = self.task_dir / path
                source = path.read_text(encoding="utf-8")
            dest = Path(env.interpolate(str(spec.get("DestPath") or "")))
            if not dest.is_absolute():
                dest = self.task_dir / dest
            nodes = tmpl.parse(
                source, str(spec.get("LeftDelim") or "{{"), str(spec.get("RightDelim") or "}}")
            )
            self.templates.append(_Template(spec, nodes, dest))

    async def _template_consul_agent(self) -> ConsulAgent | None:
        """The node's Consul agent with the token Nomad 2.0.5's template hook gives this task.

        A task whose group or task has a ``consul`` block gets the implicit identity
        ``consul_default`` when the servers configure ``consul.task_identity``
        (``handleConsulTask``), which the client logs in to Consul's auth method with;
        the template then runs with that token. Without the identity it runs with
        ``"invalid-token"``, or the client's own token when the client config says
        ``template { use_client_consul_token = true }`` (``template_hook.go``, ``Prestart``).
        """
        agent = self.ar.host.consul_for(self.ar.alloc.node_id)
        if agent is None:
            return None
        config = self.ar.host.config
        consul_block = self.task.get("Consul") or self.ar.group.get("Consul")
        if consul_block is not None and config.consul_task_identity and config.identity_signing_key:
            claims = {
                "nomad_namespace": str(self.ar.alloc.job.get("Namespace") or "default"),
                "nomad_job_id": str(self.ar.alloc.job.get("ID") or ""),
                "nomad_allocation_id": self.ar.alloc.id,
                "nomad_task": self.name,
                "aud": ["consul.io"],
            }
            bearer = sign_identity(claims, config.identity_signing_key)
            return agent.with_token(await agent.login(config.consul_auth_method, bearer))
        if config.template_use_client_consul_token:
            return agent
        return agent.with_token("invalid-token")

    async def _render_all(self, *, block: bool) -> bool:
        """Render every template until its data is complete. Returns whether any output changed."""
        assert self.data is not None
        agent = self.template_consul
        changed = False
        failures: dict[tmpl.Dependency, int] = {}
        for template in self.templates:
            attempts = 0
            while attempts < 20:
                attempts += 1
                try:
                    result = tmpl.render(template.nodes, self.data)
                except tmpl.VariableMissing as missing:
                    # consul-template blocks until the variable exists; the task stays pending
                    # and Nomad's template hook reports what it waits for.
                    if not block:
                        break
                    self._report_missing(missing)
                    attempts = 0
                    try:
                        await asyncio.wait_for(
                            self.kill_requested.wait(), self.ar.host.config.template_retry_s
                        )
                        return changed
                    except TimeoutError:
                        continue
                except tmpl.NotReady:
                    if not block:
                        break
                    await asyncio.sleep(self.ar.host.config.template_retry_s)
                    for dep in list(template.used):
                        with contextlib.suppress(ConsulError):
                            await fetch_dependency(agent, self.data, dep)
                    continue
                template.used = result.used
                if result.missing:
                    for dep in result.missing:
                        try:
                            await fetch_dependency(agent, self.data, dep)
                            failures.pop(dep, None)
                        except ConsulError as exc:
                            if not block:
                                raise
                            # consul-template retries a failed read (Nomad's consul_retry:
                            # 12 attempts) while Nomad reports the dependency missing, then
                            # gives the error up: "Template failed: <dependency>: <error>".
                            failures[dep] = failures.get(dep, 0) + 1
                            self._report_waiting(tmpl.describe(dep))
                            if failures[dep] >= self.ar.host.config.template_consul_attempts:
                                raise ConsulError(f"{tmpl.describe(dep)}: {exc}") from exc
                            await asyncio.sleep(self.ar.host.config.template_retry_s)
                    continue
                if result.output != template.rendered:
                    template.rendered = result.output
                    template.destination.parent.mkdir(parents=True, exist_ok=True)
                    template.destination.write_text(result.output, encoding="utf-8")
                    with contextlib.suppress(ValueError):
                        template.destination.chmod(int(str(template.spec.get("Perms") or "0644"), 8))
                    changed = True
                break
        return changed

    def _report_missing(self, missing: tmpl.VariableMissing) -> None:
        region = self.ar.host.store.region
        self._report_waiting(f"nomad.var.block({missing.path}@{missing.namespace}.{region})")

    def _report_waiting(self, dependency: str) -> None:
        message = f"Missing: {dependency}"
        if not self.state.events or self.state.events[-1].get("DisplayMessage") != message:
            self.event("Template", message)
            self.ar.report()

    def _read_variable(self, path: str, namespace: str | None) -> dict[str, str] | None:
        """A variable as this task's workload identity reads it (Nomad's implicit and attached policies)."""
        job_namespace = str(self.ar.alloc.job.get("Namespace") or "default")
        job_id = str(self.ar.alloc.job.get("ID") or "")
        who = Workload(job_namespace, job_id, self.ar.alloc.task_group, self.name)
        wanted = namespace or job_namespace
        variables = self.ar.host.variables
        if wanted != job_namespace or not variables.workload_may_read(who, path.strip("/")):
            raise tmpl.VariableDenied(
                f"nomad.var.block({path}@{wanted}.{self.ar.host.store.region}): "
                "Unexpected response code: 403 (Permission denied)"
            )
        found = variables.get(wanted, path)
        return None if found is None else dict(found.items)

    def _template_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for template in self.templates:
            if template.spec.get("Envvars") and template.rendered is not None:
                env.update(parse_env_file(template.rendered))
        return env

    def _fetch_artifacts(self) -> bool:
        """The artifact hook (before templates): copies of the local files dev names, or a failure."""
        artifacts = list(self.task.get("Artifacts") or [])
        if not artifacts:
            return True
        self.event("Downloading Artifacts", "Client is downloading artifacts")
        self.ar.report()
        env = self._build_env()
        for artifact in artifacts:
            source = env.interpolate(str(artifact.get("GetterSource") or ""))
            local = self.ar.host.config.artifact_files.get(source)
            try:
                if local is None:
                    raise OSError(
                        "the dev stand-in downloads nothing; name a local copy of this file "
                        "(llmgw dev --artifact URL=FILE)"
                    )
                dest = (
                    self.task_dir / env.interpolate(str(artifact.get("RelativeDest") or "local/"))
                ).resolve()
                if not dest.is_relative_to(self.task_dir.resolve()):
                    raise OSError(f"artifact destination {dest} escapes the task directory")
                if str(artifact.get("GetterMode") or "any") != "file":
                    dest = dest / Path(local).name
                dest.parent.mkdir(parents=True, exist_ok=True)
                if not self._link_artifact(Path(local), dest):
                    self.event(
                        "Downloading Artifacts",
                        f"{local} is on another filesystem than the allocation: copied, not linked",
                    )
            except OSError as exc:
                # client/allocrunner/taskrunner/artifact_hook.go: the hook's error and event.
                message = f"failed to download artifact {source!r}: {exc}".replace("'", '"', 2)
                self.event("Failed Artifact Download", message, DownloadError=message, FailsTask=True)
                return False
        return True

    @staticmethod
    def _link_artifact(local: Path, dest: Path) -> bool:
        """The local file hard-linked into the task (a multi-GB GGUF once on disk, however many
        allocations load it; the engines only read it); True if linked, False if it had to be
        copied (another filesystem, or one without hard links)."""
        dest.unlink(missing_ok=True)  # a restart finds the last run's
        try:
            os.link(local, dest)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise
        shutil.copyfile(local, dest)
        return False

    # -- running --------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self.done.set()

    async def _run(self) -> None:
        for sub in ("local", "secrets", "tmp"):
            (self.task_dir / sub).mkdir(parents=True, exist_ok=True)
        self.event("Task Setup", "Building Task Directory", Message="Building Task Directory")
        self.ar.report()
        policy = self.task.get("RestartPolicy") or self.ar.group.get("RestartPolicy") or {}
        if not self._fetch_artifacts():
            self.set_state("dead", failed=True)
            return
        try:
            env = self._build_env()
            self._prepare_templates(env)
            if self.templates:
                self.template_consul = await self._template_consul_agent()
            self.data = _ConsulData(dict(env.env), self._read_variable)
            await self._render_all(block=True)
        except ConsulError as exc:
            # The template manager kills the task (template.go, handleFirstRender).
            self.event("Killing", f"Template failed: {exc}", FailsTask=True)
            self.set_state("dead", failed=True)
            return
        except (tmpl.TemplateError, OSError) as exc:
            message = f"Template failed: {exc}"
            self.event("Setup Failure", message, SetupError=message, FailsTask=True)
            self.set_state("dead", failed=True)
            return
        watcher: asyncio.Task[None] | None = None
        if any(t.used for t in self.templates):
            watcher = asyncio.create_task(self._watch_templates(), name=f"templates-{self.name}")
        try:
            while True:
                if self.kill_requested.is_set():
                    self.set_state("dead", failed=False)
                    return
                exit_code = await self._run_once()
                if self.kill_requested.is_set():
                    self.event("Killed", "Task successfully killed")
                    self.set_state("dead", failed=False)
                    return
                if exit_code is None:
                    self.set_state("dead", failed=True)
                    return
                if self.restart_requested.is_set():
                    self.restart_requested.clear()
                    self.event(
                        "Restarting",
                        "Task restarting in 0s",
                        RestartReason="Template with change_mode restart re-rendered",
                        StartDelay=0,
                    )
                    self.state.restarts += 1
                    self.state.last_restart = now_ns()
                    self.set_state("pending")
                    continue
                hook, sidecar = _hook(self.task)
                if exit_code == 0 and ((hook and not sidecar) or self.ar.alloc.job.get("Type") == "batch"):
                    self.set_state("dead", failed=False)
                    return
                delay = await self._restart_decision(policy, exit_code)
                if delay is None:
                    self.set_state("dead", failed=True)
                    return
                # Nomad counts a restart when it schedules it, before the delay.
                self.state.restarts += 1
                self.state.last_restart = now_ns()
                self.set_state("pending")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.kill_requested.wait(), delay)
        finally:
            if watcher is not None:
                await cancel_and_wait(watcher)
            await self._deregister_services()

    async def _pull_image(self, plugin: DockerPlugin, config: JSON) -> bool | _PullFailure:
        """The docker driver's ``createImage`` (``drivers/docker/driver.go``, v2.0.6-dev):
        an image the daemon has is used as it is unless ``force_pull`` is set (or its tag is
        ``latest``, which no image the stand-in runs has: see ``docker.py``); any other is
        pulled, announced by a ``Driver`` event "Downloading image", and the task stays
        pending until it is there, ``plugin.image_pull_s`` here. Its group's services are
        registered already (``group_service_hook.go``, ``Prerun``). False when the task
        was killed meanwhile.

        The pull runs under ``image_pull_timeout`` (the task's, else the plugin's, 5 min by
        default): a pull that takes longer is cancelled with the context's deadline and
        fails the start with a recoverable error (``pullImageImpl`` and
        ``recoverablePullError``, ``drivers/docker/coordinator.go``, v2.0.5), returned here
        in the driver's words: the restart policy decides what follows, and the next try
        pulls from the start (the stand-in keeps no partly pulled layers)."""
        if plugin.image_pull_s <= 0:
            return True
        image = str(config.get("image") or "")
        key = (self.ar.alloc.node_id, image)
        if key in self.ar.host.pulled_images and not config.get("force_pull"):
            return True
        timeout = plugin.image_pull_timeout_s
        if config.get("image_pull_timeout"):
            try:
                timeout = parse_go_duration(str(config["image_pull_timeout"])) / NS
            except DurationError as exc:
                return _PullFailure(f"Failed to parse image_pull_timeout: {exc}", recoverable=False)
        self.event("Driver", "Downloading image", DriverMessage="Downloading image")
        self.ar.report()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.kill_requested.wait(), min(plugin.image_pull_s, timeout))
            return False
        if plugin.image_pull_s > timeout:
            return _PullFailure(f"Failed to pull `{image}`: context deadline exceeded", recoverable=True)
        self.ar.host.pulled_images.add(key)
        return True

    async def _restart_decision(self, policy: JSON, exit_code: int) -> float | None:
        """Seconds to wait before restarting, or None when the task must fail."""
        raw_attempts = policy.get("Attempts")
        attempts = 2 if raw_attempts is None else int(raw_attempts)
        interval = int(policy.get("Interval") or 0)
        delay_ns = int(policy.get("Delay") or 0)
        mode = str(policy.get("Mode") or "fail")
        now = now_ns()
        self.restart_times = [t for t in self.restart_times if interval <= 0 or now - t < interval]
        if len(self.restart_times) >= attempts:
            if mode == "delay" and interval > 0:
                wait_ns = max(0, self.restart_times[0] + interval - now)
                self.restart_times = []
                self.event(
                    "Restarting",
                    f"Exceeded allowed attempts, applying a delay - Task restarting in "
                    f"{format_go_duration(wait_ns)}",
                    StartDelay=wait_ns,
                    RestartReason="Exceeded allowed attempts, applying a delay",
                )
                self.restart_times.append(now + wait_ns)
                return wait_ns / NS
            reason = (
                f"Exceeded allowed attempts {attempts} in interval {format_go_duration(interval)} "
                f'and mode is "{mode}"'
            )
            self.event("Not Restarting", reason, RestartReason=reason, FailsTask=True)
            return None
        self.restart_times.append(now)
        reason = "Restart within policy"
        self.event(
            "Restarting",
            f"Task restarting in {format_go_duration(delay_ns)}",
            StartDelay=delay_ns,
            RestartReason=reason,
        )
        return delay_ns / NS

    async def _run_once(self) -> int | None:
        """Start the process and wait for it. None means it could not start (driver failure)."""
        host = self.ar.host
        env = self._build_env(self._template_env())
        self.env = env
        config = env.interpolate_any(self.task.get("Config") or {})
        driver = str(self.task.get("Driver") or "")
        plugin = host.store.nodes[self.ar.alloc.node_id].spec.docker
        process_env = env.env
        if driver == "docker" and plugin is not None:
            # Checked as the docker driver checks it; run only where the node has a local
            # binary for the image (llama.cpp's server), else failed as an image pull fails.
            message = docker.start_failure(
                plugin,
                config,
                gpus="NVIDIA_VISIBLE_DEVICES" in env.env,
                task_dir=str(self.task_dir),
                alloc_dir=str(self.ar.root),
            )
            run = docker.container_run(
                plugin,
                config,
                env.env,
                task_dir=str(self.task_dir),
                alloc_dir=str(self.ar.root),
                node_address=host.node_values(self.ar.alloc.node_id).get(
                    "attr.unique.network.ip-address", "127.0.0.1"
                ),
            )
            if message is not None or run is None:
                message = message or docker.pull_failure(str(config.get("image") or ""))
                self.event("Driver Failure", message, DriverError=message, FailsTask=True)
                # StartTask's error is not recoverable: no restart (client/.../restarts/restarts.go).
                unrecoverable = "Error was unrecoverable"
                self.event("Not Restarting", unrecoverable, RestartReason=unrecoverable, FailsTask=True)
                return None
            pulled = await self._pull_image(plugin, config)
            if isinstance(pulled, _PullFailure) and not pulled.recoverable:
                self.event("Driver Failure", pulled.message, DriverError=pulled.message, FailsTask=True)
                unrecoverable = "Error was unrecoverable"
                self.event("Not Restarting", unrecoverable, RestartReason=unrecoverable, FailsTask=True)
                return None
            if isinstance(pulled, _PullFailure):
                # A start error the task runner retries under the restart policy
                # (client/allocrunner/taskrunner/task_runner.go, runDriver: SetStartError).
                self.event("Driver Failure", pulled.message, DriverError=pulled.message)
                self.ar.report()
                return START_FAILED
            if not pulled:
                return 0  # killed while it pulled: the caller sees the kill
            argv = run.argv
            process_env = run.env
        elif driver not in ("raw_exec", "exec"):  # exec: run as raw_exec, without its chroot
            message = f"driver {driver!r} is not available in the dev stand-in"
            self.event("Driver Failure", message, DriverError=message, FailsTask=True)
            return None
        else:
            command = str(config.get("command") or "")
            if not command:
                message = f"missing command for {driver} driver"
                self.event("Driver Failure", message, DriverError=message, FailsTask=True)
                return None
            argv = [command, *(str(a) for a in (config.get("args") or []))]
        logs = self.ar.root / "alloc" / "logs"
        try:
            proc = await host.procs.spawn(
                argv,
                process_env,
                self.task_dir,
                logs / f"{self.name}.stdout.0",
                logs / f"{self.name}.stderr.0",
            )
        except OSError as exc:
            message = f"failed to launch command with executor: {exc}"
            self.event("Driver Failure", message, DriverError=message, FailsTask=True)
            return None
        self.proc = proc
        self.event("Started", "Task started by client")
        self.set_state("running")
        await self._register_services(env)
        code = await proc.wait()
        host.procs.forget(proc)
        # Any grandchildren left in the group go with the leader.
        host.procs.signal_group(proc, 9)
        self.proc = None
        await self._deregister_services()
        signal_no = -code if code < 0 else 0
        self.event(
            "Terminated",
            f"Exit Code: {code if code >= 0 else 0}" + (f", Signal: {signal_no}" if signal_no else ""),
            ExitCode=code if code >= 0 else 0,
            Signal=signal_no,
        )
        self.ar.report()
        return code if code >= 0 else 128 + signal_no

    async def kill(self, reason: str = "") -> None:
        """Stop the task as Nomad does: kill_signal, kill_timeout, then SIGKILL."""
        self.kill_requested.set()
        self.kill_reason = reason
        proc = self.proc
        if proc is None:
            return
        timeout_ns = int(self.task.get("KillTimeout") or 5 * NS)
        signal_name = str(self.task.get("KillSignal") or "SIGINT")
        self.event(
            "Killing",
            f"Sent interrupt. Waiting {format_go_duration(timeout_ns)} before force killing",
            KillTimeout=timeout_ns,
            KillReason=reason,
        )
        self.ar.report()
        await self.ar.host.procs.stop(proc, signal_number(signal_name), timeout_ns / NS)

    def crash(self) -> None:
        """The machine died: SIGKILL without any bookkeeping."""
        if self.proc is not None:
            self.ar.host.procs.signal_group(self.proc, 9)

    # -- services -------------------------------------------------------

    async def _register_services(self, env: TaskEnv) -> None:
        services = self.task.get("Services") or []
        if not services:
            return
        self.registrations = self.ar.registrations_for(services, self.name, env)
        await self.ar.register(self.registrations)

    async def _deregister_services(self) -> None:
        regs, self.registrations = self.registrations, []
        await self.ar.deregister(regs)

    # -- templates ------------------------------------------------------

    async def _watch_templates(self) -> None:
        """Re-render when Consul data or a Nomad variable changes; apply change_mode."""
        assert self.data is not None
        agent = self.template_consul
        wait_s = 30.0
        while True:
            deps = set().union(*(t.used for t in self.templates))
            if not deps:
                return
            watches: set[asyncio.Task[Any]] = {
                asyncio.create_task(
                    fetch_dependency(
                        agent, self.data, dep, index=self.data.indexes.get(dep, 0) or 1, wait_s=wait_s
                    )
                )
                for dep in deps
                if not isinstance(dep, tmpl.VarQuery)
            }
            if any(isinstance(dep, tmpl.VarQuery) for dep in deps):
                # Nomad's template runner watches its variables as it watches Consul.
                watches.add(asyncio.create_task(self.ar.host.variables.wait_change(wait_s)))
            try:
                done, _ = await asyncio.wait(watches, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in watches:
                    if not t.done():
                        t.cancel()
            errors = [t.exception() for t in done if t.exception() is not None]
            if errors:
                await asyncio.sleep(self.ar.host.config.template_retry_s)
            before = {id(tp): tp.rendered for tp in self.templates}
            try:
                changed = await self._render_all(block=False)
            except (tmpl.TemplateError, ConsulError) as exc:
                log.warning("template re-render failed for %s/%s: %s", self.ar.alloc.id, self.name, exc)
                continue
            if not changed:
                continue
            modes = {
                str(tp.spec.get("ChangeMode") or "restart")
                for tp in self.templates
                if before.get(id(tp)) != tp.rendered
            }
            if "restart" in modes and self.proc is not None:
                self.event(
                    "Restart Signaled",
                    "Template with change_mode restart re-rendered",
                    RestartReason="Template with change_mode restart re-rendered",
                )
                self.restart_requested.set()
                self.ar.report()
                await self.ar.host.procs.stop(
                    self.proc,
                    signal_number(str(self.task.get("KillSignal") or "SIGINT")),
                    int(self.task.get("KillTimeout") or 5 * NS) / NS,
                )
            elif "signal" in modes and self.proc is not None:
                for tp in self.templates:
                    if str(tp.spec.get("ChangeMode")) == "signal":
                        sig = str(tp.spec.get("ChangeSignal") or "SIGHUP")
                        self.event(
                            "Signaling",
                            "Template re-rendered",
                            TaskSignal=sig,
                            TaskSignalReason="Template re-rendered",
                        )
                        self.ar.host.procs.signal_group(self.proc, signal_number(sig))
                self.ar.report()


class AllocRunner:
    """All tasks of one allocation on one simulated node."""

    def __init__(self, host: ClientHost, alloc: AllocRecord) -> None:
        self.host = host
        self.alloc = alloc
        self.group = _group(alloc.job, alloc.task_group)
        self.root = host.alloc_root(alloc.id)
        self.tasks: dict[str, TaskRunner] = {}
        self.stop_requested = asyncio.Event()
        self.group_registrations: list[Registration] = []
        # By service id: the registrations Consul's agent has not taken yet, tried again.
        self.retrying: dict[str, asyncio.Task[None]] = {}
        self.main: asyncio.Task[None] | None = None
        self.crashed = False
        self.task_handles: list[asyncio.Task[None]] = []

    def alloc_doc(self) -> JSON:
        return self.host.store.alloc_json(self.alloc)

    def report(self) -> None:
        if self.crashed:
            return
        status, description = client_status(self.alloc.task_states)
        if self.alloc.client_status not in ("lost",):
            self.alloc.client_status = status
            self.alloc.client_description = description
        self.host.report(self.alloc)

    def start(self) -> None:
        self.main = asyncio.create_task(self._run(), name=f"alloc-{self.alloc.id}")

    def stop(self) -> None:
        self.stop_requested.set()

    async def crash(self) -> None:
        """The node died: kill every process now, report nothing."""
        self.crashed = True
        for runner in self.tasks.values():
            runner.crash()
        handles = [h for h in [self.main, *self.task_handles, *self.retrying.values()] if h is not None]
        self.retrying = {}
        for handle in handles:
            handle.cancel()
        for handle in handles:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await handle
        for runner in self.tasks.values():
            if runner.proc is not None:
                self.host.procs.forget(runner.proc)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(runner.proc.wait(), 5.0)

    async def wait(self) -> None:
        if self.main is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.main

    # -- services -------------------------------------------------------

    def registrations_for(self, services: list[JSON], workload: str, env: TaskEnv) -> list[Registration]:
        ports = {
            str(p["Label"]): int(p["Value"])
            for p in ((self.alloc.allocated.get("Shared") or {}).get("Ports") or [])
        }
        regs: list[Registration] = []
        for service in services:
            if (service.get("Provider") or "consul") != "consul":
                continue
            svc = env.interpolate_any(service)
            label = str(svc.get("PortLabel") or "")
            port = ports.get(label, 0)
            if not port and label.isdigit():
                port = int(label)
            address = str(svc.get("Address") or "127.0.0.1")
            regs.append(
                registration(
                    alloc_id=self.alloc.id,
                    workload=workload,
                    service=svc,
                    address=address,
                    port=port,
                    check_ports=ports,
                )
            )
        return regs

    async def register(self, regs: list[Registration]) -> None:
        agent = self.host.consul_for(self.alloc.node_id)
        if agent is None or self.crashed:
            return
        for reg in regs:
            try:
                await agent.register(reg)
            except ConsulError as exc:
                # Nomad's sync loop tries again (service_client.go, Run): the allocation
                # runs on, its service missing from Consul until the agent takes it.
                log.warning("consul registration of %s failed: %s", reg.service["ID"], exc)
                key = str(reg.service["ID"])
                self.retrying[key] = asyncio.create_task(self._register_later(reg), name=f"register-{key}")

    async def _register_later(self, reg: Registration) -> None:
        config = self.host.config
        failures = 1
        try:
            while True:
                await asyncio.sleep(min(config.consul_retry_s * failures, config.consul_retry_max_s))
                agent = self.host.consul_for(self.alloc.node_id)
                if agent is None or self.crashed:
                    return
                try:
                    await agent.register(reg)
                    return
                except ConsulError:
                    failures += 1
        finally:
            key = str(reg.service["ID"])
            if self.retrying.get(key) is asyncio.current_task():
                del self.retrying[key]

    async def deregister(self, regs: list[Registration]) -> None:
        for reg in regs:
            retry = self.retrying.pop(str(reg.service["ID"]), None)
            if retry is not None:
                await cancel_and_wait(retry)
        agent = self.host.consul_for(self.alloc.node_id)
        if agent is None or self.crashed:
            return
        for reg in regs:
            try:
                await agent.deregister(str(reg.service["ID"]))
            except ConsulError as exc:
                log.warning("consul deregistration of %s failed: %s", reg.service["ID"], exc)

    # -- lifecycle ------------------------------------------------------

    async def _run(self) -> None:
        for sub in ("alloc/logs", "alloc/data", "alloc/tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        tasks = list(self.group.get("Tasks") or [])
        for task in tasks:
            state = self.alloc.task_states.setdefault(str(task["Name"]), TaskStateRecord())
            state.events.append(task_event("Received", "Task received by client"))
        self.report()
        group_env = build_env(
            alloc=self.alloc_doc(),
            job=self.alloc.job,
            group=self.group,
            task={"Name": "group"},
            alloc_dir=str(self.root / "alloc"),
            task_dir=str(self.root / "alloc"),
            region=self.host.store.region,
            datacenter=self.host.store.nodes[self.alloc.node_id].spec.datacenter,
            node=self.host.node_values(self.alloc.node_id),
        )
        self.group_registrations = self.registrations_for(
            list(self.group.get("Services") or []), f"group-{self.alloc.task_group}", group_env
        )
        await self.register(self.group_registrations)

        prestart = [t for t in tasks if _hook(t)[0] == "prestart"]
        poststart = [t for t in tasks if _hook(t)[0] == "poststart"]
        poststop = [t for t in tasks if _hook(t)[0] == "poststop"]
        main = [t for t in tasks if _hook(t)[0] == ""]
        failed = False
        running: list[TaskRunner] = []
        for task in prestart:
            runner = self._start_task(task)
            if _hook(task)[1]:
                running.append(runner)
                continue
            await self._wait_one(runner)
            if runner.state.failed:
                failed = True
                break
        if not failed and not self.stop_requested.is_set():
            for task in main + poststart:
                running.append(self._start_task(task))
            failed = await self._supervise(running, main)
        # Stop: services out first, then shutdown_delay, then kill.
        await self.deregister(self.group_registrations)
        self.group_registrations = []
        reason = "Sibling task failed" if failed else ""
        if not failed and not self.alloc.desired_transition.get("NoShutdownDelay"):
            delay_ns = int(self.group.get("ShutdownDelay") or 0)
            for runner in running:
                if not runner.done.is_set():
                    delay_ns = max(delay_ns, int(runner.task.get("ShutdownDelay") or 0))
                    for reg in runner.registrations:
                        await self.deregister([reg])
                    runner.registrations = []
            if delay_ns > 0 and any(not r.done.is_set() for r in running):
                await asyncio.sleep(delay_ns / NS)
        for runner in running:
            if not runner.done.is_set():
                if failed:
                    runner.event("Sibling Task Failed", "Task's sibling failed")
                await runner.kill(reason)
        for runner in running:
            await runner.done.wait()
        for task in poststop:
            runner = self._start_task(task)
            await self._wait_one(runner)
        # Tasks that never started (stop during prestart) end dead without failing.
        for name, state in self.alloc.task_states.items():
            if state.state == "pending":
                state.state = "dead"
                state.finished_at = now_ns()
                del name
        self.report()

    def _start_task(self, task: JSON) -> TaskRunner:
        runner = TaskRunner(self, task)
        self.tasks[runner.name] = runner
        self.task_handles.append(
            asyncio.create_task(runner.run(), name=f"task-{self.alloc.id}-{runner.name}")
        )
        return runner

    async def _wait_one(self, runner: TaskRunner) -> None:
        stop = asyncio.create_task(self.stop_requested.wait())
        done = asyncio.create_task(runner.done.wait())
        try:
            await asyncio.wait({stop, done}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if not runner.done.is_set():
            await runner.kill()
            await done

    async def _supervise(self, running: list[TaskRunner], main: list[JSON]) -> bool:
        """Wait for a stop request, a failed task, or all main tasks finishing. True if a task failed."""
        main_names = {str(t["Name"]) for t in main}
        leaders = {str(t["Name"]) for t in main if t.get("Leader")}
        while True:
            waiters = [asyncio.create_task(self.stop_requested.wait())]
            waiters += [asyncio.create_task(r.done.wait()) for r in running if not r.done.is_set()]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
            if self.stop_requested.is_set():
                return False
            if any(r.done.is_set() and r.state.failed for r in running):
                return True
            finished = {r.name for r in running if r.done.is_set()}
            if leaders & finished:
                return False
            if main_names and main_names <= finished:
                return False
