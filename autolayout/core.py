"""Core value types: Dim, Mesh, Layout (:class:`Mesh` and :class:`LayoutError` are defined in
:mod:`autolayout.mesh` and exported here).

These are the words every other module speaks (docs/DESIGN.md §1): a tensor
has named dimensions (:class:`Dim`), the processors form a :class:`Mesh` with
named axes, and a :class:`Layout` maps dimension names to mesh axes.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autolayout.mesh import LayoutError, Mesh, check_name, closest

if TYPE_CHECKING:  # jax is imported lazily: core values must stay cheap to import
    import jax


@dataclass(frozen=True)
class Dim:
    """A named tensor dimension: ``str(Dim("batch", 256)) == "batch:256"``."""

    name: str
    size: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Dim name must be a non-empty string, got {self.name!r}")
        if int(self.size) != self.size or self.size < 1:
            raise ValueError(f"Dim {self.name!r} size must be a positive integer, got {self.size!r}")

    def __str__(self) -> str:
        return f"{self.name}:{self.size}"

    __repr__ = __str__


Shape = tuple[Dim, ...]


# ------------------------------------------------------------------------- Layout

Rules = tuple[tuple[str, tuple[str, ...]], ...]
Storage = tuple[tuple[str, tuple[str, ...], int], ...]
STAGES = (1, 2, 3)
# Region kinds a dim may have its own rule in (``length@norm:x``); see Layout.
REGIONS = ("norm",)
# Rematerialisation policies of scan bodies (autolayout.remat); "" = as traced.
REMAT = ("none", "full", "dots")
# stage spellings people use (ZeRO, Rajbhandari et al. 2020; FSDP is ZeRO-3)
_STAGE_NAMES = {"1": 1, "2": 2, "3": 3, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}
WHOLE = "-"  # a storage entry's axes for a parameter stored whole ('final_norm:-', stage 0 in Layout.storage)


@dataclass(frozen=True, init=False)
class Layout:
    """A computation layout: which mesh axes each named tensor dimension is split over.

    Construct it from a dict, a list of pairs (the Mesh-TensorFlow form) or a
    string; all of these are equal::

        >>> Layout({"batch": "rows", "hidden": ("cols",)})
        Layout('batch:rows;hidden:cols')
        >>> Layout([("batch", "rows"), ("hidden", "cols")]) == Layout("batch:rows;hidden:cols")
        True

    **String form.** Rules are ``dim:axis`` separated by ``;``. A dim split over
    several mesh axes lists them with ``,``, major axis first
    (``batch:rows,planes``). Optional weight-update sharding entries
    (parameter name -> mesh axes, see below) follow a ``|`` in the same syntax:
    ``"batch:rows;hidden:cols|w:rows;v:rows"``. ``str(layout)`` prints this form
    and ``Layout.parse(str(layout)) == layout``.

    **How rules are applied.** Each dim name has at most one rule, and the rule
    applies to every tensor that has that dim. A tensor gets one
    PartitionSpec entry per dim, in the tensor's own dim order: ``None`` if
    the dim has no rule, the axis name if it is split over one axis, and a
    tuple of axis names, major to minor, if it is split over several. A mesh
    axis that no dim of a tensor uses means the tensor is *replicated* along
    that axis. Two dims of one tensor may never use the same mesh axis
    (paper section 8.5). For example, on mesh ``rows:2,cols:4,planes:2`` with
    layout ``batch:rows,planes;hidden:cols``::

        tensor x[batch, d_io]      -> P(('rows', 'planes'), None)
            batch/4 per device, replicated over 'cols'
        tensor h[batch, hidden]    -> P(('rows', 'planes'), 'cols')
            fully split: each device holds 1/16 of h
        tensor w[d_io, hidden]     -> P(None, 'cols')
            replicated over 'rows' and 'planes'

    **Storage sharding** (ZeRO stages; weight-update sharding, Xu et al., "Automatic
    Cross-Replica Sharding of Weight Update in Data-Parallel Training", seed 003):
    after the ``|``, entries ``param:axes[@stage]`` store a parameter's training state
    split over mesh axes its dims leave free (axes over which its gradient is summed,
    i.e. that split the batch):

    * ``@1`` (the default, written without a suffix): the optimizer state and the
      update are sharded; the gradient is reduced into the shard once per step; the
      updated weights are all-gathered once per step (ZeRO-1, seed 003);
    * ``@2``: as ``@1``, and gradients are held sharded: reduce-scattered one layer at a
      time inside the backward scan (ZeRO-2);
    * ``@3``: as ``@2``, and the weights themselves are stored sharded and all-gathered
      just before each use, per layer inside the scan, in the forward and again in the
      backward pass (ZeRO-3, FSDP).

    The key ``*`` applies an entry to every parameter not named otherwise (on the axes
    that parameter allows): ``"batch:data,fsdp;heads:tensor|*:fsdp@3"`` is MaxText's
    FSDP over ``fsdp``. An axis of a ``*`` entry that no parameter allows (it splits no
    dim a gradient is summed over) is an error, as it is for a named parameter: the
    entry would change nothing. ``param:-`` stores a parameter whole, which a ``*`` entry
    would otherwise cover: ``"...|*:fsdp@3;final_norm:-"``.

    **Regions** (sequence parallelism, Korthikanti et al. 2022, "Reducing Activation
    Recomputation in Large Transformer Models"): a rule ``dim@norm:axes`` splits ``dim``
    over ``axes`` in the *norm region* only — the layer norms, residual adds and other
    element-wise ops on the residual stream between the contractions (tensors whose dims
    are all dims of a scan's carry). Its axes include the dim's own rule's and add axes
    the contractions use for other dims: with ``heads:x;d_ff:x``, ``length@norm:x`` is
    Megatron-LM's sequence parallelism over the tensor-parallel axis ``x`` (the matmul's
    all-reduce becomes a reduce-scatter into the region, and an all-gather feeds the next
    matmul).

    **Rematerialisation**: an option ``remat=full`` (or ``dots``, ``none``) in the storage
    section rewrites the step's scans as ``jax.checkpoint`` with that policy would
    (:mod:`autolayout.remat`): ``"...|*:y,z@3;remat=full"``.

    Layouts are frozen and hashable. Rule order is kept (it is what you wrote);
    use :meth:`canonical` to compare independent of order.
    """

    rules: Rules
    storage: Storage = field(default=())
    remat: str = ""

    def __init__(self, rules: Any = None, storage: Any = None, *, update_sharding: Any = None,
                 remat: str | None = None) -> None:
        if update_sharding is not None:
            if storage is not None:
                raise LayoutError("storage sharding given twice (storage= and update_sharding=); give it once")
            storage = update_sharding
        options: dict[str, str] = {}
        if isinstance(rules, Layout):
            rules, upd, options = rules.rules, rules.storage, ({"remat": rules.remat} if rules.remat else {})
        elif isinstance(rules, str):
            rules, _, upd = rules.partition("|")
            upd, options = _split_options(upd)
        else:
            upd = None
        if upd and storage is not None:
            raise LayoutError(
                "storage (weight-update) sharding given twice (in the layout after '|' and as an "
                "argument); give it once")
        if remat is not None and options.get("remat") is not None:
            raise LayoutError("remat given twice (in the layout string and as remat=); give it once")
        remat = remat if remat is not None else options.get("remat", "")
        if remat and remat not in REMAT:
            raise LayoutError(f"unknown remat policy {remat!r}; choose one of {', '.join(REMAT)} "
                              "(e.g. 'batch:rows|remat=full')")
        object.__setattr__(self, "rules", _normalise_rules(rules, "dim"))
        object.__setattr__(self, "storage", _normalise_storage(upd if upd else storage))
        object.__setattr__(self, "remat", remat or "")

    @classmethod
    def parse(cls, text: str) -> Layout:
        """Parse the string form, e.g. ``"batch:rows;hidden:cols|w:rows"``."""
        if not isinstance(text, str):
            raise LayoutError(f"Layout.parse expects a string like 'batch:rows;hidden:cols', got {text!r}")
        return cls(text)

    @classmethod
    def coerce(cls, spec: Any) -> Layout:
        """A Layout from a Layout, string, dict, list of pairs, or None (empty)."""
        return spec if isinstance(spec, Layout) else cls(spec)

    # -- queries ------------------------------------------------------------------
    def axes_of(self, dim: str | Dim) -> tuple[str, ...]:
        """Mesh axes ``dim`` is split over, major first; ``()`` if unsplit."""
        name = dim.name if isinstance(dim, Dim) else dim
        for d, axes in self.rules:
            if d == name:
                return axes
        return ()

    def region_axes(self, dim: str, region: str) -> tuple[str, ...]:
        """Mesh axes ``dim`` is split over in ``region`` (its ``dim@region`` rule, else its own)."""
        for d, axes in self.rules:
            if d == f"{dim}@{region}":
                return axes
        return self.axes_of(dim)

    @property
    def update_sharding(self) -> Rules:
        """``(parameter or "*", mesh axes)`` of every storage entry (any stage)."""
        return tuple((key, axes) for key, axes, _ in self.storage)

    def storage_of(self, param: str) -> tuple[tuple[str, ...], int]:
        """``(mesh axes, ZeRO stage)`` of parameter ``param``'s storage entry (its own, else
        the ``*`` entry), or ``((), 0)`` if it has none."""
        star = ((), 0)
        for key, axes, stage in self.storage:
            if key == param:
                return axes, stage
            if key == "*":
                star = (axes, stage)
        return star

    def update_axes_of(self, param: str) -> tuple[str, ...]:
        """Mesh axes the storage (weight update) of parameter ``param`` is sharded over."""
        return self.storage_of(param)[0]

    def as_dict(self) -> dict[str, tuple[str, ...]]:
        return dict(self.rules)

    def mesh_axes(self) -> set[str]:
        """Every mesh axis named by a rule or a storage entry."""
        return {a for _, axes in self.rules + self.update_sharding for a in axes}

    def canonical(self) -> Layout:
        """The same layout with rules and storage entries sorted by name."""
        return Layout(sorted(self.rules), sorted(self.storage), remat=self.remat)

    def local_size(self, dim: Dim, mesh: Any) -> int:
        """Size of ``dim`` on one device: its size / product of its mesh axes."""
        mesh = Mesh.coerce(mesh)
        axes = self.axes_of(dim)
        n = math.prod(mesh.axis_size(a) for a in axes)
        if dim.size % n:
            raise LayoutError(
                f"dim {dim.name!r} of size {dim.size} is not divisible by the product {n} of its "
                f"mesh axes {_fmt_axes(axes, mesh)}; leave {dim.name!r} unsplit or use axes whose "
                f"product divides {dim.size}"
            )
        return dim.size // n

    # -- conversions ------------------------------------------------------------
    def partition_spec(self, dims: Any) -> jax.sharding.PartitionSpec:
        """A ``PartitionSpec`` for a tensor with dims ``dims`` (Dims, names, or an object with ``.shape``).

        >>> Layout("batch:rows,planes;hidden:cols").partition_spec(["batch", "d_io", "hidden"])
        P(('rows', 'planes'), None, 'cols')
        """
        from jax.sharding import PartitionSpec

        if hasattr(dims, "shape") and not isinstance(dims, (str, Dim)):
            dims = dims.shape
        names = [d.name if isinstance(d, Dim) else d for d in dims]
        owner: dict[str, str] = {}
        entries: list[str | tuple[str, ...] | None] = []
        for name in names:
            axes = self.axes_of(name)
            for a in axes:
                if a in owner:
                    raise LayoutError(
                        f"dims {owner[a]!r} and {name!r} of tensor {names} are both split over mesh "
                        f"axis {a!r}; a mesh axis may split at most one dim of a tensor"
                    )
                owner[a] = name
            entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
        return PartitionSpec(*entries)

    def logical_axis_rules(
        self, dims: Iterable[str] | None = None
    ) -> list[tuple[str, str | tuple[str, ...] | None]]:
        """flax/t5x-style ``logical_axis_rules``: ``[("batch", "rows"), ("hidden", ("cols", "planes"))]``.

        If ``dims`` is given, its dim names without a rule are added mapped to
        ``None`` (replicated), so every logical axis is covered.
        """
        out: list[tuple[str, str | tuple[str, ...] | None]] = [
            (d, axes[0] if len(axes) == 1 else axes) for d, axes in self.rules
        ]
        if dims is not None:
            out += [(d, None) for d in dims if not self.axes_of(d)]
        return out

    # -- functional updates -------------------------------------------------------
    def with_rule(self, dim: str, axes: str | Sequence[str] | None) -> Layout:
        """A copy with ``dim`` split over ``axes`` (replacing its rule in place, else appended)."""
        return Layout(_replace(self.rules, dim, axes), self.storage, remat=self.remat)

    def without(self, dim: str) -> Layout:
        """A copy with ``dim`` unsplit."""
        return Layout(_replace(self.rules, dim, None), self.storage, remat=self.remat)

    def with_update_sharding(self, param: str, axes: str | Sequence[str] | None) -> Layout:
        """A copy whose weight update of ``param`` is sharded over ``axes`` (stage 1; None removes it)."""
        return self.with_storage(param, axes, 1)

    def with_storage(self, param: str, axes: str | Sequence[str] | None, stage: int = 1) -> Layout:
        """A copy storing ``param`` (or ``"*"``) split over ``axes`` at ZeRO ``stage`` (None removes it)."""
        entries = [(k, a, s) for k, a, s in self.storage if k != param]
        if axes is not None and not (isinstance(axes, (tuple, list)) and not axes):
            at = next((i for i, (k, _, _) in enumerate(self.storage) if k == param), len(entries))
            entries.insert(at, (param, axes, stage))
        return Layout(self.rules, entries, remat=self.remat)

    def with_remat(self, policy: str | None) -> Layout:
        """A copy with rematerialisation ``policy`` (``None``/``""``: as traced)."""
        return Layout(self.rules, self.storage, remat=policy or "")

    # -- validation ---------------------------------------------------------------
    def validate(self, graph: Any, mesh: Any) -> Layout:
        """Check this layout against a graph and mesh; return self or raise LayoutError.

        ``graph`` needs ``graph.dims`` (dim name -> size) and ``graph.tensors()``
        (objects with ``.name``, ``.shape`` (tuple of Dim) and ``.role``).
        """
        validate_layout(self, graph, mesh)
        return self

    # -- printing -------------------------------------------------------------------
    def __str__(self) -> str:
        text = _format_rules(self.rules)
        entries = [f"{key}:{','.join(axes) or WHOLE}" + (f"@{stage}" if stage > 1 else "")
                   for key, axes, stage in self.storage]
        if self.remat:
            entries.append(f"remat={self.remat}")
        if entries:
            text += "|" + ";".join(entries)
        return text

    def __repr__(self) -> str:
        return f"Layout({str(self)!r})"


_LAYOUT_EXAMPLE = "expected e.g. 'batch:rows;hidden:cols', {'batch': 'rows'} or [('batch', 'rows')]"


def _axes_tuple(axes: Any, key: str, what: str) -> tuple[str, ...]:
    """Normalise a rule's right-hand side: 'rows', 'rows,planes', ('rows', 'planes') or None."""
    if axes is None:
        return ()
    if isinstance(axes, str):
        axes = [a.strip() for a in axes.split(",")]
    elif not isinstance(axes, Iterable):
        raise LayoutError(f"mesh axes for {what} {key!r} must be a name or tuple of names, got {axes!r}")
    axes = tuple(axes)
    for a in axes:
        check_name(a, f"mesh axis in the rule for {what} {key!r}")
    for a in set(axes):
        if axes.count(a) > 1:
            raise LayoutError(
                f"mesh axis {a!r} is repeated in the rule for {what} {key!r} ({','.join(axes)}); "
                "list each mesh axis at most once"
            )
    return axes


def _normalise_rules(spec: Any, what: str) -> Rules:
    """Turn any accepted rules form into ((name, axes), ...); reject duplicates."""
    if spec is None:
        return ()
    if isinstance(spec, str):
        items: list[Any] = []
        for part in spec.split(";"):
            part = part.strip()
            if not part:
                continue  # tolerate trailing/doubled ';'
            key, sep, axes = (s.strip() for s in part.partition(":"))
            if not sep or not axes:
                raise LayoutError(
                    f"cannot read rule {part!r}: expected '{what}:axis' or '{what}:axis1,axis2' "
                    "separated by ';', e.g. 'batch:rows;hidden:cols' (weight-update sharding after "
                    "'|', e.g. 'batch:rows|w:rows')"
                )
            items.append((key, axes))
    elif isinstance(spec, Mapping):
        items = list(spec.items())
    elif isinstance(spec, Iterable):
        items = []
        for item in spec:
            if isinstance(item, str):
                items.extend(_normalise_rules(item, what))
            elif isinstance(item, (tuple, list)) and len(item) == 2:
                items.append(tuple(item))
            else:
                raise LayoutError(f"cannot read rule {item!r}; {_LAYOUT_EXAMPLE}")
    else:
        raise LayoutError(f"cannot read a layout from {spec!r}; {_LAYOUT_EXAMPLE}")
    out: dict[str, tuple[str, ...]] = {}
    for key, axes in items:
        base, at, region = key.partition("@") if isinstance(key, str) and what == "dim" else (key, "", "")
        check_name(base, f"{what} name")
        if at and region not in REGIONS:
            raise LayoutError(f"rule {key!r}: unknown region {region!r}; regions are {', '.join(REGIONS)} "
                              f"(e.g. 'length@norm:x', sequence parallelism)")
        if key in out:
            raise LayoutError(
                f"{what} {key!r} has two rules ({','.join(out[key]) or '-'} and "
                f"{','.join(_axes_tuple(axes, key, what)) or '-'}); give each {what} one rule, "
                f"listing several axes as '{key}:rows,cols'"
            )
        out[key] = _axes_tuple(axes, key, what)
    # An explicit None/() means "unsplit", which is the same as having no rule.
    return tuple((k, v) for k, v in out.items() if v)


def _split_options(text: str) -> tuple[str, dict[str, str]]:
    """Split ``key=value`` options (``remat=full``) from a storage section's entries."""
    entries, options = [], {}
    for part in text.split(";"):
        if "=" in part:
            key, _, value = (x.strip() for x in part.partition("="))
            if key != "remat":
                raise LayoutError(f"unknown layout option {key!r} in {part.strip()!r}; the one option is "
                                  "'remat=full|dots|none'")
            options[key] = value
        else:
            entries.append(part)
    return ";".join(entries), options


def _normalise_storage(spec: Any) -> Storage:
    """Storage entries ``(param or "*", axes, stage)`` from ``"w:rows@3;*:rows"``, a mapping
    ``{param: axes}`` (stage 1) or ``{param: (axes, stage)}``, or ``(param, axes[, stage])``
    items; reject duplicates and unknown stages."""
    if spec is None:
        return ()
    items: list[tuple[str, Any, Any]] = []
    if isinstance(spec, str):
        for part in spec.split(";"):
            part = part.strip()
            if not part:
                continue
            key, sep, rest = (x.strip() for x in part.partition(":"))
            axes, at, stage = (x.strip() for x in rest.partition("@"))
            if not sep or not axes:
                raise LayoutError(
                    f"cannot read storage entry {part!r}: expected 'parameter:axis[@stage]' separated by "
                    "';' after the '|', e.g. 'batch:rows|w:rows' or 'batch:rows|*:rows@3' ('w:-': stored whole)")
            items.append((key, axes, stage if at else None))
    else:
        raw = list(spec.items()) if isinstance(spec, Mapping) else list(spec) if isinstance(spec, Iterable) else None
        if raw is None:
            raise LayoutError(f"cannot read storage sharding from {spec!r}; expected e.g. 'w:rows@3' or "
                              "{'w': 'rows'}")
        for item in raw:
            if isinstance(item, str):
                items.extend(_normalise_storage(item))
                continue
            if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
                raise LayoutError(f"cannot read storage entry {item!r}; expected (parameter, axes[, stage])")
            key, axes, *stage = item
            if not stage and isinstance(axes, (tuple, list)) and len(axes) == 2 and isinstance(axes[1], int) \
                    and not isinstance(axes[1], bool):
                axes, stage = axes[0], [axes[1]]  # {param: (axes, stage)}
            items.append((key, axes, stage[0] if stage else None))
    out: dict[str, tuple[tuple[str, ...], int]] = {}
    for key, axes, stage in items:
        if key != "*":
            check_name(key, "parameter name")
        if isinstance(axes, str) and "@" in axes:
            axes, _, stage = axes.partition("@")
        if key in out:
            raise LayoutError(
                f"parameter {key!r} has two rules (storage entries); give each parameter one entry, "
                f"listing several axes as '{key}:rows,cols'")
        if isinstance(axes, str) and axes.strip() == WHOLE:  # stored whole, whatever a '*' entry says
            if key == "*" or stage is not None:
                raise LayoutError(
                    f"storage entry '{key}:{WHOLE}" + (f"@{stage}'" if stage is not None else "'")
                    + (": '*:-' would store every parameter not named otherwise whole, as no '*' entry does. "
                       "Fix: drop the entry." if key == "*" else
                       f": a parameter stored whole has no ZeRO stage. Fix: write '{key}:{WHOLE}'."))
            out[key] = ((), 0)
            continue
        st = 1 if stage is None else _STAGE_NAMES.get(str(stage).strip().lower())
        if st is None:
            raise LayoutError(f"storage entry for {key!r}: unknown stage {stage!r}; use 1, 2 or 3 (ZeRO stage; "
                              "'fsdp' = 3), e.g. 'w:rows@3'")
        ax = _axes_tuple(axes, key, "parameter")
        if ax:
            out[key] = (ax, st)
    return tuple((k, a, s) for k, (a, s) in out.items())


def _replace(rules: Rules, key: str, axes: Any) -> list[tuple[str, Any]]:
    new = [(k, axes if k == key else v) for k, v in rules]
    if key not in dict(rules):
        new.append((key, axes))
    return new


def _format_rules(rules: Rules) -> str:
    return ";".join(f"{key}:{','.join(axes)}" for key, axes in rules)


def _fmt_axes(axes: Sequence[str], mesh: Mesh) -> str:
    return "(" + ", ".join(f"{a}:{mesh.axis_size(a)}" for a in axes) + ")"


# --------------------------------------------------------------------- validation


def _clash(t: Any, layout: Layout) -> bool:
    axes = [a for d in t.shape for a in layout.axes_of(d.name)]
    return len(axes) != len(set(axes))


def _graph_tensors(graph: Any) -> list[Any]:
    tensors = graph.tensors
    return list(tensors() if callable(tensors) else tensors)


def validate_layout(layout: Any, graph: Any, mesh: Any) -> None:
    """Raise LayoutError unless ``layout`` can be applied to ``graph`` on ``mesh``.

    Checks, in order: mesh axes exist; dims exist in the graph; each dim's size
    is divisible by the product of its mesh axes; no tensor has two dims on one
    mesh axis (paper section 8.5); update-sharding entries name parameters and
    axes those parameters are not already split over.
    """
    layout, mesh = Layout.coerce(layout), Mesh.coerce(mesh)
    dims: dict[str, int] = dict(graph.dims)
    tensors = _graph_tensors(graph)

    for kind, rules in (("dim", layout.rules), ("parameter", layout.update_sharding)):
        for key, axes in rules:
            for a in axes:
                if a not in mesh:
                    raise LayoutError(
                        f"layout {str(layout)!r}: {kind} {key!r} is split over mesh axis {a!r}, "
                        f"which does not exist; mesh {mesh} has axes {list(mesh.axis_names)}."
                        + closest(a, mesh.axis_names)
                    )

    for key, axes in layout.rules:
        dim, at, region = key.partition("@")
        if dim not in dims:
            raise LayoutError(
                f"layout {str(layout)!r} has a rule for dim {dim!r}, which no tensor of the graph "
                f"has; known dims: {sorted(dims)}." + closest(dim, dims)
            )
        main = layout.axes_of(dim)
        if at and not set(main) <= set(axes):
            raise LayoutError(
                f"layout {str(layout)!r}: rule {key!r} splits {dim!r} over {','.join(axes)} in the {region} "
                f"region, without its own axes {','.join(main)}; a region adds axes to a dim. Fix: "
                f"'{key}:{','.join(dict.fromkeys((*main, *axes)))}'.")

    for key, axes in layout.rules:
        dim = key.partition("@")[0]
        size, n = dims[dim], math.prod(mesh.axis_size(a) for a in axes)
        if size % n:
            example = next((t for t in tensors if any(d.name == dim for d in t.shape)), None)
            where = f" (e.g. tensor {example.name!r} {list(example.shape)})" if example else ""
            # Suggest the largest single axis that divides the dim, as a ready-to-use rule.
            fits = sorted((s, a) for a, s in mesh if size % s == 0 and s > 1)
            fix = (f"split {dim!r} over a mesh axis whose size divides {size}, e.g. "
                   f"{str(layout.with_rule(dim, fits[-1][1]))!r}, " if fits else "")
            raise LayoutError(
                f"layout {str(layout)!r}: dim {dim!r}{where} has size {size}, which is not divisible by "
                f"{n}, the product of its mesh axes {_fmt_axes(axes, mesh)}. Fix: {fix}leave {dim!r} "
                f"unsplit, or change the size of {dim!r} to a multiple of {n}."
            )

    # Name the most recognisable offender: a user-named tensor (an argument, or one named
    # with checkpoint_name/autolayout.named) before auto-named intermediates like 'add_3'.
    def _auto(name: str) -> bool:
        base, _, tail = name.rpartition("_")
        return bool(base) and tail.isdigit()

    offenders = [t for t in tensors if _clash(t, layout)]
    for t in sorted(offenders, key=lambda t: _auto(t.name))[:1]:
        others = len(offenders) - 1
        owner: dict[str, str] = {}
        for d in t.shape:
            for a in layout.axes_of(d.name):
                if a not in owner:
                    owner[a] = d.name
                    continue
                first = owner[a]
                used = {x for dd in t.shape for x in layout.axes_of(dd.name)}
                free = [m for m, s in mesh if m not in used and dims.get(d.name, d.size) % s == 0]
                # Prefer an axis no rule uses yet, so the suggestion does not clash elsewhere.
                free.sort(key=lambda m: m in layout.mesh_axes())
                if free:
                    fix = (f"split one of them over a different mesh axis, e.g. "
                           f"{str(layout.with_rule(d.name, free[0]))!r}, or leave one unsplit")
                else:
                    fix = (f"split one of them over a different mesh axis (mesh {mesh} has no free "
                           f"axis for this tensor), or leave one unsplit, e.g. {str(layout.without(d.name))!r}")
                also = f" (and {others} other tensor{'s' if others > 1 else ''})" if others else ""
                raise LayoutError(
                    f"illegal layout {str(layout)!r}: tensor {t.name!r} {list(t.shape)}{also} would have two "
                    f"dims, {first!r} and {d.name!r}, split over the same mesh axis {a!r}; a mesh axis "
                    f"may split at most one dim of a tensor (Mesh-TensorFlow section 8.5). Fix: {fix}."
                )

    by_name = {t.name: t for t in tensors}
    for param, axes in layout.update_sharding:
        if param == "*":
            continue  # applies to each parameter on the axes it allows (costmodel.plan)
        t = by_name.get(param)
        if t is None or getattr(t, "role", None) != "param":
            params = sorted(n for n, x in by_name.items() if getattr(x, "role", None) == "param")
            what = "is not a tensor of the graph" if t is None else f"is a tensor with role {t.role!r}"
            raise LayoutError(
                f"layout {str(layout)!r}: weight-update sharding names {param!r}, which {what}; "
                f"only parameters can have their update sharded. Parameters: {params}."
                + closest(param, params)
            )
        split = {a for d in t.shape for a in layout.axes_of(d.name)}
        for a in axes:
            if a in split:
                dim = next(d.name for d in t.shape if a in layout.axes_of(d.name))
                raise LayoutError(
                    f"layout {str(layout)!r}: weight-update sharding of parameter {param!r} over mesh "
                    f"axis {a!r}, but {param!r} is already split over {a!r} by its dim {dim!r}, so its "
                    f"update is already sharded there. Fix: drop {a!r} from the entry for {param!r} or "
                    "use an axis the parameter is replicated over."
                )
