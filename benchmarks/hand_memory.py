"""Per-device memory of published training strategies, by hand — independent of the cost model.

A reference for the storage-sharding, sequence-parallelism and remat work (issues 10-12):
the per-chip memory of a named strategy written from first principles, by category, to set
next to what autolayout predicts for the same layout. Nothing here imports autolayout's
cost model, search or tracer; the shapes come from the cited configurations in
:mod:`autolayout.reporting.published_runs` (data only).

Formulas (bytes per device; ``b`` sequences of length ``s`` per device per micro-step,
``h`` = d_model, ``a`` heads, ``t`` tensor-parallel degree, ``L`` layers):

* **parameters** counted from the configuration (:func:`count_params`).
* **persistent state** (ZeRO, Rajbhandari et al. 2020, §3.1 and §5.3): mixed-precision
  Adam keeps 2Ψ (fp16 weights) + 2Ψ (fp16 gradients) + KΨ (fp32 master, momentum,
  variance; K = 12) bytes, and ZeRO-3 divides all of it by the data-parallel degree. The
  zoo's (MaxText's) mixed precision stores float32 weights (the master copy), float32
  gradients and float32 Adam moments: 4Ψ + 4Ψ + 8Ψ, the same 16Ψ. Every weight is divided
  by the devices it is split over: tensor x fsdp (plain data-parallel replicas hold copies).
* **saved activations**: with per-layer remat ("full") only each layer's input stays,
  2·s·b·h bytes (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", §4.3: full recomputation stores 2sbhL), divided by ``t`` with
  sequence parallelism (§4.2.2). "dots" (MaxText's ``minimal`` policy,
  ``checkpoint_dots_with_no_batch_dims``) also keeps the projection matmul outputs.
* **one layer's activations**, recomputed for its backward pass: Korthikanti §4.1 tensor by
  tensor (:func:`layer_activation_bytes`); with dropout and materialised attention this is
  eq. (1) ``sbh(34 + 5as/h)``, eq. (2) ``sbh(10 + 24/t + 5as/(ht))`` with tensor
  parallelism and eq. (4) ``sbh/t (34 + 5as/h)`` with sequence parallelism. The zoo's
  models have no dropout and materialise the attention scores; flash attention (MaxText,
  llm-foundry's triton kernel) keeps no ``s²`` tensor.
* **gathered weights** (FSDP, ZeRO-3): a layer's weights all-gathered in the compute dtype,
  ``/t``; two layers live (the one computing and the next being gathered, as XLA's and
  PyTorch FSDP's prefetch do), and the layer's float32 gradient before its reduce-scatter.
* **logits**: ``b·s·V/t`` float32 logits and their gradient (MaxText ``cast_logits_to_fp32``).

Peak = persistent + saved + the larger transient (a layer's backward, or the output layer).

Run: ``PYTHONPATH=$PWD python benchmarks/hand_memory.py`` (prints the table).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autolayout.reporting.published_runs import RUNS

__all__ = ["Arch", "count_params", "layer_activation_bytes", "saved_per_layer_bytes", "Strategy", "Memory",
           "hand_memory", "STRATEGIES", "table"]

GIB = 2**30
# Device memory (the hardware profiles of autolayout/costmodel/hardware.py cite the same):
# TPU v4 32 GiB HBM (cloud.google.com/tpu/docs/v4); TPU v5p 95 GiB (cloud.google.com/tpu/docs/v5p);
# H100 SXM 80 GB (NVIDIA H100 datasheet).
HBM_BYTES = {"tpu-v4": 32 * GIB, "tpu-v5p": 95 * GIB, "h100": 80e9}


@dataclass(frozen=True)
class Arch:
    """A decoder-only transformer as the zoo traces it (``transformer_lm`` or ``llama``)."""

    d_model: int
    n_layers: int
    heads: int
    kv_heads: int
    d_kv: int
    d_ff: int
    ffn_matrices: int  # 2: ReLU/GELU FFN; 3: SwiGLU (gate, up, down)
    vocab: int
    positions: int  # rows of a learned position table (0: none)
    tied: bool
    norm_vectors: int  # d_model-sized norm parameters per layer (scales and biases)
    final_norm_vectors: int

    @classmethod
    def from_zoo(cls, fn: str, kwargs: dict[str, Any]) -> "Arch":
        k = kwargs
        if fn == "transformer_lm":  # pre-norm LayerNorm (scale, bias) x 2 (x 1 with PaLM's parallel
            # layers), learned positions, untied
            norms = 2 if k.get("parallel_layers") else 4
            return cls(k["d_model"], k["n_layers"], k["heads"], k["heads"], k["d_kv"], k["d_ff"], 2,
                       k["vocab"], k["length"], False, norms, 2)
        if fn == "llama":  # RMSNorm scale x 2, SwiGLU, RoPE, untied head
            return cls(k["d_model"], k["n_layers"], k["heads"], k["kv_heads"], k["d_kv"], k["d_ff"], 3,
                       k["vocab"], 0, False, 2, 1)
        raise ValueError(f"no hand formula for zoo model {fn!r}; add one to Arch.from_zoo")

    def layer_params(self) -> int:
        d = self.d_model
        attention = d * self.heads * self.d_kv * 2 + d * self.kv_heads * self.d_kv * 2  # q, o; k, v
        return attention + self.ffn_matrices * d * self.d_ff + self.norm_vectors * d


def count_params(arch: Arch) -> int:
    """Parameters from the configuration: layers, embedding, output layer, positions, norms."""
    table = arch.vocab * arch.d_model
    return (arch.n_layers * arch.layer_params() + table * (1 if arch.tied else 2)
            + arch.positions * arch.d_model + arch.final_norm_vectors * arch.d_model)


def layer_activation_bytes(arch: Arch, b: int, s: int, t: int = 1, sp: bool = False, flash: bool = False,
                           dropout: bool = False) -> int:
    """Bytes of one layer's activations kept for its backward pass (16-bit activations,
    1-byte dropout masks), tensor by tensor as Korthikanti et al. 2022 §4.1 count them.
    Tensors that tensor parallelism splits are divided by ``t``; the layer-norm, residual
    and dropout region (replicated under tensor parallelism) too when ``sp``."""
    h, f = arch.d_model, arch.d_ff
    q, kv = arch.heads * arch.d_kv, arch.kv_heads * arch.d_kv
    rep = t if sp else 1
    sb = s * b
    # attention: layer-norm input, QKV input (norm output) | Q, K, V, out-projection input
    replicated = 2 * sb * h + 2 * sb * h
    split = 2 * sb * q + 2 * sb * kv + 2 * sb * kv + 2 * sb * q
    # feed-forward: layer-norm input, FFN input | matmul outputs, activation output(s)
    replicated += 2 * sb * h + 2 * sb * h
    split += 2 * sb * f * (2 if arch.ffn_matrices == 2 else 4)  # ReLU: in, out; SwiGLU: gate, up, silu, product
    scores = 0 if flash else 2 * arch.heads * s * s * b  # softmax output
    if dropout:
        replicated += 2 * sb * h  # the two residual dropout masks (1 byte each)
        scores += 0 if flash else 3 * arch.heads * s * s * b  # mask (1 byte) and dropout output (2 bytes)
    return replicated // rep + (split + scores) // t


def saved_per_layer_bytes(arch: Arch, remat: str, b: int, s: int, t: int, sp: bool, flash: bool) -> int:
    """Activations one layer keeps until the backward pass under a remat policy."""
    h, sb, rep = arch.d_model, s * b, t if sp else 1
    if remat == "full":
        return 2 * sb * h // rep
    if remat == "dots":  # layer input + q, k, v, out-projection, FFN matmul outputs
        proj = (arch.heads + 2 * arch.kv_heads) * arch.d_kv // t + (arch.ffn_matrices - 1) * arch.d_ff // t
        return 2 * sb * (3 * h // rep + proj)
    if remat == "none":
        return layer_activation_bytes(arch, b, s, t, sp, flash)
    raise ValueError(f"remat {remat!r}: use 'full', 'dots' or 'none'")


@dataclass(frozen=True)
class Strategy:
    """A named layout of one run: tensor x fsdp x data devices, sequence parallelism, remat."""

    name: str
    run: str  # a key of published_runs.RUNS (model, batch, hardware)
    tensor: int = 1
    fsdp: int = 1
    data: int = 1
    sp: bool = False
    remat: str = "full"
    microbatches: int = 1
    flash: bool = False  # the zoo materialises attention scores
    model_variant: int = -1  # -1: the run's model; i: run.variants[i]
    issue_GiB: float | None = None  # the figure an issue quotes for this strategy
    issue_source: str = ""
    note: str = ""


@dataclass(frozen=True)
class Memory:
    """Per-device bytes by category, the peak and the device's capacity."""

    strategy: Strategy
    params: int
    grads: int
    opt_state: int
    saved: int
    layer_activations: int
    gathered_weights: int
    layer_grads: int
    logits: int
    hbm: float

    @property
    def persistent(self) -> int:
        return self.params + self.grads + self.opt_state

    @property
    def transient(self) -> int:
        return max(self.layer_activations + self.gathered_weights + self.layer_grads,
                   self.logits + self.gathered_weights)

    @property
    def peak(self) -> int:
        return self.persistent + self.saved + self.transient


def hand_memory(st: Strategy, param_bytes: int = 4, grad_bytes: int = 4, opt_bytes: int = 8,
                compute_bytes: int = 2) -> Memory:
    """Per-device memory of strategy ``st`` (formulas in the module docstring)."""
    r = RUNS[st.run]
    model = r.model if st.model_variant < 0 else r.variants[st.model_variant]
    kw = model.as_kwargs()
    arch = Arch.from_zoo(model.fn, kw)
    devices = st.tensor * st.fsdp * st.data
    if devices != r.devices.value:
        raise ValueError(f"{st.name}: {st.tensor} x {st.fsdp} x {st.data} = {devices} devices, the run has "
                         f"{r.devices.value}")
    seqs = r.global_batch.value
    if seqs % (st.fsdp * st.data * st.microbatches):
        raise ValueError(f"{st.name}: batch {seqs} does not split over fsdp x data x microbatches")
    b, s, t = seqs // (st.fsdp * st.data * st.microbatches), r.length.value, st.tensor
    n = count_params(arch)
    shards = st.tensor * st.fsdp
    lp = arch.layer_params()
    logits = 2 * b * s * arch.vocab // t * 4
    saved = saved_per_layer_bytes(arch, st.remat, b, s, t, st.sp, st.flash)
    layer = layer_activation_bytes(arch, b, s, t, st.sp, st.flash)
    if st.remat == "dots":  # the backward recomputes what the saved matmul outputs do not hold
        layer -= saved - saved_per_layer_bytes(arch, "full", b, s, t, st.sp, st.flash)
    return Memory(
        st, params=n * param_bytes // shards, grads=n * grad_bytes // shards, opt_state=n * opt_bytes // shards,
        saved=arch.n_layers * saved, layer_activations=0 if st.remat == "none" else layer,
        gathered_weights=2 * lp * compute_bytes // t if st.fsdp > 1 else 0,
        layer_grads=lp * grad_bytes // t if st.fsdp > 1 else 0,
        logits=logits, hbm=HBM_BYTES[r.hardware])


I10, I11 = "issue 10", "issue 11"
MAXTEXT_NOTE = ("MaxText splits the residual stream's embed dim over the tensor axis (base.yml logical_axis_rules "
                "'activation_embed' -> 'tensor'): the same bytes as sequence parallelism, counted as SP here. "
                "'dots' keeps every projection output (checkpoint_dots_with_no_batch_dims). By this count the "
                "32B run's 7 sequences per chip need more than the 95 GiB: XLA's own rematerialisation under "
                "memory pressure, or a policy that keeps less than every projection, would explain the "
                "difference; not resolved here.")
GPT3 = "gpt3-175b-v4-4096"
STRATEGIES = (
    Strategy("GPT-3 175B  TP8 x FSDP512", GPT3, tensor=8, fsdp=512, issue_GiB=18,
             issue_source=f"{I10}: 'by hand, TP8 x FSDP512 ... about 18 GiB per chip' (peak)"),
    Strategy("GPT-3 175B  TP16 x FSDP256", GPT3, tensor=16, fsdp=256, issue_GiB=27,
             issue_source=f"{I11}: 'the saved layer inputs alone are 27 GiB per chip' (saved)"),
    Strategy("GPT-3 175B  TP16 x FSDP256 + SP", GPT3, tensor=16, fsdp=256, sp=True, issue_GiB=6.5,
             issue_source=f"{I11}: 'by hand that brings the same run to about 6.5 GiB' (peak)"),
    Strategy("MPT-70B  FSDP64, microbatch 8", "mpt-70b-h100-64", fsdp=64, microbatches=4),
    Strategy("MPT-70B  FSDP64, microbatch 8, flash", "mpt-70b-h100-64", fsdp=64, microbatches=4, flash=True),
    Strategy("LLaMA-2-70B  FSDP64, one step", "llama2-70b-h100-64-4m", fsdp=64),
    Strategy("LLaMA-2-70B  TP8 x FSDP8 + SP, one step", "llama2-70b-h100-64-4m", tensor=8, fsdp=8, sp=True),
    Strategy("LLaMA-2-70B  FSDP64, 16 microbatches", "llama2-70b-h100-64-4m", fsdp=64, microbatches=16),
    Strategy("LLaMA-2-70B  TP8 x FSDP8 + SP, 4 microbatches", "llama2-70b-h100-64-4m", tensor=8, fsdp=8,
             sp=True, microbatches=4),
    Strategy("PaLM 540B  TP12 x FSDP256 x DP2", "palm-540b-v4-6144", tensor=12, fsdp=256, data=2),
    Strategy("PaLM 540B  TP12 x FSDP256 x DP2 + SP", "palm-540b-v4-6144", tensor=12, fsdp=256, data=2, sp=True),
    Strategy("PaLM 540B (MQA llama)  TP12 x FSDP256 x DP2 + SP", "palm-540b-v4-6144", tensor=12, fsdp=256,
             data=2, sp=True, model_variant=0),
    Strategy("MaxText 32B  TP4 x FSDP16, dots, flash", "maxtext-32b-v5p-128", tensor=4, fsdp=16, remat="dots",
             flash=True, sp=True, note=MAXTEXT_NOTE),
    Strategy("MaxText 128B  TP8 x FSDP16, dots, flash", "maxtext-128b-v5p-256", tensor=8, fsdp=16,
             remat="dots", flash=True, sp=True, note=MAXTEXT_NOTE),
)


def table(strategies: tuple[Strategy, ...] = STRATEGIES) -> str:
    cols = ("params", "grads", "opt", "saved", "layer", "gather", "lgrad", "logits", "peak", "HBM")
    head = f"{'strategy':50s}" + "".join(f"{c:>8s}" for c in cols) + "  fits  issue"
    lines = [head, "-" * len(head)]
    for st in strategies:
        m = hand_memory(st)
        vals = (m.params, m.grads, m.opt_state, m.saved, m.layer_activations, m.gathered_weights,
                m.layer_grads, m.logits, m.peak, m.hbm)
        issue = f"{st.issue_GiB:g} GiB" if st.issue_GiB is not None else ""
        lines.append(f"{st.name:50s}" + "".join(f"{v / GIB:8.2f}" for v in vals)
                     + f"  {'yes' if m.peak <= m.hbm else 'NO ':4s}  {issue}")
    return "\n".join(lines)


def main() -> None:
    print("Per-device memory by hand (GiB): float32 weights, gradients and Adam moments sharded over "
          "tensor x fsdp;\nbf16 activations; 'saved' = activations kept for the backward pass (per-layer "
          "remat: layer inputs);\n'layer' = one layer's activations recomputed for its backward; 'gather' = "
          "two layers' gathered bf16\nweights; 'lgrad' = a layer's float32 gradient before its "
          "reduce-scatter; 'logits' = float32 logits and gradient.\n")
    print(table())
    print()
    for st in STRATEGIES:
        if st.issue_GiB is not None:
            print(f"{st.name}: {st.issue_source}")
    for note in dict.fromkeys(st.note for st in STRATEGIES if st.note):
        print(note)


if __name__ == "__main__":
    main()
