"""A searched layout as what JAX, Flax and MaxText users paste into their own training code.

* :func:`partition_specs`: one ``PartitionSpec`` per leaf of the traced function's arguments
  (parameters, optimizer state, batch) — or of its outputs — laid out as autolayout's own
  execution stores them: storage entries (``|w:x@3``) add their axes to the dim their shard
  splits (ZeRO-3 weights, the optimizer state at every stage). Pass them to
  ``jax.jit(step, in_shardings=..., out_shardings=...)``.
* :func:`logical_axis_rules`: flax/t5x ``logical_axis_rules`` (``[(logical name, mesh axes or
  None), ...]``): the layout's rules, then one rule per dim a storage shard splits (the FSDP
  axis), which Flax's resolution (:func:`resolve`: rules in order, a rule applies when its
  mesh axes are free in that array) skips wherever the dim's tensor already uses those axes,
  as activations holding the batch dim do. What the rules cannot say is in ``notes``.
* :func:`maxtext_config`: the same in MaxText's vocabulary (``configs/base.yml``): its mesh
  axis names (``data``, ``fsdp``, ``sequence``, ``tensor``), ``ici_*_parallelism`` sizes, and
  ``logical_axis_rules`` with ``activation_*`` names for activations and plain names for
  weights, where our dims map onto MaxText's logical names.

Flattened, padded storage shards (seed 003 §4: no dim of the parameter divides by the shard
count) have no ``PartitionSpec`` on the user's array: :class:`ExportError` names them and the fix.

Example::

    best = autolayout.search(g, "data:2,model:4", hardware="tpu-v4")
    specs = partition_specs(g, "data:2,model:4", best.layout)     # mirrors step's arguments
    shardings = jax.tree.map(lambda p: NamedSharding(jmesh, p), specs)
    step = jax.jit(step, in_shardings=shardings)
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autolayout.core import LayoutError
from autolayout.costmodel.placement import Placement
from autolayout.costmodel.plan import Plan, plan as make_plan
from autolayout.graph import Graph

__all__ = ["ExportError", "partition_specs", "logical_axis_rules", "resolve", "LogicalRules",
           "maxtext_config", "MaxTextConfig"]

Rule = tuple[str, "str | tuple[str, ...] | None"]


class ExportError(LayoutError):
    """A layout has no faithful form in the requested export format."""


def _entry(axes: Sequence[str]) -> Any:
    return None if not axes else axes[0] if len(axes) == 1 else tuple(axes)


def _spec(p: Placement, graph: Graph, name: str, positional: Sequence[str | None]) -> Any:
    """The ``PartitionSpec`` of tensor ``name`` stored as ``p`` on an array whose axes are
    named ``positional`` (``None`` = a size-1 axis)."""
    from jax.sharding import PartitionSpec

    if p.flat:
        raise ExportError(
            f"tensor {name!r} is stored as a flattened, padded shard over {','.join(p.flat)} (no dim of it "
            f"divides by the shard count; seed 003 §4), which no PartitionSpec of its array "
            f"{list(graph.tensor(name).shape)} can express. Fix: store it over axes whose size divides one "
            f"of its dims, or leave it out of the storage entries.")
    return PartitionSpec(*(None if d is None else _entry(p.axes_of(d)) for d in positional))


def _arg_positional(graph: Graph) -> list[tuple[str | None, ...]]:
    """Per argument leaf: its axes' dim names (``None`` for size-1 axes), positionally."""
    import jax

    shapes = [tuple(s.shape) for s in jax.tree_util.tree_leaves(graph.example_spec)] \
        if graph.example_spec is not None else [tuple(d.size for d in graph.tensor(n).shape)
                                                for n in graph.input_names]
    out = []
    for name, shape in zip(graph.input_names, shapes):
        dims = iter(graph.tensor(name).dim_names)
        out.append(tuple(None if s == 1 else next(dims) for s in shape))
    return out


def _plan(graph: Graph, mesh: Any, layout: Any) -> Plan:
    return layout if isinstance(layout, Plan) else make_plan(graph, mesh, layout)


def partition_specs(graph: Graph, mesh: Any, layout: Any, *, outputs: bool = False) -> Any:
    """``PartitionSpec`` s of the traced function's arguments (``outputs=True``: of its
    outputs), as a pytree of their structure, for ``jax.jit`` 's ``in_shardings`` /
    ``out_shardings``: each leaf as :func:`autolayout.execute` stores it under ``layout``
    (storage shards included). ``layout`` may also be a :class:`~autolayout.costmodel.plan.Plan`.

    Raises:
        ExportError: a leaf is stored as a flattened, padded shard.
    """
    import jax
    from jax.sharding import PartitionSpec

    p = _plan(graph, mesh, layout)
    if outputs:
        leaves = [PartitionSpec() if s.tensor is None else _spec(p.placements[s.tensor], graph, s.tensor, s.dims)
                  for s in graph.outputs]
        return jax.tree_util.tree_unflatten(graph.out_tree, leaves)
    leaves = [_spec(p.placements[n], graph, n, pos) for n, pos in zip(graph.input_names, _arg_positional(graph))]
    return jax.tree_util.tree_unflatten(graph.in_tree, leaves)


# --------------------------------------------------------------------------- logical rules
def resolve(names: Sequence[str | None], rules: Sequence[Rule]) -> tuple:
    """Mesh axes of an array whose axes have logical ``names`` under ``rules``, the way Flax
    resolves them (``flax.linen.logical_to_mesh_axes``): rules in order; a rule for a name
    applies when that axis has none yet and none of the rule's mesh axes is used by another
    axis of the array; axes no rule reaches are replicated (``None``)."""
    out: list[Any] = ["?" if isinstance(n, str) else None for n in names]
    for logical, axes in rules:
        if logical not in names:
            continue
        i = list(names).index(logical)
        want = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
        used = {a for e in out if e not in ("?", None) for a in ((e,) if isinstance(e, str) else e)}
        if out[i] == "?" and not used & set(want):
            out[i] = _entry(want) if want else None
    return tuple(None if e == "?" else e for e in out)


@dataclass(frozen=True)
class LogicalRules:
    """Exported ``logical_axis_rules`` and what they cannot say.

    ``rules``: ``[(dim, mesh axis | tuple of axes | None), ...]`` in Flax's priority order;
    ``storage_rules``: the subset that stores parameters split further (FSDP/ZeRO axes);
    ``notes``: argument tensors whose stored layout the rules do not reproduce, and why.
    """

    rules: tuple[Rule, ...]
    storage_rules: tuple[Rule, ...]
    notes: tuple[str, ...]

    def __iter__(self):
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)


def logical_axis_rules(graph: Graph, mesh: Any, layout: Any) -> LogicalRules:
    """flax/t5x ``logical_axis_rules`` for ``layout`` on ``graph``'s dim names (see the module
    docstring). Every dim of the graph gets a rule (``None``: replicated), so the list covers
    every logical axis; region rules (``length@norm``) have no Flax form and are noted."""
    p = _plan(graph, mesh, layout)
    lay = p.layout
    rules: list[Rule] = [(d, _entry(a)) for d, a in lay.rules if "@" not in d]
    notes = [f"rule {d!r} (a region rule, sequence parallelism) has no flax/t5x form; it is left out"
             for d, _ in lay.rules if "@" in d]
    storage: list[Rule] = []
    for pname, shard in p.shards.items():
        if not shard.dim:
            notes.append(f"{pname!r}: stored as a flattened, padded shard over {','.join(shard.axes)}; no rule "
                         "can say that")
            continue
        held = p.placements[pname].axes_of(shard.dim) if shard.stage >= 3 else \
            next((p.placements[s].axes_of(shard.dim) for s in shard.opt_state if s in p.placements), ())
        rule = (shard.dim, _entry(held or lay.axes_of(shard.dim) + shard.axes))
        if rule not in storage:
            storage.append(rule)
    rules += [r for r in storage if r not in rules]
    rules += [(d, None) for d in graph.dims if d not in {r[0] for r in rules}]
    positional = dict(zip(graph.input_names, _arg_positional(graph)))
    for name in graph.input_names:
        pl = p.placements[name]
        if pl.flat:
            continue
        want = tuple(_entry(pl.axes_of(d)) if d else None for d in positional[name])
        got = resolve(positional[name], rules)
        if got != want:
            notes.append(f"{name!r} ({graph.tensor(name).role}): the rules give {got}, autolayout stores it as "
                         f"{want}; a dim of it is split one way in computation and another in storage, which "
                         "one rule per name cannot say — give parameters their own logical names (MaxText's "
                         "activation_* convention, maxtext_config) or use partition_specs")
    return LogicalRules(tuple(rules), tuple(storage), tuple(notes))


# --------------------------------------------------------------------------- MaxText
# MaxText's logical axis names (MaxText/configs/base.yml, logical_axis_rules) and the dim
# names commonly used for them; an activation's name is "activation_" + the weight's.
_MAXTEXT_NAMES = {
    "batch": ("batch",), "length": ("length", "seq", "sequence", "seq_len", "position", "time"),
    "embed": ("embed", "d_model", "model", "emb", "hidden_size"), "heads": ("heads", "num_heads", "q_heads"),
    "kv_heads": ("kv_heads",), "kv": ("kv", "d_kv", "head_dim", "d_head"),
    "mlp": ("mlp", "d_ff", "ff", "ffn", "intermediate", "hidden"), "vocab": ("vocab", "vocab_size"),
}
# MaxText's mesh axes (base.yml ``mesh_axes``) by the parallelism they carry
_MAXTEXT_AXES = ("data", "fsdp", "fsdp_transpose", "sequence", "tensor", "autoregressive")


@dataclass(frozen=True)
class MaxTextConfig:
    """A layout in MaxText's terms (``configs/base.yml``).

    ``mesh_axes``: our mesh axis -> MaxText mesh axis (``None`` where none fits);
    ``ici_parallelism``: ``{"ici_fsdp_parallelism": 8, ...}``; ``logical_axis_rules``:
    ``[[logical name, [mesh axes]], ...]`` in MaxText names (activations ``activation_*``,
    weights plain); ``dim_names``: our dim -> MaxText logical name; ``notes``: what does not map.
    """

    mesh_axes: dict[str, str | None]
    ici_parallelism: dict[str, int]
    logical_axis_rules: list[list]
    dim_names: dict[str, str]
    notes: tuple[str, ...]


def maxtext_config(graph: Graph, mesh: Any, layout: Any) -> MaxTextConfig:
    """``layout`` on ``graph`` in MaxText's vocabulary (see :class:`MaxTextConfig`).

    Mesh axes: an axis parameters are stored over at stage 3 is ``fsdp``; else one splitting
    only the batch ``data``; the sequence (``length``) ``sequence``; heads, mlp, kv, vocab or
    the embedding in activations ``tensor``. Dims map onto MaxText's logical names by their
    usual spellings (``d_model`` -> ``embed``, ``d_ff`` -> ``mlp``, ...).
    """
    p = _plan(graph, mesh, layout)
    lay, mesh = p.layout, p.mesh
    notes: list[str] = []
    dim_names = {}
    for d in graph.dims:
        hit = next((mt for mt, spellings in _MAXTEXT_NAMES.items() if d.lower() in spellings), None)
        if hit is not None:
            dim_names[d] = hit
    fsdp = {a for s in p.shards.values() if s.stage >= 3 for a in s.axes}
    use: dict[str, set[str]] = {}
    for d, axes in lay.rules:
        for a in axes:
            use.setdefault(a, set()).add(dim_names.get(d.partition("@")[0], "?"))
    mesh_axes: dict[str, str | None] = {}
    for a in mesh.axis_names:
        kinds = use.get(a, set())
        if a in fsdp:
            mt = "fsdp"
        elif not kinds:
            mt = None
        elif kinds == {"batch"}:
            mt = "data"
        elif kinds <= {"length"}:
            mt = "sequence"
        elif kinds <= {"heads", "kv_heads", "kv", "mlp", "vocab", "embed"}:
            mt = "tensor"
        else:
            mt = None
            notes.append(f"mesh axis {a!r} splits {sorted(kinds)}: no single MaxText axis does that")
        if mt is not None and mt in mesh_axes.values():
            notes.append(f"mesh axes {[k for k, v in mesh_axes.items() if v == mt] + [a]} all act as MaxText's "
                         f"{mt!r}; MaxText has one {mt!r} axis (use their product as its size)")
        mesh_axes[a] = mt
    ici: dict[str, int] = {}
    for a, mt in mesh_axes.items():
        if mt is not None:
            ici[f"ici_{mt}_parallelism"] = ici.get(f"ici_{mt}_parallelism", 1) * mesh.axis_size(a)
    for d in graph.dims:
        if d not in dim_names and d not in graph.loop_dims and lay.axes_of(d):
            notes.append(f"dim {d!r} (split over {','.join(lay.axes_of(d))}) has no MaxText logical name; "
                         "rename it (Graph.rename) to one of " + ", ".join(sorted(_MAXTEXT_NAMES)))

    def mt_axes(axes: Sequence[str]) -> list[str]:
        return [mesh_axes[a] for a in axes if mesh_axes.get(a)]

    rules: list[list] = []
    for d, axes in lay.rules:
        base = d.partition("@")[0]
        if base in dim_names and "@" not in d:
            rules.append([f"activation_{dim_names[base]}", mt_axes(axes)])
    params = {d for t in graph.params() for d in t.dim_names}
    stored: dict[str, tuple[str, ...]] = {}
    for t in graph.params():
        pl = p.placements[t.name]
        shard = p.shards.get(t.name)
        for d in t.dim_names:
            axes = pl.axes_of(d) if not pl.flat else lay.axes_of(d)
            if shard is not None and shard.dim == d and shard.stage < 3:
                axes = lay.axes_of(d)  # stages 1-2 keep the weights whole; their state is sharded
            prev = stored.setdefault(d, axes)
            if prev != axes and d in dim_names:
                notes.append(f"weight dim {d!r} is stored over {prev or 'nothing'} in one parameter and "
                             f"{axes or 'nothing'} in {t.name!r}; one MaxText rule per name keeps the first")
    for d in sorted(params & set(dim_names), key=list(graph.dims).index):
        rules.append([dim_names[d], mt_axes(stored.get(d, ()))])
    return MaxTextConfig(mesh_axes, ici, rules, dim_names, tuple(dict.fromkeys(notes)))
