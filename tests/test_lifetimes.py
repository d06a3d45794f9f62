"""Which operand an element-wise op writes over (``lifetimes.in_place_operand``) when the op's
dims are its operand's in another order: XLA computes the op in the operand's layout and leaves
the transpose to the dots that read it, so the buffer is shared, unless another reader or another
operand needs the other order. Checked against XLA's ``memory_analysis()`` and by hand.
"""
from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

import jax.numpy as jnp
import pytest

from autolayout import execute, models, trace
from autolayout.costmodel.lifetimes import gemm_prologues, in_place_operand, lifetimes, readers_of
from autolayout.costmodel.order import min_memory
from autolayout.costmodel.profiles import H200
from autolayout.fusion import reduction

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_report  # noqa: E402

B, D, F = 64, 8, 4096  # the [F, B] contraction and its transposed ReLU are 1 MiB each
F32 = 4


def _relu_of_transposed(x, w1, w2):
    y = jnp.einsum("bd,df->fb", x, w1)  # [F, B]
    return jnp.maximum(y.T, 0.0) @ w2  # the ReLU in [B, F], read by a dot


ARGS = (jnp.ones((B, D), jnp.float32), jnp.ones((D, F), jnp.float32), jnp.ones((F, D), jnp.float32))


def test_relu_of_a_transposed_contraction_writes_over_it_as_in_xla():
    """XLA's temp heap holds one 1 MiB buffer (the dot's output, then the ReLU over it); before this
    rule the model held both (2363392 bytes predicted)."""
    g = trace(_relu_of_transposed, *ARGS)
    relu, = [o for o in g.ops() if o.fn == "max"]
    assert [d.name for d in relu.output.shape] != [d.name for d in g.tensor(relu.inputs[0]).shape]
    assert in_place_operand(g, relu.name, readers_of(g)) == relu.inputs[0]
    ex = execute(g, "d:8", "", args=ARGS, repeats=1, reference=False)
    xla = ex.xla_memory
    assert xla["temp"] == B * F * F32
    args, out = (B * D + 2 * D * F) * F32, B * D * F32
    assert ex.predicted.memory_bytes == args + out + B * F * F32
    assert ex.predicted.memory_bytes == xla["argument"] + xla["output"] + xla["temp"] - xla["alias"]


def test_transposed_operand_keeps_its_buffer_where_the_op_is_read_by_reductions():
    """llama's causal-mask select of the transposed attention scores is read by the softmax's
    reductions, which need its own order: no in-place write (XLA's buffer assignment of the zoo
    llama forward pass, ``tests/test_memory_xla.py``: 0.94 of XLA's figure, 0.86 were it shared)."""
    g = models.llama(d_model=64, heads=8, kv_heads=4, d_kv=16, d_ff=192, n_layers=2, vocab=128, batch=8,
                     length=32, train=False)
    readers = readers_of(g)
    def transposed(op, t):
        a, b = list(map(str, g.tensor(t).shape)), list(map(str, op.output.shape))
        return a != b and sorted(a) == sorted(b)

    def sources(names):  # the materialised tensors an op reads, through element-wise ops fused into it
        for n in names:
            op = g.op(n)
            yield from (sources(op.inputs) if op.kind == "elementwise" and not op.materialised else (n,))

    masked = [(o, t) for o in g.ops() if o.fn == "select_n" and o.materialised
              for t in sources(o.inputs) if g.op(t).kind == "einsum" and transposed(o, t)]
    assert masked
    for op, src in masked:
        assert any(g.op(r).kind != "einsum" for r in readers[op.name])
        assert in_place_operand(g, op.name, readers) is None


def test_transposed_operand_keeps_its_buffer_where_another_operand_has_the_op_order():
    """The moe's ReLU backward ``select(w1 contraction > 0, dy contraction, 0)``: its two contractions
    have the same dims in different orders, so XLA transposes one inside the op (a copy fusion with
    a buffer of its own, ``copy_bitcast_fusion`` in the optimized HLO of the ZeRO-3 step of
    ``tests/test_memory_xla.py``): no in-place write over the transposed one."""
    g = models.moe(batch=8, length=32, d_model=64, d_ff=128, experts=8, capacity=8, train=True)
    readers = readers_of(g)
    op = next(o for o in g.ops() if o.fn == "select_n" and o.materialised
              and all(g.op(r).kind == "einsum" for r in readers[o.name]))
    reads = [i for i in op.inputs if g.op(i).kind == "einsum"] + [
        j for i in op.inputs if not g.op(i).materialised for j in g.op(i).inputs if g.op(j).kind == "einsum"]
    orders = {tuple(map(str, g.tensor(t).shape)) for t in reads}
    assert len(orders) == 2 and len({tuple(sorted(o)) for o in orders}) == 1
    assert in_place_operand(g, op.name, readers) is None


_GPU = Path(__file__).resolve().parents[1] / "reports" / "gpu"
_MLP_STEPS = ["mlp-large", "mlp-large-f32", "mlp-small", "mlp-large-mse", "mlp-large-f32-mse", "mlp-small-mse"]


def _hlo(name: str) -> str:
    """The committed compiled HLO of H200 step ``name`` (``reports/gpu``; ``-mse`` steps in the
    regression-loss archive)."""
    suffix = "_loss" if name.endswith("-mse") else ""
    with zipfile.ZipFile(_GPU / f"hlo{suffix}.zip") as z:
        return z.read(f"{name}.compiled.txt").decode()


def _step_graph(name: str):
    """The zoo graph of H200 step ``name`` at its measured sizes."""
    rows = {r["name"]: r for r in gpu_report.load(str(_GPU))[0]}
    rows.update({r["name"]: r for r in gpu_report._jsonl(str(_GPU), "measured_loss.jsonl")})
    return models.MODELS[rows[name]["model"]](**rows[name]["kwargs"])


def _xla_gpu_select_and_its_gradient(name: str) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """``((offset, start, end), (offset, start, end))`` of the ReLU backward select that XLA:GPU's
    reduce-select multi-output fusion writes and of the cuBLAS result it selects from (the output
    gradient), from the step's compiled HLO and H200 buffer assignment (``reports/gpu``)."""
    hlo = _hlo(name)
    suffix = "_loss" if name.endswith("-mse") else ""
    with zipfile.ZipFile(_GPU / f"buffers{suffix}.zip") as z:
        files = {n.rsplit("-", 1)[-1]: z.read(n).decode() for n in z.namelist() if n.startswith(name + "/")}
    ba, ranges = files["assignment.txt"], files["range.txt"]
    fusion = re.search(r"\n  %(\S+) = \(.*\) fusion\(([^)]*)\), kind=kInput, calls=%(fused_\w*reduce_select)\b", hlo)
    assert fusion, f"{name}: no reduce-select multi-output fusion"
    body = hlo[hlo.index(f"%{fusion.group(3)} ("):]
    body = body[:body.index("\n}")]
    select = re.search(r"%(select\S*) = \S+ select\(%\S+, %(\S+), ", body)
    param = int(re.search(rf"%{re.escape(select.group(2))} = \S+ parameter\((\d+)\)", body).group(1))
    root = re.search(r"ROOT %\S+ = .* tuple\(([^)]*)\)", body).group(1)
    index = [o.strip().lstrip("%") for o in root.split(",")].index(select.group(1))
    operand = [o.strip().lstrip("%") for o in fusion.group(2).split(",")][param]
    gte = re.search(rf"%{re.escape(operand)} = \S+ get-tuple-element\(%(\S+)\), index=(\d+)", hlo)
    assert re.search(rf"%{re.escape(gte.group(1))} = .* custom-call\(", hlo), (name, operand)

    def where(value: str) -> tuple[int, int, int]:
        offset = re.search(rf"value: <\d+ {re.escape(value)} @\d+> \(size=\d+,offset=(\d+)\)", ba)
        live = re.search(rf"^\s+{re.escape(value)}:(\d+)-(\d+)$", ranges, re.M)
        return int(offset.group(1)), int(live.group(1)), int(live.group(2))

    return where(f"{fusion.group(1)}{{{index}}}"), where(f"{gte.group(1)}{{{gte.group(2)}}}")


@pytest.mark.parametrize("name", _MLP_STEPS)
def test_xla_gpu_writes_a_select_its_reduction_reads_into_a_buffer_of_its_own(name):
    """XLA:GPU fuses the ReLU's backward select into the bias gradient's reduction as a second
    output (``input_reduce_select_fusion``): the output gradient it reads last is still live at
    the fusion, at another offset (XLA's buffer assignment on the H200). On XLA:GPU's memory
    scheduler's order the model writes no select that a reduction reads over its operand; on the
    traced order (the rule applies to the GPU view only) it writes this one over the gradient."""
    (sel_at, sel_start, _), (grad_at, grad_start, grad_end) = _xla_gpu_select_and_its_gradient(name)
    assert grad_start < sel_start <= grad_end and sel_at != grad_at

    g = _step_graph(name)
    view = min_memory(g, H200)
    selects = [o.name for o in g.ops() if o.fn == "select_n" and o.materialised
               and any(reduction(g.op(r)) for r in readers_of(g)[o.name])]
    assert selects
    for s in selects:
        assert in_place_operand(view, s, readers_of(view)) is None
        src = in_place_operand(g, s, readers_of(g))
        assert src is not None and g.op(src).kind == "einsum"


def _entry_and_computations(hlo: str) -> tuple[list[str], dict[str, str]]:
    comps = {m.group(1): m.group(2) for m in re.finditer(r"\n(?:ENTRY )?%(\S+) \([^\n]*\{\n(.*?)\n\}", hlo, re.S)}
    entry = comps[re.search(r"\nENTRY %(\S+) ", hlo).group(1)]
    return [line for line in entry.split("\n") if re.match(r"\s+(?:ROOT )?%\S+ = ", line)], comps


@pytest.mark.parametrize("name", ["mlp-small", "moe", "mlp-large-mse", "moe-mse", "mlp-large-f32-mse"])
def test_xla_gpu_computes_a_relu_read_by_matmuls_in_each_of_them(name):
    """XLA:GPU holds no ReLU between the matmuls that read it: every fusion computing it
    (``maximum``) is a Triton GEMM fusion computing it inside, or a loop fusion read by one cuBLAS
    call (``__cublas$lt$matmul``), right before it in all but one case (the compiled HLO of
    ``reports/gpu``). On XLA:GPU's memory-scheduler view the model writes the ReLU nowhere
    (``lifetimes.gemm_prologues``: an empty life, its operand live to its last matmul); on the
    traced order it holds it from the forward matmul to the weight gradient."""
    entry, comps = _entry_and_computations(_hlo(name))
    names = [re.match(r"\s+(?:ROOT )?%(\S+) = ", line).group(1) for line in entry]
    relus, right_before = 0, 0
    for line in entry:
        m = re.match(r"\s+%(\S+) = .* fusion\(.*?\), kind=(k\w+), calls=%([^,\s]+)", line)
        if not m or " maximum(" not in comps[m.group(3)]:
            continue
        relus += 1
        users = [u for u in entry if re.search(rf"[(,] ?%{re.escape(m.group(1))}[,)]", u)]
        if m.group(2) == "kCustom":
            assert "gemm_fusion" in m.group(1), (name, m.group(1))
            continue
        assert len(users) == 1 and '"__cublas$lt$matmul"' in users[0], (name, m.group(1), users)
        user = re.match(r"\s+(?:ROOT )?%(\S+) = ", users[0]).group(1)
        right_before += names.index(user) == names.index(m.group(1)) + 1
    assert relus >= 2 and right_before >= relus - 2

    g = _step_graph(name)
    relu = [o.name for o in g.ops() if o.fn == "max" and o.materialised
            and all(g.op(c).kind == "einsum" for c in g.consumers(o.name))]
    assert len(relu) == 1 and relu[0] in gemm_prologues(g)
    (relu,) = relu
    view = min_memory(g, H200)
    units, alloc, free = lifetimes(view)
    readers = [units.index(c) if c in units else next(i for i, u in enumerate(units) if c in getattr(u, "body", ()))
               for c in g.consumers(relu)]
    assert free[relu] < alloc[relu]  # no buffer
    (operand,) = g.op(relu).inputs
    assert free[operand] >= max(readers)  # read where each matmul recomputes the ReLU
    _, alloc_t, free_t = lifetimes(g)  # the traced order: held from the forward matmul on
    assert free_t[relu] - alloc_t[relu] >= 1
