"""Renames of dims that move nothing: XLA makes them bitcasts, which take no buffer.

A rename (a reshape whose groups each map one dim to one dim, such as an attention's
``length -> length_1`` of the tensors its key and value projections read) is a collective or a
local slice where the layout puts the two names on different mesh axes, and an instruction
of XLA's schedule with a buffer of its own. Where the layout puts them on the same axes the
rename moves nothing: XLA's optimized HLO has a ``bitcast`` of the operand, which shares the
operand's buffer (``HloDataflowAnalysis``: a bitcast defines no value of its own), so the
renamed tensor takes no bytes and the operand's buffer lives until the renamed tensor's last
reader (measured: ``benchmarks/memory_vs_xla.py``'s ZeRO layouts of the Flax GPT and equinox
blocks, whose three 8 KiB renames the breadth-first order ran early and held, 15-22% over
XLA's figure, and the NNX llama's length -> kv_length renames, 13-14% over; with this rule
71 of its 76 chosen layouts, 66 of 72 and 134 of 144 drawn at random are within 10%, against
66, 66 and 132; ``tests/test_bitcasts.py``, ``tests/test_memory_xla.py``).

:func:`is_bitcast` is the rule (one place: ``predict`` and the search's tables both call it);
:func:`kept_spans` gives, per computation, where each renamed operand's buffer is kept alive past
its own last reader: the positions after the operand's last read up to the last read of its
renames. ``memory.peak_memory`` counts the operand's bytes there where its renames are
bitcasts, and the renamed tensors at 0 bytes; the search lists :func:`kept_spans` as names
sized by the layout (``search.names.kept``, ``search.tables.Tables.kept_bytes``).
"""
from __future__ import annotations

from functools import lru_cache

from autolayout.costmodel.lifetimes import computations
from autolayout.graph import Graph, Op

__all__ = ["is_rename", "is_loop_slice", "is_bitcast", "kept_spans"]


def is_rename(op: Op) -> bool:
    """Whether ``op`` renames dims and nothing else: a reshape whose groups each map one dim to
    one dim (a kept dim maps to itself)."""
    groups = dict(op.attrs).get("groups", ()) if op.kind == "reshape" else ()
    return bool(groups) and op.fn == "rename" and all(len(i) == 1 and len(o) == 1 for i, o in groups)


def is_loop_slice(op: Op) -> bool:
    """Whether ``op`` is a scan body's slice of a stacked input, which XLA reads with a
    ``dynamic-slice`` fused into each consumer (``fusion.with_fusion``): a rename of it is that
    consumer, a ``dynamic-slice`` fusion with a buffer of its own, never a bitcast."""
    return op.kind == "reshape" and op.fn == "slice"


def is_bitcast(op: Op, src: Op, collectives: int, in_bytes: int, out_bytes: int) -> bool:
    """Whether rename ``op`` of the output of ``src`` moves nothing under a layout whose plan
    gives it ``collectives`` collectives and its operand ``in_bytes`` and output ``out_bytes``
    local bytes: no collective and no local slice (the same local bytes), so each renamed dim has
    its source's mesh axes, and ``src`` is not a loop slice (:func:`is_loop_slice`): XLA bitcasts
    the operand."""
    return is_rename(op) and not is_loop_slice(src) and not collectives and in_bytes == out_bytes


@lru_cache(maxsize=64)
def kept_spans(graph: Graph) -> dict[str | None, tuple[tuple[str, tuple[str, ...], int, int], ...]]:
    """Per computation (``None``: the top level; a loop's name: its body), ``(operand, renames,
    start, stop)``: a materialised tensor computed in that computation and the renames of it in
    the same computation, where the last of them is read after the operand's own last reader;
    ``start..stop`` are the positions (``lifetimes``' units at the top level, body positions in
    a body) where the operand is live only as the renames' buffer. An operand whose renames map
    its dims differently (so a layout can make one a bitcast and not another) is left out: its
    renames keep their own buffers."""
    loop_of, lasts = computations(graph)
    renames: dict[str, list[str]] = {}
    for op in graph.ops():
        if not (is_rename(op) and op.materialised):
            continue
        src = graph.op(op.inputs[0])
        if src.materialised and not is_loop_slice(src):
            renames.setdefault(op.inputs[0], []).append(op.name)
    out: dict[str | None, list] = {}
    for src, rs in renames.items():
        if src not in loop_of or len({dict(graph.op(r).attrs)["groups"] for r in rs}) != 1:
            continue
        loop = loop_of[src]
        if any(loop_of.get(r, 0) != loop for r in rs):
            continue
        last = lasts[loop]
        if src not in last or any(r not in last for r in rs):
            continue  # an argument or an output reused in place: live throughout already
        stop = max(last[r] for r in rs)
        if stop > last[src]:
            out.setdefault(loop, []).append((src, tuple(rs), last[src] + 1, stop))
    return {k: tuple(v) for k, v in out.items()}
