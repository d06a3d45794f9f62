"""``execute(graph, mesh, layout)``: run a layout for real and hold it against the prediction."""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from autolayout.core import Layout, Mesh
from autolayout.costmodel.devices import hardware_for_device
from autolayout.costmodel.profiles import get_hardware
from autolayout.costmodel.plan import plan as make_plan
from autolayout.costmodel.predict import Cost, price_plan
from autolayout.exec import hlo
from autolayout.graph import Graph, require_graph

__all__ = ["execute", "Execution", "NotEnoughDevicesError", "ArgumentError", "OutputMismatchError", "BACKENDS", "jax_mesh",
           "executed_hardware"]

BACKENDS = ("shard_map", "gspmd")
# Issue 12 item 3: the predicted peak memory should be within 10% of XLA's memory_analysis of
# the executed program (benchmarks/memory_vs_xla.py reports how many layouts are).
MEMORY_TOLERANCE = 0.10


class NotEnoughDevicesError(ValueError):
    """The mesh needs more devices than JAX has."""


class ArgumentError(ValueError):
    """``args`` do not have the traced function's argument structure or shapes."""


class OutputMismatchError(ValueError):
    """The sharded run produced NaN or infinity where the unsharded reference did not (or the
    other way round): no error figure could describe that."""


@dataclass
class Execution:
    """One executed layout: results, reference, timing, program and the prediction next to it.

    ``compiled_collectives`` are parsed from the pre-optimisation HLO
    (``hlo_text``) for the shard_map backend — the program as written, which is
    what the cost model describes — and from the optimised HLO for the gspmd
    backend (whose collectives only exist after XLA's SPMD partitioner);
    ``optimized_collectives`` always come from ``compiled_hlo_text``.
    ``collectives_match`` compares ``predicted.collectives`` (one entry per op
    collective, ``count`` not expanded) with ``compiled_collectives`` as
    multisets of ``(kind, bytes, group size, mesh axes)``: see :mod:`autolayout.exec.hlo`.
    A mismatch is kept, with :meth:`collective_diff` saying what differs.

    Timing: ``step_time_s`` is the median of ``step_times_s`` (``repeats`` runs
    after a warm-up, inputs already on the devices; donated inputs get fresh
    copies before each run, untimed); :meth:`time_steps` times more runs.
    ``xla_flops`` / ``xla_memory`` are ``compiled.cost_analysis()`` /
    ``memory_analysis()`` per device (XLA counts a while-loop body once, so
    scans show fewer flops than ``predicted.flops``); ``comparison`` lays all
    of it out next to the prediction.
    """

    graph_name: str
    mesh: Mesh
    layout: Layout
    backend: str
    outputs: Any
    reference: Any
    max_abs_error: float
    max_rel_error: float
    step_time_s: float
    step_time_spread_s: float  # max - min over the timed repeats
    step_times_s: tuple[float, ...]
    hlo_text: str
    compiled_hlo_text: str
    compiled_collectives: tuple[hlo.HloCollective, ...]
    optimized_collectives: tuple[hlo.HloCollective, ...]
    predicted: Cost
    collectives_match: bool
    xla_flops: float
    xla_bytes_accessed: float
    xla_memory: dict
    compile_s: float = 0.0
    notes: tuple[str, ...] = ()
    comparison: Any = field(default=None, repr=False)
    _step: Any = field(default=None, repr=False, compare=False)  # the compiled step and inputs

    def time_steps(self, repeats: int = 5) -> tuple[float, ...]:
        """Time ``repeats`` more steps of the compiled program (e.g. interleaved with other
        layouts, so that load drift on a shared machine hits all of them alike)."""
        return self._step.time(repeats)


    @property
    def predicted_flops(self) -> float:
        return self.predicted.flops

    @property
    def predicted_memory_bytes(self) -> int:
        return self.predicted.memory_bytes

    @property
    def xla_memory_bytes(self) -> int:
        """XLA's bytes per device for the compiled step: argument + output + temp - alias
        (``memory_analysis()``; temp is the heap its temporaries share, a peak)."""
        m = self.xla_memory
        return int(m.get("argument", 0) + m.get("output", 0) + m.get("temp", 0) - m.get("alias", 0))

    @property
    def memory_ratio(self) -> float:
        """Predicted peak memory per device / XLA's (:attr:`xla_memory_bytes`); NaN when XLA
        gave no memory analysis."""
        xla = self.xla_memory_bytes
        return self.predicted.memory_bytes / xla if xla > 0 else float("nan")

    @property
    def memory_matches(self) -> bool:
        """The predicted peak memory is within :data:`MEMORY_TOLERANCE` (10%) of XLA's."""
        return abs(self.memory_ratio - 1) <= MEMORY_TOLERANCE

    def collective_diff(self) -> str:
        """Readable diff of predicted vs compiled collectives (``""`` when they match)."""
        return hlo.diff_text(self.predicted.collectives, self.compiled_collectives, self.mesh.axes)

    def summary(self) -> str:
        match = "match" if self.collectives_match else "MISMATCH"
        return (f"{self.graph_name} on {self.mesh} layout {str(self.layout) or '(replicated)'} "
                f"[{self.backend}]: max abs error {self.max_abs_error:.3g}, step "
                f"{self.step_time_s * 1e3:.3f} ms (predicted {self.predicted.time_s * 1e3:.3f} ms), "
                f"{len(self.compiled_collectives)} collectives ({match}), memory "
                f"{self.predicted.memory_bytes} B/device predicted vs {self.xla_memory_bytes} B XLA "
                f"(x{self.memory_ratio:.2f})")


class _Step:
    """A compiled step and its placed inputs. Inputs the graph donates (``graph.donated``:
    parameters and optimizer state whose buffers the updated ones reuse, as the traced
    ``jax.jit(donate_argnums=...)``) are donated here too, so XLA's memory figures are
    comparable with the prediction; each run gets fresh copies of them, made untimed."""

    def __init__(self, compiled: Any, placed: list, donate: tuple[int, ...], shardings: list) -> None:
        import jax
        import jax.numpy as jnp

        self.compiled, self.placed, self.donate = compiled, placed, donate
        self.copy = jax.jit(lambda *xs: tuple(jnp.copy(x) for x in xs),
                            out_shardings=tuple(shardings[i] for i in donate)) if donate else None

    def inputs(self) -> list:
        import jax

        args = list(self.placed)
        if self.donate:
            fresh = jax.block_until_ready(self.copy(*(args[i] for i in self.donate)))
            for i, x in zip(self.donate, fresh):
                args[i] = x
        return args

    def run(self) -> Any:
        return self.compiled(*self.inputs())

    def time(self, repeats: int) -> tuple[float, ...]:
        import jax

        times = []
        for _ in range(max(int(repeats), 1)):
            args = self.inputs()
            t = time.perf_counter()
            jax.block_until_ready(self.compiled(*args))
            times.append(time.perf_counter() - t)
        return tuple(times)


# ----------------------------------------------------------------------------- devices
def jax_mesh(mesh: Any, devices: Sequence[Any] | None) -> tuple[Mesh, Any]:
    """``(autolayout Mesh, jax.sharding.Mesh)`` for ``mesh`` (anything ``Mesh.parse`` accepts,
    laid over ``devices``, default ``jax.devices()``; or a ``jax.sharding.Mesh``); raises
    ``NotEnoughDevicesError`` when the mesh needs more devices than there are."""
    import jax

    if isinstance(mesh, jax.sharding.Mesh):
        return Mesh(list(zip(mesh.axis_names, mesh.devices.shape))), mesh
    amesh = Mesh.parse(mesh)
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) < amesh.size:
        platform = devices[0].platform if devices else "no"
        raise NotEnoughDevicesError(
            f"mesh {amesh} needs {amesh.size} devices but only {len(devices)} {platform} device(s) "
            f"are available. Use a mesh of at most {len(devices)} devices, or for testing on CPU get "
            f"virtual devices: set JAX_NUM_CPU_DEVICES={amesh.size} in the environment before "
            f"importing jax (or call jax.config.update('jax_num_cpu_devices', {amesh.size}) before "
            f"any JAX operation).")
    return amesh, amesh.to_jax(devices)


def executed_hardware(hardware: Any, graph: Graph) -> tuple[Any, str]:
    """``(profile, note)``: ``hardware`` as it prices the program :func:`execute` runs, and a
    note where that differs for ``graph``. The lowering runs a traced attention as written, its
    scores materialised: it substitutes no fused kernel, and XLA substitutes none either (no
    ``__cudnn$fmha`` call in the compiled HLO of 18 zoo steps on one H200, ``reports/gpu``), so
    a profile that prices FlashAttention (``fused_attention``: the TPU v4+ and Hopper ones)
    prices the run with it off. ``verify`` searches with the same profile, so that it ranks
    the programs it runs."""
    if not hardware.fused_attention:
        return hardware, ""
    from autolayout.costmodel.attention import attention_region

    note = ""
    if attention_region(graph).producers:
        note = (f"priced with {hardware.name}'s fused_attention off: the executed program materialises the "
                "attention scores as traced (no fused-attention kernel runs; reports/gpu measured cuDNN's 7-10x "
                "faster on an H200), where predict and search price a fused kernel on this profile")
    return hardware.replace(fused_attention=False), note


def default_hardware(jmesh: Any) -> Any:
    """The built-in profile of the devices of ``jmesh``, by exact device kind
    (:func:`~autolayout.costmodel.devices.hardware_for_device`; an unknown kind is an error)."""
    return hardware_for_device(jmesh.devices.flat[0])


# ------------------------------------------------------------------------------- args
def _expected_leaves(graph: Graph) -> list[tuple[str, tuple[int, ...], str, str]]:
    """``(path, positional shape, dtype, dims text)`` of each argument leaf."""
    import jax

    spec = getattr(graph, "example_spec", None)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(
        jax.tree_util.tree_unflatten(graph.in_tree, list(range(graph.in_tree.num_leaves))))[0]]
    spec_leaves = jax.tree_util.tree_leaves(spec) if spec is not None else [None] * len(paths)
    out = []
    for path, name, s in zip(paths, graph.input_names, spec_leaves):
        t = graph.tensor(name)
        shape = tuple(s.shape) if s is not None else tuple(d.size for d in t.shape)
        out.append((path, shape, t.dtype, "(" + ", ".join(map(str, t.shape)) + ")"))
    return out


def check_args(graph: Graph, args: Any) -> list[Any]:
    """Flatten ``args`` against the graph's argument structure; raise :class:`ArgumentError`
    naming the argument path and the expected shape on a mismatch."""
    import jax

    args = tuple(args) if isinstance(args, list) else args
    want = _expected_leaves(graph)
    flat, tree = jax.tree_util.tree_flatten_with_path(args)
    if tree != graph.in_tree:
        got = {jax.tree_util.keystr(p) for p, _ in flat}
        exp = [w[0] for w in want]
        missing = [p for p in exp if p not in got]
        extra = sorted(got - set(exp))
        detail = []
        if missing:
            detail.append(f"missing {missing[:5]} (e.g. {missing[0]} of shape {dict((w[0], w[1]) for w in want)[missing[0]]})")
        if extra:
            detail.append(f"unexpected {extra[:5]}")
        raise ArgumentError(
            f"args do not have the structure of the traced function's arguments: "
            f"{'; '.join(detail) or 'the containers differ'}. Expected structure {graph.in_tree}.")
    leaves = []
    for (path, leaf), (wpath, wshape, dtype, dims) in zip(flat, want):
        shape = tuple(np.shape(leaf))
        if tuple(s for s in shape if s != 1) != tuple(s for s in wshape if s != 1):
            raise ArgumentError(f"argument {wpath} has shape {shape}, expected {wshape} {dims}")
        have = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
        got = _dtype_kind(have)
        if got != _dtype_kind(dtype):
            raise ArgumentError(f"argument {wpath} has dtype {np.dtype(have)} ({got}), but the function was traced with {np.dtype(dtype)} ({_dtype_kind(dtype)}); "
                                f"pass a {_dtype_kind(dtype)} array, e.g. x.astype('{np.dtype(dtype)}')")
        leaves.append(leaf)
    return leaves


def _refuse_prng_keys(graph: Graph) -> None:
    """Raise :class:`ArgumentError` if the traced step takes or returns a typed PRNG key
    (``jax.random.key``): ``trace`` lets one pass through unread (it prices as 4 bytes a key),
    but the sharded program and its arguments hold plain arrays only."""
    import jax

    def is_key(dtype: Any) -> bool:
        return isinstance(dtype, str) and dtype.startswith("key<") or (
            not isinstance(dtype, str) and jax.dtypes.issubdtype(dtype, jax.dtypes.extended))

    found = []
    spec = getattr(graph, "example_spec", None)
    if spec is not None:
        found += [f"argument {jax.tree_util.keystr(p)}" for p, leaf in jax.tree_util.tree_flatten_with_path(spec)[0]
                  if is_key(leaf.dtype)]
    out_paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(
        jax.tree_util.tree_unflatten(graph.out_tree, list(range(graph.out_tree.num_leaves))))[0]]
    found += [f"output {p}" for p, o in zip(out_paths, graph.outputs) if is_key(o.dtype)]
    if found:
        raise ArgumentError(
            f"execute: {', '.join(found[:3])}{' ...' if len(found) > 3 else ''} of {graph.name!r} "
            f"{'is a typed PRNG key' if len(found) == 1 else 'are typed PRNG keys'} (jax.random.key); a sharded run takes and returns plain arrays only (autolayout traces no random "
            f"number generation). Leave the key out of the traced step's arguments and results: e.g. a dropout key "
            f"in a TrainState, or nnx.split(model, nnx.Param, ...) without the model's nnx.RngState. predict and "
            f"search price the graph as traced")


def _dtype_kind(dtype: Any) -> str:
    """``"float"``, ``"integer"``, ``"bool"`` or ``"complex"``: what an argument must match
    (widths may differ: arguments are cast to the traced dtype)."""
    import jax.numpy as jnp

    for kind, base in (("bool", jnp.bool_), ("complex", jnp.complexfloating), ("float", jnp.floating),
                       ("integer", jnp.integer)):
        if jnp.issubdtype(dtype, base):
            return kind
    return str(np.dtype(dtype))


def make_args(graph: Graph, seed: int, shardings: Sequence[Any] | None = None) -> Any:
    """Random arguments: the zoo's :func:`~autolayout.models.example_args` when the graph
    came from :mod:`autolayout.models`, else per leaf a normal(0, 1/sqrt(last dim)) float
    or a random integer below the ``vocab`` size, generated on the devices directly in
    the given ``shardings`` (``jax.jit`` with ``out_shardings``: no host copy of a large
    parameter)."""
    import jax
    import jax.numpy as jnp

    if getattr(graph, "example_spec", None) is not None:
        from autolayout.models import example_args
        return example_args(graph, seed)
    leaves = []
    for i, name in enumerate(graph.input_names):
        t = graph.tensor(name)
        shape = tuple(d.size for d in t.shape)
        dtype = np.dtype(t.dtype)
        high = graph.dims.get("vocab", shape[-1] if shape else 2)

        def shard(index: tuple, i: int = i, shape: tuple = shape, dtype: Any = dtype, high: int = high) -> Any:
            """This leaf's block at ``index`` (slices): seeded by the leaf and the block's
            offsets, so every device builds only its own block (numpy, nothing compiled)."""
            block = tuple(len(range(*sl.indices(n))) for sl, n in zip(index, shape))
            starts = tuple(sl.indices(n)[0] for sl, n in zip(index, shape))
            rng = np.random.default_rng((seed, i, *starts))
            if np.issubdtype(dtype, np.integer):
                return rng.integers(0, high, block).astype(dtype)
            if dtype == np.bool_:
                return rng.random(block) < 0.5
            scale = 1 / math.sqrt(shape[-1]) if shape else 1.0
            return (rng.standard_normal(block) * scale).astype(dtype)

        if shardings is not None and shardings[i] is not None:
            leaves.append(jax.make_array_from_callback(shape, shardings[i], shard))
        else:
            leaves.append(jnp.asarray(shard(tuple(slice(None) for _ in shape))))
    return jax.tree_util.tree_unflatten(graph.in_tree, leaves)


# ---------------------------------------------------------------------------- outputs
def assemble_outputs(graph: Graph, out_tensors: Sequence[str], values: Sequence[Any]) -> list[Any]:
    """Graph output tensors -> the traced function's output leaves (positional)."""
    by_name = dict(zip(out_tensors, values))
    return [graph.output_value(spec, by_name.get(spec.tensor)) for spec in graph.outputs]


def _place(prog: Any, jmesh: Any, values: Sequence[Any], specs: Sequence[Any], backend: str) -> list:
    """Inputs on the devices as the step takes them. Optimizer state whose update is
    sharded on flattened, padded shards (seed 003 §4, "data formatting") is converted
    once, outside the step, by its own shard_map (a local slice)."""
    import jax
    from jax.sharding import NamedSharding

    out = []
    for name, x, spec in zip(prog.g.input_names, values, specs):
        if backend == "shard_map" and name in prog.flat_io:
            layout_spec = prog.spec(name, layout=True)
            x = jax.device_put(x, NamedSharding(jmesh, layout_spec))
            x = jax.jit(jax.shard_map(prog.to_step(name), mesh=jmesh, in_specs=layout_spec,
                                      out_specs=spec))(x)
        out.append(jax.device_put(x, NamedSharding(jmesh, spec)))
    return out


def _finish(prog: Any, jmesh: Any, tensors: Sequence[Any], backend: str) -> list:
    """Step outputs -> the traced function's output leaves (flat update shards gathered
    back by their own shard_map, outside the timed and compared step)."""
    import jax

    tensors = list(tensors)
    for i, name in enumerate(prog.out_tensors):
        if backend == "shard_map" and name in prog.flat_io:
            tensors[i] = jax.jit(jax.shard_map(prog.from_step(name), mesh=jmesh, in_specs=prog.spec(name),
                                               out_specs=prog.spec(name, layout=True)))(tensors[i])
    return jax.jit(lambda *xs: assemble_outputs(prog.g, prog.out_tensors, xs))(*tensors)


def _to_tensor(graph: Graph, name: str, leaf: Any) -> Any:
    """An argument leaf reshaped to its tensor's dims (size-1 axes dropped) and dtype."""
    import jax.numpy as jnp

    t = graph.tensor(name)
    return jnp.reshape(jnp.asarray(leaf), tuple(d.size for d in t.shape)).astype(t.dtype)


def _errors(outputs: Any, reference: Any) -> tuple[float, float, list[str]]:
    """``(max abs error, max relative error, notes)`` of ``outputs`` against ``reference``.

    NaN-aware (``max(0.0, nan)`` is ``0.0`` in Python, so NaN must be handled before
    taking maxima): a value that is NaN or infinite in one and not the same in the other
    raises :class:`OutputMismatchError`; values NaN in both (or the same infinity) are not
    compared and a note says how many there are; the errors cover the remaining values.
    """
    import jax

    abs_err, rel_err, notes = 0.0, 0.0, []
    flat_out = jax.tree_util.tree_flatten_with_path(outputs)[0]
    for (path, a), b in zip(flat_out, jax.tree_util.tree_leaves(reference)):
        where = "output " + (jax.tree_util.keystr(path) or "(the only one)")
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        if a.size == 0:
            continue
        both_nan = np.isnan(a) & np.isnan(b)
        same_inf = np.isinf(a) & (a == b)
        finite = np.isfinite(a) & np.isfinite(b)
        odd = ~(finite | both_nan | same_inf)
        if odd.any():
            idx = tuple(int(i) for i in np.argwhere(odd)[0])
            raise OutputMismatchError(
                f"{where}: {int(odd.sum())} of {a.size} values are NaN or infinite in only one of the sharded run "
                f"and the unsharded reference (first at index {idx}: sharded {float(a[idx])!r}, reference {float(b[idx])!r}); "
                "the layout's program computes something else than the traced function")
        if both_nan.any() or same_inf.any():
            notes.append(f"{where}: {int(both_nan.sum())} NaN and {int(same_inf.sum())} infinite values of {a.size} "
                         "are the same in the sharded run and the unsharded reference (the traced function itself "
                         "produces them); the errors compare the other values only")
        if not finite.any():
            continue
        err = float(np.max(np.abs(a[finite] - b[finite])))
        abs_err = max(abs_err, err)
        rel_err = max(rel_err, err / max(float(np.max(np.abs(b[finite]))), 1e-30))
    return abs_err, rel_err, notes


# ---------------------------------------------------------------------------- execute
def execute(graph: Graph, mesh: Any, layout: Any = None, *, args: Any = None, seed: int = 0,
            repeats: int = 5, hardware: Any = None, backend: str = "shard_map",
            devices: Sequence[Any] | None = None, reference: bool = True,
            compiler_options: dict | None = None) -> Execution:
    """Run ``graph`` under ``layout`` on ``mesh`` and compare with the prediction.

    ``backend="shard_map"`` lowers the graph to one jitted ``jax.shard_map``
    program with explicit collectives (:mod:`autolayout.exec.lower`);
    ``backend="gspmd"`` runs the graph's interpreter under ``jax.jit`` with the
    layout as ``NamedSharding`` in/out shardings and a ``with_sharding_constraint``
    on every op output, so XLA's SPMD partitioner picks the collectives.

    ``mesh`` is anything :class:`~autolayout.core.Mesh` accepts (laid over
    ``devices``, default ``jax.devices()``) or a ``jax.sharding.Mesh``. ``args``
    has the traced function's argument structure; ``None`` draws them from
    ``seed``. The step is timed ``repeats`` times after one warm-up run.
    ``hardware`` (keyword-only: a profile, its name or a JSON path) prices the
    prediction; default: the built-in profile of the devices at hand, by their exact
    device kind (an unknown kind raises ``UnknownDeviceError`` naming it) — the run is
    compared with a prediction for the machine it ran on, so unlike ``predict`` and
    ``search`` the default is not ``DEFAULT_HARDWARE``. ``reference=False``
    skips the unsharded reference run (errors are then NaN). ``compiler_options``
    go to XLA for the step and the reference (e.g. ``{"xla_backend_optimization_level": 0}``
    compiles ~2x faster on CPU; the tests use it).

    Example::

        g = autolayout.models.mlp(batch=64, d_io=32, d_hidden=128)
        ex = execute(g, "rows:2,cols:4", "batch:rows;hidden:cols")
        ex.max_abs_error, ex.collectives_match, ex.step_time_s
        print(ex.comparison)
    """
    import jax

    require_graph(graph, "execute")
    _refuse_prng_keys(graph)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    amesh, jmesh = jax_mesh(mesh, devices)
    the_plan = make_plan(graph, amesh, layout)
    layout = the_plan.layout
    hw, attention_note = executed_hardware(get_hardware(hardware) if hardware is not None
                                           else default_hardware(jmesh), graph)
    cost = price_plan(the_plan, hw)
    from jax.sharding import NamedSharding

    from autolayout.exec.lower import ShardProgram
    prog = ShardProgram(the_plan, hw)
    if args is None:
        args = make_args(graph, seed, [NamedSharding(jmesh, prog.spec(n, layout=True)) for n in graph.input_names])
    leaves = check_args(graph, args)
    squeezed = [_to_tensor(graph, n, leaf) for leaf, n in zip(leaves, graph.input_names)]
    if backend == "shard_map":
        specs = prog.in_specs
        inner = jax.shard_map(prog.body, mesh=jmesh, in_specs=prog.in_specs, out_specs=prog.out_specs,
                              check_vma=True)
    else:
        from autolayout.exec.gspmd import gspmd_body, gspmd_spec
        specs = tuple(gspmd_spec(the_plan, n) for n in graph.input_names)
        inner = gspmd_body(the_plan, jmesh, prog.out_tensors)
    in_shardings = [NamedSharding(jmesh, s) for s in specs]
    placed = _place(prog, jmesh, squeezed, specs, backend)

    t0 = time.perf_counter()
    out_shardings = None if backend == "shard_map" else tuple(
        NamedSharding(jmesh, gspmd_spec(the_plan, n)) for n in prog.out_tensors)
    donors = set(getattr(graph, "donated", {}).values())
    donate = tuple(i for i, n in enumerate(graph.input_names) if n in donors)
    lowered = jax.jit(inner, in_shardings=in_shardings, out_shardings=out_shardings,
                      donate_argnums=donate).lower(*placed)
    hlo_text = lowered.as_text(dialect="hlo")
    compiled = lowered.compile(compiler_options=compiler_options)
    compile_s = time.perf_counter() - t0
    compiled_text = compiled.as_text() or ""
    stepper = _Step(compiled, placed, donate, in_shardings)
    tensors = jax.block_until_ready(stepper.run())
    times = list(stepper.time(repeats))
    out_leaves = _finish(prog, jmesh, tensors, backend)
    outputs = jax.tree_util.tree_unflatten(graph.out_tree, list(out_leaves))
    if reference:
        ref_args = jax.tree_util.tree_unflatten(graph.in_tree, squeezed)
        ref_fn = jax.jit(graph.evaluate).lower(*ref_args).compile(compiler_options=compiler_options)
        ref = ref_fn(*ref_args)
        abs_err, rel_err, output_notes = _errors(outputs, ref)
    else:
        ref, abs_err, rel_err, output_notes = None, float("nan"), float("nan"), []

    n = amesh.size
    pre = tuple(hlo.parse_collectives(hlo_text, n, amesh.axes))
    post = tuple(hlo.parse_collectives(compiled_text, n, amesh.axes))
    compiled_colls = pre if backend == "shard_map" else post
    match, _, _ = hlo.compare(cost.collectives, compiled_colls, amesh.axes)
    ca = compiled.cost_analysis()
    if isinstance(ca, (list, tuple)):
        ca = ca[0] if ca else {}
    ca = dict(ca or {})
    ma = compiled.memory_analysis()
    mem = {k: int(getattr(ma, f"{k}_size_in_bytes", 0) or 0)
           for k in ("argument", "output", "temp", "alias", "generated_code")} if ma is not None else {}
    ex = Execution(
        graph_name=graph.name, mesh=amesh, layout=layout, backend=backend, outputs=outputs,
        reference=ref, max_abs_error=abs_err, max_rel_error=rel_err,
        step_time_s=statistics.median(times), step_time_spread_s=max(times) - min(times),
        step_times_s=tuple(times), hlo_text=hlo_text, compiled_hlo_text=compiled_text,
        compiled_collectives=compiled_colls, optimized_collectives=post, predicted=cost,
        collectives_match=match, xla_flops=float(ca.get("flops", float("nan"))),
        xla_bytes_accessed=float(ca.get("bytes accessed", float("nan"))), xla_memory=mem,
        compile_s=compile_s, notes=tuple(dict.fromkeys(output_notes + _xla_notes(graph)
                                                      + ([attention_note] if attention_note else []))),
        _step=stepper)
    ex.comparison = comparison_table(ex)
    return ex


def _xla_notes(graph: Graph) -> list[str]:
    if not graph.loops:
        return []
    return ["XLA's cost_analysis counts a scan (while) body once, not once per iteration, so its "
            "flops for this graph are below the predicted per-step flops by the loop trip counts "
            f"({', '.join(f'{lp.name}: {lp.length}' for lp in graph.loops.values())})"]


def comparison_table(ex: Execution) -> Any:
    """Predicted vs compiled (XLA) vs measured, one row per quantity (per device)."""
    import pandas as pd

    c = ex.predicted
    pred_bytes = sum(x.bytes for x in c.collectives)
    comp_bytes = sum(x.bytes for x in ex.compiled_collectives)
    nan = float("nan")
    rows = [
        ("flops per device", c.flops, ex.xla_flops, nan),
        ("memory bytes per device", c.memory_bytes, ex.xla_memory_bytes, nan),
        ("collectives in program", len(c.collectives), len(ex.compiled_collectives), nan),
        ("collective operand bytes in program", pred_bytes, comp_bytes, nan),
        ("communicated bytes per step", c.comm_bytes, nan, nan),
        ("compute time s", c.compute_s, nan, nan),
        ("communication time s", c.comm_s, nan, nan),
        ("step time s", c.time_s, nan, ex.step_time_s),
    ]
    df = pd.DataFrame(rows, columns=["quantity", "predicted", "compiled", "measured"])
    other = df["measured"].where(df["measured"].notna(), df["compiled"])
    df["ratio"] = other / df["predicted"].where(df["predicted"] != 0)
    return df
