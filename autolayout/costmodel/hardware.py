"""Hardware profiles: peak compute, memory and interconnect of one device.

A *device* is what ``jax.devices()`` returns: one chip for TPU v4 and later
(the two TensorCores of a v4/v5p chip form one "megacore" device; v5e/v6e
have one core per chip), one TensorCore for TPU v2/v3 (their two cores have
separate HBM and are separate JAX devices), one GPU for NVIDIA parts.

Interconnect is described per mesh axis by a :class:`Link` in alpha-beta
terms: a collective step costs ``latency`` and moving ``V`` bytes costs
``V / bandwidth``. ``Link.bandwidth`` is the *effective per-device bandwidth
a ring collective along that axis achieves*, i.e. the ``B`` in
``(n-1)/n * V / B`` (the NCCL "bus bandwidth"):

* TPU ICI (torus axis with wraparound): a chip has one link to each of its
  two neighbours along the axis. A bidirectional ring (two counter-rotating
  rings, each carrying half the data) keeps both links busy, so the device
  egress is ``2 x`` the one-way per-link bandwidth. This equals the
  "bidirectional" per-link figure of the scaling-book, which uses
  ``T = V / W_ici(bidi)`` for an all-gather (jax-ml/scaling-book,
  sharding.md). An axis *without* wraparound (e.g. a v5e axis shorter than
  16, a v4/v5p axis not a multiple of 4) only gets a one-way ring: halve it
  with :meth:`Hardware.with_axis_link` (scaling-book tpus.md: missing
  wraparound "typically doubles the time of most throughput-bound comms").
* NVLink through NVSwitch: each GPU can egress its one-way NVLink bandwidth
  (450 GB/s on H100) to any peer; a ring uses exactly that, so ``B`` is the
  one-way figure and ``topology="switch"`` (only all-to-all differs).
* Inter-node InfiniBand / TPU DCN: per-device share of the host NICs; see
  :data:`~autolayout.costmodel.profiles.SLOW_LINKS` and override the slow mesh axis::

      hw = get_hardware("h100").with_axis_link("nodes", SLOW_LINKS["h100"])

This module holds the value types (:class:`Link`, :class:`Hardware`) and their JSON
files; the built-in profiles, their sources and :func:`~autolayout.costmodel.profiles.get_hardware`
are in :mod:`autolayout.costmodel.profiles`, where every number cites its public source.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

GiB = 2**30
GB = 10**9
TERA = 1e12

RING = "ring"
SWITCH = "switch"
# Devices that are threads of one process (XLA:CPU's virtual devices): every collective
# is one in-process rendezvous of its group (autolayout.costmodel.collectives).
IN_PROCESS = "in-process"
_TOPOLOGIES = (RING, SWITCH, IN_PROCESS)


@dataclass(frozen=True)
class Link:
    """Alpha-beta description of the interconnect along one mesh axis.

    Attributes:
        bandwidth: effective per-device bytes/s a ring collective along this
            axis achieves (the ``B`` of ``(n-1)/n * V / B``); see the module
            docstring for how it is derived from per-link figures.
        latency: seconds per collective step (per hop on a torus), alpha.
        topology: ``"ring"`` (torus axis: data hops neighbour to neighbour),
            ``"switch"`` (any device reaches any other in one hop, e.g.
            NVSwitch; only all-to-all cost differs from a ring) or
            ``"in-process"`` (devices are threads of one process, XLA:CPU:
            every collective is one rendezvous whose latency does not depend
            on its kind; :mod:`~autolayout.costmodel.collectives`).
        description: free text, e.g. where the numbers come from.

    >>> Link(bandwidth=1e11, latency=1e-6).bandwidth
    100000000000.0
    """

    bandwidth: float
    latency: float
    topology: str = RING
    description: str = ""

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise ValueError(f"Link bandwidth must be > 0 bytes/s, got {self.bandwidth!r}")
        if not self.latency >= 0:
            raise ValueError(f"Link latency must be >= 0 s, got {self.latency!r}")
        if self.topology not in _TOPOLOGIES:
            raise ValueError(f"Link topology must be one of {_TOPOLOGIES}, got {self.topology!r}")
        object.__setattr__(self, "bandwidth", float(self.bandwidth))
        object.__setattr__(self, "latency", float(self.latency))

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Link:
        """Inverse of :meth:`to_dict`."""
        return cls(**dict(d))


class HardwareFileError(ValueError):
    """A hardware profile file that is not JSON or not a valid profile."""


def _link_from(d: Any, where: str) -> Link:
    """A :class:`Link` from its JSON form, with errors that name the field."""
    if isinstance(d, Link):
        return d
    if not isinstance(d, Mapping):
        raise ValueError(f"{where} must be an object with bandwidth, latency and topology, got {d!r}")
    names = {f.name for f in dataclasses.fields(Link)}
    required = {f.name for f in dataclasses.fields(Link) if f.default is dataclasses.MISSING}
    if set(d) - names or required - set(d):
        raise ValueError(f"{where} needs {sorted(required)} (optional: {sorted(names - required)}), got {sorted(d)}")
    try:
        return Link.from_dict(d)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from exc


# dtype spellings people use -> the key used in ``Hardware.peak_flops``.
_DTYPE_ALIASES = {
    "bf16": "bfloat16", "f16": "float16", "fp16": "float16", "half": "float16",
    "f32": "float32", "fp32": "float32", "float": "float32", "single": "float32",
    "f64": "float64", "fp64": "float64", "double": "float64",
    "tf32": "tensorfloat32", "s8": "int8", "i8": "int8", "fp8": "float8",
}
_HALF_FLOATS = ("bfloat16", "float16")


def normalize_dtype(dtype: Any) -> str:
    """Canonical dtype name: ``'bf16'``, ``jnp.bfloat16``, ``np.dtype('bfloat16')`` -> ``'bfloat16'``.

    All float8 variants (``float8_e4m3fn``, ``float8_e5m2``, ...) map to
    ``'float8'`` since vendors quote one figure for them.

    >>> normalize_dtype("BF16")
    'bfloat16'
    """
    if isinstance(dtype, str):
        name = dtype
    else:
        # numpy dtypes and jax scalar types both expose a usable name.
        name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    name = name.strip().lower()
    name = _DTYPE_ALIASES.get(name, name)
    if name.startswith("float8"):
        return "float8"
    return name


PathLike = Union[str, os.PathLike]


@dataclass(frozen=True)
class Hardware:
    """Per-device capabilities used by the cost model.

    Attributes:
        name: profile name, e.g. ``"tpu-v5p"``.
        peak_flops: ``(dtype name, FLOP/s)`` pairs; must include ``"float32"``
            (the fallback for unknown dtypes). A mapping is accepted and
            converted.
        hbm_bytes: device memory capacity in bytes.
        hbm_bandwidth: device memory bandwidth in bytes/s.
        link: default :class:`Link` for every mesh axis.
        axis_links: ``(axis name, Link)`` overrides, e.g. a DCN axis. A
            mapping is accepted and converted.
        efficiency: fraction of peak a well-shaped matmul reaches.
        async_collectives: whether collectives run asynchronously beside compute (XLA's
            latency-hiding scheduler on TPU and GPU), so that overlappable ones hide
            behind it (:mod:`~autolayout.costmodel.overlap`); ``False`` prices every
            collective in line (XLA:CPU, or the synchronous schedule of Mesh-TF's Table 1).
        all_reduce_in_place: whether XLA writes an all-reduce's result over its operand, so
            that partial sums take no second buffer while they are reduced
            (:attr:`~autolayout.costmodel.reductions.ReductionBytes.transient`); see
            :data:`~autolayout.costmodel.profiles.SRC_ALL_REDUCE_IN_PLACE`.
        description: what one device is and how numbers were chosen.
        sources: citations for the numbers.
        op_overhead_s: launch/dispatch seconds added to every executed op (every op of the
            graph but its inputs, parameters, optimizer state and constants), priced with
            the op's compute (:func:`~autolayout.costmodel.rules.price`). 0 for the
            datasheet profiles: an accelerator's kernels are queued ahead of the one
            running (XLA:GPU launches a step's kernels as CUDA graphs,
            ``--xla_gpu_enable_command_buffer``, openxla/xla ``xla/debug_options_flags.cc``;
            XLA:TPU runs the step as one program on the chip). Not quite 0 on a GPU: one H200
            with jax 0.11.2 refit at 2.35 us per executed op (``reports/gpu``: launch-bound
            steps ran 4x their roofline), under 1% of a step at the published runs' sizes;
            :func:`~autolayout.exec.calibrate.fit_step_profile` on one GPU's steps fits it.
            XLA:CPU's thunk executor dispatches every kernel from the device's
            thread, which time-slices with the other virtual devices' on shared cores:
            :func:`~autolayout.exec.calibrate.fit_step_profile` fits it to measured steps.
        dot_operand_copies: whether a contraction also pays for copying the operands its dot
            kernel cannot read in place (:mod:`~autolayout.costmodel.dotcopy`: XLA:CPU's
            ``[batch, M, K]`` canonicalisation; in memory, a copy is live beside an original
            that outlives its dot, from the operand's producer on, or from the step's start
            for an argument's, :func:`~autolayout.costmodel.copies.copy_spans`, or at the dot
            for a fused value's, :func:`~autolayout.costmodel.copies.copy_transient_bytes`);
            ``calibrate`` sets it on CPU devices, and the built-in ``cpu`` profile has it.
        fused_attention: whether attention runs as a fused kernel that keeps the score
            tensors on chip and recomputes them in the backward pass (FlashAttention, Dao et
            al. 2022), priced by :mod:`~autolayout.costmodel.attention`; see
            :data:`~autolayout.costmodel.profiles.SRC_FUSED_ATTENTION` for which profiles set it.
        combines_gradient_reductions: whether the step reduces its parameter gradients
            together, after the last is computed, so that their unreduced partial sums are
            live at once (:attr:`~autolayout.costmodel.reductions.ReductionBytes.held`): XLA:CPU combines
            all-reduces with no byte threshold; see :data:`~autolayout.costmodel.profiles.SRC_CPU_GRADIENT_REDUCTIONS`.
            Other all-reduces that do not depend on one another are combined too
            (:func:`~autolayout.costmodel.combine.combined_all_reduces`).
        reduce_scatter_copies: whether a reduce-scatter of a dim that is not its operand's
            most major first copies the operand into that layout
            (:attr:`~autolayout.costmodel.reductions.ReductionBytes.transient`); see
            :data:`~autolayout.costmodel.profiles.SRC_CPU_GRADIENT_REDUCTIONS`.
        upcasts_half_dots: whether a contraction of half-precision (bfloat16, float16)
            operands runs in float32, so that its operands and result are held in float32
            buffers (:func:`~autolayout.costmodel.memory.stored_itemsize`); see
            :data:`~autolayout.costmodel.profiles.SRC_CPU_HALF_DOTS`.
        upcasts_half_collectives: whether a collective of a half-precision value runs in
            float32, between a convert to float32 and one back, so that an all-gather's buffer
            is float32 (:func:`~autolayout.costmodel.reductions.half_gathers`); see
            :data:`~autolayout.costmodel.profiles.SRC_CPU_HALF_COLLECTIVES`.
        breadth_first_schedule: whether the compiler schedules each computation breadth
            first, so that the collectives of the step's arguments run at its start and their
            copies are held from there (:func:`~autolayout.costmodel.sharing.spans`), and the
            memory model walks that order (:func:`~autolayout.costmodel.order.memory_order`);
            a scan body's weight gathers start at the body's start on every backend; see
            :data:`~autolayout.costmodel.profiles.SRC_CPU_SCHEDULE`.
        copies_donated_parameters: whether the compiler copies a donated parameter that a reader
            not ordered before its update still reads, so that the copy is live from the step's
            start to its last reader (:mod:`~autolayout.costmodel.donations`); see
            :data:`~autolayout.costmodel.profiles.SRC_CPU_DONATED_COPIES`.
        min_memory_schedule: whether the compiler orders each computation with XLA's
            ``DefaultMemoryScheduler`` (the least peak of list, DFS and post-order schedules), the
            order the memory model then walks (:func:`~autolayout.costmodel.order.min_memory`);
            see :data:`~autolayout.costmodel.profiles.SRC_GPU_SCHEDULE`. Without it or
            ``breadth_first_schedule``, the model walks the traced order.
        ynn_reductions: whether a reduction with at least 4096 elements on a device runs as a
            YNNPACK fusion that reads a broadcast of a value from memory
            (:mod:`~autolayout.costmodel.broadcasts`; XLA:CPU); see
            :data:`~autolayout.costmodel.profiles.SRC_CPU_YNN`.

    >>> from autolayout.costmodel.profiles import SLOW_LINKS, get_hardware
    >>> hw = get_hardware("tpu-v5p")
    >>> hw.peak("bfloat16")
    459000000000000.0
    >>> hw.with_axis_link("dcn", SLOW_LINKS["tpu-v5p"]).link_for("dcn").bandwidth
    6250000000.0
    """

    name: str
    peak_flops: tuple[tuple[str, float], ...]
    hbm_bytes: float
    hbm_bandwidth: float
    link: Link
    axis_links: tuple[tuple[str, Link], ...] = ()
    efficiency: float = 1.0
    async_collectives: bool = True
    all_reduce_in_place: bool = False  # SRC_ALL_REDUCE_IN_PLACE: XLA's generic rule; GPU profiles set True
    description: str = ""
    sources: tuple[str, ...] = field(default=())
    op_overhead_s: float = 0.0
    dot_operand_copies: bool = False
    fused_attention: bool = False  # SRC_FUSED_ATTENTION
    # SRC_CPU_GRADIENT_REDUCTIONS: XLA:CPU; accelerators combine all-reduces only up to a
    # byte threshold (XLA:GPU 30 MiB by default) and run them in place (GPU), so False there
    combines_gradient_reductions: bool = False
    reduce_scatter_copies: bool = False  # SRC_CPU_GRADIENT_REDUCTIONS: measured on XLA:CPU
    upcasts_half_dots: bool = False  # SRC_CPU_HALF_DOTS: XLA:CPU; accelerators run half dots natively
    breadth_first_schedule: bool = False  # SRC_CPU_SCHEDULE: XLA:CPU; accelerators hide latency instead
    upcasts_half_collectives: bool = False  # SRC_CPU_HALF_COLLECTIVES: XLA:CPU; accelerators move bf16 natively
    ynn_reductions: bool = False  # SRC_CPU_YNN: XLA:CPU; accelerators fuse a broadcast into its readers
    copies_donated_parameters: bool = False  # SRC_CPU_DONATED_COPIES: XLA:CPU; XLA:GPU does not follow the rule
    min_memory_schedule: bool = False  # SRC_GPU_SCHEDULE: XLA:GPU; TPU's scheduler is not published

    def __post_init__(self) -> None:
        peak = self.peak_flops
        items = peak.items() if isinstance(peak, Mapping) else peak
        peak_t = tuple((normalize_dtype(k), float(v)) for k, v in items)
        object.__setattr__(self, "peak_flops", peak_t)
        links = self.axis_links
        links_items = links.items() if isinstance(links, Mapping) else links
        object.__setattr__(self, "axis_links", tuple((str(a), l) for a, l in links_items))
        object.__setattr__(self, "sources", tuple(self.sources))
        keys = [k for k, _ in peak_t]
        if "float32" not in keys:
            raise ValueError(f"Hardware {self.name!r}: peak_flops needs a 'float32' entry (the fallback); got {keys}")
        if len(set(keys)) != len(keys):
            raise ValueError(f"Hardware {self.name!r}: duplicate dtype in peak_flops {keys}")
        for k, v in peak_t:
            if not v > 0:
                raise ValueError(f"Hardware {self.name!r}: peak_flops[{k!r}] must be > 0, got {v}")
        if self.breadth_first_schedule and self.min_memory_schedule:
            raise ValueError(f"Hardware {self.name!r}: breadth_first_schedule (XLA:CPU's scheduler) and "
                             "min_memory_schedule (XLA:GPU's) are two schedulers; set at most one")
        if not self.hbm_bytes > 0 or not self.hbm_bandwidth > 0:
            raise ValueError(f"Hardware {self.name!r}: hbm_bytes and hbm_bandwidth must be > 0")
        if not 0 <= self.op_overhead_s < float("inf"):
            raise ValueError(f"Hardware {self.name!r}: op_overhead_s must be a finite number >= 0 seconds, "
                             f"got {self.op_overhead_s!r}")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"Hardware {self.name!r}: efficiency must be in (0, 1], got {self.efficiency}")
        if not isinstance(self.link, Link):
            raise TypeError(f"Hardware {self.name!r}: link must be a Link, got {type(self.link).__name__}")
        axes = [a for a, _ in self.axis_links]
        if len(set(axes)) != len(axes):
            raise ValueError(f"Hardware {self.name!r}: duplicate axis in axis_links {axes}")
        for a, l in self.axis_links:
            if not isinstance(l, Link):
                raise TypeError(f"Hardware {self.name!r}: axis_links[{a!r}] must be a Link")

    # -- queries ---------------------------------------------------------
    def peak(self, dtype: Any) -> float:
        """Peak FLOP/s for ``dtype`` (a name or numpy/jax dtype).

        Fallbacks, in order: the exact entry; for a 16-bit float, the other
        16-bit float (both run on the same MXU/tensor-core path on these
        parts); otherwise the ``float32`` entry. What ``float32`` means is
        per profile: on TPU it is the bf16 peak, because JAX's default
        matmul precision computes float32 dots in one bfloat16 pass; on
        GPU it is the TF32 tensor-core peak, JAX's default there. Profiles
        also carry ``float32_highest`` for ``precision=HIGHEST``.

        >>> get_hardware("h100").peak("float32") == get_hardware("h100").peak("tf32")
        True
        """
        table = dict(self.peak_flops)
        name = normalize_dtype(dtype)
        if name in table:
            return table[name]
        if name in _HALF_FLOATS:
            other = _HALF_FLOATS[1 - _HALF_FLOATS.index(name)]
            if other in table:
                return table[other]
        return table["float32"]

    def link_for(self, axis_name: str) -> Link:
        """The link used by collectives along mesh axis ``axis_name``."""
        for axis, link in self.axis_links:
            if axis == axis_name:
                return link
        return self.link

    # -- derived profiles -----------------------------------------------
    def with_axis_link(self, axis: str, link: Link) -> Hardware:
        """Copy with mesh axis ``axis`` using ``link`` (replacing any earlier override)."""
        rest = tuple((a, l) for a, l in self.axis_links if a != axis)
        return dataclasses.replace(self, axis_links=rest + ((axis, link),))

    def replace(self, **kw: Any) -> Hardware:
        """Copy with fields replaced, e.g. ``hw.replace(efficiency=0.6)``."""
        return dataclasses.replace(self, **kw)

    # -- serialisation ----------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (dicts for the pair tuples, to read well in a file)."""
        return {
            "name": self.name,
            "peak_flops": dict(self.peak_flops),
            "hbm_bytes": self.hbm_bytes,
            "hbm_bandwidth": self.hbm_bandwidth,
            "link": self.link.to_dict(),
            "axis_links": {a: l.to_dict() for a, l in self.axis_links},
            "efficiency": self.efficiency,
            "async_collectives": self.async_collectives,
            "all_reduce_in_place": self.all_reduce_in_place,
            "description": self.description,
            "sources": list(self.sources),
            "op_overhead_s": self.op_overhead_s,
            "dot_operand_copies": self.dot_operand_copies,
            "fused_attention": self.fused_attention,
            "combines_gradient_reductions": self.combines_gradient_reductions,
            "reduce_scatter_copies": self.reduce_scatter_copies,
            "upcasts_half_dots": self.upcasts_half_dots,
            "breadth_first_schedule": self.breadth_first_schedule,
            "upcasts_half_collectives": self.upcasts_half_collectives,
            "ynn_reductions": self.ynn_reductions,
            "copies_donated_parameters": self.copies_donated_parameters,
            "min_memory_schedule": self.min_memory_schedule,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Hardware:
        """Inverse of :meth:`to_dict`; missing optional fields take defaults.

        Raises:
            ValueError: a required field (``name``, ``peak_flops``, ``hbm_bytes``,
                ``hbm_bandwidth``, ``link``) is missing, a field is unknown or malformed.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"a hardware profile is a JSON object, got {type(d).__name__}")
        d = dict(d)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = set(d) - set(fields)
        if unknown:
            raise ValueError(f"Unknown Hardware field(s): {sorted(unknown)}; known: {sorted(fields)}")
        missing = [n for n, f in fields.items() if n not in d and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise ValueError(f"missing required field(s) {missing}; a profile written by Hardware.save or "
                             "'autolayout calibrate --out FILE' has them all (see 'autolayout hardware tpu-v4 --json')")
        d["link"] = _link_from(d["link"], "link")
        d["axis_links"] = tuple((a, _link_from(l, f"axis_links[{a!r}]"))
                                for a, l in dict(d.get("axis_links", {})).items())
        d["sources"] = tuple(d.get("sources", ()))
        try:
            return cls(**d)
        except TypeError as exc:
            raise ValueError(f"malformed profile: {exc}") from exc

    def save(self, path: PathLike) -> None:
        """Write the profile as JSON to ``path``."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: PathLike) -> Hardware:
        """Read a profile written by :meth:`save`.

        Raises:
            HardwareFileError: (a ``ValueError``) the file is not JSON or not a valid
                profile; the message names the file and what is wrong.
            OSError: the file cannot be read.
        """
        text = Path(path).read_text()
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise HardwareFileError(f"hardware profile {str(path)!r} is not valid JSON: {exc.msg} at line "
                                    f"{exc.lineno} column {exc.colno}") from exc
        except ValueError as exc:
            raise HardwareFileError(f"hardware profile {str(path)!r}: {exc}") from exc
