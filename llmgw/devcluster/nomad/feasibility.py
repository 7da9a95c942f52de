"""Where a task group can run: constraints, drivers, devices, ports, CPU and memory.

Owns: Nomad's feasibility checks and bin-packing for one placement at a time, and the
``AllocationMetric`` documents they produce (NodesEvaluated, NodesFiltered,
ConstraintFiltered with Nomad's reasons such as ``"missing drivers"``,
``"missing devices"``, ``"distinct_hosts"`` or ``"${attr.kernel.name} = linux"``,
NodesExhausted and DimensionExhausted such as ``"devices: no devices match request"``).

It is pure apart from the injected ``pick_port`` callable: it reads node and alloc
records and returns values; the scheduler applies them.

Must not: write state, create evaluations or start processes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from llmgw.devcluster.nomad.state import AllocRecord, NodeRecord

JSON = dict[str, Any]

_UNITS: dict[str, tuple[str, float]] = {
    "b": ("byte", 1),
    "kb": ("byte", 1e3),
    "kib": ("byte", 1024),
    "mb": ("byte", 1e6),
    "mib": ("byte", 1024**2),
    "gb": ("byte", 1e9),
    "gib": ("byte", 1024**3),
    "tb": ("byte", 1e12),
    "tib": ("byte", 1024**4),
    "hz": ("hz", 1),
    "khz": ("hz", 1e3),
    "mhz": ("hz", 1e6),
    "ghz": ("hz", 1e9),
    "mw": ("watt", 1e-3),
    "w": ("watt", 1),
    "kw": ("watt", 1e3),
    "mb/s": ("bps", 1e6),
    "gb/s": ("bps", 1e9),
}


# ---------------------------------------------------------------------------
# Targets and constraints


def resolve_target(target: str, node: NodeRecord, region: str = "global") -> tuple[str | None, bool]:
    """The value a constraint operand names on ``node``; literals resolve to themselves."""
    if not (target.startswith("${") and target.endswith("}")):
        return target, True
    name = target[2:-1]
    node_fields = {
        "node.unique.id": node.id,
        "node.unique.name": node.spec.name,
        "node.datacenter": node.spec.datacenter,
        "node.class": node.spec.node_class,
        "node.pool": node.spec.node_pool,
        "node.region": region,
    }
    if name in node_fields:
        return node_fields[name], True
    if name.startswith("attr."):
        value = node.attributes.get(name[5:])
        return value, value is not None
    if name.startswith("meta."):
        value = node.meta.get(name[5:])
        return value, value is not None
    return None, False


def _as_number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def _compare_order(op: str, left: str, right: str) -> bool:
    ln, rn = _as_number(left), _as_number(right)
    lv: Any
    rv: Any
    if ln is not None and rn is not None:
        lv, rv = ln, rn
    else:
        lv, rv = left, right
    return bool({"<": lv < rv, "<=": lv <= rv, ">": lv > rv, ">=": lv >= rv}[op])


def _version_tuple(text: str) -> tuple[int, ...] | None:
    match = re.match(r"^v?(\d+(?:\.\d+)*)", text.strip())
    if not match:
        return None
    return tuple(int(p) for p in match.group(1).split("."))


def _check_version(constraint: str, value: str) -> bool:
    have = _version_tuple(value)
    if have is None:
        return False
    for part in constraint.split(","):
        match = re.match(r"^\s*(>=|<=|!=|~>|=|>|<)?\s*(\S+)\s*$", part)
        if not match:
            return False
        op = match.group(1) or "="
        want = _version_tuple(match.group(2))
        if want is None:
            return False
        width = max(len(have), len(want))
        h = have + (0,) * (width - len(have))
        w = want + (0,) * (width - len(want))
        ok = {
            "=": h == w,
            "!=": h != w,
            ">": h > w,
            ">=": h >= w,
            "<": h < w,
            "<=": h <= w,
            "~>": h >= w and h[: max(1, len(want) - 1)] == w[: max(1, len(want) - 1)],
        }[op]
        if not ok:
            return False
    return True


def check_operand(op: str, left: str | None, left_ok: bool, right: str | None, right_ok: bool) -> bool:
    """Nomad's checkConstraint for one resolved pair of operands."""
    if op in ("is_set",):
        return left_ok
    if op in ("is_not_set",):
        return not left_ok
    if op in ("distinct_hosts", "distinct_property"):
        return True  # handled by the placement loop, not per node
    if not left_ok or not right_ok or left is None or right is None:
        return False
    if op in ("=", "==", "is"):
        return left == right
    if op in ("!=", "not"):
        return left != right
    if op in ("<", "<=", ">", ">="):
        return _compare_order(op, left, right)
    if op == "regexp":
        try:
            return re.search(right, left) is not None
        except re.error:
            return False
    if op in ("version", "semver"):
        return _check_version(right, left)
    if op in ("set_contains", "set_contains_all"):
        have = {s.strip() for s in left.split(",")}
        return all(s.strip() in have for s in right.split(","))
    if op == "set_contains_any":
        have = {s.strip() for s in left.split(",")}
        return any(s.strip() in have for s in right.split(","))
    return False


def constraint_string(c: JSON) -> str:
    """Constraint.String() in Nomad: how a filtered constraint is named in the metrics."""
    return f"{c.get('LTarget') or ''} {c.get('Operand') or '='} {c.get('RTarget') or ''}"


def node_meets(c: JSON, node: NodeRecord, region: str) -> bool:
    op = c.get("Operand") or "="
    left, left_ok = resolve_target(c.get("LTarget") or "", node, region)
    right, right_ok = resolve_target(c.get("RTarget") or "", node, region)
    return check_operand(op, left, left_ok, right, right_ok)


# ---------------------------------------------------------------------------
# Devices


def parse_device_name(name: str) -> tuple[str, str, str]:
    """``gpu`` / ``nvidia/gpu`` / ``nvidia/gpu/H100`` as (vendor, type, model)."""
    parts = name.split("/")
    if len(parts) == 1:
        return "", parts[0], ""
    if len(parts) == 2:
        return parts[0], parts[1], ""
    return parts[0], parts[1], "/".join(parts[2:])


def _attribute_value(attr: JSON) -> tuple[Any, str]:
    for key in ("Int", "Float", "Bool", "String"):
        if attr.get(key) is not None:
            return attr[key], str(attr.get("Unit") or "")
    return None, ""


def _parse_attribute_literal(text: str) -> tuple[Any, str]:
    match = re.match(r"^\s*(-?\d+(?:\.\d+)?)\s*([A-Za-z/]+)?\s*$", text)
    if match:
        number = float(match.group(1))
        return number, match.group(2) or ""
    if text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true", ""
    return text, ""


def _to_base(value: Any, unit: str) -> tuple[Any, str]:
    if not unit or not isinstance(value, (int, float)) or isinstance(value, bool):
        return value, ""
    known = _UNITS.get(unit.lower())
    if known is None:
        return value, unit
    base, factor = known
    return float(value) * factor, base


def device_target(target: str, group: JSON) -> tuple[Any, str, bool]:
    """A device constraint operand: (value, unit, found)."""
    if not (target.startswith("${") and target.endswith("}")):
        value, unit = _parse_attribute_literal(target)
        return value, unit, True
    name = target[2:-1]
    if name == "device.model":
        return group.get("Name"), "", True
    if name == "device.vendor":
        return group.get("Vendor"), "", True
    if name == "device.type":
        return group.get("Type"), "", True
    if name == "device.ids":
        return ",".join(i["ID"] for i in group.get("Instances") or []), "", True
    if name.startswith("device.attr."):
        attr = (group.get("Attributes") or {}).get(name[len("device.attr.") :])
        if attr is None:
            return None, "", False
        value, unit = _attribute_value(attr)
        return value, unit, True
    return None, "", False


def device_constraint_ok(c: JSON, group: JSON) -> bool:
    op = c.get("Operand") or "="
    lv, lu, lok = device_target(c.get("LTarget") or "", group)
    rv, ru, rok = device_target(c.get("RTarget") or "", group)
    if op == "is_set":
        return lok
    if op == "is_not_set":
        return not lok
    if not lok or not rok:
        return False
    lb, lbase = _to_base(lv, lu)
    rb, rbase = _to_base(rv, ru)
    if isinstance(lb, (int, float)) and isinstance(rb, (int, float)) and lbase == rbase:
        cmp_ops = {
            "=": lb == rb,
            "==": lb == rb,
            "is": lb == rb,
            "!=": lb != rb,
            "not": lb != rb,
            "<": lb < rb,
            "<=": lb <= rb,
            ">": lb > rb,
            ">=": lb >= rb,
        }
        if op in cmp_ops:
            return cmp_ops[op]
    return check_operand(op, str(lv), True, str(rv), True)


def device_group_matches(request: JSON, group: JSON) -> bool:
    vendor, dtype, model = parse_device_name(str(request.get("Name") or ""))
    if dtype and group.get("Type") != dtype:
        return False
    if vendor and group.get("Vendor") != vendor:
        return False
    if model and group.get("Name") != model:
        return False
    return all(device_constraint_ok(c, group) for c in request.get("Constraints") or [])


# ---------------------------------------------------------------------------
# Placement


@dataclass
class Metric:
    """AllocationMetric being accumulated for one placement attempt."""

    nodes_evaluated: int = 0
    nodes_filtered: int = 0
    nodes_in_pool: int = 0
    nodes_available: dict[str, int] = field(default_factory=dict)
    class_filtered: dict[str, int] = field(default_factory=dict)
    constraint_filtered: dict[str, int] = field(default_factory=dict)
    nodes_exhausted: int = 0
    class_exhausted: dict[str, int] = field(default_factory=dict)
    dimension_exhausted: dict[str, int] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    coalesced: int = 0

    def filter(self, node: NodeRecord, reason: str) -> None:
        self.nodes_filtered += 1
        if node.spec.node_class:
            self.class_filtered[node.spec.node_class] = self.class_filtered.get(node.spec.node_class, 0) + 1
        self.constraint_filtered[reason] = self.constraint_filtered.get(reason, 0) + 1

    def exhaust(self, node: NodeRecord, dimension: str) -> None:
        self.nodes_exhausted += 1
        if node.spec.node_class:
            self.class_exhausted[node.spec.node_class] = self.class_exhausted.get(node.spec.node_class, 0) + 1
        self.dimension_exhausted[dimension] = self.dimension_exhausted.get(dimension, 0) + 1

    def as_json(self) -> JSON:
        return {
            "NodesEvaluated": self.nodes_evaluated,
            "NodesFiltered": self.nodes_filtered,
            "NodesInPool": self.nodes_in_pool,
            "NodePool": "default",
            "NodesAvailable": self.nodes_available,
            "ClassFiltered": self.class_filtered or None,
            "ConstraintFiltered": self.constraint_filtered or None,
            "NodesExhausted": self.nodes_exhausted,
            "ClassExhausted": self.class_exhausted or None,
            "DimensionExhausted": self.dimension_exhausted or None,
            "QuotaExhausted": None,
            "ResourcesExhausted": None,
            "Scores": self.scores or None,
            "ScoreMetaData": None,
            "AllocationTime": 0,
            "CoalescedFailures": self.coalesced,
        }


@dataclass
class Placement:
    node: NodeRecord
    allocated: JSON  # AllocatedResources
    metric: Metric


@dataclass
class Usage:
    """What the live (and already proposed) allocations hold."""

    devices: dict[str, set[str]] = field(default_factory=dict)  # node id -> instance ids
    ports: set[int] = field(default_factory=set)  # host-wide: all simulated nodes share 127.0.0.1
    cpu: dict[str, int] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)
    job_nodes: dict[str, set[str]] = field(default_factory=dict)  # job id -> node ids
    group_nodes: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    group_count: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (job, group, node)

    def add(self, job_id: str, group: str, node_id: str, allocated: JSON) -> None:
        for task in (allocated.get("Tasks") or {}).values():
            for dev in task.get("Devices") or []:
                self.devices.setdefault(node_id, set()).update(dev.get("DeviceIDs") or [])
            self.cpu[node_id] = self.cpu.get(node_id, 0) + int((task.get("Cpu") or {}).get("CpuShares") or 0)
            self.memory[node_id] = self.memory.get(node_id, 0) + int(
                (task.get("Memory") or {}).get("MemoryMB") or 0
            )
        for port in (allocated.get("Shared") or {}).get("Ports") or []:
            self.ports.add(int(port["Value"]))
        self.job_nodes.setdefault(job_id, set()).add(node_id)
        self.group_nodes.setdefault((job_id, group), set()).add(node_id)
        key = (job_id, group, node_id)
        self.group_count[key] = self.group_count.get(key, 0) + 1


def usage_of(allocs: Iterable[AllocRecord]) -> Usage:
    """What ``allocs`` hold. Like Nomad's ``ProposedAllocs`` (scheduler/feasible/context.go),
    an allocation told to stop keeps its devices, ports and distinct_hosts slot until its
    client reports it terminal (its tasks have exited); the caller leaves out the ones the
    same plan stops."""
    usage = Usage()
    for alloc in allocs:
        if alloc.client_terminal():
            continue
        usage.add(alloc.job_id, alloc.task_group, alloc.node_id, alloc.allocated)
    return usage


# scheduler/feasible/feasible.go, FilterConstraintHostVolumes; checked after the group's
# constraints and before its devices (the generic stack's task group checkers, stack.go).
FILTER_HOST_VOLUMES = "missing compatible host volumes"


def has_host_volumes(group: JSON, node: NodeRecord) -> bool:
    """Nomad's ``HostVolumeChecker.hasVolumes`` for volumes of the client config: every host
    volume the group asks for exists on the node by its ``source``, and a read-only one is
    asked for read-only. (Dynamic host volumes and ``per_alloc`` are not modelled.)"""
    for request in (group.get("Volumes") or {}).values():
        if (request.get("Type") or "") != "host":
            continue
        for volume in node.spec.host_volumes:
            if volume.name == request.get("Source") and (
                bool(request.get("ReadOnly")) or not volume.read_only
            ):
                break
        else:
            return False
    return True


def _has_distinct_hosts(constraints: Iterable[JSON]) -> bool:
    for c in constraints:
        if (c.get("Operand") or "") == "distinct_hosts" and str(
            c.get("RTarget") or "true"
        ).lower() != "false":
            return True
    return False


def _group_networks(group: JSON) -> list[JSON]:
    nets = list(group.get("Networks") or [])
    for task in group.get("Tasks") or []:
        nets.extend((task.get("Resources") or {}).get("Networks") or [])
    return nets


class Placer:
    """Finds a node for one allocation of a task group, like Nomad's generic stack."""

    def __init__(
        self,
        nodes: list[NodeRecord],
        usage: Usage,
        region: str,
        pick_port: Callable[[set[int]], int],
    ) -> None:
        self.nodes = sorted(nodes, key=lambda n: n.spec.name)
        self.usage = usage
        self.region = region
        self.pick_port = pick_port

    def candidate_nodes(self, job: JSON) -> tuple[list[NodeRecord], dict[str, int], int]:
        datacenters = job.get("Datacenters") or ["*"]
        pool = job.get("NodePool") or "default"
        in_pool = [n for n in self.nodes if pool in ("all", n.spec.node_pool)]
        ready = [
            n
            for n in in_pool
            if n.status == "ready" and any(_dc_match(dc, n.spec.datacenter) for dc in datacenters)
        ]
        available: dict[str, int] = {}
        for n in ready:
            available[n.spec.datacenter] = available.get(n.spec.datacenter, 0) + 1
        return ready, available, len(in_pool)

    def place(self, job: JSON, group: JSON, *, avoid_node: str = "") -> Placement | Metric:
        """A placement, or the Metric explaining why none was possible."""
        job_id = str(job["ID"])
        group_name = str(group["Name"])
        metric = Metric()
        candidates, available, in_pool = self.candidate_nodes(job)
        metric.nodes_available = available
        metric.nodes_in_pool = in_pool
        job_constraints = job.get("Constraints") or []
        tasks = group.get("Tasks") or []
        group_constraints = list(group.get("Constraints") or [])
        for task in tasks:
            group_constraints.extend(task.get("Constraints") or [])
        job_distinct = _has_distinct_hosts(job_constraints)
        group_distinct = _has_distinct_hosts(group_constraints)
        ranked: list[tuple[tuple[int, int, str], NodeRecord, JSON]] = []
        for node in candidates:
            metric.nodes_evaluated += 1
            reason = self._filter_reason(node, job_constraints, group_constraints, tasks, group)
            if reason is None and job_distinct and node.id in self.usage.job_nodes.get(job_id, set()):
                reason = "distinct_hosts"
            if (
                reason is None
                and group_distinct
                and node.id in self.usage.group_nodes.get((job_id, group_name), set())
            ):
                reason = "distinct_hosts"
            if reason is not None:
                metric.filter(node, reason)
                continue
            offer = self._offer(node, group, metric)
            if offer is None:
                continue
            same_group = self.usage.group_count.get((job_id, group_name, node.id), 0)
            free_devices = sum(len(g.get("Instances") or []) for g in node.devices) - len(
                self.usage.devices.get(node.id, set())
            )
            # Spread copies of one group (job anti-affinity), then bin-pack devices,
            # then prefer a node other than the one being replaced.
            score = (same_group + (1 if node.id == avoid_node else 0), free_devices, node.spec.name)
            ranked.append((score, node, offer))
            metric.scores[f"{node.id}.binpack"] = 1.0 / (1 + free_devices)
        if not ranked:
            return metric
        ranked.sort(key=lambda r: r[0])
        _, node, offer = ranked[0]
        self.usage.add(job_id, group_name, node.id, offer)
        return Placement(node, offer, metric)

    def _filter_reason(
        self,
        node: NodeRecord,
        job_constraints: list[JSON],
        group_constraints: list[JSON],
        tasks: list[JSON],
        group: JSON,
    ) -> str | None:
        for c in job_constraints:
            if not node_meets(c, node, self.region):
                return constraint_string(c)
        for task in tasks:
            driver = str(task.get("Driver") or "")
            info = node.drivers.get(driver)
            if info is None or not info.get("Detected") or not info.get("Healthy"):
                return "missing drivers"
        for c in group_constraints:
            if not node_meets(c, node, self.region):
                return constraint_string(c)
        if not has_host_volumes(group, node):
            return FILTER_HOST_VOLUMES
        for task in tasks:
            for request in (task.get("Resources") or {}).get("Devices") or []:
                count = int(request.get("Count") or 1)
                healthy = sum(
                    sum(1 for i in g.get("Instances") or [] if i.get("Healthy"))
                    for g in node.devices
                    if device_group_matches(request, g)
                )
                if healthy < count:
                    return "missing devices"
        return None

    def _offer(self, node: NodeRecord, group: JSON, metric: Metric) -> JSON | None:
        """AllocatedResources for ``group`` on ``node``, or None (and the exhausted dimension noted)."""
        used_devices = set(self.usage.devices.get(node.id, set()))
        tasks_out: dict[str, JSON] = {}
        cpu_total = 0
        mem_total = 0
        for task in group.get("Tasks") or []:
            resources = task.get("Resources") or {}
            cpu = int(resources.get("CPU") or 100)
            mem = int(resources.get("MemoryMB") or 300)
            cpu_total += cpu
            mem_total += mem
            devices_out: list[JSON] = []
            for request in resources.get("Devices") or []:
                count = int(request.get("Count") or 1)
                picked: JSON | None = None
                for g in node.devices:
                    if not device_group_matches(request, g):
                        continue
                    free = [
                        i["ID"]
                        for i in g.get("Instances") or []
                        if i.get("Healthy") and i["ID"] not in used_devices
                    ]
                    if len(free) >= count:
                        ids = sorted(free)[:count]
                        used_devices.update(ids)
                        picked = {
                            "Vendor": g["Vendor"],
                            "Type": g["Type"],
                            "Name": g["Name"],
                            "DeviceIDs": ids,
                        }
                        break
                if picked is None:
                    metric.exhaust(node, "devices: no devices match request")
                    return None
                devices_out.append(picked)
            tasks_out[str(task["Name"])] = {
                "Cpu": {"CpuShares": cpu},
                "Memory": {"MemoryMB": mem, "MemoryMaxMB": int(resources.get("MemoryMaxMB") or 0)},
                "Networks": None,
                "Devices": devices_out or None,
            }
        if self.usage.cpu.get(node.id, 0) + cpu_total > node.spec.cpu_shares:
            metric.exhaust(node, "cpu")
            return None
        if self.usage.memory.get(node.id, 0) + mem_total > node.spec.memory_mb:
            metric.exhaust(node, "memory")
            return None
        ports, networks = self._ports(group, node, metric)
        if ports is None:
            return None
        disk = int((group.get("EphemeralDisk") or {}).get("SizeMB") or 300)
        return {
            "Tasks": tasks_out,
            "Shared": {"DiskMB": disk, "Networks": networks, "Ports": ports or None},
        }

    def _ports(
        self, group: JSON, node: NodeRecord, metric: Metric
    ) -> tuple[list[JSON] | None, list[JSON] | None]:
        taken = set(self.usage.ports)
        ports: list[JSON] = []
        networks: list[JSON] = []
        for net in _group_networks(group):
            reserved_out: list[JSON] = []
            dynamic_out: list[JSON] = []
            for port in net.get("ReservedPorts") or []:
                value = int(port.get("Value") or 0)
                if value in taken:
                    metric.exhaust(node, f"network: reserved port collision {port.get('Label')}={value}")
                    return None, None
                taken.add(value)
                reserved_out.append({**port, "HostNetwork": port.get("HostNetwork") or "default"})
                ports.append(
                    {
                        "Label": port.get("Label"),
                        "Value": value,
                        "To": int(port.get("To") or 0),
                        "HostIP": "127.0.0.1",
                    }
                )
            for port in net.get("DynamicPorts") or []:
                value = self.pick_port(taken)
                taken.add(value)
                to = int(port.get("To") or 0)
                dynamic_out.append(
                    {**port, "Value": value, "HostNetwork": port.get("HostNetwork") or "default"}
                )
                ports.append(
                    {
                        "Label": port.get("Label"),
                        "Value": value,
                        "To": value if to == -1 else to,
                        "HostIP": "127.0.0.1",
                    }
                )
            networks.append(
                {
                    "Mode": net.get("Mode") or "host",
                    "Device": "lo",
                    "IP": "127.0.0.1",
                    "CIDR": "",
                    "MBits": net.get("MBits"),
                    "DNS": None,
                    "Hostname": "",
                    "CNI": None,
                    "ReservedPorts": reserved_out or None,
                    "DynamicPorts": dynamic_out or None,
                }
            )
        return ports, (networks or None)


def _dc_match(pattern: str, dc: str) -> bool:
    if pattern == "*":
        return True
    if "*" in pattern:
        return re.fullmatch(re.escape(pattern).replace(r"\*", ".*"), dc) is not None
    return pattern == dc
