"""The deployment watcher: each deploying allocation's health, and a deployment's end.

Owns what Nomad splits between the client's health tracker (``client/allochealth``: an
allocation is healthy once its tasks have run for the group's ``min_healthy_time`` and,
with ``health_check = "checks"``, its Consul checks pass; unhealthy when the
``healthy_deadline`` passes first, or when it fails) and the server's deployment watcher
(``nomad/deploymentwatcher/deployment_watcher.go``: a deployment succeeds once every
group has ``DesiredTotal`` healthy allocations; it fails at the first unhealthy
allocation that cannot be rescheduled (``shouldFailEarly``: llmgw's groups never
reschedule), or when a group's ``RequireProgressBy`` passes (``shouldFail``)). Each
status change creates an evaluation, as Nomad's watcher does.

Must not: place allocations (the scheduler does, and stops placing after a failed
deployment) or speak HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llmgw.devcluster.nomad.consul_http import ConsulError
from llmgw.devcluster.nomad.state import (
    EV_ALLOC_UPDATED,
    AllocRecord,
    DeploymentRecord,
    now_ns,
)

if TYPE_CHECKING:
    from llmgw.devcluster.nomad.standin import NomadStandIn

JSON = dict[str, Any]
NS = 1_000_000_000
HEALTH_POLL_S = 0.2  # how often a deploying allocation's task states and checks are looked at
DESC_SUCCESSFUL = "Deployment completed successfully"
DESC_UNHEALTHY = "Failed due to unhealthy allocations"
DESC_PROGRESS = "Failed due to progress deadline"
log = logging.getLogger(__name__)


class DeploymentWatcher:
    def __init__(
        self,
        standin: NomadStandIn,
        spawn: Callable[[Any, str], Any],
        create_eval: Callable[[str, str], Any],
    ) -> None:
        self.standin = standin
        self._spawn = spawn
        self._create_eval = create_eval
        self._watched: set[str] = set()

    def watch(self, alloc: AllocRecord) -> None:
        """Track ``alloc``'s health for its deployment (once), from when its client starts it."""
        if not alloc.deployment_id or alloc.id in self._watched:
            return
        deployment = self.standin.store.deployments.get(alloc.deployment_id)
        if deployment is None or not deployment.active() or alloc.task_group not in deployment.groups:
            return
        self._watched.add(alloc.id)
        self._spawn(self._track(alloc.id), f"deployment-health-{alloc.id}")
        state = deployment.groups[alloc.task_group]
        deadline = int(state["RequireProgressBy"])
        if deadline:
            self._spawn(self._progress_deadline(deployment.id, deadline), f"progress-{deployment.id}")

    async def _track(self, alloc_id: str) -> None:
        store = self.standin.store
        alloc = store.allocs[alloc_id]
        update = _update_of(alloc)
        min_healthy = int(update.get("MinHealthyTime") or 0)
        deadline = now_ns() + int(update.get("HealthyDeadline") or 0)
        checks = str(update.get("HealthCheck") or "checks") == "checks"
        checks_since = 0
        while True:
            alloc = store.allocs.get(alloc_id) or alloc
            deployment = store.deployments.get(alloc.deployment_id)
            if deployment is None or not deployment.active() or alloc.server_terminal():
                return
            if alloc.client_status == "failed":
                self._set_health(alloc, healthy=False)
                return
            now = now_ns()
            # Every task running for min_healthy_time since its last (re)start, or done
            # without failing (a finished prestart task).
            tasks_ok = alloc.client_status == "running" and all(
                (t.state == "running" and now - t.started_at >= min_healthy)
                or (t.state == "dead" and not t.failed)
                for t in alloc.task_states.values()
            )
            checks_ok = True
            if checks:
                if await self._checks_pass(alloc):
                    checks_since = checks_since or now
                    checks_ok = now - checks_since >= min_healthy
                else:
                    checks_since = 0
                    checks_ok = False
            if tasks_ok and checks_ok:
                self._set_health(alloc, healthy=True)
                return
            if now >= deadline:
                self._set_health(alloc, healthy=False)
                return
            await asyncio.sleep(HEALTH_POLL_S)

    async def _checks_pass(self, alloc: AllocRecord) -> bool:
        agent = self.standin.consul_for(alloc.node_id)
        if agent is None:
            return True  # no Consul: only the task states count
        try:
            found = await agent.agent_checks()
        except ConsulError:
            return False
        prefix = f"_nomad-task-{alloc.id}-"
        mine = [c for c in found if str(c.get("ServiceID") or "").startswith(prefix)]
        return all(c.get("Status") == "passing" for c in mine)

    def _set_health(self, alloc: AllocRecord, *, healthy: bool) -> None:
        store = self.standin.store
        deployment = store.deployments.get(alloc.deployment_id)
        if deployment is None or alloc.deployment_healthy is not None:
            return
        now = now_ns()
        state = deployment.groups[alloc.task_group]
        with store.txn(EV_ALLOC_UPDATED):
            alloc.deployment_healthy = healthy
            alloc.deployment_health_at = now
            store.touch_alloc(alloc)
            if healthy:
                state["HealthyAllocs"] += 1
                progress = int(state["ProgressDeadline"])
                if progress and now + progress > int(state["RequireProgressBy"]):
                    state["RequireProgressBy"] = now + progress
                    self._spawn(
                        self._progress_deadline(deployment.id, now + progress), f"progress-{deployment.id}"
                    )
            else:
                state["UnhealthyAllocs"] += 1
            store.touch_deployment(deployment)
        if not deployment.active():
            return
        if not healthy:
            # llmgw's groups never reschedule, so Nomad fails the deployment at once
            # (shouldFailEarly); a rescheduling group would wait for its progress deadline.
            if not int(state["ProgressDeadline"]) or not _reschedulable(alloc):
                self._finish(deployment, "failed", DESC_UNHEALTHY)
        elif all(s["HealthyAllocs"] >= s["DesiredTotal"] for s in deployment.groups.values()):
            self._finish(deployment, "successful", DESC_SUCCESSFUL)

    async def _progress_deadline(self, deployment_id: str, deadline: int) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(max(0.0, (deadline - now_ns()) / NS) + 0.01)
        deployment = self.standin.store.deployments.get(deployment_id)
        if deployment is None or not deployment.active():
            return
        for state in deployment.groups.values():
            by = int(state["RequireProgressBy"])
            if state["HealthyAllocs"] < state["DesiredTotal"] and by and now_ns() >= by:
                self._finish(deployment, "failed", DESC_PROGRESS)
                return

    def _finish(self, deployment: DeploymentRecord, status: str, description: str) -> None:
        store = self.standin.store
        with store.txn("DeploymentStatusUpdate"):
            deployment.status = status
            deployment.status_description = description
            store.touch_deployment(deployment)
        self._create_eval(deployment.job_id, "deployment-watcher")


def _update_of(alloc: AllocRecord) -> JSON:
    for group in alloc.job.get("TaskGroups") or []:
        if group.get("Name") == alloc.task_group:
            return dict(group.get("Update") or {})
    return {}


def _reschedulable(alloc: AllocRecord) -> bool:
    for group in alloc.job.get("TaskGroups") or []:
        if group.get("Name") == alloc.task_group:
            policy = group.get("ReschedulePolicy") or {}
            return bool(policy.get("Unlimited")) or int(policy.get("Attempts") or 0) > 0
    return False
