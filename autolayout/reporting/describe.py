"""Words for a reader: what an op computes, and why one layout beats another.

* :func:`describe_op` — ``matmul [batch,length,d_ff]×[d_ff,d_model] with layers/w2
  (block, models.py:126)`` instead of the tracer's ``dot_general_7``;
* :func:`why_faster` — the headline of a comparison: the winner against the runner-up,
  by how much, and which collectives, compute or memory make the difference.

Both read only public values (:class:`~autolayout.graph.Graph` ops and
:class:`~autolayout.costmodel.predict.Cost`), so the demo, the reports and the command
line say the same thing.
"""
from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from autolayout.reporting.fmt import fmt_bytes, fmt_time

__all__ = ["describe_op", "why_faster", "collectives_by_kind"]

# ops that only move or rename data: walked through to find the parameter an op reads
_PASS_THROUGH = ("reshape",)
_WALK = 4


def _shape(shape: Any) -> str:
    return "[" + ",".join(d.name for d in shape) + "]"


def _source(op: Any) -> str:
    """``/x/models.py:126:16 (transformer_lm.<locals>.block)`` -> ``block, models.py:126``."""
    m = re.match(r"(?P<file>[^:]+):(?P<line>\d+)(?::\d+)?(?:\s*\((?P<fn>[^)]*)\))?", op.source or "")
    if not m:
        return ""
    file = m.group("file").replace("\\", "/").rsplit("/", 1)[-1]
    fn = (m.group("fn") or "").rsplit(".", 1)[-1]
    return f"{fn}, {file}:{m.group('line')}" if fn else f"{file}:{m.group('line')}"


def _param_read(graph: Any, tensor: str) -> str | None:
    """The parameter ``tensor`` is (or is a slice/rename of), walking back through reshapes."""
    params = {t.name for t in graph.params()}
    for _ in range(_WALK):
        if tensor in params:
            return tensor
        op = graph.op(tensor)
        if op.kind not in _PASS_THROUGH or len(op.inputs) != 1:
            return None
        tensor = op.inputs[0]
    return tensor if tensor in params else None


def _gradient_of(graph: Any, name: str) -> str | None:
    """The parameter whose gradient ``name`` is (``grad/<param>``), through reshapes/stacks."""
    frontier, seen = [name], set()
    for _ in range(_WALK):
        nxt = []
        for t in frontier:
            if t.startswith("grad/"):
                return t[len("grad/"):]
            for u in graph.consumers(t):
                if u not in seen and graph.op(u).kind in _PASS_THROUGH:
                    seen.add(u)
                    nxt.append(u)
        frontier = nxt
    return next((t[len("grad/"):] for t in frontier if t.startswith("grad/")), None)


def describe_op(graph: Any, name: str) -> str:
    """What op ``name`` of ``graph`` computes, in words a reader of a report understands.

    Args:
        graph: a traced :class:`~autolayout.graph.Graph`.
        name: the op's name (the tensor it produces, e.g. ``"dot_general_7"``).

    Returns:
        e.g. ``"matmul [batch,length,d_ff]×[d_ff,d_model] with layers/w2 (block, models.py:126)"``
        or ``"matmul [batch,length,d_model]×[batch,length,d_ff] -> gradient of layers/w1 (...)"``.

    Example::

        g = autolayout.models.transformer_lm()
        describe_op(g, "dot_general_7")
    """
    op = graph.op(name)
    ins = " × ".join(_shape(s) for s in op.input_shapes) if op.input_shapes else ""
    reduced = [d.name for d in op.reduced_dims]
    if op.kind == "einsum" and len(op.inputs) >= 2:
        what = f"matmul {ins}" if reduced else f"product {ins}"
    elif op.kind == "einsum":
        what = f"sum over {','.join(reduced)} of {ins}" if reduced else f"copy {ins} -> {_shape(op.output.shape)}"
    elif op.kind == "reduce":
        what = f"{op.fn} over {','.join(reduced)} of {ins}"
    elif op.kind == "gather":
        what = f"embedding lookup (gather) {ins}"
    elif op.kind == "scatter":
        what = f"embedding gradient (scatter-add) {ins}"
    elif op.kind == "reshape":
        what = f"{op.fn} {ins} -> {_shape(op.output.shape)}"
    elif op.kind == "elementwise":
        what = f"{op.fn} {_shape(op.output.shape)}"
    else:
        what = f"{op.kind} {_shape(op.output.shape)}"
    params = [p for p in (_param_read(graph, t) for t in op.inputs) if p]
    grad = _gradient_of(graph, name)
    if grad:
        what += f" -> gradient of {grad}"
    elif params:
        what += " with " + ", ".join(dict.fromkeys(params))
    where = _source(op)
    return f"{what} ({where})" if where else what


# ----------------------------------------------------------------------------- why faster
def collectives_by_kind(cost: Any) -> dict[str, tuple[float, float, int]]:
    """``{kind: (bytes per step, seconds per step, executions per step)}`` of a Cost's collectives."""
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for c in cost.collectives:
        row = out[c.kind]
        row[0] += c.bytes * c.count
        row[1] += c.time_s * c.count
        row[2] += c.count
    return {k: (b, t, int(n)) for k, (b, t, n) in out.items()}


def _axes(cost: Any, kind: str) -> str:
    """The mesh-axis groups a Cost's collectives of ``kind`` run over: ``"cols / rows×cols"``."""
    groups = dict.fromkeys("×".join(c.mesh_axes) for c in cost.collectives if c.kind == kind)
    return " / ".join(groups)


def _n(count: int, kind: str) -> str:
    return f"{count} {kind}{'s' * (count != 1)}"


def _comm_diff(winner: Any, runner: Any) -> list[str]:
    """Per collective kind, what the winner moves less (or more) than the runner-up."""
    w, r = collectives_by_kind(winner), collectives_by_kind(runner)
    rows = []
    for kind in sorted(set(w) | set(r), key=lambda k: -abs(r.get(k, (0, 0, 0))[1] - w.get(k, (0, 0, 0))[1])):
        wb, wt, wn = w.get(kind, (0.0, 0.0, 0))
        rb, rt, rn = r.get(kind, (0.0, 0.0, 0))
        if abs(rt - wt) < 0.02 * max(runner.time_s, 1e-30):
            continue  # not what makes the difference
        if wn == 0:
            rows.append(f"no {kind}s where the runner-up has {_n(rn, kind)} ({fmt_bytes(rb)}, {fmt_time(rt)})")
        elif rn == 0:
            rows.append(f"{_n(wn, kind)} the runner-up does not have ({fmt_bytes(wb)}, {fmt_time(wt)})")
        else:
            rows.append(f"{_n(wn, kind)} over {_axes(winner, kind)} moving {fmt_bytes(wb)} in {fmt_time(wt)} where "
                        f"the runner-up has {rn} over {_axes(runner, kind)} moving {fmt_bytes(rb)} in {fmt_time(rt)}")
    return rows[:3]


def why_faster(winner: str, w: Any, runner: str, r: Any) -> str:
    """One or two sentences: ``winner`` against ``runner`` (both predicted :class:`Cost`s).

    Says by what factor the winner is faster and where the difference comes from:
    compute (FLOPs per device), communication (per collective kind: bytes and time per
    step) and peak memory per device.

    Example::

        why_faster("2-D", predict(g, m, "batch:rows;hidden:cols"), "data-parallel", predict(g, m, "batch:all"))
    """
    if r.time_s <= 0 or w.time_s <= 0:
        return f"`{winner}` and `{runner}` are predicted at {fmt_time(w.time_s)} and {fmt_time(r.time_s)}."
    ratio = r.time_s / w.time_s
    head = (f"`{winner}` is predicted {ratio:.2f}x as fast as the runner-up `{runner}` "
            f"({fmt_time(w.time_s)} vs {fmt_time(r.time_s)} per step)")
    reasons = []
    d_comm, d_comp = r.comm_s - w.comm_s, r.compute_s - w.compute_s
    if d_comm > 0.02 * r.time_s:
        reasons.append(f"{fmt_time(d_comm)} less communication")
    elif d_comm < -0.02 * r.time_s:
        reasons.append(f"{fmt_time(-d_comm)} more communication")
    if d_comp > 0.02 * r.time_s:
        flops = f", {r.flops / w.flops:.2g}x fewer FLOPs per device" if w.flops and r.flops > 1.05 * w.flops else ""
        reasons.append(f"{fmt_time(d_comp)} less compute{flops}")
    elif d_comp < -0.02 * r.time_s:
        reasons.append(f"{fmt_time(-d_comp)} more compute")
    text = head + (": " + " and ".join(reasons) if reasons else ": the two are within 2% on compute and on "
                   "communication") + "."
    diff = _comm_diff(w, r)
    if diff:
        text += f" `{winner}` has " + "; ".join(diff) + "."
    if abs(w.memory_bytes - r.memory_bytes) > 0.05 * max(r.memory_bytes, 1):
        more = "less" if w.memory_bytes < r.memory_bytes else "more"
        text += (f" It needs {fmt_bytes(w.memory_bytes)} per device, {more} than the runner-up's "
                 f"{fmt_bytes(r.memory_bytes)}.")
    return text
