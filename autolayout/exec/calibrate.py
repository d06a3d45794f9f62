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
  ``(t(k_hi) - t(k_lo)) / (k_hi - k_lo)``, so dispatch overhead cancels).
  :func:`fit_alpha_beta` fits ``alpha`` (latency per step) and ``B`` (bandwidth)
  with the cost model's own formula,
  :func:`~autolayout.costmodel.collectives.collective_time`: priced once with a
  unit latency and once with a unit inverse bandwidth it gives each sample's
  ``steps`` and ``bytes`` coefficients, and ``t = alpha * steps + bytes / B`` is
  fitted by non-negative least squares on relative errors. On CPU devices the links
  are ``"in-process"`` (every collective one rendezvous of its group, ``ceil(log2 n)``
  latency steps whatever its kind: :mod:`~autolayout.costmodel.collectives`), elsewhere
  ``"switch"``.
* **whole steps** (:func:`fit_step_profile`): what only real steps show (XLA's
  fusion of element-wise ops, a dispatch cost per executed op, collectives between
  compute waiting for the slowest of the device threads that share the cores)
  refitted to measured step times of whole layouts, with the cost model's own
  pricing as the model.

Nothing falls back silently: a timing lost in noise, a fit without samples or
with a non-positive bandwidth raises :class:`CalibrationError` saying what was
measured, at which sizes, and what to change.
"""
from __future__ import annotations

import itertools
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from autolayout.costmodel.collectives import KINDS, collective_time
from autolayout.costmodel.hardware import IN_PROCESS, SWITCH, Hardware, Link

__all__ = ["calibrate", "fit_alpha_beta", "fit_step_profile", "step_terms", "nnls_relative", "collective_terms",
           "CalibrationError", "StepSample", "StepFit", "STEP_TERMS"]

# A loop of hi iterations must take this much longer than one of lo iterations for the
# difference to count as a measurement rather than noise (8 virtual devices share the
# host's cores; other processes load them too): 10% of the longer run.
NOISE_FRACTION = 0.1
# How many times the iteration count of a timing is multiplied by 4 before giving up.
MAX_GROWTH = 3


class CalibrationError(ValueError):
    """A calibration measurement could not be made or fitted reliably; the message names
    what was measured, at which sizes, and what to change (more repeats, a quieter machine,
    larger sizes)."""


def _median_time(fn: Any, args: Sequence[Any], repeats: int) -> float:
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _per_iter(fn: Any, x: Any, lo: int, hi: int, repeats: int, what: str) -> tuple[float, int]:
    """``(seconds per loop iteration, iterations used)`` of ``fn(x, k)`` (a loop of ``k``
    dependent iterations): ``(t(hi) - t(lo)) / (hi - lo)``, which cancels fixed launch
    costs. When the difference is lost in noise (under :data:`NOISE_FRACTION` of
    ``t(hi)``), ``hi`` grows 4x up to :data:`MAX_GROWTH` times; then
    :class:`CalibrationError` names ``what`` and the times."""
    tried = []
    for _ in range(MAX_GROWTH + 1):
        t_lo, t_hi = _median_time(fn, (x, lo), repeats), _median_time(fn, (x, hi), repeats)
        tried.append(f"{hi} iterations {t_hi * 1e6:.0f} us vs {lo}: {t_lo * 1e6:.0f} us")
        if t_hi - t_lo > NOISE_FRACTION * t_hi:
            return (t_hi - t_lo) / (hi - lo), hi
        hi = lo + 4 * (hi - lo)
    raise CalibrationError(
        f"calibrating {what}: the time of the extra loop iterations is lost in timing noise "
        f"({'; '.join(tried)}; a difference under {NOISE_FRACTION:.0%} of the longer run is noise). "
        f"Calibrate with more repeats (repeats=, now {repeats}) or quick=False, on a quieter machine.")


# ------------------------------------------------------------------------------- fits
def nnls_relative(a: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Non-negative ``x`` minimising ``sum(((a @ x) / t - 1) ** 2)`` (least squares on
    relative errors), exactly: the optimum of a non-negative least-squares problem is the
    unconstrained fit on its support (Lawson & Hanson, "Solving Least Squares Problems",
    1974, ch. 23), so trying every support of the few columns and keeping the best
    feasible one finds it. ``a`` is ``(samples, k)`` with ``k <= 8``.

    >>> nnls_relative(np.array([[1.0, 1.0], [1.0, 2.0]]), np.array([3.0, 5.0]))
    array([1., 2.])
    """
    a, t = np.asarray(a, float), np.asarray(t, float)
    if a.ndim != 2 or a.shape[0] != t.shape[0] or a.shape[1] > 8:
        raise ValueError(f"nnls_relative needs a (samples, k <= 8) matrix and one time per sample, "
                         f"got {a.shape} and {t.shape}")
    if not (t > 0).all():
        raise ValueError(f"nnls_relative needs positive times, got {t[t <= 0][:3]}")
    m = a / t[:, None]
    y = np.ones(len(t))
    best, best_res = np.zeros(a.shape[1]), float(len(t))  # x = 0: every relative error is -1
    for r in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), r):
            sub = m[:, cols]
            if np.linalg.matrix_rank(sub) < r:
                continue
            sol, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if (sol < 0).any():
                continue
            res = float(np.sum((sub @ sol - y) ** 2))
            if res < best_res - 1e-12:
                best, best_res = np.zeros(a.shape[1]), res
                best[list(cols)] = sol
    return best


def collective_terms(kind: str, operand_bytes: float, n: int, topology: str = SWITCH) -> tuple[float, float]:
    """``(steps, bytes)`` of one collective: its time is ``alpha * steps + bytes / B``.
    Read off :func:`~autolayout.costmodel.collectives.collective_time` itself, priced
    with a unit latency (and no bytes) and with a unit inverse bandwidth (and no
    latency), so the fit uses exactly the cost model's formula."""
    steps = collective_time(kind, 0.0, [(n, Link(1.0, 1.0, topology))])
    per_byte = collective_time(kind, operand_bytes, [(n, Link(1.0, 0.0, topology))])
    return steps, per_byte


def fit_alpha_beta(samples: Sequence[tuple[str, float, int, float]], *, topology: str = SWITCH,
                   what: str = "collectives") -> tuple[float, float]:
    """``(alpha seconds/step, bandwidth bytes/s)`` fitted to ``(kind, operand bytes, n,
    seconds)`` samples by non-negative least squares on relative errors, with the cost
    model's :func:`~autolayout.costmodel.collectives.collective_time` as the model
    (:func:`collective_terms`).

    Raises:
        CalibrationError: no sample has ``n > 1`` and a positive time, or the fitted
            bandwidth term is zero (times that do not grow with the operand size: no
            bandwidth can be read from them). ``what`` names the measurement.
    """
    rows = [(*collective_terms(k, v, n, topology), t) for k, v, n, t in samples if t > 0 and n > 1]
    if not rows:
        raise CalibrationError(f"fitting alpha/beta of {what}: no usable sample (need group size > 1 and a "
                               f"positive time; got {len(samples)} sample(s): {list(samples)[:4]})")
    a = np.array([[s, w] for s, w, _ in rows])
    t = np.array([r[2] for r in rows])
    alpha, inv_b = nnls_relative(a, t)
    if not inv_b > 0:
        sizes = sorted({int(v) for _, v, _, _ in samples})
        raise CalibrationError(
            f"fitting alpha/beta of {what}: the collective times do not grow with the operand size "
            f"(sizes {sizes} B; times {', '.join(f'{k} {int(v)}B {s * 1e6:.0f}us' for k, v, _, s in samples)}), "
            "so no bandwidth can be read from them. Calibrate with quick=False (larger sizes) and more repeats, "
            "on a quieter machine.")
    return float(alpha), float(1.0 / inv_b)


@dataclass(frozen=True)
class StepSample:
    """One measured step of a layout: ``graph``, ``mesh``, ``layout`` and its ``time_s``."""

    graph: Any
    mesh: Any
    layout: Any
    time_s: float


@dataclass(frozen=True)
class StepFit:
    """What :func:`fit_step_profile` fitted: the profile, ``compute_scale`` (measured
    compute / the micro-benchmarked profile's), one ``link`` for every mesh axis, the
    per-op ``op_overhead_s``, the number of ``samples`` and the median relative error of
    the fit on them."""

    hardware: Hardware
    compute_scale: float
    link: Link
    op_overhead_s: float
    samples: int
    median_abs_rel_error: float


STEP_TERMS = ("compute", "steps", "bytes", "ops")


def step_terms(hardware: Hardware, samples: Sequence[StepSample]) -> np.ndarray:
    """``(samples, 4)`` design matrix of step times (columns :data:`STEP_TERMS`): each
    sample's compute time on ``hardware`` without per-op overhead, its collective steps,
    its collective bytes and its number of executed ops, all read off the cost model
    itself (:func:`~autolayout.costmodel.predict.predict` with every mesh axis on a
    unit-latency link, then on a unit-inverse-bandwidth link, and with
    ``op_overhead_s`` 0 and 1 s), so that on a profile without overlap
    (``async_collectives=False``) ``time = c * compute + alpha * steps + bytes / B +
    op_overhead_s * ops`` exactly. Steps without collectives (one device) are linear on any
    profile; a profile with ``async_collectives`` is refused only where a sample has some."""
    from autolayout.costmodel.predict import predict

    topology = hardware.link.topology  # the latency steps depend on it (collectives.latency_steps)
    lat = hardware.replace(link=Link(float("inf"), 1.0, topology), axis_links=(), op_overhead_s=0.0)
    per_byte = lat.replace(link=Link(1.0, 0.0, topology))
    per_op = lat.replace(op_overhead_s=1.0)
    rows = []
    for s in samples:
        c = predict(s.graph, s.mesh, s.layout, hardware=lat)
        if hardware.async_collectives and c.collectives:
            raise CalibrationError(
                f"fitting step times on {hardware.name!r}: layout {str(s.layout)!r} has collectives and the "
                "profile overlaps them with compute (async_collectives=True), so step time is not linear in the "
                "link figures; fit a profile with async_collectives=False (CPU devices), or steps on one device")
        ops = predict(s.graph, s.mesh, s.layout, hardware=per_op).compute_s - c.compute_s
        rows.append((c.compute_s, c.comm_s, predict(s.graph, s.mesh, s.layout, hardware=per_byte).comm_s, ops))
    return np.array(rows, float).reshape(len(rows), len(STEP_TERMS))


def fit_step_profile(hardware: Hardware, samples: Sequence[StepSample]) -> StepFit:
    """Refit a micro-benchmarked profile to measured step times of whole layouts.

    A real step differs from the micro-benchmarks in ways only whole steps show: XLA
    fuses element-wise ops (less memory traffic than op-by-op), every executed op costs
    a dispatch on the device's thread, and a collective between compute waits for the
    slowest of the device threads sharing the cores (a tight loop of collectives keeps
    them in step). ``time = c * compute + alpha * steps + bytes / B + op_overhead_s *
    ops`` (:func:`step_terms`) is fitted by non-negative least squares on relative
    errors; the profile returned has its compute rates divided by ``c`` (the roofline
    scales exactly), one link ``(B, alpha)`` on every mesh axis and ``op_overhead_s``.
    Four numbers for all layouts and models: nothing is fitted per layout. Steps with no
    collective at all (one device: ``benchmarks/gpu_validate.py`` on one GPU) fit the compute
    scale and the per-op overhead alone and keep the profile's links and overlap.

    Raises:
        CalibrationError: fewer than 4 samples, a non-positive time, or a fit with no
            compute or no bandwidth term (the times do not grow with the work or with
            the bytes: measure more layouts or repeats).
    """
    if len(samples) < len(STEP_TERMS):
        raise CalibrationError(f"fitting step times: {len(samples)} measured step(s) given, at least "
                               f"{len(STEP_TERMS)} needed for {len(STEP_TERMS)} parameters ({', '.join(STEP_TERMS)}); "
                               "measure more layouts")
    t = np.array([s.time_s for s in samples], float)
    if not (t > 0).all():
        i = int(np.argmin(t))
        raise CalibrationError(f"fitting step times: step time {t[i]} of layout {str(samples[i].layout)!r} is not "
                               "positive; measure it again")
    a = step_terms(hardware, samples)
    links = bool(a[:, 1:3].any())  # no collective in any step (one device): compute and per-op overhead alone
    cols = list(range(len(STEP_TERMS))) if links else [0, 3]
    x = np.zeros(len(STEP_TERMS))
    x[cols] = nnls_relative(a[:, cols], t)
    c, alpha, inv_b, overhead = (float(v) for v in x)
    if links and (not c > 0 or not inv_b > 0):
        raise CalibrationError(
            f"fitting step times of {len(t)} layouts: the fit has no {'compute' if not c > 0 else 'bandwidth'} "
            f"term (compute scale {c:.3g}, latency {alpha:.3g} s/step, inverse bandwidth {inv_b:.3g} s/B, "
            f"per-op overhead {overhead:.3g} s): the times do not grow with the work; measure more layouts (with "
            "and without collectives) or more repeats, on a quieter machine")
    if not c > 0:
        raise CalibrationError(f"fitting step times of {len(t)} steps without collectives: the fit has no "
                               f"compute term (per-op overhead {overhead:.3g} s): the times do not grow with "
                               "the work; measure larger steps")
    if links:
        link = Link(1.0 / inv_b, alpha, hardware.link.topology, f"fitted to {len(t)} measured steps")
        refit = f"every axis alpha {alpha * 1e6:.1f} us/step, B {1 / inv_b / 1e9:.3f} GB/s, "
        relinked = dict(link=link, axis_links=())
    else:
        link, refit, relinked = hardware.link, "", {}
    note = (f"refitted to {len(t)} measured steps{'' if links else ' without collectives'}: compute x{c:.3f} "
            f"(peak and memory bandwidth / {c:.3f}), {refit}{overhead * 1e6:.{1 if links else 2}f} us per executed op"
            + ("" if links else "; links not refitted"))
    fitted = hardware.replace(name=hardware.name + "+steps", peak_flops={k: v / c for k, v in hardware.peak_flops},
                              hbm_bandwidth=hardware.hbm_bandwidth / c, op_overhead_s=overhead,
                              sources=tuple(hardware.sources) + (note,), **relinked)
    err = float(np.median(np.abs(a @ x - t) / t))
    return StepFit(fitted, c, link, overhead, len(t), err)


# --------------------------------------------------------------------------- memory
def _host_memory_per_device(jmesh: Any) -> tuple[float, str]:
    """``(bytes, where from)``: the device's own limit where it reports one, else (CPU
    devices report no memory stats) the host's physical memory shared by the devices."""
    dev = jmesh.devices.flat[0]
    stats = dev.memory_stats() or {}
    if stats.get("bytes_limit"):
        return float(stats["bytes_limit"]), f"{dev.platform} memory_stats bytes_limit"
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError) as exc:
        raise CalibrationError(
            f"calibrating memory capacity: {dev.platform} devices report no memory limit and the host's "
            f"physical memory cannot be read ({type(exc).__name__}: {exc}); pass memory_bytes= (per device)"
        ) from exc
    n = jmesh.devices.size
    return float(total) / n, f"host physical memory {total / 2**30:.1f} GiB shared by {n} devices"


# ------------------------------------------------------------------------- calibrate
def calibrate(mesh: Any, *, quick: bool = False, devices: Sequence[Any] | None = None,
              repeats: int | None = None, save_to: Any = None, name: str | None = None,
              memory_bytes: float | None = None, verbose: bool = False, links_from: Any = None) -> Hardware:
    """Measure a Hardware profile on the devices of ``mesh`` (all running at once).

    ``mesh``: anything :class:`~autolayout.core.Mesh` accepts, or a ``jax.sharding.Mesh``.
    ``quick=True`` uses fewer sizes and repeats (seconds instead of a minute on CPU).
    ``save_to``: a path to write the profile as JSON (``Hardware.load`` reads it).
    ``memory_bytes``: the memory of one device, where the devices report none and the
    host's cannot be read. The measured samples are kept in the profile's ``sources``.
    On a mesh with no axis of size > 1 (one GPU) no link can be measured: the profile keeps
    those of ``links_from`` (a profile or its name; default: the devices' built-in profile).
    On accelerators the matmuls are bf16 and float32 at n = 2048-8192 after a 2 s warm-up,
    the stream 1 GiB (sizes under which one H200 measured launch latency or cold clocks:
    ``reports/gpu``); on CPU devices float32 at n = 64-512 and 8-32 MiB.
    :func:`fit_step_profile` refits the result to measured steps of whole layouts.

    Raises:
        CalibrationError: a timing lost in noise, or collective times from which no
            bandwidth can be fitted; the message says what to change.

    Example::

        hw = calibrate("rows:2,cols:4", quick=True)
        predict(graph, "rows:2,cols:4", layout, hardware=hw).time_s
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from autolayout.exec.runner import jax_mesh

    amesh, jmesh = jax_mesh(mesh, devices)
    platform = jmesh.devices.flat[0].platform
    # XLA:CPU's virtual devices are threads of this process: every collective is one
    # in-process rendezvous (costmodel.collectives); accelerators get one-hop links
    topology = IN_PROCESS if platform == "cpu" else SWITCH
    repeats = repeats or (3 if quick else 7)
    all_axes = tuple(amesh.axis_names)
    ndev = amesh.size
    notes = []

    def run_local(body: Any, local_shape: tuple, dtype: Any = jnp.float32) -> Any:
        """jit(shard_map(body)) over a (ndev * local_shape[0], ...) array split on all axes."""
        spec = P(all_axes)
        f = jax.jit(jax.shard_map(body, mesh=jmesh, in_specs=(spec, P()), out_specs=spec))
        x = jax.device_put(jnp.ones((ndev * local_shape[0], *local_shape[1:]), dtype) * 0.5,
                           NamedSharding(jmesh, spec))
        return f, x

    # -- matmul throughput (per device, all devices at once)
    accelerator = platform != "cpu"
    if accelerator:
        # Sizes and warm-up from one H200 (reports/gpu/kernels.json, benchmarks/gpu_validate.py):
        # a bf16 n^3 matmul ran at 43, 504, 818 and 805 TFLOP/s at n = 1024, 2048, 4096, 8192 (under
        # 2048 it measures launch latency, not the matrix units), and at 656 TFLOP/s at 8192 before
        # 2 s of matmuls brought the clocks up (idle SM clock 345 MHz, nvidia-smi). float32 runs at
        # JAX's default precision, TF32 on Hopper (403 TFLOP/s there), so both dtypes are measured.
        sizes, dtypes = ((2048, 8192) if quick else (2048, 4096, 8192)), (jnp.bfloat16, jnp.float32)
        warm_s = 2.0
    else:
        sizes, dtypes, warm_s = ((64, 256) if quick else (64, 128, 256, 512)), (jnp.float32,), 0.0
    rates: dict[str, list[float]] = {}
    for dtype in dtypes:
        dname = jnp.dtype(dtype).name
        for n in sizes:
            def mm(x: Any, k: Any, n: int = n) -> Any:
                w = jnp.eye(n, dtype=x.dtype) * 0.999 + 1e-4
                return lax.fori_loop(0, k, lambda i, y: y @ w, x)

            f, x = run_local(mm, (n, n), dtype)
            if warm_s:
                end = time.perf_counter() + warm_s
                while time.perf_counter() < end:
                    jax.block_until_ready(f(x, 8))
                warm_s = 0.0
            t, _ = _per_iter(f, x, 1, 4 if quick else 8, repeats, f"a {n}x{n} {dname} matmul")
            rate = 2 * n ** 3 / t
            notes.append(f"matmul {dname + ' ' if accelerator else ''}{n}: {rate / 1e9:.2f} GFLOP/s per device")
            rates.setdefault(dname, []).append(rate)
    main = "bfloat16" if accelerator else "float32"
    best = max(rates[main])
    efficiency = min(statistics.median(rates[main]) / best, 1.0)
    if accelerator:
        peaks = {"bfloat16": best, "float16": best, "float32": max(rates["float32"]),
                 "tensorfloat32": max(rates["float32"])}
    else:
        peaks = {"float32": best, "bfloat16": best}

    # -- memory bandwidth: 1 GiB on accelerators (H200: 3.39 TB/s at 64 MiB, 4.27 at 1 GiB,
    # reports/gpu/kernels.json), 8-32 MiB per CPU device
    mb = (1024 if accelerator else 8 if quick else 32) * 2**20 // 4
    rows = mb // 1024

    def stream(x: Any, k: Any) -> Any:
        return lax.fori_loop(0, k, lambda i, y: y * 0.999 + 0.001, x)

    f, x = run_local(stream, (rows, 1024))
    t, _ = _per_iter(f, x, 1, 5, repeats, f"a {rows * 1024 * 4 / 2**20:.0f} MiB stream (y = a x + b)")
    hbm_bw = 2 * rows * 1024 * 4 / t
    notes.append(f"stream {rows * 1024 * 4 / 2**20:.0f} MiB: {hbm_bw / 1e9:.2f} GB/s per device")

    # -- alpha/beta per mesh axis
    # quick: the larger size at 2 MiB, where a collective takes ~1-6 ms against ~20-150 us at
    # 4 KiB on 8 XLA:CPU devices (measured on a loaded 2-core host); at 256 KiB the bandwidth
    # term was within the timing noise of a loaded machine (a 64 KiB all-gather measured
    # faster than a 1 KiB one) and the fit found no bandwidth (CalibrationError)
    nbytes = (4096, 2097152) if quick else (4096, 65536, 1048576)
    links, pooled = {}, []
    for axis in all_axes:
        size = amesh.axis_size(axis)
        if size == 1:
            continue
        samples = []
        for kind in KINDS:
            for v in nbytes:
                elems = max(v // 4 // size, 1) * size

                def coll(x: Any, k: Any, kind: str = kind, elems: int = elems, axis: str = axis,
                         size: int = size) -> Any:
                    def one(i: Any, y: Any) -> Any:
                        if kind == "all-reduce":  # psum's result is invariant over axis: make it vary again
                            return lax.pcast(lax.psum(y, axis) * (1.0 / size), axis, to="varying")
                        if kind == "all-gather":
                            return lax.all_gather(y[: elems // size], axis, tiled=True)
                        if kind == "reduce-scatter":
                            return jnp.tile(lax.psum_scatter(y, axis, tiled=True), size)
                        return lax.all_to_all(y.reshape(size, -1), axis, 0, 0, tiled=True).reshape(-1)
                    return lax.fori_loop(0, k, one, x.reshape(-1))[None]

                f, x = run_local(coll, (1, elems))
                operand = elems * 4 // (size if kind == "all-gather" else 1)
                t, _ = _per_iter(f, x, 1, 4 if quick else 8, repeats,
                                 f"a {operand} B {kind} over mesh axis {axis}:{size}")
                samples.append((kind, float(operand), size, t))
        alpha, bw = fit_alpha_beta(samples, topology=topology, what=f"mesh axis {axis}:{size}")
        pooled.extend(samples)
        links[axis] = Link(bw, alpha, topology, f"calibrated on mesh axis {axis}:{size} ({len(samples)} samples)")
        notes.append(f"axis {axis}:{size}: alpha {alpha * 1e6:.1f} us/step, B {bw / 1e9:.2f} GB/s; "
                     + ", ".join(f"{k} {int(v)}B {t * 1e6:.0f}us" for k, v, _, t in samples))
        if verbose:
            print(notes[-1])
    if pooled:
        alpha, bw = fit_alpha_beta(pooled, topology=topology, what="all mesh axes pooled")
        link = Link(bw, alpha, topology, "pooled fit over all mesh axes")
    else:  # one device (or every axis of size 1): nothing to measure a link with
        from autolayout.costmodel.devices import UnknownDeviceError, hardware_for_device
        from autolayout.costmodel.profiles import get_hardware

        try:
            base = get_hardware(links_from) if links_from is not None else hardware_for_device(jmesh.devices.flat[0])
        except UnknownDeviceError as exc:
            raise CalibrationError(
                f"calibrating on mesh {amesh}: no axis of size > 1, so no collective can be measured, and the "
                f"devices have no built-in profile to take the links from ({exc}); pass links_from= a profile "
                "whose links to keep, or calibrate on a mesh with at least 2 devices on an axis") from exc
        link, links = base.link, dict(base.axis_links)
        notes.append(f"links not measured (mesh {amesh} has no axis of size > 1): those of profile {base.name!r}")
    if memory_bytes is None:
        memory_bytes, mem_note = _host_memory_per_device(jmesh)
    else:
        mem_note = "memory_bytes given by the caller"
    notes.append(f"memory per device: {memory_bytes / 2**30:.2f} GiB ({mem_note})")
    hw = Hardware(
        name=name or f"calibrated-{platform}",
        peak_flops=peaks,
        hbm_bytes=memory_bytes,
        hbm_bandwidth=hbm_bw,
        link=link,
        axis_links=links,
        efficiency=efficiency,
        # XLA:CPU runs each collective in line on the calling thread (a synchronous
        # rendezvous of the device threads), so nothing overlaps compute there; the same
        # reason as the built-in cpu profile. Accelerators run them asynchronously.
        async_collectives=platform != "cpu",
        # XLA:CPU copies a dot's operands into [batch, M, K] order where they are not
        # (autolayout.costmodel.dotcopy; benchmarks/einsum_layout.py measures the cost)
        dot_operand_copies=platform == "cpu",
        # XLA:CPU reduces a step's gradients together and relayouts reduce-scatter operands
        # (costmodel/memory.py; profiles.SRC_CPU_GRADIENT_REDUCTIONS)
        combines_gradient_reductions=platform == "cpu",
        reduce_scatter_copies=platform == "cpu",
        # XLA:CPU runs half-precision dots in float32 (profiles.SRC_CPU_HALF_DOTS)
        upcasts_half_dots=platform == "cpu",
        upcasts_half_collectives=platform == "cpu",  # profiles.SRC_CPU_HALF_COLLECTIVES
        # XLA:CPU schedules breadth first (profiles.SRC_CPU_SCHEDULE)
        breadth_first_schedule=platform == "cpu",
        # XLA:CPU's YNNPACK reductions read broadcasts from memory (profiles.SRC_CPU_YNN)
        ynn_reductions=platform == "cpu",
        copies_donated_parameters=platform == "cpu",  # SRC_CPU_DONATED_COPIES
        min_memory_schedule=platform == "gpu",  # XLA:GPU's DefaultMemoryScheduler (profiles.SRC_GPU_SCHEDULE)
        description=(f"measured by autolayout.exec.calibrate on {ndev} {platform} devices "
                     f"(mesh {amesh}, quick={quick}), all devices running at once"),
        sources=tuple(notes),
    )
    if save_to is not None:
        hw.save(save_to)
    return hw
