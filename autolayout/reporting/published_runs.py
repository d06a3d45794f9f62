"""Published training runs and the large configurations of the issues, as cited data.

Every figure sits next to its source (:class:`Cited`): the paper section or table, or the
repository file it was read from. Where a publication does not state something (a dtype,
the parallelism, a mesh shape), the field is ``None`` and :attr:`PublishedRun.unsourced`
says so; nothing is guessed. Numbers derived from published ones (a ratio, a product) say
so in their source. Each run names the zoo function and keyword arguments that trace the
model (:class:`ModelConfig`), with the ways the zoo model differs from the published
architecture.

Two kinds of entries (:attr:`PublishedRun.kind`):

* ``"published"`` — a run with a published throughput or utilisation: Mesh-TensorFlow's
  4.9B LM on 512 TPUv2 cores, MaxText 32B/128B on TPU v5p, PaLM 540B on 6144 TPU v4,
  MPT-70B on 64 H100 and MPT-30B on one 8-GPU node (llm-foundry), Megatron-LM GPT-3 175B on 96 and 4608 H100, NeMo
  LLaMA-2-70B on 64 H100 (FP8);
* ``"target"`` — a published model and batch on a machine that the issues ask autolayout
  to fit, with no published throughput there: GPT-3 175B on 4096 TPU v4, LLaMA-2-70B at
  its published 4M-token batch on 64 H100.

This module is data only (the benchmarks read it; it imports nothing from the cost model).

Example::

    from autolayout import models
    from autolayout.reporting.published_runs import RUNS
    r = RUNS["maxtext-32b-v5p-128"]
    r.mfu.value, r.mfu.source      # 0.7147, 'MaxText/configs/v5p/README.md ...'
    graph = getattr(models, r.model.fn)(**r.zoo_kwargs())
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

__all__ = ["Cited", "ModelConfig", "Parallelism", "PublishedRun", "RUNS", "run"]


@dataclass(frozen=True)
class Cited:
    """A value and where it was published: ``Cited(0.462, "PaLM Table 3")``."""

    value: Any
    source: str

    def __repr__(self) -> str:
        return f"{self.value!r} [{self.source}]"


@dataclass(frozen=True)
class ModelConfig:
    """A zoo function (``autolayout.models.<fn>``) and keyword arguments that trace the model."""

    fn: str
    kwargs: tuple[tuple[str, Any], ...]
    source: str
    differences: str = ""  # how the traced zoo model differs from the published architecture

    def as_kwargs(self) -> dict[str, Any]:
        return dict(self.kwargs)

    def __repr__(self) -> str:
        return f"{self.fn}({', '.join(f'{k}={v!r}' for k, v in self.kwargs)})"


@dataclass(frozen=True)
class Parallelism:
    """The parallelism a publication used: tensor (model), fully sharded data (ZeRO-3),
    plain data, pipeline degrees and whether sequence parallelism was on."""

    tensor: int = 1
    fsdp: int = 1
    data: int = 1
    pipeline: int = 1
    sequence: bool | None = None  # None: not stated
    source: str = ""

    @property
    def devices(self) -> int:
        return self.tensor * self.fsdp * self.data * self.pipeline

    def __repr__(self) -> str:
        parts = [f"{k}{v}" for k, v in (("TP", self.tensor), ("FSDP", self.fsdp), ("DP", self.data),
                                         ("PP", self.pipeline)) if v != 1]
        sp = {True: " +SP", False: "", None: ""}[self.sequence]
        return f"{' x '.join(parts) or 'one device'}{sp} [{self.source}]"


@dataclass(frozen=True)
class PublishedRun:
    """One training run (or target configuration) with its sources.

    ``mesh`` is the device mesh in autolayout's syntax (``"dcn:2,x:12,y:16,z:16"``);
    ``slow_axis`` is the mesh axis that crosses the data-centre network or InfiniBand
    (``None`` when the run stays inside one ICI/NVLink domain). ``global_batch`` counts
    sequences per optimizer step; ``microbatches`` the gradient-accumulation steps within
    it (the model's ``batch`` kwarg is one micro-step of the whole machine).
    """

    name: str
    kind: str  # "published" | "target"
    title: str
    model: ModelConfig
    hardware: str  # an autolayout hardware profile (autolayout.get_hardware)
    devices: Cited
    mesh: Cited
    slow_axis: str | None
    global_batch: Cited
    length: Cited
    microbatches: Cited | None
    param_dtype: Cited | None
    compute_dtype: Cited | None
    remat: Cited | None
    parallelism: Parallelism | None
    published_params: Cited | None
    mfu: Cited | None = None
    hfu: Cited | None = None
    tflops_per_device: Cited | None = None
    tokens_per_s: Cited | None = None
    variants: tuple[ModelConfig, ...] = ()  # other zoo renderings of the same model
    unsourced: tuple[str, ...] = ()  # what the publication does not state (left out)
    notes: str = ""

    def __repr__(self) -> str:
        util = f", MFU {self.mfu.value:.1%}" if self.mfu is not None else ""
        return (f"PublishedRun({self.name!r}: {self.model!r} on {self.devices.value} {self.hardware} "
                f"{self.mesh.value}{util})")

    def zoo_kwargs(self, **overrides: Any) -> dict[str, Any]:
        """The model's keyword arguments plus the published dtypes and a per-layer remat
        where the publication states them (``overrides`` win)."""
        kw = self.model.as_kwargs()
        if self.param_dtype is not None:
            kw["param_dtype"] = self.param_dtype.value
        if self.compute_dtype is not None:
            kw["compute_dtype"] = self.compute_dtype.value
        if self.remat is not None and self.remat.value == "full":
            kw["remat"] = True
        return {**kw, **overrides}


def _model(fn: str, source: str, differences: str = "", **kwargs: Any) -> ModelConfig:
    return ModelConfig(fn, tuple(kwargs.items()), source, differences)


# ----------------------------------------------------------------------------- sources
MTF = "Shazeer et al. 2018, 'Mesh-TensorFlow: Deep Learning for Supercomputers' (seeds/000)"
MAXTEXT_V5P = "AI-Hypercomputer/maxtext MaxText/configs/v5p"
MAXTEXT_BASE = ("AI-Hypercomputer/maxtext MaxText/configs/base.yml (base_emb_dim 2048, base_num_query_heads "
                "16, base_num_kv_heads 16, base_mlp_dim 7168, base_num_decoder_layers 16, head_dim 128, "
                "vocab_size 32000, mlp_activations [silu, linear], logits_via_embedding False) scaled by "
                "MaxText/pyconfig.py get_individual_scales")
MAXTEXT_DTYPES = "MaxText/configs/base.yml: weight_dtype float32, dtype bfloat16 (activations)"
MAXTEXT_MINIMAL = ("remat_policy=minimal = jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims "
                   "(MaxText layers/decoders.py get_remat_policy): saves the projection matmul outputs")
V5P_DOCS = "cloud.google.com/tpu/docs/v5p: topology table (cores, chips), 459 bf16 TFLOP/s per chip"
PALM = "Chowdhery et al. 2022, 'PaLM: Scaling Language Modeling with Pathways'"
GPT3 = "Brown et al. 2020, 'Language Models are Few-Shot Learners', Table 2.1"
FOUNDRY = "mosaicml/llm-foundry scripts/train/benchmarking/README.md, table 'H100 80GB BF16', row 70b/64 GPUs"
MPT_YAML = "mosaicml/llm-foundry scripts/train/yamls/pretrain/mpt-70b.yaml"
FOUNDRY_30B = ("mosaicml/llm-foundry scripts/train/benchmarking/README.md, table 'H100 80GB BF16', row 30b, "
               "SeqLen 2048, 8 GPUs")
MPT_30B_YAML = "mosaicml/llm-foundry scripts/train/yamls/pretrain/mpt-30b.yaml"
MEGATRON = ("NVIDIA/Megatron-LM README.md, 'Training Speed and Scalability': strong scaling of the "
            "standard GPT-3 model, vocabulary 131,072, sequence length 4096, batch 1152 sequences")
NEMO = ("NVIDIA/NeMo docs/source/performance/performance_summary.md (NeMo 24.07 container, DGX-H100, "
        "FP8), row LLAMA2-70B")
LLAMA2 = "Touvron et al. 2023, 'Llama 2: Open Foundation and Fine-Tuned Chat Models'"
HF_70B = "Hugging Face meta-llama/Llama-2-70b-hf safetensors metadata (total parameters)"
H100_NODE = "8 GPUs per H100 node (NVIDIA DGX/HGX H100); the publication does not give the node layout"
GPT3_SHAPE = dict(d_model=12288, d_ff=49152, heads=96, d_kv=128, n_layers=96)
LLAMA2_70B = dict(d_model=8192, heads=64, kv_heads=8, d_kv=128, d_ff=28672, n_layers=80, vocab=32000)


def _maxtext(scale: int, tflops: float, mfu: float, slice_: str, chips: int, topology: str, tp: int,
             per_device_batch: int, shape: dict) -> PublishedRun:
    script = f"{MAXTEXT_V5P}/{scale}b.sh"
    return PublishedRun(
        name=f"maxtext-{scale}b-{slice_}", kind="published",
        title=f"MaxText {scale}B on 1x {slice_}",
        model=_model("llama", f"{MAXTEXT_BASE}, global_parameter_scale={scale} ({script})",
                     "MaxText runs attention as a flash kernel (attention='flash'); the zoo materialises "
                     "the scores. The published name is the nominal size; the traced count is the model's.",
                     **shape, kv_heads=shape["heads"], d_kv=128, vocab=32000, batch=per_device_batch * chips,
                     length=2048),
        hardware="tpu-v5p",
        devices=Cited(chips, f"{V5P_DOCS}: {slice_} is {topology}, {chips} chips"),
        mesh=Cited("x:{},y:{},z:{}".format(*topology.split("x")), f"{V5P_DOCS}: {slice_} topology {topology}"),
        slow_axis=None,
        global_batch=Cited(per_device_batch * chips, f"{script}: per_device_batch_size={per_device_batch} x "
                                                     f"{chips} chips"),
        length=Cited(2048, f"{script}: max_target_length=2048"),
        microbatches=None,
        param_dtype=Cited("float32", MAXTEXT_DTYPES), compute_dtype=Cited("bfloat16", MAXTEXT_DTYPES),
        remat=Cited("minimal", f"{script}: {MAXTEXT_MINIMAL}"),
        parallelism=Parallelism(tensor=tp, fsdp=chips // tp, source=f"{script}: ici_tensor_parallelism={tp}, "
                                f"ici_fsdp_parallelism=-1 (the remaining {chips // tp})"),
        published_params=None,
        mfu=Cited(mfu, f"{MAXTEXT_V5P}/README.md, {scale}B model, 1x {slice_}: {tflops:g} TFLOP/sec/chip, "
                       f"{mfu:.2%} MFU"),
        tflops_per_device=Cited(tflops, f"{MAXTEXT_V5P}/README.md ({scale}B, 1x {slice_})"),
        unsourced=("exact parameter count (the README names the model '%dB')" % scale,),
        notes="MFU is MaxText's own model-FLOPs count per chip over the v5p bf16 peak (459 TFLOP/s).")


def _foundry(size: int, gpus: int, table: str, yaml: str, shape: dict, *, micro_batch: int, grad_accum: int,
             global_batch: int, params: int, mfu: float, hfu: float, tokens_per_s: float, shape_note: str,
             differences: str, unsourced: tuple = (), notes: str = "") -> PublishedRun:
    """A row of llm-foundry's H100 BF16 benchmark table (``table`` cites it) for the MPT model of
    ``yaml``: FSDP FULL_SHARD over every GPU, amp_bf16 with PURE mixed precision, activation
    checkpointing per block; the batch is one micro-step of every GPU."""
    one_node = gpus == 8
    return PublishedRun(
        name=f"mpt-{size}b-h100-{gpus}", kind="published",
        title=f"MPT-{size}B (llm-foundry) on {gpus} H100{' (one node)' if one_node else ''}, FSDP",
        model=_model("transformer_lm", f"{yaml}: {shape_note}, expansion_ratio 4, vocab_size 50368, "
                     f"max_seq_len 2048; batch = one micro-step of {gpus} GPUs x {micro_batch}", differences,
                     d_model=shape["d_model"], d_ff=4 * shape["d_model"], heads=shape["heads"], d_kv=128,
                     n_layers=shape["n_layers"], vocab=50368, batch=gpus * micro_batch, length=2048),
        hardware="h100",
        devices=Cited(gpus, table),
        mesh=(Cited("gpu:8", f"{table}: one 8-GPU node (NVLink); " + H100_NODE) if one_node
              else Cited(f"node:{gpus // 8},gpu:8", H100_NODE)),
        slow_axis=None if one_node else "node",
        global_batch=Cited(global_batch, f"{table}: GlobalBatchSize {global_batch}"),
        length=Cited(2048, f"{table}: SeqLen 2048"),
        microbatches=Cited(grad_accum, f"{table}: GradAccum {grad_accum}, MicroBatchSize {micro_batch}"),
        param_dtype=Cited("float32", f"{yaml}: precision amp_bf16, fsdp_config.mixed_precision PURE "
                                     "(float32 master weights, bf16 compute and communication)"),
        compute_dtype=Cited("bfloat16", f"{table}: Precision amp_bf16"),
        remat=Cited("full", f"{table}: Activation Checkpointing True (per block)"),
        parallelism=Parallelism(fsdp=gpus, sequence=False, source=f"{table}: Sharding Strategy FULL_SHARD"),
        published_params=Cited(params, f"{table}: NumParams"),
        mfu=Cited(mfu / 100, f"{table}: MFU {mfu:g}"), hfu=Cited(hfu / 100, f"{table}: HFU {hfu:g}"),
        tokens_per_s=Cited(tokens_per_s, f"{table}: Throughput (T/s) {tokens_per_s:g}"),
        unsourced=unsourced, notes=notes)


_RUNS = (
    PublishedRun(
        name="mtf-4.9b-tpuv2-512", kind="published",
        title="Mesh-TensorFlow 4.9B language model on 512 TPUv2 cores",
        model=_model("transformer_lm", f"{MTF} §9.1 and Table 2 (d_model 1024, d_k = d_v 256, d_ff 262144, "
                     "256 heads, 4.90B parameters); 6 layers and vocabulary 32768 are not stated in the paper: "
                     "they reproduce 4.90B (autolayout/reporting/paper.py PAPER_LM_SIZES)",
                     "Mesh-TF trained with Adafactor; the zoo step uses Adam (memory of the optimizer differs).",
                     d_model=1024, d_ff=262144, heads=256, d_kv=256, n_layers=6, vocab=32768, batch=256,
                     length=256),
        hardware="tpu-v2",
        devices=Cited(512, f"{MTF} §9: '2-dimensional TPUv2 meshes of up to 16 x 32 = 512 cores'"),
        mesh=Cited("rows:16,cols:32", f"{MTF} §9.1: batch split along the mesh dimension of size 16, model "
                                      "dimensions along the one of size 32"),
        slow_axis=None,
        global_batch=Cited(256, f"{MTF} §9.1: 'Batch size for all models was 256 sequences of 256 tokens'"),
        length=Cited(256, f"{MTF} §9.1"),
        microbatches=None, param_dtype=None, compute_dtype=None, remat=None,
        parallelism=Parallelism(tensor=32, data=16, sequence=False,
                                source=f"{MTF} §9: layout batch:rows; vocab, d_ff, heads: cols"),
        published_params=Cited(4.90e9, f"{MTF} Table 2, last row"),
        mfu=Cited(6.0 / 11.5, f"{MTF} §9: 'computational efficiency of over 50% (6 PFLOP/s out of a maximum "
                              "11.5 PFLOP/s)'; the value is 6/11.5"),
        unsourced=("dtypes", "rematerialisation", "number of layers and vocabulary (reconstructed)")),
    _maxtext(32, 328, 0.7147, "v5p-128", 64, "4x4x4", 4, 7,
             dict(d_model=8192, heads=64, d_ff=28672, n_layers=32)),
    _maxtext(128, 315, 0.6868, "v5p-256", 128, "4x4x8", 8, 1,
             dict(d_model=8192, heads=128, d_ff=57344, n_layers=64)),
    PublishedRun(
        name="palm-540b-v4-6144", kind="published",
        title="PaLM 540B on 6144 TPU v4 chips (two pods)",
        model=_model("transformer_lm", f"{PALM} Table 1 (118 layers, d_model 18432, 48 heads of 256, "
                     "d_ff 4 x d_model = 73728, vocabulary 256k); the SwiGLU FFN is rendered as a ReLU FFN "
                     "of 1.5 x 73728 = 110592 (same weights and flops), as issue 11 states it",
                     "PaLM has multi-query attention (one key/value head), RoPE, a shared input/output "
                     "embedding and no biases; this rendering has full multi-head attention and learned "
                     "positions (about 598B parameters). Its layers are parallel as PaLM's (§2 'Parallel "
                     "Layers': one layer norm, attention and FFN read the same input). The llama variant "
                     "below has PaLM's attention and FFN exactly.",
                     d_model=18432, d_ff=110592, heads=48, d_kv=256, n_layers=118, vocab=256000, batch=2048,
                     length=2048, parallel_layers=True),
        variants=(_model("llama", f"{PALM} Table 1 and §2 (SwiGLU, multi-query attention, RoPE, no biases)",
                         "Untied output head: 545.1B parameters, the published 540.35B plus the 4.72B head "
                         "PaLM shares with the embedding; sequential rather than parallel layers.",
                         d_model=18432, heads=48, kv_heads=1, d_kv=256, d_ff=73728, n_layers=118,
                         vocab=256000, batch=2048, length=2048),),
        hardware="tpu-v4",
        devices=Cited(6144, f"{PALM} §4: two TPU v4 Pods of 3072 chips"),
        mesh=Cited("dcn:2,x:12,y:16,z:16", "issue 11's mesh: 2 pods over the data-centre network "
                   f"({PALM} §4) of 3072 chips each; the 12x16x16 slice shape is not published"),
        slow_axis="dcn",
        global_batch=Cited(2048, f"{PALM} Table 1: batch 512 -> 1024 -> 2048 sequences over training"),
        length=Cited(2048, f"{PALM} §5: sequence length 2048"),
        microbatches=None, param_dtype=None, compute_dtype=None,
        remat=Cited("unspecified", f"{PALM} §4.1: HFU 57.8% counts rematerialisation; the policy is not given"),
        parallelism=Parallelism(tensor=12, fsdp=256, data=2, sequence=None,
                                source=f"{PALM} §4: 12-way model and 256-way fully sharded data parallelism "
                                       "within each pod, data parallelism across the two pods"),
        published_params=Cited(540.35e9, f"{PALM} Table 1"),
        mfu=Cited(0.462, f"{PALM} §4.1, Table 3 (model FLOPs utilisation)"),
        hfu=Cited(0.578, f"{PALM} §4.1 (hardware FLOPs utilisation, with rematerialisation)"),
        tokens_per_s=Cited(238.3e3, f"{PALM} §4.1, Table 3: 238.3K tokens/s"),
        unsourced=("dtypes", "remat policy", "per-pod slice shape", "whether the batch of the MFU figure "
                   "was 2048 (the last stage of the batch schedule)"),
        notes="The throughput is for the training run; the batch grew from 512 to 2048 sequences."),
    _foundry(70, 64, FOUNDRY, MPT_YAML, dict(d_model=8192, heads=64, n_layers=80), micro_batch=8, grad_accum=4,
             global_batch=2048, params=64_862_437_376, mfu=42.57, hfu=56.76, tokens_per_s=66523,
             shape_note="d_model 8192, n_heads 64, n_layers 80",
             differences="The published count (64,862,437,376) is that of learned positions, biases in every "
                         "dense layer and layer norm, and an output layer tied to the embedding; the zoo model "
                         "has no dense-layer biases (-9 x 8192 per layer) and an untied output layer "
                         "(+50368 x 8192): 65,269,153,792.",
             unsourced=("the inter-node network of the benchmark cluster",)),
    _foundry(30, 8, FOUNDRY_30B, MPT_30B_YAML, dict(d_model=7168, heads=56, n_layers=48), micro_batch=3,
             grad_accum=21, global_batch=504, params=29_975_214_080, mfu=38.11, hfu=50.82, tokens_per_s=16022,
             shape_note="d_model 7168, n_heads 56, n_layers 48",
             differences="As for MPT-70B: the zoo model has no dense-layer biases and an untied output layer.",
             notes="The same framework, precision, sharding and remat as the MPT-70B run, on one node: its "
                   "collectives stay on NVLink. benchmarks/published.py measures the framework's H100 "
                   "efficiency on it (calibrate_efficiency) and predicts the 64-GPU MPT-70B run with that."),
    *(PublishedRun(
        name=f"megatron-gpt3-175b-h100-{n}", kind="published",
        title=f"Megatron-LM GPT-3 175B on {n} H100 (strong scaling)",
        model=_model("transformer_lm", f"{GPT3} (96 layers, d_model 12288, 96 heads of 128) with {MEGATRON}",
                     "Megatron's GPT has learned positions and biases like the zoo model; its attention "
                     "is fused (flash) rather than materialised.",
                     **GPT3_SHAPE, vocab=131072, batch=1152, length=4096),
        hardware="h100",
        devices=Cited(n, MEGATRON), mesh=Cited(f"node:{n // 8},gpu:8", H100_NODE), slow_axis="node",
        global_batch=Cited(1152, MEGATRON), length=Cited(4096, MEGATRON),
        microbatches=None, param_dtype=None, compute_dtype=None, remat=None, parallelism=None,
        published_params=None,
        mfu=Cited(mfu, f"{MEGATRON}: 'a reduction in MFU from 47% to 42%' from 96 to 4608 GPUs"),
        unsourced=("parallelism (only in the README's model_table.png image)", "dtypes", "remat",
                   "micro-batch size", "exact parameter count ('slightly more than 175 billion')"),
        notes="Data-parallel, tensor-parallel and pipeline communication overlapped with compute "
              "(--overlap-grad-reduce, --overlap-param-gather, --tp-comm-overlap).")
      for n, mfu in ((96, 0.47), (4608, 0.42))),
    PublishedRun(
        name="nemo-llama2-70b-h100-64-fp8", kind="published",
        title="NeMo LLaMA-2-70B on 64 H100, FP8, TP4 x PP4",
        model=_model("llama", f"{LLAMA2} Table 1 / models.LLAMA_PRESETS['llama2-70b']; batch = GBS 128",
                     "NeMo runs its matmuls in FP8 (Transformer Engine) with pipeline parallelism; autolayout "
                     "has no pipeline stages yet.", **LLAMA2_70B, batch=128, length=4096),
        hardware="h100",
        devices=Cited(64, NEMO), mesh=Cited("node:8,gpu:8", H100_NODE), slow_axis="node",
        global_batch=Cited(128, f"{NEMO}: GBS 128, MBS 1"), length=Cited(4096, f"{NEMO}: sequence length 4096"),
        microbatches=None,
        param_dtype=None, compute_dtype=None, remat=None,
        parallelism=Parallelism(tensor=4, pipeline=4, data=4, source=f"{NEMO}: TP 4, PP 4, CP 1, VP 20; DP derived"),
        published_params=Cited(68_976_648_192, HF_70B),
        tflops_per_device=Cited(759, f"{NEMO}: Model TFLOP / sec / GPU 759"),
        tokens_per_s=Cited(1707 * 64, f"{NEMO}: 1707 tokens/sec/GPU x 64 GPUs (product derived)"),
        unsourced=("MFU (derive from 759 TFLOP/s and the H100 FP8 dense peak)", "remat", "master-weight dtype",
                   "the dtype outside the FP8 matmuls"),
        notes=f"Matmuls in FP8 ({NEMO}: 'pre-training performance ... at FP8 precision', Transformer Engine); "
              "the zoo has no FP8-matmul mode, so compute_dtype is left unset. The pipeline runs GBS 128 / "
              "(MBS 1 x DP 4) = 32 micro-batches per step (derived), interleaved over VP 20 virtual stages."),
    PublishedRun(
        name="gpt3-175b-v4-4096", kind="target",
        title="GPT-3 175B on a full TPU v4 pod (issue 10's configuration; no published run)",
        model=_model("transformer_lm", f"{GPT3}: 96 layers, d_model 12288, 96 heads, d_head 128, context 2048, "
                     "batch 3.2M tokens = 1536 x 2048; vocabulary 50257 padded to 50304 (MaxText "
                     "configs/models/gpt3-175b.yml vocab_size 50304)", "", **GPT3_SHAPE, vocab=50304,
                     batch=1536, length=2048),
        hardware="tpu-v4",
        devices=Cited(4096, "cloud.google.com/tpu/docs/v4: a full pod, topology 16x16x16"),
        mesh=Cited("x:16,y:16,z:16", "issue 10"), slow_axis=None,
        global_batch=Cited(1536, GPT3), length=Cited(2048, GPT3), microbatches=None,
        param_dtype=Cited("float32", "issue 10 (float32 master weights and Adam)"),
        compute_dtype=Cited("bfloat16", "issue 10"), remat=Cited("full", "issue 10 (per-layer remat)"),
        parallelism=Parallelism(tensor=8, fsdp=512, sequence=False,
                                source="issue 10's hand strategy (TP8 x FSDP512); not a publication"),
        published_params=Cited(175.0e9, f"{GPT3} (n_params 175.0B)"),
        unsourced=("any published throughput of GPT-3 on TPU v4",)),
    PublishedRun(
        name="llama2-70b-h100-64-4m", kind="target",
        title="LLaMA-2-70B at its 4M-token batch on 64 H100 (issue 10; no published run)",
        model=_model("llama", f"{LLAMA2} Table 1 (70B, GQA, context 4096) and §2.2 (global batch 4M tokens)",
                     "", **LLAMA2_70B, batch=1024, length=4096),
        hardware="h100",
        devices=Cited(64, "issue 10"), mesh=Cited("node:8,gpu:8", f"issue 10; {H100_NODE}"), slow_axis="node",
        global_batch=Cited(1024, f"{LLAMA2} §2.2: 'global batch-size of 4M tokens' = 1024 x 4096"),
        length=Cited(4096, f"{LLAMA2} Table 1: context length 4k"), microbatches=None,
        param_dtype=None, compute_dtype=None, remat=None, parallelism=None,
        published_params=Cited(68_976_648_192, HF_70B),
        unsourced=("any published throughput on 64 H100 at this batch",),
        notes="By hand (benchmarks/hand_memory.py) the layer inputs alone of 1024 x 4096 tokens take "
              "80 GiB per GPU on 64 GPUs whatever the split: one step needs gradient accumulation."),
)

RUNS: Mapping[str, PublishedRun] = MappingProxyType({r.name: r for r in _RUNS})


def run(name: str) -> PublishedRun:
    """The run called ``name``.

    Raises:
        KeyError: no such run; the message lists the names.
    """
    if name not in RUNS:
        raise KeyError(f"no published run {name!r}; known: {', '.join(RUNS)}")
    return RUNS[name]
