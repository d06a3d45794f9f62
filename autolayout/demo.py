"""``autolayout demo``: the pipeline end to end on a small transformer, one section at a time.

Each section is a function that takes the :class:`Demo` state, prints its part and
may add to the state; :data:`SECTIONS` lists them in order, so a new stage (cost
table, search, execution) is one function and one entry. Sizes are CPU-friendly:
the whole demo runs in seconds.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

from autolayout.graph import Graph, SignatureClass

# The built-in transformer (autolayout.models.transformer_lm) at a size a laptop traces
# and runs in well under a second.
SIZES = dict(d_model=64, d_ff=256, heads=4, d_kv=16, n_layers=2, vocab=256, batch=16, length=32)
WIDTH = 78


@dataclass
class Demo:
    """What the sections share: the traced graph, and anything later sections add."""

    sizes: dict[str, int]
    graph: Graph | None = None
    extras: dict[str, Any] = field(default_factory=dict)


def header(title: str) -> None:
    print()
    print(f"== {title} ".ljust(WIDTH, "="))


def table(rows: list[tuple], head: tuple, align: str) -> None:
    """Print ``rows`` under ``head``; ``align`` has one ``<`` or ``>`` per column."""
    cells = [tuple(str(c) for c in head)] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    for k, row in enumerate(cells):
        print("  " + "  ".join(c.ljust(w) if a == "<" else c.rjust(w)
                               for c, w, a in zip(row, widths, align)).rstrip())
        if k == 0:
            print("  " + "  ".join("-" * w for w in widths))


# --------------------------------------------------------------------------- sections
def section_trace(demo: Demo) -> None:
    """Trace one Adam training step of the built-in transformer (nothing is allocated)."""
    import time

    from autolayout import models

    header("1. Trace: a plain JAX training step -> named-dimension graph")
    args = ", ".join(f"{k}={v}" for k, v in demo.sizes.items())
    t0 = time.perf_counter()
    demo.graph = models.transformer_lm(**demo.sizes)
    print(f"  models.transformer_lm({args})")
    print(f"  traced in {time.perf_counter() - t0:.2f} s (jax.ShapeDtypeStruct arguments, Adam)")
    print()
    for line in demo.graph.summary().splitlines():
        print("  " + line)


def section_signatures(demo: Demo) -> None:
    """Signature classes by kind: what the cost model and the search work on."""
    g = demo.graph
    header("2. Signature classes: identical ops (repeated layers) share a class")
    classes = g.signature_classes()
    by_kind: dict[str, list[SignatureClass]] = defaultdict(list)
    for c in classes:
        by_kind[c.kind].append(c)
    ops = Counter(op.kind for op in g.ops())
    rows = []
    for kind in sorted(by_kind, key=lambda k: -ops[k]):
        cs = by_kind[kind]
        flops = sum(g.op(c.ops[0]).flops() * c.count for c in cs if _contraction(g, c))
        rows.append((kind, ops[kind], len(cs), sum(c.count for c in cs), f"{flops:.3g}" if flops else ""))
    rows.append(("total", len(g), len(classes), sum(c.count for c in classes), f"{g.flops():.3g}"))
    table(rows, ("kind", "ops", "classes", "executions/step", "model flops"), "<>>>>")
    print()
    print("  heaviest contractions (flops per step):")
    top = sorted((c for c in classes if _contraction(g, c)),
                 key=lambda c: -g.op(c.ops[0]).flops() * c.count)[:5]
    table([(_einsum_text(g, c), c.count, f"{g.op(c.ops[0]).flops() * c.count:.3g}") for c in top],
          ("einsum", "count", "flops"), "<>>")


def _contraction(g: Graph, c: SignatureClass) -> bool:
    """Einsums of two or more inputs: what model flops (``Graph.flops``) count."""
    return c.kind == "einsum" and len(g.op(c.ops[0]).inputs) >= 2


def _einsum_text(g: Graph, c: SignatureClass) -> str:
    op = g.op(c.ops[0])
    shape = lambda s: "[" + ",".join(d.name for d in s) + "]"  # noqa: E731
    return ", ".join(shape(s) for s in op.input_shapes) + " -> " + shape(op.output.shape)


SECTIONS: list[Callable[[Demo], None]] = [section_trace, section_signatures]


def run(sizes: dict[str, int] | None = None) -> int:
    """Run every section in order; returns the exit code (0)."""
    demo = Demo(dict(sizes or SIZES))
    print("autolayout demo: how should each tensor dimension be split across a mesh?")
    for section in SECTIONS:
        section(demo)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
