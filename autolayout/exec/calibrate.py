"""``calibrate(mesh)``: measure a :class:`~autolayout.costmodel.hardware.Hardware` profile.

Every measurement runs on *all* devices of the mesh at once (one ``shard_map``
program), so shared resources are shared as in a real step — on this machine
8 virtual CPU devices share 2 cores, and each device gets its share.

* **matmul throughput**: a chain of ``k`` square matmuls per device at several
  sizes; ``peak_flops`` is the best rate and ``efficiency`` the median rate over
  the sizes divided by it (the cost model charges every matmul at
  ``peak * efficiency``, and most matmuls of a sharded step are small).
* **memory bandwidth**: ``y = a * x + b`` over a large local array (read + write).
* **alpha/beta per mesh axis**: all-reduce, all-gather, reduce-scatter and
  all-to-all over that axis at a few operand sizes; each time is the slope of a
  chain of ``k`` dependent collectives (``fori_loop`` with a traced trip count:
  ``t(k_hi) - t(k_lo)``, so dispatch overhead cancels). ``alpha`` (latency per
  step) and ``B`` (bandwidth) are fitted by relative least squares to the cost
  model's own formulas (:mod:`autolayout.costmodel.collectives`):
  ``t = alpha * steps + coef * V / B`` with ``steps`` = ``n-1`` (``2(n-1)`` for
  all-reduce) and ``coef`` = ``(n-1)`` for all-gather (``V`` = shard),
  ``(n-1)/n`` for reduce-scatter and all-to-all (switch topology), ``2(n-1)/n``
  for all-reduce.
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Any, Sequence

import numpy as np

from autolayout.costmodel.hardware import SWITCH, Hardware, Link

__all__ = ["calibrate", "fit_alpha_beta"]

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")


def _median_time(fn: Any, args: Sequence[Any], repeats: int) -> float:
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _per_iter(t_lo: float, t_hi: float, lo: int, hi: int) -> float:
    """Time of one loop iteration from runs of ``lo`` and ``hi`` iterations. The difference
    cancels fixed launch costs; when it is lost in noise (8 devices share the host's cores,
    and other work may load them) it is not trusted and the plain ``t_hi / hi`` (an upper
    bound, so a conservative rate) is used instead of dividing by almost nothing."""
    diff = (t_hi - t_lo) / (hi - lo)
    return diff if t_hi - t_lo > 0.1 * t_hi else t_hi / hi


def _model_terms(kind: str, nbytes: float, n: int) -> tuple[float, float]:
    """``(steps, coef * V)`` of the cost model's formula for one collective."""
    if kind == "all-gather":
        return n - 1, (n - 1) * nbytes
    if kind == "all-reduce":
        return 2 * (n - 1), 2 * (n - 1) / n * nbytes
    return n - 1, (n - 1) / n * nbytes  # reduce-scatter, all-to-all on a switch


def fit_alpha_beta(samples: Sequence[tuple[str, float, int, float]]) -> tuple[float, float]:
    """``(alpha seconds/step, bandwidth bytes/s)`` fitted to ``(kind, operand bytes, n, seconds)``
    samples by least squares on relative errors, both constrained positive."""
    rows = [(*_model_terms(k, v, n), t) for k, v, n, t in samples if t > 0 and n > 1]
    if not rows:
        return 0.0, 1e15
    a = np.array([[s / t, w / t] for s, w, t in rows])
    y = np.ones(len(rows))
    sol, *_ = np.linalg.lstsq(a, y, rcond=None)
    alpha, inv_b = float(sol[0]), float(sol[1])
    if inv_b <= 0:  # latency only
        alpha, inv_b = float(np.dot(a[:, 0], y) / np.dot(a[:, 0], a[:, 0])), 0.0
    elif alpha < 0:  # bandwidth only
        alpha, inv_b = 0.0, float(np.dot(a[:, 1], y) / np.dot(a[:, 1], a[:, 1]))
    return max(alpha, 0.0), (1.0 / inv_b if inv_b > 0 else 1e15)


def _host_memory_per_device(jmesh: Any) -> float:
    dev = jmesh.devices.flat[0]
    try:
        stats = dev.memory_stats() or {}
        if stats.get("bytes_limit"):
            return float(stats["bytes_limit"])
    except Exception:  # CPU devices have no memory stats
        pass
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 16 * 2**30
    return float(total) / jmesh.devices.size


def calibrate(mesh: Any, *, quick: bool = False, devices: Sequence[Any] | None = None,
              repeats: int | None = None, save_to: Any = None, name: str | None = None,
              verbose: bool = False) -> Hardware:
    """Measure a Hardware profile on the devices of ``mesh`` (all running at once).

    ``mesh``: anything :class:`~autolayout.core.Mesh` accepts, or a ``jax.sharding.Mesh``.
    ``quick=True`` uses fewer sizes and repeats (seconds instead of a minute on CPU).
    ``save_to``: a path to write the profile as JSON (``Hardware.load`` reads it).
    The measured samples are kept in the profile's ``description``/``sources``.

    Example::

        hw = calibrate("rows:2,cols:4", quick=True)
        predict(graph, "rows:2,cols:4", layout, hw).time_s
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from autolayout.exec.runner import _jax_mesh

    amesh, jmesh = _jax_mesh(mesh, devices)
    repeats = repeats or (3 if quick else 7)
    all_axes = tuple(amesh.axis_names)
    ndev = amesh.size
    notes = []

    def run_local(body: Any, local_shape: tuple, dtype: Any = jnp.float32, k_static: bool = False) -> Any:
        """jit(shard_map(body)) over a (ndev * local_shape[0], ...) array split on all axes."""
        spec = P(all_axes)
        f = jax.jit(jax.shard_map(body, mesh=jmesh, in_specs=(spec, P()), out_specs=spec, check_vma=False))
        x = jax.device_put(jnp.ones((ndev * local_shape[0], *local_shape[1:]), dtype) * 0.5,
                           NamedSharding(jmesh, spec))
        return f, x

    # -- matmul throughput (per device, all devices at once)
    sizes = (64, 256) if quick else (64, 128, 256, 512)
    rates = []
    for n in sizes:
        def mm(x: Any, k: Any) -> Any:
            w = jnp.eye(n, dtype=x.dtype) * 0.999 + 1e-4
            return lax.fori_loop(0, k, lambda i, y: y @ w, x)

        f, x = run_local(mm, (n, n))
        lo, hi = 1, 4 if quick else 8
        t = _per_iter(_median_time(f, (x, lo), repeats), _median_time(f, (x, hi), repeats), lo, hi)
        rate = 2 * n ** 3 / max(t, 1e-9)
        notes.append(f"matmul {n}: {rate / 1e9:.2f} GFLOP/s per device")
        rates.append(rate)
    best = max(rates)
    efficiency = min(max(statistics.median(rates) / best, 1e-3), 1.0)

    # -- memory bandwidth
    mb = (8 if quick else 32) * 2**20 // 4
    rows = mb // 1024

    def stream(x: Any, k: Any) -> Any:
        return lax.fori_loop(0, k, lambda i, y: y * 0.999 + 0.001, x)

    f, x = run_local(stream, (rows, 1024))
    t = _per_iter(_median_time(f, (x, 1), repeats), _median_time(f, (x, 5), repeats), 1, 5)
    hbm_bw = 2 * rows * 1024 * 4 / max(t, 1e-9)
    notes.append(f"stream {rows * 1024 * 4 / 2**20:.0f} MiB: {hbm_bw / 1e9:.2f} GB/s per device")

    # -- alpha/beta per mesh axis
    nbytes = (4096, 262144) if quick else (4096, 65536, 1048576)
    links, pooled = {}, []
    for axis in all_axes:
        size = amesh.axis_size(axis)
        if size == 1:
            continue
        samples = []
        for kind in KINDS:
            for v in nbytes:
                elems = max(v // 4 // size, 1) * size

                def coll(x: Any, k: Any, kind: str = kind) -> Any:
                    def one(i: Any, y: Any) -> Any:
                        if kind == "all-reduce":
                            return lax.psum(y, axis) * (1.0 / size)
                        if kind == "all-gather":
                            return lax.all_gather(y[: elems // size], axis, tiled=True)
                        if kind == "reduce-scatter":
                            return jnp.tile(lax.psum_scatter(y, axis, tiled=True), size)
                        return lax.all_to_all(y.reshape(size, -1), axis, 0, 0, tiled=True).reshape(-1)
                    return lax.fori_loop(0, k, one, x.reshape(-1))[None]

                f, x = run_local(coll, (1, elems))
                lo, hi = 1, 4 if quick else 8
                t = _per_iter(_median_time(f, (x, lo), repeats), _median_time(f, (x, hi), repeats), lo, hi)
                operand = elems * 4 // (size if kind == "all-gather" else 1)
                samples.append((kind, float(operand), size, max(t, 1e-9)))
        alpha, bw = fit_alpha_beta(samples)
        pooled.extend(samples)
        links[axis] = Link(bw, alpha, SWITCH, f"calibrated on mesh axis {axis}:{size} ({len(samples)} samples)")
        notes.append(f"axis {axis}:{size}: alpha {alpha * 1e6:.1f} us/step, B {bw / 1e9:.2f} GB/s; "
                     + ", ".join(f"{k} {int(v)}B {t * 1e6:.0f}us" for k, v, _, t in samples))
        if verbose:
            print(notes[-1])
    alpha, bw = fit_alpha_beta(pooled) if pooled else (0.0, 1e15)
    platform = jmesh.devices.flat[0].platform
    hw = Hardware(
        name=name or f"calibrated-{platform}",
        peak_flops={"float32": best, "bfloat16": best},
        hbm_bytes=_host_memory_per_device(jmesh),
        hbm_bandwidth=hbm_bw,
        link=Link(bw, alpha, SWITCH, "pooled fit over all mesh axes"),
        axis_links=links,
        efficiency=efficiency,
        description=(f"measured by autolayout.exec.calibrate on {ndev} {platform} devices "
                     f"(mesh {amesh}, quick={quick}), all devices running at once"),
        sources=tuple(notes),
    )
    if save_to is not None:
        hw.save(save_to)
    return hw
