"""The exact MILP's variables and constraint families, one method per family.

The numbered formulas are those of llm_planner.placement.milp.milp's docstring. Times in
the model are in units of `unit_s` seconds (chosen so the objective is about
100, far above the solvers' absolute tolerances); memory rows are divided by the
device's capacity. A term list is [(column, coefficient), ...]; the shard size
b_s is either a variable (S > 1) or the constant Q (S = 1), and every family
handles both through `size_terms`.
"""

from __future__ import annotations

import math

import networkx as nx
import numpy as np

from llm_planner.mip.backends import LinearModel, ModelBuilder
from llm_planner.placement.bounds.times import task_times
from llm_planner.placement.milp.cost_terms import cost_groups, uniform_cost, useful_pieces
from llm_planner.placement.milp.symmetry import CRITERIA, group_use_rows, problem_classes, symmetry_rows
from llm_planner.placement.milp.token_rows import token_charges, token_makespan_rows
from llm_planner.placement.problem import PlacementProblem

Terms = list[tuple[int, float]]


class Formulation:
    """Builds the MILP of one problem and maps solutions back to placements."""

    def __init__(
        self, problem: PlacementProblem, *, contiguous: bool, unit_s: float, horizon: float, symmetry: str = "none"
    ):
        p = self.p = problem
        self.S, self.Q, self.N, self.K = p.max_shards, p.batch_size, p.num_tasks, p.num_devices
        self.unit, self.H = unit_s, horizon
        self.fixed = self.S == 1  # shard size is the constant Q: no size variables at all
        self.latency = p.objective == "latency"
        self.contiguous = contiguous
        self.symmetry = symmetry
        self.mb = ModelBuilder()
        sup = np.broadcast_to(p.supported, (self.S, self.N, self.K)).astype(float)
        self.x = self.mb.add_vars("x", (self.S, self.N, self.K), upper=sup, integer=True)
        if not self.fixed:
            self.size = self.mb.add_vars("b", self.S, upper=self.Q, integer=True)
            self.active = self.mb.add_vars("u", self.S, upper=1, integer=True)
            self.y = self.mb.add_vars("y", (self.S, self.N, self.K), upper=sup * self.Q)
        name = "makespan" if self.latency else "max_load"
        self.obj = int(self.mb.add_vars(name, 1, cost=1.0, upper=horizon if self.latency else math.inf)[0])
        self.t_full = np.where(p.supported, task_times(p, self.Q), 0.0) / unit_s  # t(i, k, Q) in model units
        self.dur: dict[tuple[int, int, int], Terms] = {}
        self.rows: dict[str, int] = {}

    # -- helpers --------------------------------------------------------------------
    def size_terms(self, s: int, coef: float) -> tuple[Terms, float]:
        """coef * b_s as (terms, constant)."""
        return ([], coef * self.Q) if self.fixed else ([(int(self.size[s]), coef)], 0.0)

    def devices(self, i: int) -> list[int]:
        return [int(k) for k in np.flatnonzero(self.p.supported[i])]

    def duration(self, s: int, i: int) -> Terms:
        return [t for k in self.devices(i) for t in self.dur[(s, i, k)]]

    def _rows(self, name: str, rows: list[tuple[Terms, float, float]]) -> None:
        self.rows[name] = self.mb.add_row_list(name, rows)

    def build(self) -> LinearModel:
        self.add_assignment()
        if not self.fixed:
            self.add_shard_sizes()
            self.add_mccormick()
        self.add_task_times()
        self.add_colocation()
        self.add_memory()
        if self.p.has_groups:
            self.add_exclusivity()
        self.add_symmetry_breaking()
        if self.latency:
            self.add_precedence()
            self.add_no_overlap()
            self.add_makespan()
        else:
            self.add_loads()
            if self.contiguous:
                self.add_contiguity()
        return self.mb.build()

    # -- families --------------------------------------------------------------------
    def add_assignment(self) -> None:
        """(1) sum_k x[s,i,k] = u_s (= 1 when S = 1).  Rows: S * N."""
        S, N, K = self.S, self.N, self.K
        rows = np.repeat(np.arange(S * N), K)
        cols = self.x.reshape(S * N * K)
        vals = np.ones(S * N * K)
        if self.fixed:
            self.rows["assign"] = self.mb.add_rows("assign", rows, cols, vals, np.ones(S * N), np.ones(S * N))
            return
        rows = np.concatenate([rows, np.arange(S * N)])
        cols = np.concatenate([cols, np.repeat(self.active, N)])
        vals = np.concatenate([vals, -np.ones(S * N)])
        self.rows["assign"] = self.mb.add_rows("assign", rows, cols, vals, np.zeros(S * N), np.zeros(S * N))

    def add_shard_sizes(self) -> None:
        """(2) sum_s b_s = Q;  u_s <= b_s <= Q u_s;  b_s >= b_{s+1}.  Rows: 1 + 2S + (S - 1)."""
        b, u, Q = [int(c) for c in self.size], [int(c) for c in self.active], self.Q
        rows: list[tuple[Terms, float, float]] = [([(c, 1.0) for c in b], Q, Q)]
        for s in range(self.S):
            rows.append(([(b[s], 1.0), (u[s], -1.0)], 0.0, math.inf))
            rows.append(([(b[s], 1.0), (u[s], -float(Q))], -math.inf, 0.0))
        rows += [([(b[s], 1.0), (b[s + 1], -1.0)], 0.0, math.inf) for s in range(self.S - 1)]
        self._rows("shard_size", rows)

    def add_mccormick(self) -> None:
        """(3) y = b_s x exactly: y <= Q x;  y <= b_s;  y >= b_s - Q (1 - x).  Rows: 3 S N K."""
        S, N, K, Q = self.S, self.N, self.K, self.Q
        n = S * N * K
        y, x = self.y.ravel(), self.x.ravel()
        b = np.repeat(self.size, N * K)
        r = np.arange(n)
        self.rows["mccormick"] = self.mb.add_rows(
            "mccormick",
            np.concatenate([r, r, r + n, r + n, r + 2 * n, r + 2 * n, r + 2 * n]),
            np.concatenate([y, x, y, b, y, b, x]),
            np.concatenate(
                [np.ones(n), -Q * np.ones(n), np.ones(n), -np.ones(n), np.ones(n), -np.ones(n), -Q * np.ones(n)]
            ),
            np.concatenate([-np.inf * np.ones(2 * n), -Q * np.ones(n)]),
            np.concatenate([np.zeros(2 * n), np.inf * np.ones(n)]),
        )

    def add_task_times(self) -> None:
        """(4) time of (s, i) on k: t(i,k,Q) x when S = 1; f x + g y for one piece; else a
        variable d[s,i,k] >= f_j x + g_j y for every piece j.  Rows: S * (pieces of multi-piece (i, k))."""
        multi = (
            []
            if self.fixed
            else [(i, k) for i in range(self.N) for k in self.devices(i) if len(self._pieces(i, k)) > 1]
        )
        d = self.mb.add_vars("d", (self.S, len(multi))) if multi else None
        where = {ik: j for j, ik in enumerate(multi)}
        rows: list[tuple[Terms, float, float]] = []
        for s in range(self.S):
            for i in range(self.N):
                for k in self.devices(i):
                    x = int(self.x[s, i, k])
                    if self.fixed:
                        self.dur[(s, i, k)] = [(x, float(self.t_full[i, k]))]
                        continue
                    y, pieces = int(self.y[s, i, k]), self._pieces(i, k)
                    if (i, k) not in where:
                        self.dur[(s, i, k)] = [(x, pieces[0][0]), (y, pieces[0][1])]
                        continue
                    dc = int(d[s, where[(i, k)]])
                    self.dur[(s, i, k)] = [(dc, 1.0)]
                    rows += [([(dc, 1.0), (x, -f), (y, -g)], 0.0, math.inf) for f, g in pieces]
        self._rows("task_time", rows)

    def _pieces(self, i: int, k: int) -> list[tuple[float, float]]:
        return [(f / self.unit, g / self.unit) for f, g in useful_pieces(self.p.time_pieces[i, k])]

    def add_colocation(self) -> None:
        """(9) x[s,a,k] = x[s,c,k] for consecutive members a, c of a colocation group.  Rows: S K (|g| - 1)
        per group."""
        rows: list[tuple[Terms, float, float]] = []
        for group in self.p.colocate_groups():
            for a, c in zip(group, group[1:]):
                rows += [
                    ([(int(self.x[s, a, k]), 1.0), (int(self.x[s, c, k]), -1.0)], 0.0, 0.0)
                    for s in range(self.S)
                    for k in range(self.K)
                ]
        self._rows("colocate", rows)

    def add_memory(self) -> None:
        """(8) sum_i W_i h[i,k] + sum_{s,i} m_i y[s,i,k] <= cap_k (memory counted where mem_counts),
        h[i,k] >= x[s,i,k] (h = x when S = 1).  Rows: one per device of finite capacity, plus S N K links."""
        p = self.p
        weights = p.weight_bytes[:, None] * p.mem_counts * p.supported  # [N, K]
        per_sample = p.mem_bytes_per_sample[:, None] * p.mem_counts * p.supported
        limited = [
            k
            for k in range(self.K)
            if math.isfinite(p.mem_capacity[k]) and (weights[:, k].any() or per_sample[:, k].any())
        ]
        rows: list[tuple[Terms, float, float]] = []
        h = None
        if not self.fixed and weights.any():
            h = self.mb.add_vars("h", (self.N, self.K), upper=1.0)
            for s in range(self.S):
                rows += [
                    ([(int(h[i, k]), 1.0), (int(self.x[s, i, k]), -1.0)], 0.0, math.inf)
                    for i, k in zip(*np.nonzero(weights))
                ]
        for k in limited:
            cap = float(p.mem_capacity[k])
            terms: Terms = []
            for i in np.flatnonzero(weights[:, k] + per_sample[:, k]):
                if self.fixed:
                    terms.append((int(self.x[0, i, k]), (weights[i, k] + self.Q * per_sample[i, k]) / cap))
                    continue
                if weights[i, k]:
                    terms.append((int(h[i, k]), weights[i, k] / cap))
                if per_sample[i, k]:
                    terms += [(int(self.y[s, i, k]), per_sample[i, k] / cap) for s in range(self.S)]
            rows.append((terms, -math.inf, 1.0))
        self._rows("memory", rows)

    def add_exclusivity(self) -> None:
        """(14) tensor-parallel groups: use[k] in {0,1} for every group and every device in one;
        x[s,i,k] <= use[k];  use[d] + sum_{groups G containing d} use[G] <= 1 for each such
        physical device d: a device serves one used group or itself.
        Rows: S N (groups + their members) + members."""
        p = self.p
        shared = sorted({d for m in p.device_members if len(m) > 1 for d in m})
        units = shared + [k for k in range(self.K) if p.degree(k) > 1]
        self.use = dict(zip(units, (int(c) for c in self.mb.add_vars("use", len(units), upper=1, integer=True))))
        rows: list[tuple[Terms, float, float]] = []
        for k in units:
            for s in range(self.S):
                rows += [
                    ([(int(self.x[s, i, k]), 1.0), (self.use[k], -1.0)], -math.inf, 0.0)
                    for i in np.flatnonzero(p.supported[:, k])
                ]
        for d in shared:
            holders = [k for k in units if d in p.device_members[k]]
            rows.append(([(self.use[k], 1.0) for k in holders], -math.inf, 1.0))
        self._rows("exclusive", rows)

    def add_symmetry_breaking(self) -> None:
        """(13) m(k_a) >= m(k_b) for consecutive interchangeable devices, and the same for the
        server sums of interchangeable servers (solve/milp/symmetry.py).  Rows: one per consecutive pair."""

        if self.symmetry in CRITERIA:
            self._rows("symmetry", symmetry_rows(self, problem_classes(self.p), self.symmetry))
            if self.p.has_groups:
                self._rows("symmetry_groups", group_use_rows(self.p, self.use))

    # -- latency ---------------------------------------------------------------------
    def _cut_rows(
        self, g: int, s: int, a: int, c: int, k: int, group: list[int] | None, fixed_s: float, slope_s: float
    ) -> tuple[Terms, float, float]:
        """g >= c(b_s) when task a is on k and task c is not on k (group None), or on one of the devices of
        `group`, with c(b) = fixed + slope * b and b_s = 0 when the shard is empty. Exact: c sits on at
        most one device, so X = sum_{l in group} x[s,c,l] is 0 or 1 (big-M is Q * slope)."""
        f, g_ = fixed_s / self.unit, slope_s / self.unit
        full = f + g_ * self.Q
        b_terms, b_const = self.size_terms(s, -g_)
        xa = int(self.x[s, a, k])
        if group is None:  # g >= f (x_ak - x_ck) + slope (b - Q (1 - x_ak + x_ck))
            terms = [(g, 1.0), (xa, -full), (int(self.x[s, c, k]), full)] + b_terms
            return terms, -g_ * self.Q - b_const, math.inf
        # g >= f (x_ak + X - 1) + slope (b - Q (2 - x_ak - X))
        terms = [(g, 1.0), (xa, -full)] + [(int(self.x[s, c, l]), -full) for l in group] + b_terms
        return terms, -f - 2 * g_ * self.Q - b_const, math.inf

    def add_precedence(self) -> None:
        """(5) start[s,v] >= start[s,u] + time(s,u) + w[s,e],  w[s,e] >= c(e,k,l,b_s) when u on k, v on l != k.
        Rows: S E (1 + K) for edges whose cost is the same on every link, else S E (1 + sum_k groups(k)),
        a group being the devices that v may use and that e reaches from k at one cost (`cost_groups`)."""
        p = self.p
        self.start = self.mb.add_vars("start", (self.S, self.N), upper=self.H)
        costly = [e for e in range(p.num_edges) if p.comm_fixed[e].any() or p.comm_slope[e].any()]
        w = self.mb.add_vars("w", (self.S, len(costly)))
        col = {e: j for j, e in enumerate(costly)}
        rows: list[tuple[Terms, float, float]] = []
        for s in range(self.S):
            for e in range(p.num_edges):
                u, v = int(p.edge_src[e]), int(p.edge_dst[e])
                terms = [(int(self.start[s, v]), 1.0), (int(self.start[s, u]), -1.0)] + [
                    (c, -a) for c, a in self.duration(s, u)
                ]
                if e in col:
                    we = int(w[s, col[e]])
                    terms.append((we, -1.0))
                    rows += self._transfer_rows(we, s, e)
                rows.append((terms, 0.0, math.inf))
        self._rows("precedence", rows)

    def _transfer_rows(self, g: int, s: int, e: int) -> list[tuple[Terms, float, float]]:
        p = self.p
        u, v = int(p.edge_src[e]), int(p.edge_dst[e])
        same = uniform_cost(p, e)
        if same is not None:
            return [self._cut_rows(g, s, u, v, k, None, *same) for k in self.devices(u)]
        groups = cost_groups(p.comm_fixed[e], p.comm_slope[e], self.devices(u), self.devices(v))
        return [self._cut_rows(g, s, u, v, k, ls, f, slope) for k, f, slope, ls in groups]

    def overlap_pairs(self) -> list[tuple[int, int, int, int]]:
        """(s, i, s2, j) of items that may share a device and are not ordered by a path."""
        p = self.p
        closure = nx.transitive_closure_dag(nx.DiGraph(list(zip(p.edge_src.tolist(), p.edge_dst.tolist()))))
        share = (p.supported.astype(int) @ p.supported.T.astype(int)) > 0
        pairs = []
        for s in range(self.S):
            for s2 in range(s, self.S):
                for i in range(self.N):
                    for j in range(i + 1 if s2 == s else 0, self.N):
                        if share[i, j] and not (s2 == s and (closure.has_edge(i, j) or closure.has_edge(j, i))):
                            pairs.append((s, i, s2, j))
        return pairs

    def add_no_overlap(self) -> None:
        """(6) for items p, q on a common device k, o_pq = 1 if p first:
        start_q >= start_p + time_k(p) - H (1 - o) - H (2 - x_pk - x_qk), and the mirror with o.
        Rows: 2 per (pair, common device)."""
        self.pairs = self.overlap_pairs()
        self.order = self.mb.add_vars("o", len(self.pairs), upper=1, integer=True)
        H, st, rows = self.H, self.start, []
        for n, (s, i, s2, j) in enumerate(self.pairs):
            o = int(self.order[n])
            for k in np.flatnonzero(self.p.supported[i] & self.p.supported[j]):
                xp, xq = int(self.x[s, i, k]), int(self.x[s2, j, k])
                base = [(xp, -H), (xq, -H)]
                rows.append(
                    (
                        [(int(st[s2, j]), 1.0), (int(st[s, i]), -1.0), (o, -H)]
                        + base
                        + [(c, -a) for c, a in self.dur[(s, i, k)]],
                        -3 * H,
                        math.inf,
                    )
                )
                rows.append(
                    (
                        [(int(st[s, i]), 1.0), (int(st[s2, j]), -1.0), (o, H)]
                        + base
                        + [(c, -a) for c, a in self.dur[(s2, j, k)]],
                        -2 * H,
                        math.inf,
                    )
                )
        self._rows("no_overlap", rows)

    def add_makespan(self) -> None:
        """(7) C >= start[s,i] + time(s,i) for every sink i.  Rows: S * sinks."""
        sinks = sorted(set(range(self.N)) - set(self.p.edge_src.tolist()))
        rows = [
            (
                [(self.obj, 1.0), (int(self.start[s, i]), -1.0)] + [(c, -a) for c, a in self.duration(s, i)],
                0.0,
                math.inf,
            )
            for s in range(self.S)
            for i in sinks
        ]
        self._rows("makespan", rows + token_makespan_rows(self))

    # -- throughput -------------------------------------------------------------------
    def add_loads(self) -> None:
        """(10) T >= load_k = sum_{s,i} time_k(s,i) + transfer charges to k.  Rows: K plus the charge rows:
        direct model: g >= c(e, b_s) for an edge leaving k and for one entering k (2 S E K rows when the
        edge costs the same on every link; else 2 S E sum_k groups(k), one charge for each device and
        group of partners at one cost, see `_direct_charges`);
        host-staged model: per task u and accelerator k, out[s,u,k] >= hop_u b_s (x_uk - x_vk) and
        in[s,u,k] >= hop_u b_s (x_vk - x_uk) over u's out-edges (u, v) (2 S E K' rows)."""
        p = self.p
        load: list[Terms] = [[] for _ in range(self.K)]
        for (_s, _i, k), terms in self.dur.items():
            load[k] += terms
        charges = self._host_staged_charges() if p.throughput_model == "host_staged" else self._direct_charges()
        charges += token_charges(self)
        rows: list[tuple[Terms, float, float]] = []
        for g, payers, cut_rows in charges:
            rows += cut_rows
            for k in payers:
                load[k].append((g, 1.0))
        rows += [([(self.obj, 1.0)] + [(c, -a) for c, a in load[k]], 0.0, math.inf) for k in range(self.K)]
        self._rows("load", rows)

    def _direct_charges(self) -> list[tuple[int, list[int], list]]:
        """(charge column, the device that pays it, its rows) for every cut edge of the direct model.

        A cut edge (u, v) with u on k and v on l costs c(e,k,l) to both k and l. The sender's charge
        is split by the groups of receivers that e reaches from k at one cost (`cost_groups`), the
        receiver's by the groups of senders: v on a device of group G makes exactly one of k's
        group charges positive, and it equals c(e,k,l). On a cluster of a few link classes this is
        a few columns per (edge, device) instead of one per (edge, device pair): GPT-3 on 54
        devices has 98 x 54 x 53 pairs.
        """
        p, out = self.p, []
        costly = [e for e in range(p.num_edges) if p.comm_fixed[e].any() or p.comm_slope[e].any()]
        same = {e: uniform_cost(p, e) for e in costly}
        uniform = [e for e in costly if same[e] is not None]
        grouped = []  # (e, paying device, fixed, slope, partners, paying end is the sender)
        for e in costly:
            if same[e] is None:
                u, v = int(p.edge_src[e]), int(p.edge_dst[e])
                fixed, slope = p.comm_fixed[e], p.comm_slope[e]
                grouped += [
                    (e, k, f, g, ls, True)
                    for k, f, g, ls in cost_groups(fixed, slope, self.devices(u), self.devices(v))
                ]
                grouped += [
                    (e, l, f, g, ks, False)
                    for l, f, g, ks in cost_groups(fixed.T, slope.T, self.devices(v), self.devices(u))
                ]
        g_out = self.mb.add_vars("cut_out", (self.S, len(uniform), self.K))
        g_in = self.mb.add_vars("cut_in", (self.S, len(uniform), self.K))
        g_group = self.mb.add_vars("cut", (self.S, len(grouped)))
        for s in range(self.S):
            for n, e in enumerate(uniform):
                u, v = int(p.edge_src[e]), int(p.edge_dst[e])
                for k in range(self.K):
                    out.append(
                        (int(g_out[s, n, k]), [k], [self._cut_rows(int(g_out[s, n, k]), s, u, v, k, None, *same[e])])
                    )
                    out.append(
                        (int(g_in[s, n, k]), [k], [self._cut_rows(int(g_in[s, n, k]), s, v, u, k, None, *same[e])])
                    )
            for n, (e, k, f, slope, partners, sender) in enumerate(grouped):
                g, u, v = int(g_group[s, n]), int(p.edge_src[e]), int(p.edge_dst[e])
                mine, theirs = (u, v) if sender else (v, u)
                out.append((g, [k], [self._cut_rows(g, s, mine, theirs, k, partners, f, slope)]))
        return out

    def _host_staged_charges(self) -> list[tuple[int, list[int], list]]:
        """(charge column, the accelerator that pays it, its rows) for every task output of the host-staged model."""
        p, out = self.p, []
        succ = p.out_edges()
        senders = [u for u in range(self.N) if p.hop_s_per_sample[u] > 0 and succ[u]]
        accelerators = [k for k in range(self.K) if not p.is_cpu[k]]
        g_out = self.mb.add_vars("hop_out", (self.S, len(senders), len(accelerators)))
        g_in = self.mb.add_vars("hop_in", (self.S, len(senders), len(accelerators)))
        for s in range(self.S):
            for n, u in enumerate(senders):
                hop, dests = float(p.hop_s_per_sample[u]), [int(p.edge_dst[e]) for e in succ[u]]
                for a, k in enumerate(accelerators):
                    go, gi = int(g_out[s, n, a]), int(g_in[s, n, a])
                    out.append((go, [k], [self._cut_rows(go, s, u, v, k, None, 0.0, hop) for v in dests]))
                    out.append((gi, [k], [self._cut_rows(gi, s, v, u, k, None, 0.0, hop) for v in dests]))
        return out

    def add_contiguity(self) -> None:
        """(11) z[s,i,k] >= x[s,i,k];  z[s,w,k] >= z[s,v,k] and x[s,w,k] <= x[s,v,k] + 1 - z[s,v,k] for
        every edge (v, w) between forward tasks (tasks labelled is_backward are exempt, as in the paper).
        Rows: S K (N + 2E)."""
        p = self.p
        covered = np.array([not t.label("is_backward", False) for t in p.graph.tasks])
        edges = [(int(a), int(b)) for a, b in zip(p.edge_src, p.edge_dst) if covered[a] and covered[b]]
        z = self.mb.add_vars("z", (self.S, self.N, self.K), upper=1.0)
        rows: list[tuple[Terms, float, float]] = []
        for s in range(self.S):
            for k in range(self.K):
                X, Z = self.x[s, :, k], z[s, :, k]
                rows += [([(int(Z[i]), 1.0), (int(X[i]), -1.0)], 0.0, math.inf) for i in np.flatnonzero(covered)]
                rows += [([(int(Z[w]), 1.0), (int(Z[v]), -1.0)], 0.0, math.inf) for v, w in edges]
                rows += [([(int(X[w]), 1.0), (int(X[v]), -1.0), (int(Z[v]), 1.0)], -math.inf, 1.0) for v, w in edges]
        self._rows("contiguity", rows)
