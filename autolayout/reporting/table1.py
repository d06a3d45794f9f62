"""Table 1 of the Mesh-TensorFlow paper (§8.6), reproduced by the cost model itself.

The paper's table drops constant factors and lower-order terms; its §8 text
states the exact number of values all-reduced per processor. For each layout we
trace the paper's MLP (:func:`autolayout.models.mlp`), run :func:`predict`, and
put the prediction beside the paper's formulas. The ratio columns show that our
numbers differ from the table only by the constants it drops (12 for compute:
six ``b·d_io·d_h`` matmuls per training step at 2 flops per multiply-add; 2
for communication: the table counts one of the two all-reduced matrices).
"""
from __future__ import annotations

from typing import Any

__all__ = ["table1", "TABLE1_LAYOUTS", "indivisible"]

# The five layouts of Table 1, in the paper's order (their formulas: _paper below).
TABLE1_LAYOUTS = ("[]", "batch:all", "hidden:all", "batch:rows;hidden:cols",
                  "batch:rows;hidden:cols;io:planes")


def indivisible(b: int, d_io: int, d_h: int, n: int, r: int, c: int, p: int) -> list[tuple[str, str, str]]:
    """``(size argument, mesh argument, layout)`` for each size of Table 1 that its layout splits
    over a mesh axis whose size does not divide it (``b`` over ``n`` in ``batch:all``, ...)."""
    splits = [("b", b, "n", n, "batch:all"), ("d_h", d_h, "n", n, "hidden:all"),
              ("b", b, "r", r, "batch:rows;hidden:cols"), ("d_h", d_h, "c", c, "batch:rows;hidden:cols"),
              ("d_io", d_io, "p", p, "batch:rows;hidden:cols;io:planes")]
    return [(size, count, layout) for size, value, count, devices, layout in splits if value % devices]


def _paper(layout: str, b: int, dio: int, dh: int, n: int, r: int, c: int, p: int) -> dict:
    """The paper's formulas: Table 1 columns and the exact §8.1-8.3 text."""
    if layout == "[]":
        return dict(mesh=f"all:{n}", comp=b * dio * dh, comm=0, text=0, memory=b * dio + b * dh + dio * dh)
    if layout == "batch:all":
        return dict(mesh=f"all:{n}", comp=b * dio * dh / n, comm=dio * dh, text=2 * dio * dh,
                    memory=b / n * dio + b / n * dh + dio * dh)
    if layout == "hidden:all":
        return dict(mesh=f"all:{n}", comp=b * dio * dh / n, comm=dio * b, text=2 * b * dio,
                    memory=b * dio + b * dh / n + dio * dh / n)
    if layout == "batch:rows;hidden:cols":
        return dict(mesh=f"rows:{r},cols:{c}", comp=b * dio * dh / (r * c), comm=dio * (b / r + dh / c),
                    text=2 * b * dio / r + 2 * dio * dh / c,
                    memory=b / r * dio + b / r * dh / c + dio * dh / c)
    # §8.3: "every matrix ... tiled across two mesh dimensions ... every einsum requires an
    # allreduce across one mesh dimension": 2 of each of the three matrix shapes.
    return dict(mesh=f"rows:{r},cols:{c},planes:{p}", comp=b * dio * dh / (r * c * p),
                comm=b / r * dio / p + b / r * dh / c + dio / p * dh / c,
                text=2 * (b / r * dio / p + b / r * dh / c + dio / p * dh / c),
                memory=b / r * dio / p + b / r * dh / c + dio / p * dh / c)


def table1(b: int = 1024, d_io: int = 1024, d_h: int = 4096, *, n: int = 8, r: int = 4, c: int = 2,
           p: int = 2, hardware: Any = "tpu-v3", graph: Any = None) -> Any:
    """Predict every layout of the paper's Table 1 and return a DataFrame beside the paper.

    Columns: ``comp_flops`` (predicted matmul flops per device) and ``paper_comp``
    with their ratio; ``allreduced_values`` (values all-reduced per processor:
    operand elements of every all-reduce) beside the paper's exact §8 text
    (``paper_text``; we add the bias gradient ``d_h``/its slice and the scalar
    loss, which the text calls approximate) and the Table column; parameter
    values per processor; predicted time. Example::

        df = table1(b=512, d_io=256, d_h=1024, n=8, r=4, c=2, p=2)
    """
    import pandas as pd

    from autolayout import models
    from autolayout.costmodel.predict import predict

    given = {"b": b, "d_io": d_io, "d_h": d_h, "n": n, "r": r, "c": c, "p": p}
    for size, count, layout in indivisible(b, d_io, d_h, n, r, c, p)[:1]:
        raise ValueError(f"table1: {count}={given[count]} does not divide {size}={given[size]}, which Table 1's "
                         f"layout {layout!r} splits over it; give {count} a value that divides {given[size]}, or {size} "
                         f"a multiple of {given[count]}")
    g = graph if graph is not None else models.mlp(b, d_io, d_h)
    rows = []
    for lay in TABLE1_LAYOUTS:
        paper = _paper(lay, b, d_io, d_h, n, r, c, p)
        cost = predict(g, paper["mesh"], "" if lay == "[]" else lay, hardware=hardware)
        df = cost.per_op
        mm = df[(df.kind == "einsum") & df.fn.eq("dot")]
        comp = float((mm.flops * mm["count"]).sum())
        values = sum(cc.bytes // 4 * cc.count for cc in cost.collectives if cc.kind == "all-reduce")
        rows.append({
            "layout": lay, "mesh": paper["mesh"],
            "comp_flops": comp, "paper_comp": paper["comp"], "comp_ratio": comp / paper["comp"],
            "allreduced_values": values, "paper_text": paper["text"], "paper_comm": paper["comm"],
            "param_values": cost.memory["params"] // 4, "paper_memory": paper["memory"],
            "compute_ms": cost.compute_s * 1e3, "comm_ms": cost.comm_s * 1e3, "time_ms": cost.time_s * 1e3,
            "memory_MiB": cost.memory_bytes / 2 ** 20})
    return pd.DataFrame(rows)
