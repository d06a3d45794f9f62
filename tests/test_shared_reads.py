"""One conversion for the ops of one computation that read a tensor in the same placement
(``sharing.shared_reads``): the plan converts it for the first reader and the others read that
copy, as XLA's CSE leaves one of identical collectives. References: the compiled program's
optimised HLO (XLA finds no identical all-gathers left to merge, and the count is the plan's),
the pre-optimisation HLO of a hand-written ``shard_map`` (XLA merges two identical all-gathers
there: the fact the rule rests on), and the outputs of ``jax.jit`` of the traced function.
"""
from __future__ import annotations

import collections
import sys
from functools import lru_cache
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from autolayout import execute, predict
from autolayout.costmodel.plan import plan
from autolayout.costmodel.sharing import shared_reads

from autolayout.exec import hlo

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import memory_vs_xla as bench  # noqa: E402


def test_xla_merges_identical_all_gathers_of_one_computation():
    """The fact behind the rule: two all-gathers of one operand over the same devices in one
    computation compile to one (XLA's CSE); over different devices they stay two."""
    mesh = jax.make_mesh((2, 4), ("a", "b"))

    def step(axes):
        def fn(w, x):  # the forward's and the backward's gather of a ZeRO-3 weight
            h = x @ jax.lax.all_gather(w, axes[0], tiled=True)
            return h @ jax.lax.all_gather(w, axes[1], tiled=True).T
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P(("a", "b")), P()), out_specs=P(),
                                     check_vma=False))

    counts = {}
    for axes in [(("a", "b"), ("a", "b")), (("a", "b"), ("b", "a"))]:
        f = step(axes)
        w = jax.device_put(jnp.ones((16, 16)), NamedSharding(mesh, P(("a", "b"))))
        x = jax.device_put(jnp.ones((4, 16)), NamedSharding(mesh, P()))
        lowered = f.lower(w, x)
        pre = hlo.parse_collectives(lowered.as_text(dialect="hlo"), 8)
        post = hlo.parse_collectives(lowered.compile().as_text(), 8)
        counts[axes[1]] = (sum(c.kind == "all-gather" for c in pre), sum(c.kind == "all-gather" for c in post))
    # (a, b) twice: one left; gathering over (b, a) the second time orders the blocks differently
    assert counts == {("a", "b"): (2, 1), ("b", "a"): (2, 2)}, counts


CASES = [  # (model in bench.CASES, ZeRO-3 layout, all-gathers the plan shares)
    ("mlp-train", "batch:data,model|*:data,model@3", 2),  # w and v: forward and input-gradient dots
    ("equinox_block-donated", "batch:data;heads:model;mlp:model|*:data@3", 7),  # every weight of the block
    ("linen_gpt-donated", "batch:data;heads:model;mlp:model|*:data@3", 10),  # 7 in the backward scan's body
]


@lru_cache(maxsize=None)
def built(model):
    return bench.CASES[model][0]()


@pytest.mark.parametrize("model,layout,shared", CASES, ids=[c[0] for c in CASES])
def test_plan_makes_each_all_gather_once_as_xla_does(model, layout, shared):
    g, args = built(model)
    p = plan(g, bench.MESH, layout)
    assert sum(len(o.shared) for o in p.ops.values()) == shared
    ex = execute(g, bench.MESH, layout, args=args, repeats=1, compiler_options=bench.FAST)
    assert ex.collectives_match, ex.collective_diff()  # the lowering makes them once too
    assert ex.max_abs_error < 1e-4, ex.max_abs_error  # against jax.jit of the traced step
    kinds = collections.Counter(c.kind for c in ex.optimized_collectives)
    assert kinds["all-gather"] == sum(c.kind == "all-gather" for c in ex.predicted.collectives), (kinds, layout)


def test_shared_copy_is_held_from_first_to_last_reader():
    """By hand, the mlp's ZeRO-3 step: v (hidden x io) is read by the forward's second dot and
    the backward's first; the plan gathers it once, for the first, and the memory model holds the
    gathered copy from the start of the step (v is a parameter: XLA's breadth-first schedule runs
    its all-gather first, sharing._ready_at) to the last reader (positions of the schedule), with
    the bytes of the whole v."""
    g, _ = built("mlp-train")
    sharing, spans = shared_reads(g)
    units = list(g.schedule)
    fwd = next(n for n in units if isinstance(n, str) and g.op(n).kind == "einsum" and "v" in g.op(n).inputs)
    bwd = [n for n in units if isinstance(n, str) and "v" in g.op(n).inputs and g.op(n).kind == "einsum" and n != fwd]
    assert sharing[(bwd[0], "v")] == fwd
    assert (fwd, "v", 0, units.index(bwd[-1])) in spans[None]
    p = plan(g, bench.MESH, "batch:data,model|*:data,model@3")
    v = g.tensor("v")
    assert p.ops[fwd].span_bytes == {"v": v.nbytes}  # gathered whole: the layout leaves v's dims unsplit
    assert p.ops[bwd[0]].shared == {"v": fwd} and "v" not in p.ops[bwd[0]].conversions
    c = predict(g, bench.MESH, "batch:data,model|*:data,model@3")
    gathers = [x for x in c.collectives if x.kind == "all-gather" and x.tensor == "v"]
    assert [x.op for x in gathers] == [fwd]


def test_sharer_without_its_providers_copy_is_a_lowering_error():
    """A plan whose provider holds no converted copy for its sharers (``OpPlan.span_bytes``
    emptied by hand, as a planner bug would leave it) fails lowering with a named error, not a
    bare KeyError."""
    import dataclasses

    from autolayout.exec.lower import LoweringError, ShardProgram
    from autolayout.exec.runner import jax_mesh

    g, _ = built("mlp-train")
    layout = "batch:data,model|*:data,model@3"
    p = plan(g, bench.MESH, layout)
    fwd = next(o for o, op in p.ops.items() if op.span_bytes.get("v"))
    ops = dict(p.ops)
    ops[fwd] = dataclasses.replace(ops[fwd], span_bytes={})
    prog = ShardProgram(dataclasses.replace(p, ops=ops))
    _, jmesh = jax_mesh(p.mesh, None)
    body = jax.shard_map(prog.body, mesh=jmesh, in_specs=prog.in_specs, out_specs=prog.out_specs)
    args = [jnp.zeros([d.size for d in g.tensor(n).shape], g.tensor(n).dtype) for n in g.input_names]
    with pytest.raises(LoweringError, match=rf"reads 'v' from the converted copy of op '{fwd}'"):
        jax.eval_shape(body, *args)
