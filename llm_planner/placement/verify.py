"""Independent verifier and simulator: checks a Plan against its PlacementProblem.

Nothing here trusts the solver, and nothing here uses llm_planner.placement.schedule:
every number is re-derived from the problem's cost arrays (task_time,
transfer_time, mem_* arrays, supported) by this module's own code.

Checks (each failure is one readable sentence in VerifyReport.violations):
  1. shards: sizes >= 1 summing to the batch Q, at most max_shards of them, one
     assignment per shard, the plan's objective is the problem's;
  2. assignment: every task of every shard on exactly one existing device that
     supports it, no unknown task; colocation groups on one device per shard;
  3. schedule: every (shard, task) exactly once and nothing else, on its
     assigned device, finish - start = t(i, k, b_s), start >= 0;
  4. precedence: start(v) >= finish(u) + c(e, k_u, k_v, b_s) for every edge
     e = (u, v) within a shard;
  5. no two items overlap on one device;
  6. memory: on device k, the weights of every task it holds (once, whatever the
     number of shards), plus mem_bytes_per_sample * b_s for every (task, shard)
     on k and every batch in flight, counted only where mem_counts[i, k], plus the
     largest activation workspace (workspace_bytes_per_sample * b_s) among its
     items, at most its usable memory (problem.usable). Batches in flight: 1 for
     latency, for throughput ceil(makespan / max load) from the simulation's makespan
     and the recomputed loads (llm_planner.core.plan.batches_in_flight, the launcher's
     count), which must be the plan's own;
     tensor-parallel groups: the devices used share no physical device (a device
     serves one group or itself), every group is devices of one kind in one node
     whose count the task's sharded sizes divide, and each member's own bytes
     (cost.shard_of: 1/k of the sharded weights and per-sample memory, the
     replicated parts whole) fit its kind's usable memory;
  7. objective: an event simulation (llm_planner.placement.verify_sim) re-runs every
     device's order (the plan's start times, ties broken by topological
     position) as soon as possible, and every start_s must be the simulation's;
     latency is its makespan, throughput the busiest device's load per batch
     divided by Q, with loads under the problem's throughput model ("direct" or
     "host_staged", docs/objectives.md). objective_s and max_load_s (both
     objectives) must match within rel_tol, and be finite (infinity matches
     nothing); 0 <= lower_bound_s <= objective_s * (1 + rel_tol). An order that
     deadlocks (a cycle through devices) is a violation, never a hang.

Everything here takes the plan and its problem, already built: no file is read,
so the solvers (solve.api verifies every plan it returns) reach no file loader.
A plan file is checked by llm_planner.placement.verify_file, which reads it, rebuilds its
problem from the recorded inputs and adds the file-level checks of
llm_planner.placement.verify_fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from llm_planner.core.plan import Plan, batches_in_flight
from llm_planner.core.tensor_groups import GroupError, group_from_members, is_group_name, member_names
from llm_planner.cost.roofline import shard_of
from llm_planner.placement.problem import PlacementProblem
from llm_planner.placement.verify_sim import EventSimulation

Item = tuple[int, int]  # (shard, task index)


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    ok: bool
    violations: tuple[str, ...]
    simulated_objective_s: float  # latency (s) or s per sample, recomputed; nan if it could not be
    memory_used_bytes: dict[str, float]  # every device, by the verifier's own count
    device_busy_s: dict[str, float]  # every device: sum of its task times in one batch
    device_load_s: dict[str, float] = field(default_factory=dict)  # load per batch, throughput model
    simulated_makespan_s: float = math.nan  # the simulation's makespan, whatever the objective
    memory_per_device_bytes: dict[str, float] = field(
        default_factory=dict
    )  # used devices: bytes on one (a group: on each member)
    batches_in_flight: int = 1  # of the steady state whose memory was checked (1: latency)


def verify_plan(plan: Plan, problem: PlacementProblem, *, rel_tol: float = 1e-6) -> VerifyReport:
    """Check every constraint and recompute the objective; see the module docstring."""
    if not rel_tol >= 0:
        raise ValueError(f"rel_tol must be >= 0, got {rel_tol}")
    c = _Checker(plan, problem, rel_tol)
    c.check_shards()
    assign = c.read_assignments()
    c.check_colocation(assign)
    times = c.read_schedule(assign)
    c.check_precedence(assign, times)
    c.check_overlap(assign, times)
    busy, loads = c.device_loads(assign)
    makespan = c.simulate(assign, times)
    batches = c.batches_in_flight(loads, makespan)
    memory = c.check_memory(assign, batches)
    per_device = c.check_groups(assign, batches)
    simulated = c.check_objective(loads, makespan, assign)
    names = problem.device_names
    return VerifyReport(
        ok=not c.violations,
        violations=tuple(c.violations),
        simulated_objective_s=simulated,
        memory_used_bytes={names[k]: float(memory[k]) for k in range(len(names))},
        device_busy_s={names[k]: float(busy[k]) for k in range(len(names))},
        device_load_s={names[k]: float(loads[k]) for k in range(len(names))},
        simulated_makespan_s=makespan,
        batches_in_flight=batches,
        memory_per_device_bytes={
            names[k]: float(per_device.get(k, memory[k])) for k in sorted({int(k) for a in assign for k in a if k >= 0})
        },
    )


def _s(x: float) -> str:
    return f"{x:.6g} s"


def _gb(x: float) -> str:
    return f"{x / 1e9:.4g} GB"


class _Checker:
    """Holds the plan, the problem and the violations found so far."""

    def __init__(self, plan: Plan, problem: PlacementProblem, rel_tol: float):
        self.plan, self.p, self.rel_tol = plan, problem, rel_tol
        self.violations: list[str] = []
        self.tasks = [t.name for t in problem.graph.tasks]
        self.task_index = {n: i for i, n in enumerate(self.tasks)}
        self.devices = problem.device_names
        self.device_index = {n: k for k, n in enumerate(self.devices)}
        self.num_shards = min(len(plan.shard_sizes), len(plan.shard_assignments))
        self.sizes = [int(b) for b in plan.shard_sizes[: self.num_shards]]
        self.step_s = math.nan  # a decode step's latency, with the token hand-off (simulate)
        finite = [abs(x) for st in plan.schedule for x in (st.start_s, st.finish_s) if math.isfinite(x)]
        self.atol = rel_tol * max([*finite, 1e-9])  # absolute slack for comparing times

    def bad(self, msg: str) -> None:
        self.violations.append(msg)

    def item(self, it: Item) -> str:
        return f"task {self.tasks[it[1]]!r} of shard {it[0]}"

    def close(self, a: float, b: float) -> bool:
        """Equal within rel_tol, and both finite (infinity is close to nothing)."""
        return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= self.rel_tol * max(abs(a), abs(b)) + 1e-15

    def check_shards(self) -> None:
        plan, p = self.plan, self.p
        if plan.objective != p.objective:
            self.bad(f"the plan optimises {plan.objective!r} but the problem's objective is {p.objective!r}")
        if len(plan.shard_sizes) != len(plan.shard_assignments):
            self.bad(
                f"the plan has {len(plan.shard_sizes)} shard sizes but {len(plan.shard_assignments)} shard assignments"
            )
        for s, b in enumerate(self.sizes):
            if b < 1:
                self.bad(f"shard {s} has {b} samples; every shard needs at least 1")
        if sum(plan.shard_sizes) != p.batch_size:
            self.bad(
                f"shard sizes {list(plan.shard_sizes)} sum to {sum(plan.shard_sizes)}, "
                f"not the batch size {p.batch_size}"
            )
        if len(plan.shard_sizes) > p.max_shards:
            self.bad(f"the plan has {len(plan.shard_sizes)} shards but at most {p.max_shards} are allowed")

    def read_assignments(self) -> list[np.ndarray]:
        """Device index of every task per shard; -1 where missing, unknown or unsupported."""
        out = []
        for s in range(self.num_shards):
            a = np.full(len(self.tasks), -1, dtype=int)
            for name, dev in self.plan.shard_assignments[s].items():
                i, k = self.task_index.get(name), self.device_index.get(dev)
                if i is None:
                    self.bad(f"shard {s} assigns {name!r}, which is not a task of graph {self.p.graph.name!r}")
                elif k is None:
                    self.bad(f"shard {s} puts task {name!r} on {self._unknown(dev)}")
                elif not self.p.supported[i, k]:
                    self.bad(
                        f"shard {s} puts task {name!r} on device {dev!r} "
                        f"(kind {self.p.devices[k].kind!r}), which cannot run it"
                    )
                else:
                    a[i] = k
            for _i, name in enumerate(self.tasks):
                if name not in self.plan.shard_assignments[s]:
                    self.bad(f"shard {s} assigns no device to task {name!r}")
            out.append(a)
        return out

    def _unknown(self, dev: str) -> str:
        """Why `dev` is no device of the problem, for a group: what the cluster cannot form."""

        if not is_group_name(dev):
            return f"unknown device {dev!r}"
        try:
            group_from_members(self.p.cluster, member_names(dev))
        except GroupError as exc:
            return f"a tensor-parallel group the cluster cannot form: {exc}"
        return f"group {dev!r}, larger than the plan's max_tp {self.p.max_tp} or running none of the model's tasks"

    def check_colocation(self, assign: list[np.ndarray]) -> None:
        for group in self.p.colocate_groups():
            for s, a in enumerate(assign):
                devs = sorted({self.devices[a[i]] for i in group if a[i] >= 0})
                if len(devs) > 1:
                    names = ", ".join(repr(self.tasks[i]) for i in group)
                    self.bad(f"shard {s}: colocated tasks {names} are split over devices {devs}")

    def read_schedule(self, assign: list[np.ndarray]) -> dict[Item, tuple[float, float]]:
        """(start, finish) of every scheduled item, after checking each entry."""
        times: dict[Item, tuple[float, float]] = {}
        for entry in self.plan.schedule:
            s, i = entry.shard, self.task_index.get(entry.task)
            if i is None or not 0 <= s < self.num_shards:
                what = f"unknown task {entry.task!r}" if i is None else f"shard {s}, which the plan does not have"
                self.bad(f"the schedule has an entry for {what}")
                continue
            it = (s, i)
            if it in times:
                self.bad(f"{self.item(it)} is scheduled more than once")
                continue
            start, finish = float(entry.start_s), float(entry.finish_s)
            if not (math.isfinite(start) and math.isfinite(finish) and start >= 0):
                self.bad(
                    f"{self.item(it)} has start {start} s and finish {finish} s; both must be finite and start >= 0"
                )
                continue
            times[it] = (start, finish)
            k = assign[s][i]
            if k < 0:
                continue
            if entry.device != self.devices[k]:
                self.bad(f"{self.item(it)} is scheduled on {entry.device!r} but assigned to {self.devices[k]!r}")
            want = self.p.task_time(i, k, self.sizes[s])
            if abs((finish - start) - want) > self.atol + self.rel_tol * want:
                self.bad(
                    f"{self.item(it)} on {self.devices[k]!r} lasts {_s(finish - start)} "
                    f"but takes {_s(want)} for {self.sizes[s]} samples"
                )
        for s in range(self.num_shards):
            for i in range(len(self.tasks)):
                if (s, i) not in times:
                    self.bad(f"{self.item((s, i))} is missing from the schedule")
        return times

    def check_precedence(self, assign: list[np.ndarray], times: dict[Item, tuple[float, float]]) -> None:
        p = self.p
        for s in range(self.num_shards):
            a = assign[s]
            for e in range(p.num_edges):
                u, v = int(p.edge_src[e]), int(p.edge_dst[e])
                if (s, u) not in times or (s, v) not in times or a[u] < 0 or a[v] < 0:
                    continue
                moved = p.transfer_time(e, int(a[u]), int(a[v]), self.sizes[s])
                arrive = times[(s, u)][1] + moved
                if times[(s, v)][0] < arrive - self.atol:
                    self.bad(
                        f"{self.item((s, v))} starts at {_s(times[(s, v)][0])} on {self.devices[a[v]]!r}, "
                        f"before the output of {self.tasks[u]!r} arrives at {_s(arrive)} "
                        f"(finish {_s(times[(s, u)][1])} on {self.devices[a[u]]!r} + transfer {_s(moved)})"
                    )

    def check_overlap(self, assign: list[np.ndarray], times: dict[Item, tuple[float, float]]) -> None:
        by_device: dict[int, list[Item]] = {}
        for it in times:
            k = int(assign[it[0]][it[1]])
            if k >= 0:
                by_device.setdefault(k, []).append(it)
        for k, items in by_device.items():
            items.sort(key=lambda it: times[it])
            running: Item | None = None
            for it in items:
                if running is not None and times[it][0] < times[running][1] - self.atol:
                    self.bad(
                        f"device {self.devices[k]!r} runs {self.item(it)} from {_s(times[it][0])} "
                        f"while {self.item(running)} runs until {_s(times[running][1])}"
                    )
                if running is None or times[it][1] > times[running][1]:
                    running = it

    def batches_in_flight(self, loads: np.ndarray, makespan: float) -> int:
        """The steady state's batches in flight from the verifier's own makespan and loads (the
        plan's own count where the simulation could not run: the violations say why); a plan that
        claims another count is a violation."""

        if math.isnan(makespan):
            return self.plan.batches_in_flight
        batches = batches_in_flight(self.p.objective, makespan, float(loads.max()) if len(loads) else 0.0)
        if self.plan.objective == self.p.objective and batches != self.plan.batches_in_flight:
            self.bad(
                f"the plan keeps {self.plan.batches_in_flight} batch(es) in flight, but the simulated makespan "
                f"{_s(makespan)} over the recomputed max load {_s(float(loads.max()))} gives {batches}"
            )
        return batches

    def check_memory(self, assign: list[np.ndarray], batches: int = 1) -> np.ndarray:
        p = self.p
        used = np.zeros(p.num_devices)
        held: set[tuple[int, int]] = set()  # (task, device) pairs whose weights are on the device
        for s, a in enumerate(assign):
            for i, k in enumerate(a):
                if k < 0 or not p.mem_counts[i, k]:
                    continue
                used[k] += p.mem_bytes_per_sample[i] * max(self.sizes[s], 0) * batches
                if (i, int(k)) not in held:
                    held.add((i, int(k)))
                    used[k] += p.weight_bytes[i]
        self.workspace_bytes = self.workspace(assign)  # the groups' member check reads it too
        used += self.workspace_bytes
        steady = f", with {batches} batches in flight" if batches > 1 else ""
        for k in range(p.num_devices):
            if used[k] > p.usable[k] * (1 + self.rel_tol):
                self.bad(
                    f"device {self.devices[k]!r} needs {_gb(used[k])} of memory but holds {_gb(p.usable[k])} "
                    f"(over by {_gb(used[k] - p.usable[k])}{steady})"
                )
        return used

    def workspace(self, assign: list[np.ndarray]) -> np.ndarray:
        """[K] the largest activation workspace among the (task, shard) items on each device (a group:
        on each member, so k times it in all)."""
        p, out = self.p, np.zeros(self.p.num_devices)
        for s, a in enumerate(assign):
            for i, k in enumerate(a):
                if k >= 0:
                    need = p.graph.tasks[i].workspace_bytes_per_sample * max(self.sizes[s], 0)
                    out[k] = max(out[k], need * p.devices[k].degree)
        return out

    def check_groups(self, assign: list[np.ndarray], batches: int = 1) -> dict[int, float]:
        """Exclusivity, group shape and each member's memory (module docstring, 6); returns the
        bytes on each member of every used group."""
        p = self.p
        used = sorted({int(k) for a in assign for k in a if k >= 0})
        for a, b in p.conflicts(used):
            self.bad(
                f"devices {self.devices[a]!r} and {self.devices[b]!r} are both used but share a physical device "
                "(a device serves one tensor-parallel group or itself)"
            )
        return {k: self._check_group(k, p.devices[k], assign, batches) for k in used if p.devices[k].degree > 1}

    def _check_group(self, k: int, device, assign: list[np.ndarray], batches: int) -> float:

        p = self.p
        singles = p.cluster.device_map()
        members = [singles.get(m) for m in device.members]
        if None in members or len({(m.node, m.kind) for m in members}) != 1:
            self.bad(f"group {device.name!r} is not devices of one kind in one node: {list(device.members)}")
            return math.nan
        tasks = sorted({i for a in assign for i, kk in enumerate(a) if kk == k})
        for i in tasks:
            if not p.graph.tasks[i].shards_over(device.degree):
                self.bad(
                    f"task {self.tasks[i]!r} does not shard over {device.degree} devices (its sizes "
                    f"{list(p.graph.tasks[i].tp_divides)} are not all multiples of {device.degree})"
                )
        per_member = sum(shard_of(p.graph.tasks[i], device.degree).weight_bytes for i in tasks if p.mem_counts[i, k])
        per_member += batches * sum(
            shard_of(p.graph.tasks[i], device.degree).mem_bytes_per_sample * self.sizes[s]
            for s, a in enumerate(assign)
            for i, kk in enumerate(a)
            if kk == k and p.mem_counts[i, k]
        )
        per_member += self.workspace_bytes[k] / device.degree
        usable = p.cluster.kind(device.kind).usable_mem_bytes
        if per_member > usable * (1 + self.rel_tol):
            steady = f" (with {batches} batches in flight)" if batches > 1 else ""
            self.bad(f"each member of group {device.name!r} needs {_gb(per_member)} but may fill {_gb(usable)}{steady}")
        return per_member

    def device_loads(self, assign: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(task time per device, load per batch per device under the throughput model)."""
        p = self.p
        busy, comm = np.zeros(p.num_devices), np.zeros(p.num_devices)
        for s, a in enumerate(assign):
            b = self.sizes[s]
            for i, k in enumerate(a):
                if k >= 0:
                    busy[k] += p.task_time(i, int(k), b)
            if p.throughput_model == "direct":
                for e in range(p.num_edges):
                    k, l = int(a[p.edge_src[e]]), int(a[p.edge_dst[e]])
                    if k >= 0 and l >= 0 and k != l:
                        moved = p.transfer_time(e, k, l, b)
                        comm[k] += moved
                        comm[l] += moved
                if p.token_loop is not None and min(int(a[i]) for i in p.token_loop) >= 0:
                    handoff = p.token_time(a, b)  # the decode loop's token, lm_head -> embed: both ends
                    comm[int(a[p.token_loop[0]])] += handoff
                    comm[int(a[p.token_loop[1]])] += handoff
            else:  # host_staged: an output pays once leaving its accelerator, once entering each other one
                crossings: set[tuple[int, int]] = set()  # (source task, receiving device)
                for e in range(p.num_edges):
                    u, v = int(p.edge_src[e]), int(p.edge_dst[e])
                    if a[u] >= 0 and a[v] >= 0 and a[u] != a[v]:
                        crossings.add((u, int(a[v])))
                for u in sorted({u for u, _ in crossings}):
                    if not p.is_cpu[a[u]]:
                        comm[a[u]] += p.hop_s_per_sample[u] * b
                for u, l in crossings:
                    if not p.is_cpu[l]:
                        comm[l] += p.hop_s_per_sample[u] * b
        return busy, busy + comm

    def simulate(self, assign: list[np.ndarray], times: dict[Item, tuple[float, float]]) -> float:
        """Makespan of the devices' orders run as soon as possible; nan if they cannot be run.
        Each item's start must be the simulation's: a schedule that idles for no reason is not the plan's."""
        items = [(s, i) for s in range(self.num_shards) for i in range(len(self.tasks))]
        if any(it not in times or assign[it[0]][it[1]] < 0 for it in items):
            return math.nan  # the violations above already say what is missing
        topo = {self.p.graph.index(n): pos for pos, n in enumerate(self.p.graph.topological_order())}
        orders: list[list[Item]] = [[] for _ in range(self.p.num_devices)]
        for it in sorted(items, key=lambda it: (*times[it], topo[it[1]], it[0])):
            orders[int(assign[it[0]][it[1]])].append(it)
        sim = EventSimulation(self.p, self.sizes, assign, orders)
        makespan = sim.run(self)
        self.step_s = self.token_step(assign, sim.finish, makespan)
        late = [
            it
            for it in items
            if it in sim.start and abs(times[it][0] - sim.start[it]) > self.atol + self.rel_tol * sim.start[it]
        ]
        for it in late[:10]:
            self.bad(
                f"{self.item(it)} starts at {_s(times[it][0])} in the schedule, "
                f"but its device order runs it at {_s(sim.start[it])} "
                "(each item starts as soon as its device is free and its inputs have arrived)"
            )
        if len(late) > 10:
            self.bad(f"... and {len(late) - 10} more items start elsewhere than the simulation says")
        return makespan

    def token_step(self, assign: list[np.ndarray], finish: dict[Item, float], makespan: float) -> float:
        """A decode step: the makespan, or a shard's lm_head finish plus its token hand-off back to
        embed's device when that is later (PlacementProblem.token_time; docs/objectives.md)."""
        loop = self.p.token_loop
        if loop is None or math.isnan(makespan):
            return makespan
        ends = [
            finish[(s, loop[0])] + self.p.token_time(a, self.sizes[s])
            for s, a in enumerate(assign)
            if (s, loop[0]) in finish and min(int(a[i]) for i in loop) >= 0
        ]
        return max([makespan, *ends])

    def check_objective(self, loads: np.ndarray, makespan: float, assign: list[np.ndarray]) -> float:
        plan, p = self.plan, self.p
        for name in ("objective_s", "lower_bound_s", "max_load_s"):
            value = getattr(plan, name)
            if not (math.isfinite(value) and value >= 0):
                self.bad(f"{name} is {value}; it must be a finite number >= 0")
        max_load = float(loads.max()) if len(loads) else 0.0
        simulated = self.step_s if p.objective == "latency" else max_load / p.batch_size
        if math.isnan(simulated):
            self.bad("the objective cannot be recomputed: the plan is incomplete or its device orders deadlock")
        elif not self.close(plan.objective_s, simulated):
            what = "makespan" if p.objective == "latency" else "max device load / batch size"
            self.bad(f"the plan claims objective {_s(plan.objective_s)} but the simulated {what} is {_s(simulated)}")
        if p.objective == "latency" and plan.schedule:
            index = {t.name: i for i, t in enumerate(self.p.graph.tasks)}
            finish = {(st.shard, index.get(st.task, -1)): st.finish_s for st in plan.schedule}
            own = self.token_step(assign, finish, max(finish.values()))
            if not self.close(plan.objective_s, own):
                self.bad(f"the plan claims latency {_s(plan.objective_s)} but its own schedule ends at {_s(own)}")
        if not self.close(plan.max_load_s, max_load):
            self.bad(
                f"the plan claims a max device load of {_s(plan.max_load_s)} per batch; recomputed: {_s(max_load)}"
            )
        if not plan.lower_bound_s <= plan.objective_s * (1 + self.rel_tol) + 1e-15:
            self.bad(f"the lower bound {_s(plan.lower_bound_s)} exceeds the objective {_s(plan.objective_s)}")
        return simulated
