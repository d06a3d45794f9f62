"""Build the notebooks in this directory from the cell lists below (nbformat).

    python notebooks/build.py            # write explore_layouts.ipynb, bring_your_own_model.ipynb
    python notebooks/build.py --execute  # ... and run them (nbclient), keeping the outputs

The notebooks are generated, never edited by hand: change a cell here and rebuild.
tests/test_notebooks.py executes every notebook headlessly so they never rot.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

SETUP = '''\
import os

# 8 virtual CPU devices, so sharded programs run on any machine. This must happen before
# jax starts; on a TPU or GPU host the accelerators are used when there are enough of them.
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax
import autolayout
from autolayout import models
from autolayout.reporting import plots
from autolayout.reporting.devices import devices_for
from IPython.display import Image, display

MESH = "rows:2,cols:4"
devices, note = devices_for(8)   # the default backend's devices if it has 8, else the CPU ones
print(len(devices), devices[0].platform, "devices", note)'''


def explore_layouts() -> list:
    md, code = new_markdown_cell, new_code_cell
    return [
        md("# Explore layouts\n\n"
           "Trace a JAX training step into a named-dimension graph, compare layouts with the cost model, "
           "let CP-SAT find the fastest one, then run it on 8 devices and check the prediction.\n\n"
           "A *layout* maps tensor dimension names to mesh axes: `batch:rows;d_ff:cols` splits every tensor's "
           "`batch` dimension over the mesh's `rows` and `d_ff` over `cols`. Layouts never change results, "
           "only speed and memory."),
        code(SETUP),
        md("## 1. Trace\n\nThe built-in transformer LM (`autolayout.models.transformer_lm`), one Adam step, at the "
           "size you would train (for the cost model and the search) and at a size this machine runs (for "
           "validation). Tracing uses `jax.ShapeDtypeStruct`s: nothing is allocated, and layers run under "
           "`lax.scan`, so the graph does not grow with depth."),
        code('big = models.transformer_lm(d_model=1024, d_ff=4096, heads=16, d_kv=64, n_layers=12, vocab=32768,\n'
             '                            batch=64, length=1024, param_dtype="bfloat16")\n'
             'small = models.transformer_lm(d_model=64, d_ff=256, heads=4, d_kv=16, n_layers=2, vocab=256,\n'
             '                              batch=16, length=32)\n'
             'print(big.summary())'),
        md("## 2. Compare layouts\n\n`autolayout.predict` prices a layout per device for a hardware profile "
           "(here an 8-chip TPU v4 slice; `autolayout.known_hardware()` lists the profiles). No device is needed: "
           "every time and memory figure in this section and the next is a **prediction for TPU v4 chips**, per "
           "chip and per training step, not something measured on this machine. `DOES NOT FIT` means the layout "
           "needs more memory per chip than a TPU v4 has (32 GiB)."),
        code('layouts = {\n'
             '    "data-parallel": "batch:rows,cols",\n'
             '    "model-parallel": "heads:cols;d_ff:cols;vocab:cols",\n'
             '    "2-D (paper §9)": "batch:rows;heads:cols;d_ff:cols;vocab:cols",\n'
             '    "replicated": "",\n'
             '}\n'
             'costs = {name: autolayout.predict(big, MESH, lay, hardware="tpu-v4") for name, lay in layouts.items()}\n'
             'for name, c in costs.items():\n'
             '    print(f"{name:16s} {c.summary()}")'),
        code('names = list(costs)\n'
             'display(Image(plots.time_bars(names, [c.compute_s for c in costs.values()],\n'
             '                              [c.comm_s for c in costs.values()], title="Predicted step on tpu-v4")))\n'
             'display(Image(plots.memory_bars(names, [c.memory_bytes for c in costs.values()],\n'
             '                                autolayout.get_hardware("tpu-v4").hbm_bytes,\n'
             '                                [c.memory for c in costs.values()])))'),
        md("Where does the time go? Each `Cost` has a per-op table (`per_op`, one row per op, times in seconds) "
           "and the list of collectives, stated the way XLA's HLO states them. "
           "`autolayout.reporting.describe.describe_op` says what an op is; `count` is how often it runs per step "
           "(12 layers), `total_ms` its predicted time over all of them, `collectives` what each run communicates "
           "(bytes per chip over a mesh axis)."),
        code('import pandas as pd\n'
             'from autolayout.reporting.describe import describe_op\n\n'
             'pd.set_option("display.max_colwidth", 100)   # show op descriptions in full\n'
             'c = costs["2-D (paper §9)"]\n'
             'top = c.per_op.sort_values("total_s", ascending=False).head(8)\n'
             'top.assign(op=[describe_op(big, n) for n in top.op], total_ms=top.total_s * 1e3)[\n'
             '    ["op", "count", "local_shape", "total_ms", "collectives"]]'),
        code('print(c.collectives[:3])   # the first three collectives: kind(bytes per device over axis[group size]) x runs'),
        md("## 3. Search\n\n`autolayout.search` builds a CP-SAT model that is exact with respect to the cost model "
           "(its objective is `predict`'s time) and may also shard weight updates (Xu et al. 2020)."),
        code('result = autolayout.search(big, MESH, hardware="tpu-v4")\n'
             'print(result.summary())\n'
             'print(f"{costs[\'2-D (paper §9)\'].time_s / result.cost.time_s:.2f}x faster than the paper\'s 2-D layout")'),
        md("Memory is a constraint (default: the device's HBM). When no layout fits, the search says how much "
           "the leanest layout needs, which layout that is, and what fills the device there (here with every "
           "layer rematerialised, `remat=\"full\"`, and a 2 GiB limit):"),
        code('try:\n'
             '    autolayout.search(big, MESH, hardware="tpu-v4", memory_limit="2GiB", remat="full")\n'
             '    print("a layout fits in 2 GiB")\n'
             'except autolayout.SearchError as exc:   # a ValueError, like every autolayout error\n'
             '    print(exc)'),
        md("## 4. Execute and validate\n\nLayouts never change results, so the layout chosen for the TPU can be "
           "checked here on the small model: run it as one `jax.shard_map` program on the local devices, compare "
           "its outputs with the unsharded step and its compiled collectives with the predicted ones (kind, "
           "bytes, group size).\n\n"
           "The times printed here are of a **different model on a different machine** from section 2: the small "
           "transformer on 8 *virtual* CPU devices that share this machine's cores. To compare like with like, "
           "`execute` prices its prediction with a profile of these devices — here one measured by "
           "`autolayout.calibrate` (a few seconds) — never with the TPU profile. Expect the measured time to be "
           "within a small factor of that prediction, not equal: the calibration is quick and other processes share "
           "the cores."),
        code('hw_here = autolayout.calibrate(MESH, quick=True, devices=devices)   # this machine\'s profile\n'
             'ex = autolayout.execute(small, MESH, result.layout, devices=devices, repeats=3, hardware=hw_here)\n'
             'print(ex.summary())\n'
             'assert ex.collectives_match and ex.max_rel_error < 1e-4\n'
             'ex.comparison'),
        md("How to read `comparison` (all per device, one training step): *predicted* is the cost model with the "
           "calibrated profile, *compiled* is XLA's own account of the compiled program, *measured* the median "
           "timed step. The collectives rows must match exactly (ratio 1). XLA's `flops per device` counts the body "
           "of a `while` loop once, so with the layers under `lax.scan` its figure is below ours (ratio < 1) by "
           "about the layers' share; `memory bytes per device` is XLA's peak of the compiled program against our "
           "liveness sweep."),
        md("Next: `autolayout.report(graph, MESH, layouts, out=...)` writes all of this as an HTML + Markdown "
           "report (see `bring_your_own_model.ipynb`), and `autolayout demo` runs the whole pipeline from the "
           "command line."),
    ]


def bring_your_own_model() -> list:
    md, code = new_markdown_cell, new_code_cell
    return [
        md("# Bring your own model\n\n"
           "Any JAX function can be traced: name the axes of its arguments, and autolayout infers the names of "
           "every other axis (docs/DESIGN.md §3 in the repository). Then search its layout, run it, and write a report."),
        code(SETUP),
        md("## 1. A plain JAX model\n\nA two-layer regression network with GELU, trained with Adam. "
           "`autolayout.train_step` wraps the loss into `(params, opt_state, batch) -> (params, opt_state, loss)` "
           "and names the gradients so weight updates can be sharded."),
        code('import jax.numpy as jnp\n\n'
             'def loss_fn(params, batch):\n'
             '    h = jax.nn.gelu(batch["x"] @ params["w1"] + params["b1"])\n'
             '    y = h @ params["w2"]\n'
             '    return jnp.mean((y - batch["y"]) ** 2)\n\n'
             'def make_graph(B, F, H, O):\n'
             '    """Trace one Adam step at these sizes (ShapeDtypeStructs: nothing is allocated)."""\n'
             '    f32 = jnp.float32\n'
             '    params = {"w1": jax.ShapeDtypeStruct((F, H), f32), "b1": jax.ShapeDtypeStruct((H,), f32),\n'
             '              "w2": jax.ShapeDtypeStruct((H, O), f32)}\n'
             '    batch = {"x": jax.ShapeDtypeStruct((B, F), f32), "y": jax.ShapeDtypeStruct((B, O), f32)}\n'
             '    step = autolayout.train_step(loss_fn, "adam", 1e-3)\n'
             '    return autolayout.trace(\n'
             '        step, params, autolayout.init_opt_state("adam", params), batch,\n'
             '        # one name per axis; a prefix of the argument tree is enough (None: infer)\n'
             '        dims=({"w1": "features hidden", "b1": "hidden", "w2": "hidden out"}, None,\n'
             '              {"x": "batch features", "y": "batch out"}),\n'
             '        roles=("param", "opt_state", "input"), name="regressor")\n\n'
             'graph = make_graph(B=16384, F=4096, H=16384, O=4096)   # the size you would train\n'
             'small = make_graph(B=256, F=128, H=512, O=64)          # a size this machine runs\n'
             'print(graph.summary())'),
        md("## 2. The Flax pattern\n\nFlax is not a dependency of autolayout. With Flax, trace `model.apply` inside "
           "the loss and name the parameters with a tree shaped like the `params` collection:\n\n"
           "```python\n"
           "class MLP(nn.Module):\n"
           "    @nn.compact\n"
           "    def __call__(self, x):\n"
           "        h = nn.gelu(nn.Dense(H)(x))  # Dense_0: modules are numbered as created\n"
           "        return nn.Dense(O)(h)        # Dense_1\n\n"
           "model = MLP()\n"
           "params = jax.eval_shape(model.init, jax.random.PRNGKey(0), batch[\"x\"])[\"params\"]\n"
           "dims = {\"Dense_0\": {\"kernel\": \"features hidden\", \"bias\": \"hidden\"},\n"
           "        \"Dense_1\": {\"kernel\": \"hidden out\", \"bias\": \"out\"}}\n"
           "```\n\nThe next cell runs this when Flax is installed."),
        code('try:\n'
             '    import flax.linen as nn\n'
             'except ImportError:\n'
             '    nn = None\n'
             '    print("flax is not installed: skipping the Flax example (pip install flax to run it)")\n\n'
             'if nn is not None:\n'
             '    B, F, H, O = 256, 128, 512, 64\n'
             '    batch = {"x": jax.ShapeDtypeStruct((B, F), jnp.float32), "y": jax.ShapeDtypeStruct((B, O), jnp.float32)}\n\n'
             '    class MLP(nn.Module):\n'
             '        @nn.compact\n'
             '        def __call__(self, x):\n'
             '            h = nn.gelu(nn.Dense(H)(x))  # Dense_0: modules are numbered as created\n'
             '            return nn.Dense(O)(h)        # Dense_1\n\n'
             '    model = MLP()\n'
             '    flax_params = jax.eval_shape(model.init, jax.random.PRNGKey(0), batch["x"])["params"]\n'
             '    flax_step = autolayout.train_step(\n'
             '        lambda p, b: jnp.mean((model.apply({"params": p}, b["x"]) - b["y"]) ** 2), "adam", 1e-3)\n'
             '    flax_graph = autolayout.trace(\n'
             '        flax_step, flax_params, autolayout.init_opt_state("adam", flax_params), batch,\n'
             '        dims=({"Dense_0": {"kernel": "features hidden", "bias": "hidden"},\n'
             '               "Dense_1": {"kernel": "hidden out", "bias": "out"}}, None,\n'
             '              {"x": "batch features", "y": "batch out"}),\n'
             '        roles=("param", "opt_state", "input"))\n'
             '    print(flax_graph.summary())'),
        md("## 3. Find its layout\n\nFor a TPU v4 slice of 8 chips, and for a larger one (256 chips). The times and "
           "memory printed are predictions per TPU v4 chip and per training step of the large graph; nothing runs "
           "here."),
        code('for mesh in (MESH, "rows:16,cols:16"):\n'
             '    r = autolayout.search(graph, mesh, hardware="tpu-v4")\n'
             '    print(f"{mesh:16s} {str(r.layout) or \'(replicated)\'}")\n'
             '    print(" " * 17 + r.cost.summary())'),
        md("## 4. Run layouts here and check the predictions\n\nWith the small graph on the local devices and "
           "arguments of the traced structure (omit `args=` to draw random ones): each layout's outputs are "
           "compared with the unsharded step, its compiled collectives with the predicted ones, and the predicted "
           "times with the measured ones.\n\n"
           "These predictions are for **this machine** (a profile measured by `autolayout.calibrate` on its 8 "
           "virtual CPU devices), not for the TPU of section 3, and the last candidate is the best layout *for "
           "this machine*. Virtual devices share a few cores, so absolute times are noisy; what a layout choice "
           "needs is the order, which the chart's Spearman rank correlation measures (1 = same order)."),
        code('import numpy as np\n'
             'from autolayout.reporting.fmt import spearman\n\n'
             'def example_args(B, F, H, O, seed=0):\n'
             '    """Concrete arguments with the traced structure: (params, opt_state, batch)."""\n'
             '    rng = np.random.default_rng(seed)\n'
             '    p = {"w1": rng.standard_normal((F, H), np.float32) / np.sqrt(F), "b1": np.zeros(H, np.float32),\n'
             '         "w2": rng.standard_normal((H, O), np.float32) / np.sqrt(H)}\n'
             '    b = {"x": rng.standard_normal((B, F), np.float32), "y": rng.standard_normal((B, O), np.float32)}\n'
             '    return p, autolayout.init_opt_state("adam", p), b\n\n'
             'args = example_args(B=256, F=128, H=512, O=64)\n'
             'hw = autolayout.calibrate(MESH, quick=True, devices=devices)\n'
             'candidates = ["", "batch:rows,cols", "batch:rows;hidden:cols",\n'
             '              str(autolayout.layout(small, MESH, hardware=hw))]   # the best layout for this machine\n'
             'runs = [autolayout.execute(small, MESH, lay, args=args, hardware=hw, devices=devices, repeats=3)\n'
             '        for lay in candidates]\n'
             'print("on this machine, per step:   predicted (calibrated)   measured")\n'
             'for ex in runs:\n'
             '    print(f"{str(ex.layout)[:30] or \'(replicated)\':30s} {ex.predicted.time_s * 1e3:12.2f} ms {ex.step_time_s * 1e3:12.2f} ms"\n'
             '          f"   collectives {\'match\' if ex.collectives_match else \'MISMATCH\'}")\n'
             '# Adam\'s first step divides by sqrt(nu) ~ |gradient|, which magnifies float rounding: 1e-3\n'
             'assert all(ex.collectives_match and ex.max_rel_error < 1e-3 for ex in runs)\n'
             'rho = spearman([ex.predicted.time_s for ex in runs], [ex.step_time_s for ex in runs])\n'
             'display(Image(plots.scatter([ex.predicted.time_s for ex in runs], [ex.step_time_s for ex in runs],\n'
             '                            [str(ex.layout)[:30] or "(replicated)" for ex in runs], rho,\n'
             '                            title="This machine", xlabel="predicted (calibrated profile)")))'),
        md("## 5. A report\n\n`autolayout.report` writes `index.html` (self-contained), `report.md`, PNG charts "
           "and CSV tables: the layouts side by side and the search's result (it runs `autolayout.search` and adds "
           "its layout as `searched`; `search=False` turns that off). By default it also executes every layout on "
           "the local devices (`execute=True`, the slow part: compile and time each one, for a graph they can "
           "run); the large graph here is only predicted. Its first paragraph says which layout to use and why."),
        code('import tempfile\n\n'
             'rep = autolayout.report(graph, MESH, {"data-parallel": "batch:rows,cols", "2-D": "batch:rows;hidden:cols"},\n'
             '                        hardware="tpu-v4", execute=False, out=tempfile.mkdtemp())\n'
             'print(rep.intro)\n'
             'print(sorted(p.name for p in rep.path.iterdir()))'),
    ]


NOTEBOOKS = {"explore_layouts.ipynb": explore_layouts, "bring_your_own_model.ipynb": bring_your_own_model}


def build(execute: bool = False, timeout: int = 600) -> list[Path]:
    paths = []
    for name, cells in NOTEBOOKS.items():
        nb = new_notebook(cells=cells())
        for i, cell in enumerate(nb.cells):  # stable ids: rebuilding gives the same file
            cell["id"] = f"{Path(name).stem.replace('_', '-')}-{i:02d}"
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.metadata["language_info"] = {"name": "python"}
        path = HERE / name
        if execute:
            from nbclient import NotebookClient
            NotebookClient(nb, timeout=timeout, kernel_name="python3",
                           resources={"metadata": {"path": str(HERE)}}).execute()
        nbformat.validate(nb)
        nbformat.write(nb, path)
        paths.append(path)
    return paths


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--execute", action="store_true", help="run the notebooks and keep their outputs")
    args = parser.parse_args()
    for p in build(args.execute):
        print("wrote", p)
    sys.exit(0)
