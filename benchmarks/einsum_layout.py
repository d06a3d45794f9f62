"""Why MoE layouts run slower than predicted on 8 CPU devices: the batch dim's position.

Times the MoE model's einsums (``autolayout.models.moe`` at the validation sizes, local
shapes of the ``d_ff:cols`` layout) per device with all 8 virtual devices running at once
(as ``autolayout.calibrate`` does), next to square matmuls of the same FLOPs and to the
same einsums with the batch dim moved first. The cost model prices every contraction at
one rate (``peak * efficiency``); this shows whether the rate depends on the matmul's
size (it does not: square 128x128x64 and 256^3 run at the same rate) or on its shape
(it does: a batch dim that is not leading costs XLA:CPU transposes around the dot).

Each time is the slope of a ``fori_loop`` of ``k`` iterations, ``(t(12) - t(2)) / 10``,
minus the same loop without the einsum, so dispatch and the loop's own work cancel; the
figure is the median of ``PASSES`` passes over all cases (other work on the shared cores
moves single passes by up to 2x).

Run: python benchmarks/einsum_layout.py
"""
from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

LO, HI, REPEATS, PASSES = 2, 12, 7, 3
# MoE validation sizes (autolayout.reporting.measured.VALIDATION_MODELS["moe"]), d_ff split 4 ways
B, L, E, C, D, F = 8, 32, 8, 8, 64, 32
CASES = {
    "square 128x128 @ 128x64": ("ik,kj->ij", (128, 128), (128, 64)),
    "square 256^3": ("ik,kj->ij", (256, 256), (256, 256)),
    "dispatch blec,bld->becd": ("blec,bld->becd", (B, L, E, C), (B, L, D)),
    "combine blec,becd->bld": ("blec,becd->bld", (B, L, E, C), (B, E, C, D)),
    "expert becd,edf->becf": ("becd,edf->becf", (B, E, C, D), (E, D, F)),
    "  same, batch first ebcd,edf->ebcf": ("ebcd,edf->ebcf", (E, B, C, D), (E, D, F)),
    "expert becf,efd->becd": ("becf,efd->becd", (B, E, C, F), (E, F, D)),
    "grad w1 becd,becf->edf": ("becd,becf->edf", (B, E, C, D), (B, E, C, F)),
    "  same, batch first ebcd,ebcf->edf": ("ebcd,ebcf->edf", (E, B, C, D), (E, B, C, F)),
}


def _median(f, *args) -> float:
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def per_device_time(mesh: Mesh, spec: str, a_shape: tuple, b_shape: tuple) -> float:
    """Seconds of one einsum per device, all devices at once (loop slope minus the empty loop)."""
    def loop(do_einsum: bool):
        def body(a, b, k):
            a, b = a[0], b[0]

            def it(i, carry):
                x, out = carry
                x = x * 0.999  # the operand changes every iteration: nothing is hoisted
                return x, jnp.einsum(spec, x, b) if do_einsum else out
            return lax.fori_loop(0, k, it, (a, jnp.einsum(spec, a, b) * 0))[1][None]
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("all"), P("all"), P()), out_specs=P("all")))

    n = mesh.devices.size
    a = jax.device_put(jnp.full((n, *a_shape), 0.5, jnp.float32), NamedSharding(mesh, P("all")))
    b = jax.device_put(jnp.full((n, *b_shape), 0.5, jnp.float32), NamedSharding(mesh, P("all")))
    slope = []
    for do in (True, False):
        f = loop(do)
        slope.append((_median(f, a, b, HI) - _median(f, a, b, LO)) / (HI - LO))
    return slope[0] - slope[1]


def main() -> None:
    mesh = Mesh(np.array(jax.devices()[:8]), ("all",))
    print(f"{'einsum (local shapes)':38s} {'MFLOP':>7s} {'time':>9s} {'GFLOP/s per device':>19s}")
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(PASSES):
        for name, (spec, a_shape, b_shape) in CASES.items():
            times[name].append(per_device_time(mesh, spec, a_shape, b_shape))
    for name, (spec, a_shape, b_shape) in CASES.items():
        ins, _ = spec.split("->")
        sizes = dict(zip(ins.split(",")[0], a_shape)) | dict(zip(ins.split(",")[1], b_shape))
        flops = 2 * int(np.prod([sizes[c] for c in sizes]))
        t = statistics.median(times[name])
        runs = ", ".join(f"{flops / x / 1e9:.1f}" for x in times[name])
        print(f"{name:38s} {flops / 1e6:7.2f} {t * 1e6:7.0f}us {flops / t / 1e9:19.2f}  ({runs})", flush=True)


if __name__ == "__main__":
    main()
