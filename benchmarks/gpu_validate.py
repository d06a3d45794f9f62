"""The cost model against measured training steps on one NVIDIA GPU (H100 or H200).

Two parts, so that the GPU is held only for the measurement:

``--kernels OUT --measure OUT``, on the GPU machine (about 3.5 minutes on an H200 for all of
:data:`CONFIGS`; ``--only NAME ...`` measures some):

* ``--kernels``: the ceilings (bf16 and float32 n³ matmuls at n = 1024 ... 16384, a
  ``y = a x + b`` stream at 64 MiB ... 4 GiB, after 2 s of large matmuls that bring the clocks
  up) and :func:`attention_step` compiled by XLA and with cuDNN's fused kernel, into
  ``OUT/kernels.json``;
* ``--measure``: every zoo training step of :data:`CONFIGS` run by ``autolayout.execute`` on a
  one-device mesh (``d:1``): the measured step time (median of the timed repeats), XLA's
  ``memory_analysis`` and what the compiled HLO holds (kernels, a cuDNN fused-attention call
  or none), next to the prediction of the device's built-in profile; one JSON line per step
  in ``OUT/measured.jsonl``, written as it goes, and the compiled HLO in ``OUT/hlo.zip``;
  with ``--dumps`` also XLA's buffer assignment (``OUT/buffers.zip``) and its peak of live
  bytes (``OUT/live.jsonl``, :func:`xla_live.live_peak`), which split the GPU memory misses of
  ``reports/gpu`` into the model's liveness and XLA's packing (the third 2026-11-28 run collected them).

``--measure OUT --loss``: the MLP and MoE steps with a regression loss instead
(:data:`LOSS_CONFIGS`), into ``OUT/measured_loss.jsonl`` (``hlo_loss.zip``, and with ``--dumps``
``buffers_loss.zip`` and ``live_loss.jsonl``; about a minute).

``benchmarks/gpu_report.py``, anywhere (no GPU): prices every measured step again, calibrates
on half of the steps and checks the other half, and writes ``reports/gpu/README.md``.

XLA:GPU compiles the traced attention as written (the HLO is checked for cuDNN's fused
attention call, ``__cudnn$fmha``): the steps are priced with ``fused_attention`` off, as the
program runs; the built-in Hopper profiles price a fused kernel, which a JAX user gets by
calling one (``jax.nn.dot_product_attention(implementation="cudnn")``, Pallas), and which
:func:`attention_kernels` times against the materialised one.

Run (GPU):  PYTHONPATH=$PWD python benchmarks/gpu_validate.py --kernels $OUT --measure $OUT
     (smoke, CPU): PYTHONPATH=$PWD python benchmarks/gpu_validate.py --kernels /tmp/g --measure /tmp/g --smoke
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import time
import traceback
import zipfile

# (name, zoo model, sizes and options). Mixed precision as trained today (float32 parameters
# and Adam state, bfloat16 compute) unless the name says float32; sizes chosen to fill a GPU
# without exceeding an H100's 80 GB (the measured peak is in the results), from kernel-launch
# bound (tiny) to matmul bound (mlp-large).
BF16 = dict(compute_dtype="bfloat16")
CONFIGS = [
    ("gpt-350m", "transformer_lm", dict(d_model=1024, d_ff=4096, heads=16, d_kv=64, n_layers=12, vocab=32768,
                                        batch=8, length=1024, **BF16)),
    ("gpt-350m-remat", "transformer_lm", dict(d_model=1024, d_ff=4096, heads=16, d_kv=64, n_layers=12,
                                              vocab=32768, batch=8, length=1024, remat=True, **BF16)),
    ("gpt-350m-long", "transformer_lm", dict(d_model=1024, d_ff=4096, heads=16, d_kv=64, n_layers=12,
                                             vocab=32768, batch=2, length=4096, **BF16)),
    ("gpt-1b", "transformer_lm", dict(d_model=2048, d_ff=8192, heads=16, d_kv=128, n_layers=8, vocab=32768,
                                      batch=8, length=1024, **BF16)),
    ("gpt-125m-f32", "transformer_lm", dict(d_model=768, d_ff=3072, heads=12, d_kv=64, n_layers=12,
                                            vocab=32768, batch=8, length=1024)),
    ("gpt-tiny", "transformer_lm", dict(d_model=256, d_ff=1024, heads=4, d_kv=64, n_layers=4, vocab=8192,
                                        batch=8, length=256, **BF16)),
    ("llama-1b", "llama", dict(d_model=2048, heads=16, kv_heads=4, d_kv=128, d_ff=5632, n_layers=8,
                               vocab=32000, batch=4, length=1024, **BF16)),
    ("llama-300m-remat", "llama", dict(d_model=1024, heads=16, kv_heads=4, d_kv=64, d_ff=2816, n_layers=12,
                                       vocab=32000, batch=16, length=512, remat=True, **BF16)),
    ("mlp-large", "mlp", dict(batch=16384, d_io=4096, d_hidden=16384, **BF16)),
    ("mlp-small", "mlp", dict(batch=4096, d_io=2048, d_hidden=8192, **BF16)),
    ("moe", "moe", dict(d_model=1024, d_ff=4096, experts=8, capacity=256, batch=16, length=1024, **BF16)),
    ("moe-f32", "moe", dict(d_model=512, d_ff=2048, experts=8, capacity=128, batch=16, length=512)),
    # measured in a second run (2026-11-28), for a larger held-out half
    ("gpt-350m-short", "transformer_lm", dict(d_model=1024, d_ff=4096, heads=16, d_kv=64, n_layers=12,
                                              vocab=32768, batch=32, length=256, **BF16)),
    ("gpt-1b-parallel", "transformer_lm", dict(d_model=2048, d_ff=8192, heads=16, d_kv=128, n_layers=8,
                                               vocab=32768, batch=8, length=1024, parallel_layers=True, **BF16)),
    ("llama-1b-remat", "llama", dict(d_model=2048, heads=16, kv_heads=4, d_kv=128, d_ff=5632, n_layers=8,
                                     vocab=32000, batch=8, length=1024, remat=True, **BF16)),
    ("llama-tiny-f32", "llama", dict(d_model=256, heads=8, kv_heads=2, d_kv=32, d_ff=768, n_layers=4, vocab=4096,
                                     batch=8, length=256)),
    ("mlp-large-f32", "mlp", dict(batch=8192, d_io=4096, d_hidden=16384)),
    ("moe-large", "moe", dict(d_model=2048, d_ff=8192, experts=16, capacity=512, batch=8, length=2048, **BF16)),
]
# The MLP and MoE steps again with a regression loss (``loss="mse"``, ``autolayout.models._loss``):
# the zoo's linear loss ``sum(y * dy)`` takes the loss gradient as an input, so XLA may run the
# backward's input-gradient matmuls before the forward's, an order the traced step does not have
# (reports/gpu/findings.md); with ``--loss`` into OUT/measured_loss.jsonl (hlo_loss.zip, ...).
LOSS_CONFIGS = [(f"{name}-mse", model, {**kw, "loss": "mse"}) for name, model, kw in CONFIGS if model in ("mlp", "moe")]
SMOKE = {"transformer_lm": dict(d_model=32, d_ff=64, heads=2, d_kv=16, n_layers=2, vocab=64, batch=2, length=16),
         "llama": dict(d_model=32, heads=4, kv_heads=2, d_kv=8, d_ff=64, n_layers=2, vocab=64, batch=2, length=16),
         "mlp": dict(batch=64, d_io=32, d_hidden=64), "moe": dict(d_model=32, d_ff=64, experts=4, capacity=8,
                                                                batch=2, length=16)}
FMHA = "__cudnn$fmha"  # the custom-call target of XLA:GPU's cuDNN fused attention
REPEATS = 10


def _slope_s(fn, *args, lo: int = 2, hi: int = 12, repeats: int = 5) -> float:
    """Seconds per call of ``fn(*args)``: ``hi`` and ``lo`` calls queued back to back with one
    sync at the end, ``(t(hi) - t(lo)) / (hi - lo)`` (dispatch and sync cancel), median of
    ``repeats``; one untimed round first."""
    import jax

    def run(k: int) -> float:
        t = time.perf_counter()
        out = None
        for _ in range(k):
            out = fn(*args)
        jax.block_until_ready(out)
        return time.perf_counter() - t

    run(hi)
    return statistics.median((run(hi) - run(lo)) / (hi - lo) for _ in range(repeats))


def ceilings(smoke: bool) -> dict:
    """Measured matmul rates (bfloat16; float32 at JAX's default precision) at several sizes,
    and stream bandwidth (``y = a x + b``, bytes read + written) at several sizes, after 2 s of
    large matmuls that bring the clocks up (an idle H200 reads 345 MHz, nvidia-smi)."""
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(0)
    f = jax.jit(lambda x, y: x @ y)
    big = 512 if smoke else 8192
    a = jax.random.normal(key, (big, big), jnp.bfloat16)  # random data: zeros run faster (device/METHOD.md)
    t_end = time.perf_counter() + (0.2 if smoke else 2.0)
    while time.perf_counter() < t_end:
        jax.block_until_ready([f(a, a) for _ in range(10)])
    out = {}
    for dtype in ("bfloat16", "float32"):
        for n in ((128, 256, 512) if smoke else (1024, 2048, 4096, 8192, 16384)):
            x = jax.random.normal(key, (n, n), dtype)
            y = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
            out[f"matmul_{dtype}_{n}_flops"] = 2 * n ** 3 / _slope_s(f, x, y)
        out[f"matmul_{dtype}_flops"] = max(v for k, v in out.items() if k.startswith(f"matmul_{dtype}_"))
    g = jax.jit(lambda v: v * 1.0001 + 0.5)
    for dtype, item in (("float32", 4), ("bfloat16", 2)):
        for mib in ((4, 16) if smoke else (64, 1024, 4096)):
            x = jax.random.normal(key, (mib * 2 ** 20 // item,), dtype)
            out[f"stream_{dtype}_{mib}MiB_bytes_per_s"] = 2 * mib * 2 ** 20 / _slope_s(g, x)
    out["stream_bytes_per_s"] = max(v for k, v in out.items() if k.startswith("stream_"))
    return out


def attention(q, k, v):
    """Causal softmax attention as the zoo's transformer writes it (scores in float32)."""
    import jax
    import jax.numpy as jnp

    s = jnp.einsum("blhd,bmhd->bhlm", q, k, preferred_element_type=jnp.float32) * (q.shape[-1] ** -0.5)
    n = q.shape[1]
    s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -1e30)
    p = jax.nn.softmax(s, axis=-1).astype(q.dtype)
    return jnp.einsum("bhlm,bmhd->blhd", p, v)


def attention_step(q, k, v, dy):
    """Forward and backward of :func:`attention` (the output and the q, k, v gradients)."""
    import jax

    out, vjp = jax.vjp(attention, q, k, v)
    return out, vjp(dy)


def cudnn_attention_step(q, k, v, dy):
    """The same with cuDNN's fused kernel (``jax.nn.dot_product_attention``)."""
    import jax

    def fused(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")

    out, vjp = jax.vjp(fused, q, k, v)
    return out, vjp(dy)


ATTENTION_SHAPES = ((8, 1024, 16, 64), (2, 4096, 16, 64), (4, 2048, 32, 128))  # (batch, length, heads, d_kv)


def attention_kernels(smoke: bool) -> list[dict]:
    """Measured forward + backward of :func:`attention` compiled by XLA and by cuDNN."""
    import jax
    import jax.numpy as jnp

    rows = []
    for shape in (((2, 64, 2, 16),) if smoke else ATTENTION_SHAPES):
        keys = jax.random.split(jax.random.PRNGKey(2), 4)
        args = [jax.random.normal(kk, shape, jnp.bfloat16) for kk in keys]
        row = {"shape": list(shape)}
        for name, fn in (("xla", attention_step), ("cudnn", cudnn_attention_step)):
            try:
                f = jax.jit(fn)
                row[f"{name}_s"] = _slope_s(f, *args)
                row[f"{name}_out"] = [float(jnp.linalg.norm(t.astype(jnp.float32)))
                                      for t in jax.tree_util.tree_leaves(f(*args))]
            except Exception as exc:  # recorded, shown in the report (cuDNN is GPU-only)
                row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:500]
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def kernels(out: str, smoke: bool) -> None:
    """``OUT/kernels.json``: :func:`ceilings` and :func:`attention_kernels` on the first device."""
    import jax

    os.makedirs(out, exist_ok=True)
    dev = jax.devices()[0]
    res = {"jax": jax.__version__, "device_kind": dev.device_kind, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    res.update(ceilings(smoke))
    print(json.dumps(res), flush=True)
    res["attention"] = attention_kernels(smoke)
    with open(os.path.join(out, "kernels.json"), "w") as f:
        json.dump(res, f, indent=1)


def _hlo_facts(text: str) -> dict:
    """Kernels of the compiled program (fusions and custom calls outside fused computations)
    and whether cuDNN's fused attention is among them."""
    kernels = len(re.findall(r"=\s*\S+\s+(?:fusion|custom-call)\(", text))
    return {"hlo_kernels": kernels, "cudnn_fmha": FMHA in text,
            "while_loops": len(re.findall(r"=\s*\S+\s+while\(", text))}


def measure(out: str, smoke: bool, only: list[str] | None, dumps: bool = False, loss: bool = False) -> None:
    import jax

    import autolayout
    from autolayout.costmodel.devices import UnknownDeviceError, hardware_for_device
    from autolayout.costmodel.profiles import get_hardware

    os.makedirs(out, exist_ok=True)
    dev = jax.devices()[0]
    try:
        base = hardware_for_device(dev)
        profile_note = f"built-in profile {base.name} for device kind {dev.device_kind!r}"
    except UnknownDeviceError:
        base = get_hardware("h200" if "H200" in dev.device_kind else "h100")
        profile_note = f"device kind {dev.device_kind!r} not in DEVICE_KINDS; priced on {base.name}"
    hw = base.replace(fused_attention=False)  # XLA compiles the traced attention as written
    info = {"jax": jax.__version__, "device_kind": dev.device_kind, "platform": dev.platform,
            "profile": base.name, "profile_note": profile_note, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    from jax import lax
    scan = [e for e in jax.make_jaxpr(lambda c: lax.scan(lambda h, x: (h + x, h), c, c[None]))(
        jax.numpy.ones(3)).eqns if e.primitive.name == "scan"]
    info["scan_params"] = sorted(scan[0].params) if scan else []
    print(json.dumps(info), flush=True)
    with open(os.path.join(out, "device.json"), "w") as f:
        json.dump(info, f, indent=1)
    suffix = "_loss" if loss else ""  # the regression-loss steps' files: measured_loss.jsonl, hlo_loss.zip, ...
    path = os.path.join(out, f"measured{suffix}.jsonl")
    for name, model, kw in (LOSS_CONFIGS if loss else CONFIGS):
        if only and name not in only:
            continue
        kw = dict(kw)
        if smoke:
            kw = {**{k: v for k, v in kw.items() if not isinstance(v, int)}, **SMOKE[model]}
        t0 = time.perf_counter()
        row = {"name": name, "model": model, "kwargs": kw}
        dump = os.path.join(out, "dump", name)
        options = {"xla_dump_to": dump, "xla_dump_hlo_as_text": True} if dumps else None
        try:
            g = autolayout.models.MODELS[model](**kw)
            ex = autolayout.execute(g, "d:1", None, hardware=hw, reference=False, repeats=REPEATS,
                                    compiler_options=options)
        except Exception as exc:  # recorded in the results, not hidden: the report shows it
            row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            row["traceback"] = traceback.format_exc()[-3000:]
            print(json.dumps(row), flush=True)
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")
            continue
        c = ex.predicted
        row.update(measured_s=ex.step_time_s, step_times_s=list(ex.step_times_s),
                   predicted_s=c.time_s, predicted_compute_s=c.compute_s, predicted_memory_bytes=c.memory_bytes,
                   xla_memory=ex.xla_memory, xla_memory_bytes=ex.xla_memory_bytes, model_flops=c.model_flops,
                   hardware_flops=c.hardware_flops, xla_flops=ex.xla_flops, compile_s=ex.compile_s,
                   total_s=time.perf_counter() - t0, **_hlo_facts(ex.compiled_hlo_text))
        print(json.dumps({k: v for k, v in row.items() if k != "step_times_s"}), flush=True)
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
        with zipfile.ZipFile(os.path.join(out, f"hlo{suffix}.zip"), "a", zipfile.ZIP_DEFLATED) as z:
            z.writestr(f"{name}.compiled.txt", ex.compiled_hlo_text)  # for reading memory offline
        if dumps:  # the step's buffer assignment and live ranges (benchmarks/xla_live.py reads them)
            from xla_live import live_peak

            try:
                row_live = live_peak(dump)
                prefix = row_live["module"].replace("-buffer-assignment.txt", "")
            except ValueError as exc:  # several programs dumped: recorded, and every one's files kept
                row_live, prefix = {"error": str(exc)[:2000]}, ""
            with zipfile.ZipFile(os.path.join(out, f"buffers{suffix}.zip"), "a", zipfile.ZIP_DEFLATED) as z:
                for f in os.listdir(dump):
                    if f.startswith(prefix) and f.endswith(("-buffer-assignment.txt", "-live-range.txt")):
                        z.write(os.path.join(dump, f), f"{name}/{f}")
            with open(os.path.join(out, f"live{suffix}.jsonl"), "a") as f:
                f.write(json.dumps({"name": name, **{k: v for k, v in row_live.items() if k != "module"}}) + "\n")
            shutil.rmtree(dump)
        del ex, g
    if dumps and os.path.isdir(os.path.join(out, "dump")):
        os.rmdir(os.path.join(out, "dump"))  # each step's folder went once its files were zipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measure", metavar="OUT", help="measure on this machine's first device, write OUT/")
    ap.add_argument("--kernels", metavar="OUT", help="measure ceilings and attention kernels, write OUT/kernels.json")
    ap.add_argument("--dumps", action="store_true",
                    help="with --measure: XLA's buffer assignment of each step (OUT/buffers.zip) and its live peak "
                         "(OUT/live.jsonl, benchmarks/xla_live.py), to root-cause memory misses")
    ap.add_argument("--loss", action="store_true",
                    help="with --measure: the MLP and MoE steps with a regression loss (LOSS_CONFIGS) instead, "
                         "into OUT/measured_loss.jsonl")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (a CPU check of the script)")
    ap.add_argument("--only", nargs="*", help="configs to measure (default: all)")
    args = ap.parse_args(argv)
    if args.kernels:
        kernels(args.kernels, args.smoke)
    if args.measure:
        measure(args.measure, args.smoke, args.only, args.dumps, args.loss)
    if args.kernels or args.measure:
        return 0
    ap.error("give --kernels OUT and/or --measure OUT (the report: benchmarks/gpu_report.py)")
    return 2


if __name__ == "__main__":
    sys.exit(main())
