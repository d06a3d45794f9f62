"""Which element-wise values XLA:CPU writes to memory around a reduction, against the model's
fusion marks (``Op.materialised``, set by ``fusion.with_fusion``).

On this machine's jax (0.10.2) XLA:CPU runs a reduction as a YNNPACK custom fusion
(``ynn_fusion``, ``kind=kCustom``) that takes in the element-wise chain feeding it, broadcasts
included (``sum(tanh(x) * g, 0)`` is one fusion reading ``x`` and ``g``); a value read by the
reduction and by another fusion is computed once into memory for the reduction (and recomputed
in the other fusions, as any cheap producer is); ``sin`` is not taken in. ``fusion.with_fusion``
follows that rule (a reduction fuses its element-wise producers; before, it materialised an
element-wise op a reduction reads, and agreed on 3 of the 11 programs). This script prints, for small
programs of each kind, the buffers of the programs' large shape (``f32[64,128]``) in XLA's
optimized HLO and in the traced graph, and how many programs agree in number. DESIGN.md §11
records what changing the rule did to ``benchmarks/memory_vs_xla.py``.

Run: ``python benchmarks/xla_cpu_reductions.py`` (one CPU device; a few seconds).
"""
from __future__ import annotations

import re
import sys

import jax
import jax.numpy as jnp

from autolayout import trace

B, D, F = 64, 128, 256  # the large shape is [B, D]
LARGE = f"f32[{B},{D}]"


def _ln(x, g):
    m = jnp.mean(x, -1, keepdims=True)
    d = x - m
    r = jax.lax.rsqrt(jnp.mean(d * d, -1, keepdims=True) + 1e-6)
    return d * r * g


def _ln_loss(params, x):
    g, w = params
    return jnp.sum(jnp.tanh(_ln(x, g) @ w))


def _rms_scale_grad(x, dy):
    r = jax.lax.rsqrt(jnp.mean(x * x, axis=1, keepdims=True) + 1e-6)
    return jnp.sum(dy * (x * r), axis=0)


def _shared_loop_and_reduction(x, y, w, r):
    xr = x * r[:, None]
    return (xr * 2.0) @ w, jnp.sum(y * xr, axis=0)


def _shared_two_reductions(x, y, r):
    xr = x * r[:, None]
    return jnp.sum(xr, axis=1), jnp.sum(y * xr, axis=0)


def _shared_output_and_reduction(x, y, r):
    xr = x * r[:, None]
    return xr + 1.0, jnp.sum(y * xr, axis=0)


def _shared_expensive(x, y):
    t = jnp.tanh(x)
    return jnp.exp(t) @ y.T, jnp.sum(y * t, axis=0)


def cases() -> dict:
    x, y = jnp.ones((B, D)), jnp.ones((B, D))
    g, r, w = jnp.ones((D,)), jnp.ones((B,)), jnp.ones((D, 32))
    return {
        "sum(tanh(x), 1)": (lambda x: jnp.sum(jnp.tanh(x), axis=1), (x,)),
        "sum(x * 2 + 1, 1)": (lambda x: jnp.sum(x * 2 + 1, axis=1), (x,)),
        "sum((x - 1) * (y + 1), 1)": (lambda x, y: jnp.sum((x - 1) * (y + 1), axis=1), (x, y)),
        "sum(tanh(x) * g, 0)": (lambda x, g: jnp.sum(jnp.tanh(x) * g, axis=0), (x, g)),
        "sum(tanh(x) * sin(y), 1)": (lambda x, y: jnp.sum(jnp.tanh(x) * jnp.sin(y), axis=1), (x, y)),
        "rms scale gradient": (_rms_scale_grad, (x, y)),
        "x*r read by a dot's fusion and a sum": (_shared_loop_and_reduction, (x, y, w, r)),
        "x*r read by two sums": (_shared_two_reductions, (x, y, r)),
        "x*r read by an output and a sum": (_shared_output_and_reduction, (x, y, r)),
        "tanh(x) read by exp and a sum": (_shared_expensive, (x, y)),
        "layer norm gradient": (jax.grad(_ln_loss), ((g, jnp.ones((D, F))), x)),
    }


def xla_buffers(text: str, shape: str = LARGE) -> list[str]:
    """The instructions of ``shape`` (``LARGE`` unless given) in the entry computation of
    optimized HLO ``text`` (a compiled program's ``as_text()``) that take a buffer (not
    parameters, bitcasts, tuples)."""
    entry = text[text.index("\nENTRY"):]
    out = []
    for line in entry.splitlines()[1:]:
        m = re.match(r"\s*(?:ROOT )?%(\S+) = (\S+?)(?:\{[\d,]*\})? ([\w-]+)\(", line)
        if m and m.group(2) == shape and m.group(3) not in ("parameter", "bitcast", "tuple", "get-tuple-element"):
            out.append(m.group(1))
    return out


def computations(text: str) -> tuple[dict[str, str], str | None]:
    """The computations of optimized HLO ``text`` by name (their instruction lines), and the
    name of its one ``while`` loop's body (None without a loop)."""
    bodies = re.findall(r"body=%([\w.\-]+)", text)
    comps = {m.group(1): m.group(2) for m in re.finditer(r"\n%?([\w.\-]+) [^\n]*\{\n(.*?)\n\}", text, re.S)}
    if len(bodies) > 1:
        raise ValueError(f"computations: the program has {len(bodies)} while loops, expected at most one")
    return comps, (bodies[0] if bodies else None)


def model_buffers(fn, args) -> list[str]:
    """The graph's materialised tensors of ``LARGE`` shape computed in the step."""
    g = trace(fn, *args)
    return [op.name for op in g.ops() if op.materialised and op.kind not in ("input", "param")
            and op.output.dtype == "float32" and tuple(d.size for d in op.output.shape) == (B, D)]


def main() -> int:
    rows = []
    for name, (fn, args) in cases().items():
        xla, model = xla_buffers(jax.jit(fn).lower(*args).compile().as_text()), model_buffers(fn, args)
        rows.append((name, xla, model))
    width = max(len(r[0]) for r in rows)
    print(f"{'program':{width}}  XLA  model  buffers of {LARGE} (XLA | model)")
    for name, xla, model in rows:
        mark = "" if len(xla) == len(model) else "  <- differs"
        print(f"{name:{width}}  {len(xla):3d}  {len(model):5d}  {', '.join(xla) or '-'} | {', '.join(model) or '-'}{mark}")
    agree = sum(len(x) == len(m) for _, x, m in rows)
    print(f"{agree} of {len(rows)} programs: as many large buffers in the model as in XLA:CPU's optimized HLO")
    return 0


if __name__ == "__main__":
    sys.exit(main())
