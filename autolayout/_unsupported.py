"""Unsupported constructs: why each one is, how to rewrite it, and one error for all.

The tracer (:mod:`autolayout._interpret`) records every equation it has no rule for and
goes on with a placeholder value, so that one trace reports every unsupported construct
of a function at once, each with its source line and a specific rewrite where one exists.
"""
from __future__ import annotations

from dataclasses import dataclass

from autolayout._unify import TraceError

# Why a primitive has no named-dimension rule, and the rewrite that has one.
REWRITES: dict[str, tuple[str, str]] = {
    "while": ("a `lax.while_loop` (or a `fori_loop` whose bounds are known only at run time) repeats "
              "its body a data-dependent number of times, so the step's cost and collectives are "
              "unknown when tracing",
              "use `lax.scan`, or `lax.fori_loop` with Python-int bounds (JAX lowers it to a scan)"),
    "cond": ("`lax.cond` / `lax.switch` runs a branch chosen at run time, so the step's cost and "
             "collectives depend on the data",
             "compute both branches and pick with `jnp.where(pred, a, b)`, or make the choice outside "
             "the traced function; a library's cond, such as `optax.MultiSteps`'s choice between "
             "accumulating and applying gradients, goes with the library: trace the step without it "
             "(accumulate over microbatches with `lax.scan` inside the step instead)"),
    "scatter": ("`x.at[i].set(v)` overwrites positions chosen at run time",
                "`jnp.where(jax.nn.one_hot(i, n, dtype=bool), v, x)` (a mask along the indexed axis), "
                "or `x.at[i].add(v - x[i])` with unique indices"),
    "scatter-mul": ("`x.at[i].multiply(v)` has no rule", "multiply by `jnp.where(one_hot(i, n), v, 1)`"),
    "scatter-min": ("`x.at[i].min(v)` has no rule", "a masked `jnp.minimum` with `jax.nn.one_hot(i, n)`"),
    "scatter-max": ("`x.at[i].max(v)` has no rule", "a masked `jnp.maximum` with `jax.nn.one_hot(i, n)`"),
    "reduce_window_max": ("pooling windows are not named dims",
                          "for non-overlapping windows reshape and reduce: "
                          "`x.reshape(b, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))`"),
    "reduce_window_sum": ("pooling windows are not named dims",
                          "for non-overlapping windows reshape and reduce: "
                          "`x.reshape(b, h // 2, 2, w // 2, 2, c).sum(axis=(2, 4))`"),
    "reduce_window": ("pooling windows are not named dims",
                      "for non-overlapping windows reshape into (windows, window) and reduce"),
    # the gradient of a max-pool (reduce_window_max's transpose)
    "select_and_scatter_add": ("a max-pool's gradient scatters into pooling windows, which are not named dims",
                               "for non-overlapping windows reshape and reduce in the forward pass: "
                               "`x.reshape(b, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))`, whose gradient "
                               "has a rule"),
    "conv_general_dilated": ("grouped (e.g. depthwise) convolutions have no named-dimension rule",
                             "reshape the channels to (groups, channels per group) and convolve each "
                             "group with `feature_group_count=1`, or write a depthwise 3x3 as the sum of "
                             "9 shifted slices times per-channel weights"),
    "rng_bit_generator": ("random bits are drawn inside the step",
                          "draw random numbers outside the traced function and pass them in"),
    "random_bits": ("random bits are drawn inside the step (e.g. for dropout)",
                    "draw random numbers outside the traced function and pass them in "
                    "(e.g. a dropout mask as an input), or trace the deterministic step"),
    "threefry2x32": ("random bits are drawn inside the step",
                     "draw random numbers outside the traced function and pass them in"),
}
for _p in ("random_seed", "random_split", "random_fold_in", "random_wrap", "random_unwrap"):
    REWRITES[_p] = ("random keys are made or split inside the step (e.g. for dropout)",
                    "draw random numbers outside the traced function and pass them in "
                    "(e.g. a dropout mask as an input), or trace the deterministic step")
NO_REWRITE = "compute this step outside the traced function and pass its result in"
for _p in ("cholesky", "eigh", "svd", "lu", "qr", "triangular_solve", "fft", "custom_linear_solve", "eig"):
    REWRITES[_p] = ("linear-algebra kernels have no named-dimension rule", NO_REWRITE)


class Unsupported(TraceError):
    """One construct the tracer has no rule for (collected, then reported together)."""

    def __init__(self, prim: str, shapes: str, source: str, why: str, rewrite: str) -> None:
        self.item = Item(prim, shapes, source, why, rewrite)
        super().__init__(str(self.item))


@dataclass(frozen=True)
class Item:
    prim: str
    shapes: str
    source: str
    why: str
    rewrite: str

    def __str__(self) -> str:
        return (f"unsupported primitive `{self.prim}` with inputs ({self.shapes}) at "
                f"{self.source or 'unknown source'}: {self.why}. Rewrite: {self.rewrite}.")


def unsupported(prim: str, shapes: str, source: str, why: str | None = None) -> Unsupported:
    """The error for ``prim``: ``why`` (else the table's reason) and the table's rewrite."""
    reason, rewrite = REWRITES.get(prim, ("autolayout has no named-dimension rule for it", (
        "express this step with einsum, elementwise, reduction, reshape, slicing, gather or scan "
        "operations, or compute it outside the traced function")))
    return Unsupported(prim, shapes, source, why or reason, rewrite)


def report(items: list[Item], fn: str) -> TraceError:
    """One error listing every unsupported construct, each primitive at a source line once
    (the forward pass's and the backward pass's equations of one line, with their inputs'
    shapes joined)."""
    merged: dict[tuple, Item] = {}
    for it in dict.fromkeys(items):
        key = (it.prim, it.source or id(it), it.why, it.rewrite)
        if key in merged:
            merged[key] = Item(it.prim, f"{merged[key].shapes}) and ({it.shapes}", it.source, it.why, it.rewrite)
        else:
            merged[key] = it
    seen = list(merged.values())
    if len(seen) == 1:
        return TraceError(str(seen[0]))
    lines = "\n".join(f"  {i + 1}. {it}" for i, it in enumerate(seen))
    return TraceError(f"{len(seen)} unsupported constructs in {fn!r} (fix them all, then trace again):\n{lines}")
