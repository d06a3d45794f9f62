"""The CP-SAT model of DESIGN §5.

Variables
    ``x[d, m]``  dim ``d`` is split over mesh axis ``m`` (only for non-loop dims
                 and axes of size > 1 whose size divides ``d``);
    ``y[D, a]``  one-hot over the valid assignments ``a`` of a dim group ``D``
                 (see tables.py), linked by ``Σ_{a: m ∈ a(d)} y[D, a] = x[d, m]``;
    ``w[p, a]``  weight-update sharding of parameter ``p`` while its dims group
                 ``D_p`` has assignment ``a`` (``w[p, a] <= y[D_p, a]``, wus.py).

Constraints on ``x``: divisibility (no axis subset whose product does not divide
the dim: one clause per minimal bad subset), legality and ``check_op`` (at most
one dim of each conflict group per axis, space.py), and lexicographic order of
the columns of interchangeable axes (symmetry breaking). Memory rows
``Σ_{t live at point} bytes(t) <= limit`` are added lazily (solver.py).

Objective (integer): ``Σ_H Σ_a round((T[H, a] - min_a T[H, a]) / unit) · y[H, a]
+ Σ round(dtime / unit) · w``. ``T[D, a] = Σ_{classes c of D} k_c ·
op_cost(c, a).time_s`` per dim group; every group is *folded* into the largest
group ``H ⊇ D`` (``T[H, b] += T[D, b restricted to D]``), since ``y[D]`` is a
function of ``y[H]`` — only maximal groups get one-hots, which shrinks the model
and tightens its LP relaxation. ``unit`` is the power of ten (seconds) that maps
the largest possible objective to at most ``RESOLUTION`` (10^12) units, so each
coefficient is rounded by at most ``unit / 2`` and the objective in seconds,
``Σ_H min_a T[H, a] + unit · objective``, matches ``predict`` to within
``(number of terms) · unit / 2`` (``SearchResult.tolerance_s``). Overlap (overlap.py):
one integer slack per overlap domain, ``s_d >= Σ (overlappable − compute)`` (and, for the
collectives beside independent work, ``s_d >= Σ (beside − work compute)``) over the
one-hots and storage options, ``s_d >= 0``, added to the objective.

Memory rows fold each tensor's bytes into an existing one-hot containing its dims
the same way. ``prune`` fixes to 0 every ``y``/``w`` whose coefficient alone
would push the objective past that of a known feasible layout (the warm start):
those assignments cannot be in any optimal layout, and there are many of them
(e.g. splitting ``d_kv`` 16 ways in GPT-3).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from autolayout.costmodel.overlap import domain_of_row, step_time
from autolayout.search.names import (is_held, is_relayout, is_layout_sized, is_partial, is_result, is_transient,
                                     op_of, span_kind)
from autolayout.search.orders import enforce
from autolayout.search.tables import Tables, prod_axes
from autolayout.search.wus import WusParam

__all__ = ["LayoutModel", "Decoded", "RESOLUTION"]

# 10^11: CP-SAT (ortools 9.15) returned wrong "OPTIMAL" objectives with its presolve on at
# 10^12 once the overlap rows (one slack per domain) were added — the decoded layout's own
# objective was lower than the reported one (tests/test_search.py pins such a case); at 10^11
# and below it is exact there, and the rounding stays far below the 1e-9 the tests ask.
RESOLUTION = 10 ** 11


@dataclass
class Decoded:
    """A point of the search space: the layout's rules and its update sharding."""

    axes_of: dict[str, tuple[str, ...]]
    wus: dict[str, tuple[tuple[str, ...], int]]  # param -> (storage axes, ZeRO stage)
    active: list[tuple[int, int]]  # (index in LayoutModel.wus, option index)


class LayoutModel:
    """A CP-SAT model over the layouts of ``tables.graph`` on ``tables.mesh``."""

    def __init__(self, tables: Tables, wus: list[WusParam], *, time_objective: bool = True) -> None:
        self.tables, self.space, self.wus = tables, tables.space, wus
        self.model = m = cp_model.CpModel()
        space, mesh = self.space, tables.mesh
        self.x: dict[tuple[str, str], cp_model.IntVar] = {}
        for d in space.dims:
            for a in space.axes:
                if space.usable(d, a):
                    self.x[d, a] = m.NewBoolVar(f"x[{d},{a}]")
        # divisibility: forbid each minimal axis subset whose product does not divide the dim
        for d in space.dims:
            usable = [a for a in space.axes if (d, a) in self.x]
            bad: list[tuple[str, ...]] = []
            for r in range(2, len(usable) + 1):
                for combo in itertools.combinations(usable, r):
                    if space.size[d] % prod_axes(mesh, combo) and not any(set(b) <= set(combo) for b in bad):
                        bad.append(combo)
                        m.AddBoolOr([self.x[d, a].Not() for a in combo])
        # a region dim keeps its base dim's axes (a region adds axes): x[d, m] => x[d@norm, m]
        for v in space.dims:
            b = space.base[v]
            if b == v:
                continue
            for a in space.axes:
                if (b, a) in self.x:
                    if (v, a) in self.x:
                        m.AddImplication(self.x[b, a], self.x[v, a])
                    else:
                        m.Add(self.x[b, a] == 0)
        # legality (tensors) and check_op (reducing ops): one dim of a conflict group per axis
        for grp in self.space.groups:
            for a in space.axes:
                lits = [self.x[d, a] for d in space.order(grp) if (d, a) in self.x]
                if len(lits) >= 2:
                    m.AddAtMostOne(lits)
        # symmetry: columns of interchangeable axes in decreasing lexicographic order
        n = len(space.dims)
        if n <= 50:
            weight = {d: 2 ** (n - 1 - i) for i, d in enumerate(space.dims)}
            for sym in tables.symmetric:
                for a, b in zip(sym, sym[1:]):
                    lhs = sum(weight[d] * self.x[d, a] for d in space.dims if (d, a) in self.x)
                    rhs = sum(weight[d] * self.x[d, b] for d in space.dims if (d, b) in self.x)
                    if not isinstance(lhs, int):
                        m.Add(lhs >= rhs)
        self.y: dict[tuple[str, ...], list] = {}
        self.w: list[dict[int, cp_model.IntVar]] = []
        for k, p in enumerate(wus):
            ys = self.onehot(p.dims)
            wk = {}
            for j, opt in enumerate(p.options):
                v = m.NewBoolVar(f"w[{p.param},{opt.index},{','.join(opt.axes)}@{opt.stage}]")
                m.AddImplication(v, ys[opt.index])
                wk[j] = v
            if len(wk) > 1:
                m.AddAtMostOne(list(wk.values()))  # one storage option per parameter
            self.w.append(wk)
        self.constant_s = 0.0
        self.unit = 1e-12
        self.terms = 0
        self.objective: cp_model.LinearExpr | int = 0
        self.obj_vars: list = []
        self.obj_coefs: list[int] = []
        self.coef: dict[tuple[str, ...], np.ndarray] = {}  # integer objective coefficients per group
        self.wcoef: dict[tuple[int, int], int] = {}
        # overlap rows (overlap.py): per domain its slack variable, constant and coefficients
        self.slack: dict[str, Any] = {}
        self.over_const: dict[str, int] = {}
        self.over_coef: dict[tuple[str, tuple[str, ...]], np.ndarray] = {}
        self.over_wcoef: dict[tuple[str, int, int], int] = {}
        self._proj: dict[tuple, np.ndarray] = {}
        self.pruned = 0
        if time_objective:
            self._time_objective()
        self.memory_rows: list[tuple[str, ...]] = []
        self.output_rows: list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = []
        self.guards: dict[tuple[str, ...], frozenset[str] | None] = {}  # a row's orders (LivePoints.guards)
        self.order_literals: dict[str, Any] | None = None  # search.orders.order_literals, made once
        self.guard_literals: dict[frozenset[str], Any] = {}  # search.orders.order_literal, per set of orders

    # -- variables --------------------------------------------------------------------
    def onehot(self, dims: tuple[str, ...]) -> list:
        """``y[dims, ·]`` (created with its one-hot and linking constraints on first use)."""
        ys = self.y.get(dims)
        if ys is not None:
            return ys
        g = self.tables.group(dims)
        m = self.model
        if len(g.assignments) == 1:
            ys = [1]
        else:
            ys = [m.NewBoolVar(f"y[{','.join(dims)}#{i}]") for i in range(len(g.assignments))]
            m.AddExactlyOne(ys)
            for j, d in enumerate(dims):
                for a in self.space.axes:
                    if (d, a) in self.x:
                        m.Add(sum(ys[i] for i, asg in enumerate(g.assignments) if a in asg[j])
                              == self.x[d, a])
        self.y[dims] = ys
        return ys

    def project(self, host: tuple[str, ...], dims: tuple[str, ...]) -> np.ndarray:
        """For each assignment of ``host`` (⊇ ``dims``), the index of its restriction to ``dims``."""
        key = (host, dims)
        hit = self._proj.get(key)
        if hit is None:
            h, g = self.tables.group(host), self.tables.group(dims)
            pos = [host.index(d) for d in dims]
            hit = self._proj[key] = np.array([g.index[tuple(b[i] for i in pos)] for b in h.assignments],
                                             dtype=np.int64)
        return hit

    def host(self, dims: tuple[str, ...], candidates: list[tuple[str, ...]]) -> tuple[str, ...]:
        """The largest candidate containing ``dims`` (first in canonical order), else ``dims``."""
        inside = [h for h in candidates if set(dims) <= set(h)]
        return min(inside, key=lambda h: (-len(h), h)) if inside else dims

    def _time_objective(self) -> None:
        # Fold every group into the largest group containing its dims: y of a subset is a
        # function of y of the superset, so one one-hot per maximal group carries all the
        # cost (fewer variables, tighter LP relaxation).
        tables = self.tables
        live = [g for g in tables.groups.values() if g.classes]

        def varies(a: np.ndarray) -> bool:
            return bool(a.max() > a.min())

        groups = [g for g in live if varies(g.time) or any(varies(o) for o in g.over.values())]
        self.constant_s = sum(float(g.time.min()) for g in live if g not in groups)
        maximal = [g.dims for g in groups if not any(set(g.dims) < set(h.dims) for h in groups)]

        def fold(arrays: list[tuple[tuple[str, ...], np.ndarray]]) -> dict[tuple[str, ...], np.ndarray]:
            out = {h: np.zeros(len(tables.group(h).assignments)) for h in maximal}
            for dims, a in arrays:
                h = self.host(dims, maximal)
                out[h] += a[self.project(h, dims)] if h != dims else a
            return out

        folded = fold([(g.dims, g.time) for g in groups])
        domains = sorted({d for g in live for d in g.over} | {d for p in self.wus for o in p.options for d in o.dover})
        over_const = {d: sum(float(g.over[d].min()) for g in live if g not in groups and d in g.over)
                      for d in domains}
        over = {d: fold([(g.dims, g.over[d]) for g in groups if d in g.over]) for d in domains}
        # the most the overlap term of a domain can add (its upper bound), to drop domains that
        # never expose anything and to scale the integer objective
        over_ub = {}
        for d in domains:
            hi = over_const[d] + sum(float(t.max()) for t in over[d].values())
            hi += sum(max((o.dover.get(d, 0.0) for o in p.options), default=0.0) for p in self.wus
                      if any(o.dover.get(d, 0.0) > 0 for o in p.options))
            over_ub[d] = hi
        domains = [d for d in domains if over_ub[d] > 0]
        excess = sum(float(t.max() - t.min()) for t in folded.values())
        excess += sum(abs(o.dtime) for p in self.wus for o in p.options)
        excess += sum(over_ub[d] for d in domains)
        self.unit = 10.0 ** math.ceil(math.log10(excess / RESOLUTION)) if excess > 0 else 1e-12
        terms = []
        for dims in sorted(folded):
            t = folded[dims]
            lo = float(t.min())
            self.constant_s += lo
            coef = np.rint((t - lo) / self.unit).astype(np.int64)
            if coef.max() == 0:
                continue
            ys = self.onehot(dims)
            self.coef[dims] = coef
            terms += [(int(c), v) for c, v in zip(coef, ys) if c]
            self.terms += 1
        for k, (p, wk) in enumerate(zip(self.wus, self.w)):
            for j, opt in enumerate(p.options):
                c = int(round(opt.dtime / self.unit))
                self.wcoef[k, j] = c
                if c:
                    terms.append((c, wk[j]))
                    self.terms += 1
        # overlap (overlap.py): per row d of a domain, s >= Σ (its terms), s >= 0
        rows: dict[str, list] = {}
        for d in domains:
            row_vars, row_coefs = [], []
            const = int(round(over_const[d] / self.unit))
            for dims in sorted(over[d]):
                # per host its minimum goes to the constant (the one-hot picks one entry), so
                # the coefficients are >= 0 as in the objective
                lo = float(over[d][dims].min())
                const += int(round(lo / self.unit))
                coef = np.rint((over[d][dims] - lo) / self.unit).astype(np.int64)
                if not coef.any():
                    continue
                ys = self.onehot(dims)
                self.over_coef[d, dims] = coef
                for c, v in zip(coef, ys):
                    if isinstance(v, int):
                        const += int(c) * v
                    elif c:
                        row_vars.append(v)
                        row_coefs.append(int(c))
                self.terms += 1
            for k, (p, wk) in enumerate(zip(self.wus, self.w)):
                for j, opt in enumerate(p.options):
                    c = int(round(opt.dover.get(d, 0.0) / self.unit))
                    if c:
                        self.over_wcoef[d, k, j] = c
                        row_vars.append(wk[j])
                        row_coefs.append(c)
                        self.terms += 1
            self.over_const[d] = const
            ub = max(1, int(math.ceil(over_ub[d] / self.unit)) + self.terms)
            rows.setdefault(domain_of_row(d), []).append((row_vars, row_coefs, const, ub))
        for dom, its in rows.items():  # one slack per domain, at least each of its rows
            s_d = self.slack[dom] = self.model.NewIntVar(0, max(r[3] for r in its), f"overlap[{dom or 'top'}]")
            for row_vars, row_coefs, const, _ in its:
                self.model.Add(s_d >= cp_model.LinearExpr.WeightedSum(row_vars, row_coefs) + const)
            terms.append((1, s_d))
        self.obj_vars = [v for _, v in terms]
        self.obj_coefs = [c for c, _ in terms]
        self.objective = cp_model.LinearExpr.WeightedSum(self.obj_vars, self.obj_coefs) if terms else 0
        self.model.Minimize(self.objective)

    def units(self, point: Decoded) -> int:
        """Integer objective of ``point``."""
        restrict = self.tables.restrict
        total = sum(int(c[restrict(point.axes_of, dims)]) for dims, c in self.coef.items())
        total += sum(self.wcoef[k, j] for k, j in point.active)
        worst: dict[str, int] = {}
        for d in self.over_const:
            row = self.over_const[d] + sum(int(c[restrict(point.axes_of, dims)])
                                           for (dd, dims), c in self.over_coef.items() if dd == d)
            row += sum(self.over_wcoef.get((d, k, j), 0) for k, j in point.active)
            worst[domain_of_row(d)] = max(worst.get(domain_of_row(d), 0), row)
        return total + sum(worst.values())

    def lower_units(self) -> int:
        """A lower bound of the objective: every one-hot block at its minimum."""
        wmin: dict[int, int] = {}
        for (k, j), c in self.wcoef.items():
            wmin[k] = min(wmin.get(k, 0), c)
        return sum(wmin.values())

    def prune(self, upper: int) -> int:
        """Fix to 0 every y/w whose own coefficient already makes the objective exceed
        ``upper`` (the objective of a layout known to satisfy every constraint, memory
        included): each one-hot block contributes at least its minimum, so
        ``objective >= lower - min(block) + coef``. Optimal layouts (objective <= upper)
        are never cut. Returns the number of variables fixed."""
        wmin: dict[int, int] = {}
        for (k, j), c in self.wcoef.items():
            wmin[k] = min(wmin.get(k, 0), c)
        lower = self.lower_units()  # group blocks have minimum 0 (coefficients are shifted)
        fixed = 0
        for dims, coef in self.coef.items():
            ys = self.y[dims]
            for c, v in zip(coef, ys):
                if lower + int(c) > upper and not isinstance(v, int):
                    self.model.Add(v == 0)
                    fixed += 1
        for (k, j), c in self.wcoef.items():
            if lower - wmin.get(k, 0) + c > upper:
                self.model.Add(self.w[k][j] == 0)
                fixed += 1
        self.pruned += fixed
        return fixed

    def seconds(self, value: float) -> float:
        """Objective units -> seconds per step."""
        return self.constant_s + value * self.unit

    def tolerance_s(self) -> float:
        """Largest difference rounding can make between the objective and the exact time."""
        return (self.terms + 1) * self.unit / 2

    # -- memory --------------------------------------------------------------------------
    def memory_expr(self, names: tuple[str, ...]) -> tuple[list, list, int]:
        """``(vars, coefs, constant)``: local bytes live at a point, linear in y and w."""
        graph, tables = self.tables.graph, self.tables
        per_group: dict[tuple[str, ...], np.ndarray] = {}
        const = 0
        for n in names:
            if is_transient(n):  # bytes the running op holds (storage options add their own)
                dims, vec = tables.transient_bytes(graph.op(op_of(n)))
            elif is_partial(n):  # a split reduction's partial sums in its collective's phase
                dims, vec, _ = tables.phase_bytes(graph.op(op_of(n)))
            elif is_result(n):  # a split reduction's output in its contraction's phase
                dims, _, vec = tables.phase_bytes(graph.op(op_of(n)))
            elif is_held(n):  # bytes a gradient-reducing op holds until the combined reduction
                dims, vec = tables.held_bytes(graph.op(op_of(n)))
            elif is_relayout(n):  # a relayout copy waiting for its reduce-scatter (phases.collective_sequence)
                dims, vec = tables.relayout_bytes(graph.op(op_of(n)))
            elif (kind := span_kind(n)) is not None:  # a buffer live over a span (names.SPAN_KINDS)
                dims, vec = kind.nbytes(tables, *kind.parts(n))
            elif is_layout_sized(n):  # a combined all-reduce's, a parameter's copy: by the whole layout, 0 here
                continue
            else:
                dims, vec = tables.stored_bytes(graph.tensor(n))
            if len(vec) == 1:
                const += int(vec[0])
            elif dims in per_group:
                per_group[dims] = per_group[dims] + vec
            else:
                per_group[dims] = vec.copy()
        hosts = [h for h, ys in self.y.items() if len(ys) > 1]
        folded: dict[tuple[str, ...], np.ndarray] = {}
        for dims, vec in per_group.items():
            h = self.host(dims, hosts)
            v = vec[self.project(h, dims)] if h != dims else vec
            folded[h] = folded[h] + v if h in folded else v
        vars_, coefs = [], []
        for dims, vec in sorted(folded.items()):
            lo = int(vec.min())
            const += lo
            if vec.max() == lo:
                continue
            ys = self.onehot(dims)
            for c, v in zip(vec - lo, ys):
                if c:
                    vars_.append(v)
                    coefs.append(int(c))
        live = set(names)
        for p, wk in zip(self.wus, self.w):
            for j, opt in enumerate(p.options):
                c = sum(b for t, b in opt.dbytes.items() if t in live)
                if c:
                    vars_.append(wk[j])
                    coefs.append(int(c))
        return vars_, coefs, const

    def add_memory_row(self, names: tuple[str, ...], limit: int, guard: frozenset[str] | None = None) -> bool:
        """Add ``bytes live at names <= limit``, for the layouts of one order only where ``guard``
        is not None (``search.orders.enforce``); False if no layout can satisfy it."""
        vars_, coefs, const = self.memory_expr(names)
        self.memory_rows.append(names)
        self.guards[names] = guard
        lowest = const + sum(min(c, 0) for c in coefs)
        enforce(self, self.model.Add(cp_model.LinearExpr.WeightedSum(vars_, coefs) <= limit - const), guard)
        return lowest <= limit or guard is not None

    def add_output_row(self, names: tuple[str, ...], temps: tuple[str, ...], free: tuple[str, ...],
                       limit: int, guard: frozenset[str] | None = None) -> None:
        """Add a linear relaxation of a point's bytes where the step's outputs are allocated for
        the whole call (``search.liveness.total_at``): its live bytes (``names``) plus the output
        allocations not yet written (``free``) less the bytes of the live temporaries (``temps``)
        they hold, ``<= limit``. How much they hold (``outputs.output_placement``: one temporary
        per allocation, only into one at least its size) is not linear in the layout; here
        temporaries and allocations are grouped by their bytes' expression, a group's temporaries
        may go into a group's allocations only where the layout makes them fit (a literal that
        enforces ``bytes(temporary) <= bytes(allocation)``), and the bytes moved between groups are
        free variables bounded by what the temporaries have and the allocations take. Every
        placement XLA can make is one of these, so the row is a true constraint (the solver picks
        the most it can hold); it is weaker than the exact placement (several temporaries may share
        an allocation's bytes), so the solver still cuts off by itself a layout it admits that is
        over the limit. It cuts off the layouts whose temporaries are too large for the free
        allocations at once, which the one-layout cuts took one at a time. ``guard``: as
        :meth:`add_memory_row`'s."""
        self.output_rows.append((names, temps, free))
        self.guards[names] = guard
        m = self.model

        def groups(ns) -> list[tuple[int, list, list, int, int, int]]:
            found: dict[tuple, list] = {}
            for n in ns:
                vs, cs, const = self.memory_expr((n,))
                if not vs and const == 0:
                    continue
                key = (tuple(v.Index() for v in vs), tuple(cs), const)
                if key in found:
                    found[key][0] += 1
                else:
                    found[key] = [1, vs, cs, const]
            # (count, vars, coefs, constant, least bytes, most bytes)
            return [(k, vs, cs, c, c + sum(min(x, 0) for x in cs), c + sum(max(x, 0) for x in cs))
                    for k, vs, cs, c in found.values()]

        def expr(vs, cs, const, times: int = 1):
            return cp_model.LinearExpr.WeightedSum(vs, [times * c for c in cs]) + times * const

        tg, og = groups(temps), groups(free)
        moved = []
        into: dict[int, list] = {}
        for a, (nt, tv, tc, tk, tlo, thi) in enumerate(tg):
            out_of = []
            for b, (no, ov, oc, ok, olo, ohi) in enumerate(og):
                if tlo > ohi or thi <= 0:  # never fits
                    continue
                z = m.NewIntVar(0, max(0, min(nt * thi, no * ohi)), "")
                if thi > olo:  # fits only under some layouts
                    f = m.NewBoolVar("")
                    m.Add(expr(tv, tc, tk) <= expr(ov, oc, ok)).OnlyEnforceIf(f)
                    m.Add(z == 0).OnlyEnforceIf(f.Not())
                out_of.append(z)
                into.setdefault(b, []).append(z)
            if out_of:
                m.Add(sum(out_of) <= expr(tv, tc, tk, nt))
                moved += out_of
        for b, zs in into.items():
            no, ov, oc, ok, _, _ = og[b]
            m.Add(sum(zs) <= expr(ov, oc, ok, no))
        vs, cs, const = self.memory_expr(names)
        allocations = sum(expr(ov, oc, ok, no) for no, ov, oc, ok, _, _ in og) if og else 0
        enforce(self, m.Add(cp_model.LinearExpr.WeightedSum(vs, cs) + const + allocations - sum(moved) <= limit),
                guard)

    # -- decoding, hints -------------------------------------------------------------------
    def decode(self, value) -> Decoded:
        """Read a solution; ``value(var) -> bool``."""
        axes_of: dict[str, tuple[str, ...]] = {}
        for d in self.space.dims:
            axes = tuple(a for a in self.space.axes if (d, a) in self.x and value(self.x[d, a]))
            if axes:
                axes_of[d] = axes
        wus, active = {}, []
        for k, (p, wk) in enumerate(zip(self.wus, self.w)):
            for j, v in wk.items():
                if value(v):
                    wus[p.param] = (p.options[j].axes, p.options[j].stage)
                    active.append((k, j))
        return Decoded(axes_of, wus, active)

    def hint(self, point: Decoded) -> None:
        """Warm start from ``point`` (all x, y and w; written to the proto in bulk)."""
        idx: list[int] = []
        val: list[int] = []
        for (d, a), v in self.x.items():
            idx.append(v.Index())
            val.append(int(a in point.axes_of.get(d, ())))
        for dims, ys in self.y.items():
            if len(ys) > 1:
                i = self.tables.restrict(point.axes_of, dims)
                idx += [v.Index() for v in ys]
                val += [int(j == i) for j in range(len(ys))]
        on = set(point.active)
        for k, wk in enumerate(self.w):
            for j, v in wk.items():
                idx.append(v.Index())
                val.append(int((k, j) in on))
        self.model.ClearHints()
        hint = self.model.Proto().solution_hint
        hint.vars.extend(idx)
        hint.values.extend(val)

    def tie_break_model(self, best: int) -> tuple[cp_model.CpModel, Any]:
        """A copy of the model with the objective fixed at ``best`` units, minimising the
        lexicographic tie-break of solver.py; returns it and ``var -> its copy``."""
        m2 = self.model.clone()

        ints = {v.Index() for v in self.slack.values()}

        def twin(v: Any) -> Any:
            if v.Index() in ints:
                return m2.get_int_var_from_proto_index(v.Index())
            return m2.get_bool_var_from_proto_index(v.Index())

        if self.obj_vars:
            m2.Add(cp_model.LinearExpr.WeightedSum([twin(v) for v in self.obj_vars], self.obj_coefs) <= best)
        # one slot per x bit, then one per parameter (at most one of its w is on)
        slots = [[self.x[d, a]] for d in self.space.dims for a in self.space.axes if (d, a) in self.x]
        for p, wk in zip(self.wus, self.w):  # per parameter: no storage option, then lower stages first
            for stage in (3, 2, 1):
                slot = [v for j, v in wk.items() if p.options[j].stage == stage]
                if slot:
                    slots.append(slot)
        weights = tie_break_weights([len(s) for s in slots])
        bits, coefs = [], []
        for slot, w in zip(slots, weights):
            for v in slot:
                bits.append(twin(v))
                coefs.append(w)
        m2.Minimize(cp_model.LinearExpr.WeightedSum(bits, coefs) if bits else 0)
        return m2, twin

    def size(self) -> tuple[int, int]:
        proto = self.model.Proto()
        return len(proto.variables), len(proto.constraints)


def tie_break_weights(sizes: list[int], cap: int = 2 ** 60) -> list[int]:
    """Objective weights of the tie-break's slots (each a set of booleans of which at most one
    is on), earlier slots first: a slot's weight exceeds what all later slots can add, so the
    order is lexicographic, for the longest prefix of slots whose weights keep
    ``Σ size × weight`` under ``cap`` (CP-SAT rejects an objective that may overflow int64 —
    "Possible integer overflow in objective"); the slots after that prefix weigh 1 each."""
    n = len(sizes)
    for k in range(n, -1, -1):  # slots [0, k) lexicographic, the rest 1
        tail = n - k
        weights = [1] * n
        later = tail  # what the slots after i can add at most
        for i in range(k - 1, -1, -1):
            weights[i] = later + 1
            later += weights[i]
        if sum(s * w for s, w in zip(sizes, weights)) < cap:
            return weights
    raise RuntimeError(f"internal: {n} tie-break slots of sizes up to {max(sizes)} overflow even with weight 1")


def layout_terms(tables: Tables, axes_of: dict[str, tuple[str, ...]]) -> tuple[float, dict[str, float]]:
    """The parts of :func:`evaluate_time` the axes give before any storage option: the linear
    seconds and the per-row overlap terms of :func:`~autolayout.costmodel.overlap.step_time`
    (a storage option adds its ``dtime`` and ``dover`` to them)."""
    total = 0.0
    over: dict[str, float] = {}
    for g in tables.groups.values():
        if g.classes:
            i = tables.restrict(axes_of, g.dims)
            total += float(g.time[i])
            for d, a in g.over.items():
                over[d] = over.get(d, 0.0) + float(a[i])
    return total, over


def evaluate_time(tables: Tables, wus: list[WusParam], point: Decoded) -> float:
    """Predicted seconds per step of ``point`` from the tables (exact up to float summation
    order): the compute and exposed collectives, plus per overlap domain what its
    overlappable collectives add beyond its compute (:func:`~autolayout.costmodel.overlap.step_time`)."""
    total, over = layout_terms(tables, point.axes_of)
    for k, j in point.active:
        o = wus[k].options[j]
        total += o.dtime
        for d, v in o.dover.items():
            over[d] = over.get(d, 0.0) + v
    return step_time(total, over)


def canonical_columns(tables: Tables, axes_of: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Permute interchangeable axes so that their columns are in decreasing lexicographic order."""
    space = tables.space
    mapping = {a: a for a in space.axes}
    for sym in tables.symmetric:
        cols = {a: tuple(int(a in axes_of.get(d, ())) for d in space.dims) for a in sym}
        ranked = sorted(sym, key=lambda a: cols[a], reverse=True)
        for new, old in zip(sym, ranked):
            mapping[old] = new
    order = {a: i for i, a in enumerate(tables.mesh.axis_names)}
    return {d: tuple(sorted((mapping[a] for a in axes), key=order.__getitem__)) for d, axes in axes_of.items()}
