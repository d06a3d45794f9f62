"""The built-in hardware profiles (TPU v2-v6e, H100, H200, XLA:CPU), the slow inter-host
links to put on a data-centre mesh axis, and :func:`get_hardware`, which resolves a profile
name or a JSON file. The value types are in :mod:`autolayout.costmodel.hardware`.

Every number below cites its public source next to it. Figures that could not be found
stated directly are derived, and the derivation is shown.
"""
from __future__ import annotations

import difflib
import os
from typing import Union

from autolayout.costmodel.hardware import GB, RING, SWITCH, TERA, GiB, Hardware, Link, PathLike

__all__ = ["PROFILES", "DEFAULT_HARDWARE", "SLOW_LINKS", "get_hardware", "known_hardware"]


# ---------------------------------------------------------------------------
# Sources (kept as constants so profiles can list them).
# ---------------------------------------------------------------------------
SRC_SCALING_TPUS = (
    "jax-ml/scaling-book tpus.md (https://jax-ml.github.io/scaling-book/tpus/): "
    "ICI BW/link one-way v4p 4.5e10, v5p 1e11, v5e 5e10, v6e 1e11 B/s; "
    "DCN ~2.5e10 B/s per host"
)
SRC_SCALING_SHARDING = (
    "jax-ml/scaling-book sharding.md (https://jax-ml.github.io/scaling-book/sharding/): "
    "ICI per-hop latency 'typically around 1us'; AllGather T = V / W_ici(bidirectional)"
)
SRC_SCALING_GPUS = (
    "jax-ml/scaling-book gpus.md (https://jax-ml.github.io/scaling-book/gpus/): "
    "H100 GPU egress 450 GB/s (NVLink, unidirectional), 8x400 Gbps CX7 NICs per node"
)
SRC_JAX_PRECISION = (
    "JAX docs 'Matmul precision' (https://docs.jax.dev/en/latest/201/precision.html): default float32 "
    "dots use bfloat16 on TPU, TF32 on recent GPUs; jax-ml/jax issue #18934: HIGH = bfloat16_3x, "
    "HIGHEST = bfloat16_6x on TPU"
)
SRC_PALLAS_MATMUL = (
    "JAX docs 'Pallas TPU - Your First Matmul' (jax-ml/jax docs/pallas/tpu/matmul.md): "
    "'pretty good utilization (80-90%) in the bigger matmuls' on TPU v5e"
)
SRC_NCCL_TUNING = (
    "NVIDIA/nccl src/graph/tuning.cc hwLat table: ring per-step latency "
    "LL128 NVLink 1.9 us, NET 4.0 us, NET Simple 9.6 us"
)


SRC_FUSED_ATTENTION = (
    "Fused attention (Hardware.fused_attention): FlashAttention (Dao et al. 2022, 'FlashAttention: Fast and "
    "Memory-Efficient Exact Attention with IO-Awareness', Algorithms 1-2: scores tiled in on-chip SRAM, the "
    "backward recomputes them from Q, K and the saved softmax statistics m, l). On TPU the Pallas kernels "
    "jax/experimental/pallas/ops/tpu/flash_attention.py and splash_attention (MaxText attention='flash', "
    "AI-Hypercomputer/maxtext MaxText/layers/attentions.py); on Hopper cuDNN's fused attention and "
    "FlashAttention-2 (Dao 2023; NVIDIA Transformer Engine, llm-foundry attn_impl: flash). Set on the TPU v4+ "
    "and Hopper profiles. Unset on tpu-v2/v3: those profiles price the Mesh-TensorFlow 2018 programs the "
    "paper reproductions run, whose attention materialises the scores (mesh_tensorflow/transformer/"
    "attention.py), and Pallas' Mosaic TPU backend is not used on them here; use "
    "replace(fused_attention=True) to price a kernel there. Unset on CPU: XLA:CPU compiles the traced "
    "attention as written, with no fused-attention kernel, so CPU validation and the memory-vs-XLA checks "
    "(benchmarks/memory_vs_xla.py) keep pricing materialised scores")


def _tpu_peaks(bf16: float, **extra: float) -> dict[str, float]:
    """TPU peak table: float32 at the bf16 rate (JAX default one bf16 pass),
    HIGH/HIGHEST at 1/3 and 1/6 of it (3 and 6 bf16 passes; SRC_JAX_PRECISION)."""
    return {
        "bfloat16": bf16,
        "float32": bf16,
        "float32_high": bf16 / 3,
        "float32_highest": bf16 / 6,
        **extra,
    }


def _ici(one_way_per_link: float, devices_per_chip: int = 1, what: str = "") -> Link:
    """ICI ring link: both directions of the axis (2x one-way), shared by the
    devices of a chip (TPU v2/v3 cores share the chip's links)."""
    return Link(
        bandwidth=2 * one_way_per_link / devices_per_chip,
        latency=1e-6,  # SRC_SCALING_SHARDING: ICI hop ~1 us
        topology=RING,
        description=f"ICI torus axis with wraparound, bidirectional ring {what}".strip(),
    )


def _tpu(
    name: str, *, peaks: dict[str, float], hbm_bytes: float, hbm_bw: float, link: Link,
    description: str, sources: tuple[str, ...], fused_attention: bool = True,
) -> Hardware:
    return Hardware(
        name=name,
        peak_flops=peaks,
        hbm_bytes=hbm_bytes,
        hbm_bandwidth=hbm_bw,
        link=link,
        efficiency=0.85,  # SRC_PALLAS_MATMUL: 80-90% of peak for large bf16 matmuls
        fused_attention=fused_attention,  # SRC_FUSED_ATTENTION
        description=description,
        sources=tuple(sources) + (SRC_JAX_PRECISION, SRC_PALLAS_MATMUL, SRC_SCALING_SHARDING)
        + ((SRC_FUSED_ATTENTION,) if fused_attention else ()),
    )


TPU_V2 = _tpu(
    "tpu-v2",
    # 180 TFLOP/s per Cloud TPU v2 board of 4 chips (Google I/O 2017 / Cloud TPU
    # beta announcement) = 45 TFLOP/s per chip, 2 TensorCores per chip -> 22.5 per core.
    peaks=_tpu_peaks(180 * TERA / 4 / 2),
    # 8 GB HBM per core, 16 GB per chip, 64 GB per 4-chip board (Cloud TPU v2 beta coverage).
    hbm_bytes=8 * GiB,
    # 600 GB/s HBM per chip (Wikipedia 'Tensor Processing Unit', second generation), 2 cores.
    hbm_bw=600 * GB / 2,
    # 4 ICI links of 496 Gbit/s each (Jouppi et al., CACM 2020 'A Domain-Specific
    # Supercomputer for Training Deep Neural Networks'); taken as one-way. 2 cores share them.
    link=_ici(496e9 / 8, devices_per_chip=2, what="(per core: the chip's links are shared by its 2 cores)"),
    description=(
        "Cloud TPU v2, one JAX device = one TensorCore (2 per chip, separate 8 GiB HBM each). "
        "The Mesh-TensorFlow 16x32 mesh counts 512 cores of a 256-chip pod. Link bandwidth is "
        "per core, i.e. half the chip's per-axis ring bandwidth (exact for an axis whose ring "
        "leaves the chip at every step; an axis that pairs the two cores of a chip gets ~2x)."
    ),
    fused_attention=False,  # SRC_FUSED_ATTENTION: the Mesh-TF 2018 programs materialise the scores
    sources=(
        "Cloud TPU v2: 180 TFLOPS and 64 GB HBM per 4-chip board, 8 GB HBM per core "
        "(Google Cloud TPU beta announcement, 2018)",
        "Wikipedia 'Tensor Processing Unit': TPUv2 16 GB HBM, 600 GB/s per chip",
        "Jouppi et al., 'A Domain-Specific Supercomputer for Training Deep Neural Networks', "
        "CACM 63(7) 2020: 4 ICI links x 496 Gbit/s",
    ),
)

TPU_V3 = _tpu(
    "tpu-v3",
    # 123 TFLOP/s bf16 per chip, 2 TensorCores per chip (cloud.google.com/tpu/docs/v3).
    peaks=_tpu_peaks(123 * TERA / 2),
    # HBM2 32 GiB and 900 GBps per chip (cloud.google.com/tpu/docs/v3), split over 2 cores.
    hbm_bytes=32 * GiB // 2,
    hbm_bw=900 * GB / 2,
    # One-way per link derived from the same page: all-reduce bandwidth 340 TB/s per
    # 1024-chip pod = 332 GB/s egress per chip over 4 links -> 83 GB/s one-way per link.
    # (The same derivation reproduces scaling-book's v4/v5e/v6e per-link figures exactly;
    # scaling-book's tpus.md itself lists 1e11 for v3.)
    link=_ici(340e12 / 1024 / 4, devices_per_chip=2, what="(per core: the chip's links are shared by its 2 cores)"),
    description=(
        "Cloud TPU v3, one JAX device = one TensorCore (2 per chip, 16 GiB HBM each). Link "
        "bandwidth is per core (half the chip's per-axis ring bandwidth), as for tpu-v2."
    ),
    fused_attention=False,  # SRC_FUSED_ATTENTION: the Mesh-TF 2018 programs materialise the scores
    sources=(
        "https://cloud.google.com/tpu/docs/v3: 123 TFLOPS bf16 per chip, HBM2 32 GiB / 900 GBps, "
        "2D torus, all-reduce bandwidth per pod 340 TB/s (1024 chips)",
    ),
)

TPU_V4 = _tpu(
    "tpu-v4",
    # 275 TFLOP/s bf16 or int8 per chip (cloud.google.com/tpu/docs/v4).
    peaks=_tpu_peaks(275 * TERA, int8=275 * TERA),
    hbm_bytes=32 * GiB,  # HBM2 32 GiB (cloud.google.com/tpu/docs/v4)
    hbm_bw=1200 * GB,  # 1200 GBps (cloud.google.com/tpu/docs/v4)
    # 4.5e10 B/s one-way per link (scaling-book tpus.md); check: 1.1 PB/s all-reduce
    # bandwidth per 4096-chip pod / 6 links = 44.8 GB/s.
    link=_ici(4.5e10),
    description="Cloud TPU v4, one JAX device = one chip (2 TensorCores as a megacore), 3D torus.",
    sources=(
        "https://cloud.google.com/tpu/docs/v4: 275 TFLOPS bf16/int8, HBM2 32 GiB / 1200 GBps, "
        "all-reduce bandwidth per pod 1.1 PB/s (4096 chips)",
        SRC_SCALING_TPUS,
    ),
)

TPU_V5E = _tpu(
    "tpu-v5e",
    # 197 TFLOP/s bf16, 393 TOP/s int8 per chip (cloud.google.com/tpu/docs/v5e).
    peaks=_tpu_peaks(197 * TERA, int8=393 * TERA),
    hbm_bytes=16 * GB,  # "HBM2 capacity and bandwidth 16 GB, 819 GBps" (cloud.google.com/tpu/docs/v5e)
    hbm_bw=819 * GB,
    # 400 GBps bidirectional ICI per chip over 4 ports = 50 GB/s one-way per link
    # (cloud.google.com/tpu/docs/v5e; scaling-book tpus.md: 5e10 one-way).
    link=_ici(50 * GB),
    description="Cloud TPU v5e, one JAX device = one chip (1 TensorCore), 2D torus (16x16 pod).",
    sources=(
        "https://cloud.google.com/tpu/docs/v5e: 197 TFLOPS bf16, 393 TOPS int8, 16 GB / 819 GBps HBM2, "
        "400 GBps bidirectional ICI per chip, 4 ICI ports, 2x100 Gbps NIC per 8-chip host",
        SRC_SCALING_TPUS,
    ),
)

TPU_V5P = _tpu(
    "tpu-v5p",
    # 459 TFLOP/s bf16 and fp8 per chip (cloud.google.com/tpu/docs/v5p); int8 9.18e14 (scaling-book tpus.md).
    peaks=_tpu_peaks(459 * TERA, float8=459 * TERA, int8=918 * TERA),
    hbm_bytes=95 * GiB,  # "HBM capacity per chip (GiB) 95" (cloud.google.com/tpu/docs/v5p)
    hbm_bw=2765 * GB,  # "HBM bandwidth per chip (GBps) 2765" (cloud.google.com/tpu/docs/v5p)
    # 1200 GBps bidirectional ICI per chip over 6 links = 100 GB/s one-way per link
    # (cloud.google.com/tpu/docs/v5p; scaling-book tpus.md: 1e11 one-way).
    link=_ici(100 * GB),
    description="Cloud TPU v5p, one JAX device = one chip (2 TensorCores as a megacore), 3D torus.",
    sources=(
        "https://cloud.google.com/tpu/docs/v5p: 459 TFLOPS bf16/fp8, 95 GiB / 2765 GBps HBM, "
        "1200 GBps bidirectional ICI per chip, DCN 50 Gbps per chip",
        SRC_SCALING_TPUS,
    ),
)

TPU_V6E = _tpu(
    "tpu-v6e",
    # 918 TFLOP/s bf16, 1836 TOP/s int8 per chip (cloud.google.com/tpu/docs/v6e).
    peaks=_tpu_peaks(918 * TERA, int8=1836 * TERA),
    hbm_bytes=32 * GB,  # "HBM capacity per chip 32 GB" (cloud.google.com/tpu/docs/v6e)
    hbm_bw=1638 * GB,  # "HBM bandwidth per chip 1638 GBps" (cloud.google.com/tpu/docs/v6e)
    # 800 GBps bidirectional ICI per chip over 4 ports = 100 GB/s one-way per link
    # (cloud.google.com/tpu/docs/v6e; scaling-book tpus.md: 1e11 one-way).
    link=_ici(100 * GB),
    description="Cloud TPU v6e (Trillium), one JAX device = one chip (1 TensorCore), 2D torus (16x16 pod).",
    sources=(
        "https://cloud.google.com/tpu/docs/v6e: 918 TFLOPS bf16, 1836 TOPS int8, 32 GB / 1638 GBps HBM, "
        "800 GBps bidirectional ICI per chip, 4 ICI ports, 8 chips per host",
        SRC_SCALING_TPUS,
    ),
)

# NVLink 4 through NVSwitch: 900 GB/s bidirectional per GPU = 450 GB/s each way
# (NVIDIA H100/H200 datasheets; scaling-book gpus.md "each GPU can egress 450GB/s").
NVLINK4 = Link(
    bandwidth=450 * GB,
    latency=1.9e-6,  # SRC_NCCL_TUNING: ring LL128 per-step latency on NVLink
    topology=SWITCH,
    description="NVLink 4 via NVSwitch inside one 8-GPU HGX/DGX node, 450 GB/s per GPU each way",
)

# H100 SXM5 tensor-core figures are quoted "with sparsity"; dense is half:
# bf16/fp16 1979 -> 989.4, tf32 989 -> 494.7, fp8/int8 3958 -> 1978.9 TFLOP/s;
# fp32 (CUDA cores) 66.9, fp64 tensor 66.9 (NVIDIA H100 datasheet; glennklockwood.com
# H100 table lists the same dense values). H200 has the same GH100 compute.
_HOPPER_PEAKS = {
    "bfloat16": 989.4 * TERA, "float16": 989.4 * TERA, "tensorfloat32": 494.7 * TERA,
    "float32": 494.7 * TERA,  # JAX's default float32 dot on Hopper runs as TF32 (SRC_JAX_PRECISION)
    "float32_highest": 66.9 * TERA,  # true fp32 on CUDA cores
    "float64": 66.9 * TERA, "float8": 1978.9 * TERA, "int8": 1978.9 * TERA,
}
_GPU_EFFICIENCY_NOTE = (
    "efficiency 0.75 is a judgement between two measurements on one H200 with jax 0.11.2 (reports/gpu, "
    "benchmarks/gpu_validate.py): XLA's best bf16 matmul reached 0.83 of the datasheet peak (TF32 0.81), and 18 "
    "whole training steps refit at 0.72 of it (compute x1.147 over the measured ceilings); memory bandwidth is the "
    "datasheet's, which XLA's float32 stream reached at 0.90. Refit to measured steps (fit_step_profile) to replace it"
)


SRC_ALL_REDUCE_IN_PLACE = (
    "XLA buffer sharing of all-reduce: the generic rule (xla/service/hlo_dataflow_analysis.cc, "
    "HloDataflowAnalysis::CanShareOperandBufferWithUser) shares an operand's buffer with its user only "
    "for element-wise users and a few in-place ops, not all-reduce, unless a backend hint says so; the GPU "
    "backend's hint does (xla/service/gpu/buffer_sharing.cc, CanShareBufferHint: 'NCCL all-reduce can be "
    "performed in-place'); XLA:CPU has none (measured: benchmarks/memory_vs_xla.py, an all-reduced gradient "
    "takes two buffers in memory_analysis's temp); the TPU backend's is not public, so TPU profiles keep the "
    "generic rule")

SRC_CPU_SCHEDULE = (
    "XLA:CPU schedules each computation breadth first (openxla/xla xla/service/cpu/cpu_compiler.cc, "
    "CpuCompiler::CreateHloSchedule: BFSMemoryScheduler, xla/hlo/transforms/simplifiers/hlo_memory_scheduler.cc): "
    "an instruction runs as soon as its operands are ready, in the order they became ready, so the all-gathers "
    "of the step's parameters run at its start (measured: the optimized HLO of benchmarks/memory_vs_xla.py's "
    "ZeRO-3 layouts, at the top level and in scan bodies; tests/test_memory_rules.py), and the memory model "
    "walks each computation in that order (costmodel/order.py; tests/test_order.py). XLA:TPU and XLA:GPU run "
    "the latency-hiding scheduler (MaxText sets xla_tpu_enable_latency_hiding_scheduler; "
    "xla/service/gpu/gpu_hlo_schedule.cc), which starts an asynchronous collective a bounded distance ahead of "
    "its use, not at the step's start; inside a scan body a layer's gathers start at the body's start there too "
    "(the layer's weights are gathered before its first matmul).")
SRC_GPU_SCHEDULE = (
    "XLA:GPU orders the module with DefaultMemoryScheduler before its latency-hiding scheduler runs "
    "(openxla/xla xla/service/gpu/gpu_hlo_schedule.cc, ScheduleGpuModule -> ScheduleGpuModuleWithMemoryScheduler): "
    "list, DFS and post-order schedules of every computation, the one whose peak of live bytes is least kept "
    "(xla/hlo/transforms/simplifiers/hlo_memory_scheduler.cc, DefaultMemoryScheduler::Run); the memory model "
    "walks that order (costmodel/order.py min_memory, costmodel/schedulers.py). Measured against the committed "
    "H200 steps (reports/gpu): replayed on each program's own entry computation, XLA's order is one of the "
    "three (benchmarks/xla_memory_scheduler.py: the DFS to the instruction in 9 of the 24 programs, the post "
    "order in one, the list within ties of it in another); the model's memory within 10% of XLA:GPU's "
    "memory_analysis in 18 of the 24 steps, 14 in the traced order (benchmarks/gpu_report.py), each scan's stack "
    "fills instructions the scheduler places")
SRC_CPU_YNN = (
    "XLA:CPU runs an instruction with at least 4096 elements (or an operand that has them) as a YNNPACK "
    "fusion where it can (openxla/xla xla/backends/cpu/ynn_support.cc: IsInstructionPreferredByYnn, "
    "kMinElements = 4096); a reduction's YNN fusion reads the broadcast of a value from memory, which XLA "
    "writes at the broadcast's shape (measured: tests/test_broadcasts.py, the wrapped_broadcast of a norm's "
    "rsqrt at 8x16x32 elements and none at 4x16x32; linen_gpt's layer norm backward in "
    "benchmarks/memory_vs_xla.py); XLA:TPU and XLA:GPU fuse the broadcast into its readers.")
SRC_CPU_DONATED_COPIES = (
    "XLA's copy insertion copies an argument aliased to an output (jax.jit donate_argnums) where one of its "
    "readers may run after the instruction writing that output (openxla/xla xla/service/copy_insertion.cc: "
    "AddCopiesForAliasedInputOutputs, then RemoveUnnecessaryCopies under the dependency ordering); on XLA:CPU a "
    "donated parameter is copied exactly when a reader is not an ancestor of that instruction (measured: the "
    "optimized HLO of 61 donated layouts of benchmarks/memory_vs_xla.py, 61 of 61; the traced-graph rule of "
    "costmodel/donations.py agrees in 57, equinox_block's stage-2 and replicated steps copying 4-5 more). "
    "XLA:GPU does not follow the rule (reports/gpu/hlo.zip, hlo_loss.zip: 8 of 24 H200 steps copy 9 parameters; "
    "the rule counts agree in 7 of 24 steps, naming copies in 13), so GPU and TPU profiles leave it off.")
SRC_CPU_GRADIENT_REDUCTIONS = (
    "XLA:CPU combines every all-reduce that does not depend on another into one, with no byte threshold "
    "(openxla/xla xla/service/cpu/cpu_compiler.cc: CpuAllReduceCombiner(kCombineBytes = "
    "std::numeric_limits<int64_t>::max(), kCombineCount = 256)), so a step's gradient all-reduces run "
    "together after the last gradient; its schedulers (the default concurrency-optimized BFScheduler and the "
    "DFSMemoryScheduler) also put the gradients' reduce-scatters after the last gradient contraction, and "
    "its layout assignment makes a reduce-scatter's scattered dim most major, copying the operand where it "
    "is not (measured: benchmarks/memory_vs_xla.py's mlp layouts, optimized HLO and buffer assignment; "
    "tests/test_memory_rules.py). XLA:GPU combines all-reduces only up to "
    "xla_gpu_all_reduce_combine_threshold_bytes (30 MiB by default) and runs them in place; the TPU "
    "compiler's rules are not public: neither is modelled there")

SRC_CPU_HALF_DOTS = (
    "XLA:CPU normalises half-precision ops to float32 (openxla/xla xla/service/cpu/cpu_compiler.cc runs "
    "FloatNormalization with CpuFloatSupport, xla/service/cpu/cpu_float_support.h, which keeps a bf16 dot "
    "only where a library (XNNPACK, oneDNN) takes it): a bfloat16 dot reads float32 converts of its "
    "operands and writes a float32 result that a convert rounds back (measured: the optimized HLO and "
    "buffer assignment of examples/linen_bf16_mlp.py in benchmarks/memory_vs_xla.py: 'convert_convert_fusion' "
    "f32 buffers of the bf16 weights and activations, 'dot_general = f32[...] dot', every dot of the step). "
    "GPUs and TPUs run bf16 dots natively")


SRC_CPU_HALF_COLLECTIVES = (
    "XLA:CPU normalises a collective of a half-precision value to float32 as it does a dot "
    "(SRC_CPU_HALF_DOTS: FloatNormalization with CpuFloatSupport): measured in the optimized HLO of "
    "examples/linen_bf16_mlp.py's ZeRO-3 step in benchmarks/memory_vs_xla.py (batch:data|*:data@3, 8 CPU "
    "devices, jax 0.10.2), where the step's 'all-gather' of bf16[2,128,128] before optimization is an "
    "'all-gather' of f32[2,128,128] after it, between 'convert_bitcast_fusion' converts (all_gather_invariant.29, "
    "all_gather_invariant.25: 128 KiB float32 buffers live at the step's peak, beside the float32 copy "
    "convert_bitcast_fusion.1 that both dots read). GPUs and TPUs all-gather bf16 natively")


def _hopper(name: str, hbm_bytes: float, hbm_bw: float, sheet: str) -> Hardware:
    return Hardware(
        name=name,
        peak_flops=_HOPPER_PEAKS,
        hbm_bytes=hbm_bytes,
        hbm_bandwidth=hbm_bw,
        link=NVLINK4,
        efficiency=0.75,
        all_reduce_in_place=True,  # SRC_ALL_REDUCE_IN_PLACE
        min_memory_schedule=True,  # SRC_GPU_SCHEDULE
        fused_attention=True,  # SRC_FUSED_ATTENTION: cuDNN fused attention / FlashAttention-2
        description=(
            f"NVIDIA {name.upper()} SXM, one JAX device = one GPU. Default link = NVLink inside an "
            "8-GPU node; give the inter-node mesh axis SLOW_LINKS['" + name + "'] (one 400 Gb/s NDR "
            "InfiniBand NIC per GPU) via with_axis_link. " + _GPU_EFFICIENCY_NOTE
        ),
        sources=(sheet, SRC_SCALING_GPUS, SRC_NCCL_TUNING, SRC_JAX_PRECISION, SRC_ALL_REDUCE_IN_PLACE,
                 SRC_FUSED_ATTENTION, SRC_GPU_SCHEDULE),
    )


H100 = _hopper(
    "h100",
    hbm_bytes=80 * GB,  # 80 GB HBM3 (NVIDIA H100 SXM datasheet)
    hbm_bw=3.35e12,  # 3.35 TB/s (NVIDIA H100 SXM datasheet)
    sheet=(
        "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100/), SXM: "
        "BF16 1,979 TFLOPS with sparsity, TF32 989, FP32 67, FP64 tensor 67, 80 GB, 3.35 TB/s, NVLink 900 GB/s"
    ),
)

H200 = _hopper(
    "h200",
    hbm_bytes=141 * GB,  # 141 GB HBM3e (NVIDIA H200 datasheet)
    hbm_bw=4.8e12,  # 4.8 TB/s (NVIDIA H200 datasheet)
    sheet=(
        "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200/): 141 GB HBM3e, "
        "4.8 TB/s, NVLink 900 GB/s, same Hopper compute as H100 SXM"
    ),
)

# Placeholder for "this machine" (virtual CPU devices). Meant to be replaced by
# a profile measured with `calibrate`; the numbers only give the right orders.
CPU = Hardware(
    name="cpu",
    # One x86 core with two 256-bit FMA pipes: 2 pipes x 8 fp32 lanes x 2 FLOP = 32 FLOP/cycle
    # (AMD Zen 2+/Intel Skylake optimization manuals), at a nominal 2.5 GHz = 8e10 FLOP/s.
    # bfloat16 is converted to float32 on most CPUs, so it gets the same figure.
    peak_flops={"float32": 32 * 2.5e9, "bfloat16": 32 * 2.5e9},
    hbm_bytes=4 * GiB,  # placeholder share of host DRAM per virtual device
    hbm_bandwidth=10 * GB,  # placeholder: order of one core's DRAM stream bandwidth
    link=Link(
        bandwidth=5 * GB,  # placeholder: in-process copies between virtual devices
        latency=10e-6,  # placeholder: thread rendezvous per collective step
        topology=SWITCH,
        description="placeholder: host-memory copies between virtual CPU devices",
    ),
    efficiency=0.5,
    # XLA:CPU runs a collective in line on the calling thread (its collectives are
    # synchronous rendezvous between the device threads): nothing overlaps compute.
    async_collectives=False,
    all_reduce_in_place=False,  # SRC_ALL_REDUCE_IN_PLACE: measured on XLA:CPU
    combines_gradient_reductions=True,  # SRC_CPU_GRADIENT_REDUCTIONS
    reduce_scatter_copies=True,  # SRC_CPU_GRADIENT_REDUCTIONS
    upcasts_half_dots=True,  # SRC_CPU_HALF_DOTS
    upcasts_half_collectives=True,  # SRC_CPU_HALF_COLLECTIVES
    breadth_first_schedule=True,  # SRC_CPU_SCHEDULE
    ynn_reductions=True,  # SRC_CPU_YNN
    copies_donated_parameters=True,  # SRC_CPU_DONATED_COPIES
    # XLA:CPU copies a dot's operands into [batch, M, K] order (costmodel/dotcopy.py), as calibrate sets
    dot_operand_copies=True,
    description=(
        "PLACEHOLDER for the machine at hand (one JAX CPU device ~ one core). Not a measured "
        "profile: run calibrate and use the profile it writes instead."
    ),
    sources=("derivation in comments (32 FLOP/cycle/core AVX2 FMA x 2.5 GHz); other numbers are placeholders",),
)

PROFILES: dict[str, Hardware] = {
    hw.name: hw for hw in (TPU_V2, TPU_V3, TPU_V4, TPU_V5E, TPU_V5P, TPU_V6E, H100, H200, CPU)
}

# The target profile of `predict`, `search`, `layout` and `report` (and of the CLI's
# `--hardware`) when none is given: the TPU generation of the Mesh-TensorFlow paper's §9
# experiments that the committed reports reproduce. Every output names the profile it used.
DEFAULT_HARDWARE = "tpu-v3"

# Slow (inter-host) links to put on a data-centre mesh axis with
# ``hw.with_axis_link(axis, SLOW_LINKS[hw.name])``. Per-device share of the host NIC.
_DCN_LATENCY = 9.6e-6  # SRC_NCCL_TUNING NET ring Simple per-step latency, used as a proxy for a host-NIC hop
SLOW_LINKS: dict[str, Link] = {
    # scaling-book tpus.md: DCN ~2.5e10 B/s per host; hosts have 4 chips = 8 cores (v2/v3).
    "tpu-v2": Link(2.5e10 / 8, _DCN_LATENCY, RING, "DCN, 2.5e10 B/s per host / 8 cores (scaling-book tpus.md)"),
    "tpu-v3": Link(2.5e10 / 8, _DCN_LATENCY, RING, "DCN, 2.5e10 B/s per host / 8 cores (scaling-book tpus.md)"),
    "tpu-v4": Link(2.5e10 / 4, _DCN_LATENCY, RING, "DCN, 2.5e10 B/s per 4-chip host (scaling-book tpus.md)"),
    # 2 x 100 Gbps NIC per 8-chip host = 25 Gbps per chip (cloud.google.com/tpu/docs/v5e).
    "tpu-v5e": Link(200e9 / 8 / 8, _DCN_LATENCY, RING, "DCN, 2x100 Gbps per 8-chip host (cloud docs v5e)"),
    # "Data center network (DCN) bandwidth per chip (Gbps) 50" (cloud.google.com/tpu/docs/v5p).
    "tpu-v5p": Link(50e9 / 8, _DCN_LATENCY, RING, "DCN, 50 Gbps per chip (cloud docs v5p)"),
    "tpu-v6e": Link(2.5e10 / 8, _DCN_LATENCY, RING, "DCN, 2.5e10 B/s per 8-chip host (scaling-book tpus.md)"),
    # One ConnectX-7 400 Gb/s NDR InfiniBand NIC per GPU (mlcommons DGX-H100 system doc;
    # scaling-book gpus.md) = 50 GB/s each way per GPU. Latency: NCCL NET ring LL128 4.0 us.
    "h100": Link(400e9 / 8, 4.0e-6, RING, "InfiniBand NDR 400 Gb/s per GPU (DGX H100)"),
    "h200": Link(400e9 / 8, 4.0e-6, RING, "InfiniBand NDR 400 Gb/s per GPU (DGX H200)"),
    "cpu": Link(1 * GB, 50e-6, RING, "placeholder"),
}


def _key(name: str) -> str:
    """Comparison key: case-insensitive, '-', '_' and spaces ignored."""
    return "".join(ch for ch in name.lower() if ch not in "-_ ")


def known_hardware() -> list[str]:
    """Names of the built-in profiles."""
    return list(PROFILES)


def get_hardware(x: Union[Hardware, PathLike]) -> Hardware:
    """Resolve ``x`` to a :class:`Hardware`.

    ``x`` may be a Hardware (returned as is), a profile name (case-insensitive,
    ``'_'``/``'-'`` interchangeable, ``'tpu'`` prefix optional: ``"TPU_v5e"``,
    ``"v5e"``), or a path to a JSON file written by :meth:`Hardware.save`.

    >>> get_hardware("TPU_V4").name
    'tpu-v4'
    """
    if isinstance(x, Hardware):
        return x
    if isinstance(x, os.PathLike):
        return Hardware.load(x)
    if not isinstance(x, str):
        raise TypeError(f"get_hardware expects a Hardware, a profile name or a JSON path, got {type(x).__name__}")
    wanted = _key(x)
    for name, hw in PROFILES.items():
        if wanted in (_key(name), _key(name).removeprefix("tpu")):
            return hw
    if x.lower().endswith(".json") or os.path.isfile(x):
        return Hardware.load(x)
    known = known_hardware()
    close = difflib.get_close_matches(wanted, [_key(n) for n in known], n=1, cutoff=0.5)
    hint = ""
    if close:
        hint = f" Did you mean {next(n for n in known if _key(n) == close[0])!r}?"
    raise ValueError(f"Unknown hardware {x!r}.{hint} Known profiles: {', '.join(known)} (or a path to a JSON profile).")
