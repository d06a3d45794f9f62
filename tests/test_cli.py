"""The ``autolayout`` command line: every subcommand at small sizes, --json, one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from autolayout import cli

MLP = ["mlp", "--batch", "64", "--d-io", "32", "--d-hidden", "128"]
MESH = ["--mesh", "rows:2,cols:4"]
SUBCOMMANDS = ["demo", "predict", "search", "execute", "report", "calibrate", "table1", "hardware"]


def run(args: list[str], capsys) -> tuple[int, str, str]:
    """``(exit code, stdout, stderr)`` of ``autolayout ARGS`` run in-process."""
    try:
        code = cli.main(args)
    except SystemExit as exc:  # argparse: --help (0) and usage errors (2)
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def run_json(args: list[str], capsys) -> object:
    code, out, err = run(args + ["--json"], capsys)
    assert code == 0, err
    return json.loads(out)


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code not in (0, None)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("autolayout")
    assert "error:" in lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# ------------------------------------------------------------------------------ help
@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_help_with_examples(command, capsys):
    code, out, _ = run([command, "--help"], capsys)
    assert code == 0
    assert f"autolayout {command}" in out and "examples:" in out


def test_model_commands_list_model_options_in_help(capsys):
    _, out, _ = run(["search", "--help"], capsys)
    assert "--d-model=64" in out and "transformer_lm" in out and "--d-hidden=2048" in out


def test_top_level_help_and_version(capsys):
    code, out, _ = run(["--help"], capsys)
    assert code == 0 and all(c in out for c in SUBCOMMANDS)
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out.startswith("autolayout ")


# --------------------------------------------------------------------------- predict
def test_predict_json_and_table(capsys):
    data = run_json(["predict", *MLP, *MESH, "--layout", "batch:rows;hidden:cols"], capsys)
    assert data["layout"] == "batch:rows;hidden:cols" and data["mesh"] == "rows:2,cols:4"
    # the step waits for compute and the collectives that do not overlap it (overlap.py)
    assert data["time_s"] == pytest.approx(data["compute_s"] + data["exposed_comm_s"])
    hidden = data["comm_s"] - data["exposed_comm_s"]
    assert -1e-15 <= hidden <= data["overlapped_comm_s"] * (1 + 1e-9) + 1e-15
    assert data["overlapped_comm_s"] == pytest.approx(
        sum(c["time_s"] * c["count"] for c in data["collectives"] if c["overlapped"]))
    assert data["hardware"] == "tpu-v3" and data["collectives"]
    code, out, _ = run(["predict", *MLP, *MESH, "--layout", "batch:rows", "--layout", "hidden:cols",
                        "--hardware", "tpu-v4", "--per-op", "3"], capsys)
    assert code == 0 and "batch:rows" in out and "hidden:cols" in out and "slowest ops" in out


def test_predict_lists_the_buffers_at_the_memory_peak(capsys):
    # the replicated MLP forward pass at its second matmul (tests/test_memory_peak.py counts it by
    # hand): the first dot's [64, 128] float32 output (32 KiB), then the two 32 x 128 weights (16 KiB each)
    args = ["predict", "mlp", "--batch", "64", "--d-io", "32", "--d-hidden", "128", "--no-train", *MESH,
            "--hardware", "cpu"]
    data = run_json(args, capsys)
    assert sum(b["bytes"] for b in data["peak_buffers"]) == data["memory_bytes"]
    top = [(b["name"], b["bytes"]) for b in data["peak_buffers"][:3]]
    assert top[0] == ("dot_general_0", 64 * 128 * 4) and sorted(top[1:]) == [("v", 32 * 128 * 4), ("w", 32 * 128 * 4)]
    code, out, _ = run(args + ["--peak", "2"], capsys)
    assert code == 0 and "largest buffers live at the memory peak" in out
    names = [line.split()[0] for line in out.split("memory peak")[1].splitlines()[3:] if line.strip()]
    assert names[0] == "dot_general_0" and len(names) == 2 and names[1] in ("v", "w")


def test_predict_several_layouts_json_is_a_list(capsys):
    data = run_json(["predict", *MLP, *MESH, "--layout", "batch:rows", "--layout", ""], capsys)
    assert [d["layout"] for d in data] == ["batch:rows", ""]


def test_model_sizes_come_from_the_zoo_signature(capsys):
    data = run_json(["predict", "transformer_lm", "--d-model", "32", "--d-ff", "64", "--heads", "2", "--d-kv", "8",
                     "--n-layers", "1", "--vocab", "64", "--batch", "8", "--length", "8", "--no-train",
                     "--mesh", "all:2", "--layout", "batch:all"], capsys)
    assert data["layout"] == "batch:all"


# ---------------------------------------------------------------------------- search
def test_search_json(capsys):
    data = run_json(["search", "mlp", "--batch", "4096", "--d-io", "512", "--d-hidden", "2048", "--mesh",
                     "rows:4,cols:2", "--hardware", "tpu-v4", "--memory-limit", "16GiB"], capsys)
    assert data["status"] == "OPTIMAL" and data["gap"] == 0
    assert data["cost"]["time_s"] == pytest.approx(data["objective_s"], rel=1e-3)
    assert data["num_variables"] > 0


LLAMA_7B = ["llama", "--d-model", "4096", "--heads", "32", "--kv-heads", "32", "--d-kv", "128", "--d-ff", "11008",
            "--n-layers", "32", "--vocab", "32000", "--batch", "512", "--length", "2048", "--compute-dtype", "bfloat16",
            "--mesh", "data:16,model:16", "--hardware", "tpu-v4"]


def test_search_prints_the_layout_with_a_star_entry(capsys):
    """A LLaMA-2 7B on 256 v4 chips is stored FSDP-sharded: the printed layout writes the entry
    most parameters share once (``compact_layout``), and it predicts as the one the search found."""
    data = run_json(["search", *LLAMA_7B], capsys)
    long, short = data["layout"], data["compact_layout"]
    assert "|*:" in short and "|*:" not in long and len(short) < len(long) / 2
    code, out, _ = run(["search", *LLAMA_7B], capsys)
    assert code == 0 and f"\n  {short}\n" in out
    named, starred = (run_json(["predict", *LLAMA_7B, "--layout", lay], capsys) for lay in (long, short))
    for key in ("time_s", "memory_bytes", "comm_bytes", "flops"):
        assert named[key] == starred[key] == data["cost"][key], key


def test_search_over_mesh_shapes(capsys):
    data = run_json(["search", *MLP, "--num-devices", "8", "--no-weight-update-sharding"], capsys)
    assert {m["mesh"] for m in data["meshes"]} == {"all:8", "rows:4,cols:2", "rows:2,cols:2,planes:2"}
    code, out, _ = run(["search", *MLP, "--num-devices", "8"], capsys)
    assert code == 0 and "meshes tried" in out and "best layout" in out


# ------------------------------------------------------------------ execute, report
def test_execute_json_validates(capsys):
    data = run_json(["execute", *MLP, *MESH, "--layout", "batch:rows;hidden:cols", "--repeats", "1", "--strict"],
                    capsys)
    assert data["collectives_match"] is True and data["ok"] is True
    assert data["max_abs_error"] < 1e-4 and data["step_time_s"] > 0
    assert {row["quantity"] for row in data["comparison"]} >= {"step time s", "flops per device"}


def test_execute_table(capsys):
    code, out, _ = run(["execute", *MLP, *MESH, "--layout", "hidden:cols", "--repeats", "1"], capsys)
    assert code == 0 and "collectives: match" in out and "max abs error" in out


def test_report_writes_html(tmp_path, capsys):
    out = tmp_path / "rep"
    data = run_json(["report", *MLP, *MESH, "--layouts", "batch:rows,cols", "batch:rows;hidden:cols", "--out",
                     str(out), "--repeats", "1", "--no-scaling", "--quiet"], capsys)
    assert (out / "index.html").is_file() and (out / "report.md").is_file()
    assert data["index"] == str(out / "index.html")
    assert len(data["layouts"]) >= 2 and data["spearman"] is not None


# ------------------------------------------------------------- calibrate, table1, hw
def test_calibrate_writes_a_profile_predict_can_use(tmp_path, capsys):
    profile = tmp_path / "new" / "profile.json"  # a missing folder is created
    data = run_json(["calibrate", *MESH, "--quick", "--out", str(profile)], capsys)
    assert profile.is_file() and data["peak_flops"]["float32"] > 0
    data = run_json(["predict", *MLP, *MESH, "--layout", "batch:rows", "--hardware", str(profile)], capsys)
    assert data["hardware"].startswith("calibrated")


def test_table1(capsys):
    rows = run_json(["table1", "--batch", "256", "--d-io", "64", "--d-hidden", "256"], capsys)
    assert [r["layout"] for r in rows][1:3] == ["batch:all", "hidden:all"]
    assert all(r["comp_ratio"] == pytest.approx(12) for r in rows)
    code, out, _ = run(["table1"], capsys)
    assert code == 0 and "Table 1" in out


def test_hardware_list_and_show(capsys):
    code, out, _ = run(["hardware"], capsys)
    assert code == 0 and "tpu-v4" in out and "h100" in out
    data = run_json(["hardware", "v5p"], capsys)
    assert data["name"] == "tpu-v5p"


def test_demo_without_execution(tmp_path, capsys):
    code, out, _ = run(["demo", "--no-execute", "--no-calibrate", "--hardware", "tpu-v4", "--out", str(tmp_path)],
                       capsys)
    assert code == 0
    assert "5. Search" in out and "skipped (--no-execute)" in out
    assert (tmp_path / "index.html").is_file()


# ------------------------------------------------------------------------- --out
def _refuse_work(monkeypatch):
    """Stand in for the demo, the report and calibration: any work before --out is checked fails the test."""
    import types

    import autolayout.exec

    def ran(*args, **kwargs):
        raise AssertionError("the command did its work before checking --out")

    monkeypatch.setitem(sys.modules, "autolayout.demo", types.SimpleNamespace(run=ran))
    monkeypatch.setattr(sys.modules["autolayout.report"], "report", ran)  # the package, not the function
    monkeypatch.setattr(autolayout.exec, "calibrate", ran)
    monkeypatch.setattr(cli, "_graph", ran)


@pytest.mark.parametrize("command, where, needles", [
    (["report", *MLP, *MESH, "--layouts", "batch:rows", "--no-execute", "--no-search"], "file",
     ["is an existing file, not a directory", "give a directory path", "remove the file"]),
    (["report", *MLP, *MESH, "--layouts", "batch:rows", "--no-execute", "--no-search"], "proc",
     ["cannot create it or write in it", "give a directory you can write to"]),
    (["report", *MLP, *MESH, "--layouts", "batch:rows"], "under-file",
     ["cannot create it or write in it", "give a directory you can write to"]),
    (["report", "--all"], "file", ["is an existing file, not a directory"]),
    (["demo", "--no-calibrate", "--quiet"], "file", ["is an existing file, not a directory"]),
    (["demo", "--no-calibrate", "--quiet"], "proc", ["cannot create it or write in it"]),
    (["calibrate", "--quick"], "dir", ["is a directory: give a file path, e.g. --out"]),
    (["calibrate", "--quick"], "proc", ["cannot write a file there", "give a path you can write to"]),
])
def test_out_is_checked_before_any_work(tmp_path, monkeypatch, command, where, needles, capsys):
    (tmp_path / "afile").write_text("keep me")
    out = {"file": tmp_path / "afile", "proc": "/proc/autolayout-test/rep", "under-file": tmp_path / "afile" / "rep",
           "dir": tmp_path}[where]
    _refuse_work(monkeypatch)
    code, _, err = run([*command, "--out", str(out)], capsys)
    assert code == 2
    assert_one_line_error(code, err, f"--out {out}", *needles)
    assert (tmp_path / "afile").read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_out_check_leaves_no_trace(tmp_path, capsys):
    """Checking a missing --out creates nothing when the command then fails (an illegal layout)."""
    out = tmp_path / "a" / "b"
    code, _, err = run(["report", *MLP, *MESH, "--layouts", "batch:rows;hidden:rows", "--no-execute", "--no-search",
                        "--out", str(out), "--quiet"], capsys)
    assert code == 2 and "illegal" in err and list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------- model sources
def test_model_from_json_and_yaml_config(tmp_path, capsys):
    cfg = tmp_path / "model.json"
    cfg.write_text(json.dumps({"model": "mlp", "sizes": {"batch": 64, "d_io": 32, "d_hidden": 128}}))
    data = run_json(["predict", str(cfg), *MESH, "--layout", "batch:rows"], capsys)
    assert data["layout"] == "batch:rows"
    # command-line options override the file
    data = run_json(["predict", str(cfg), "--batch", "128", *MESH, "--layout", "batch:rows,cols"], capsys)
    assert data["layout"] == "batch:rows,cols"
    yml = tmp_path / "model.yaml"
    yml.write_text("model: mlp\nbatch: 64\nd_io: 32\nd_hidden: 128\n")
    assert run_json(["predict", str(yml), *MESH, "--layout", "hidden:cols"], capsys)["layout"] == "hidden:cols"


def test_model_from_a_users_function(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_models.py").write_text(textwrap.dedent("""
        import jax, jax.numpy as jnp
        import autolayout

        def tiny(batch: int = 16, width: int = 32):
            f32 = jnp.float32
            return autolayout.trace(lambda x, w: jnp.tanh(x @ w).sum(),
                                    jax.ShapeDtypeStruct((batch, width), f32),
                                    jax.ShapeDtypeStruct((width, width), f32),
                                    dims=("batch io", "io hidden"), roles=("input", "param"), name="tiny")

        def not_a_graph():
            return 42
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = run_json(["predict", "my_models:tiny", "--batch", "64", "--mesh", "all:8", "--layout", "batch:all"],
                    capsys)
    assert data["layout"] == "batch:all"
    code, _, err = run(["predict", "my_models:not_a_graph", "--mesh", "all:8"], capsys)
    assert_one_line_error(code, err, "returned int, not an autolayout Graph")
    code, _, err = run(["predict", "my_models:missing", "--mesh", "all:8"], capsys)
    assert_one_line_error(code, err, "has no function 'missing'")
    code, _, err = run(["predict", "no_such_module_xyz:f", "--mesh", "all:8"], capsys)
    assert_one_line_error(code, err, "cannot import module 'no_such_module_xyz'")


# -------------------------------------------------------------------------- errors
@pytest.mark.parametrize("args, needles", [
    (["search", "transfomer_lm", *MESH], ["unknown model 'transfomer_lm'", "Did you mean 'transformer_lm'?"]),
    (["predict", *MLP, "--mesh", "rows:x", "--layout", "batch:rows"], ["--mesh", "rows:x"]),
    (["predict", *MLP, *MESH, "--layout", "batch:rows;batch:cols"], ["batch"]),
    (["predict", *MLP, *MESH, "--layout", "batch:nope"], ["nope"]),
    (["predict", *MLP, "--mesh", "all:8", "--layout", "batch:all;hidden:all"], ["'batch'", "'hidden'", "all"]),
    (["predict", *MLP, *MESH, "--layout", "batch:rows", "--hardware", "tpu-v9"], ["Unknown hardware 'tpu-v9'"]),
    (["predict", *MLP, *MESH, "--layout", "batch:rows", "--hardware", "missing.json"], ["missing.json"]),
    (["search", *MLP, *MESH, "--memory-limit", "16 parsecs"], ["cannot read memory size '16 parsecs'"]),
    (["search", *MLP, *MESH, "--memory-limit", "1KiB"], ["memory_limit", "At that peak, per device: ", "the largest buffers "]),
    (["search", *MLP, *MESH, "--memory-limit=-5GiB"], ["--memory-limit", "must be positive, got '-5GiB'"]),
    (["search", *MLP], ["--mesh", "--num-devices"]),
    (["search", *MLP, *MESH, "--depth", "3"], ["unrecognized", "--depth"]),
    (["predict", "mlp", "--batch", "many", *MESH], ["--batch", "many"]),
    (["predict", *MLP], ["--mesh"]),
    (["table1", "--batch", "0"], ["--batch"]),
    (["table1", "--n", "3"], ["--n 3 does not divide --batch 1024", "layout 'batch:all'",
                              "give --n a value that divides 1024, or --batch a multiple of 3"]),
    (["table1", "--d-io", "1000", "--p", "3"], ["--p 3 does not divide --d-io 1000", "io:planes"]),
    (["predict", "mlp", "--batch", "-8", *MESH], ["--batch -8: a dimension size must be a positive integer",
                                                  "give e.g. --batch 1024"]),
    (["predict", "mlp", "--batch=0", *MESH], ["--batch 0: a dimension size must be a positive integer"]),
    (["search", "transformer_lm", "--n-layers", "-2", *MESH], ["--n-layers -2", "give e.g. --n-layers 2"]),
    (["predict", "mlp", *MESH, "--layout", "hidden:cols|*:rows@3"],
     ["'*:rows@3' shards no parameter over mesh axis rows", "Fix: split the batch over rows"]),
    (["hardware", "--bogus"], ["unrecognized", "--bogus"]),
    (["frobnicate"], ["frobnicate"]),
    (["report", *MESH], ["MODEL"]),
    (["report", "--all", "--only", "nope", "--out", "/tmp/autolayout-test-nope"], ["unknown report", "nope"]),
    (["predict", "missing.json", *MESH], ["config file 'missing.json' does not exist"]),
    (["execute", *MLP, "--mesh", "all:64", "--layout", "batch:all"], ["64 devices"]),
])
def test_bad_arguments_give_one_line_errors(args, needles, capsys):
    code, _, err = run(args, capsys)
    assert_one_line_error(code, err, *needles)


def test_bad_config_files(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = run(["predict", str(bad), *MESH], capsys)
    assert_one_line_error(code, err, "cannot read JSON config")
    nomodel = tmp_path / "nomodel.json"
    nomodel.write_text('{"sizes": {}}')
    code, _, err = run(["predict", str(nomodel), *MESH], capsys)
    assert_one_line_error(code, err, "'model' key")
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"model": "mlp", "depth": 3}')
    code, _, err = run(["predict", str(wrong), *MESH], capsys)
    assert_one_line_error(code, err, "has no parameter(s) ['depth']")


@pytest.mark.parametrize("text, needles", [
    ('{"model": "mlp", "sizes": {"batch": "many"}}', ["sizes.batch is 'many' (str); expected an integer"]),
    ('{"model": "mlp", "kwargs": {"d_io": 3.5}}', ["kwargs.d_io is 3.5 (float); expected an integer"]),
    ('{"model": "mlp", "batch": -3}', ["batch is -3; a dimension size must be a positive integer (e.g. 1024)"]),
    ('{"model": "mlp", "sizes": {"train": "yes"}}', ["sizes.train is 'yes' (str); expected true or false"]),
    ('{"model": "mlp", "sizes": {"learning_rate": "fast"}}', ["sizes.learning_rate is 'fast'", "expected a number"]),
    ('{"model": "mlp", "sizes": [64]}', ["'sizes' must be a mapping"]),
], ids=["str-size", "float-size", "negative-size", "str-bool", "str-float", "sizes-list"])
def test_config_values_are_checked_when_the_file_is_read(tmp_path, text, needles, capsys):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(text)
    code, _, err = run(["predict", str(cfg), *MESH], capsys)
    assert code == 2
    assert_one_line_error(code, err, f"config {cfg}:", *needles)


def test_console_script_errors_without_traceback():
    """The installed entry point, in a fresh process: a library error is one line on stderr."""
    proc = subprocess.run([sys.executable, "-m", "autolayout.cli", "predict", "mlp", "--mesh", "all:8",
                           "--layout", "batch:all;hidden:all"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("autolayout: error:")


def test_python_m_report_is_the_report_command():
    proc = subprocess.run([sys.executable, "-m", "autolayout.report", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "--all" in proc.stdout and "Traceback" not in proc.stderr


# ------------------------------------------------- honest answers (issue 14)
@pytest.mark.parametrize("args, needles", [
    (["search", *MLP, *MESH, "--num-devices", "8"], ["--mesh", "--num-devices", "not both"]),
    (["search", *MLP, *MESH, "--time-limit", "-5"], ["--time-limit", "positive number of seconds", "'-5'"]),
    (["search", *MLP, *MESH, "--time-limit", "0"], ["--time-limit", "positive"]),
    (["predict", *MLP, *MESH, "--per-op", "-1"], ["--per-op", "count >= 0", "'-1'"]),
    (["predict", *MLP, *MESH, "--peak", "-2"], ["--peak", "count >= 0", "'-2'"]),
    (["execute", *MLP, *MESH, "--tolerance", "-1"], ["--tolerance", ">= 0"]),
    (["execute", *MLP, "--mesh", "rows:16", "--layout", "batch:rows"],
     ["--mesh rows:16", "needs 16 devices", "JAX_NUM_CPU_DEVICES=16", "smaller --mesh"]),
    (["report", *MLP, *MESH, "--layouts", "batch:rows", "batch:rows;hidden:rows", "--no-execute", "--no-search",
      "--out", "/tmp/autolayout-test-illegal"], ["--layouts 'batch:rows;hidden:rows' is illegal on --mesh rows:2,cols:4"]),
], ids=["mesh-and-num-devices", "negative-time-limit", "zero-time-limit", "negative-per-op", "negative-peak", "negative-tolerance",
        "mesh-bigger-than-devices", "report-illegal-layout"])
def test_more_bad_arguments_give_one_line_errors(args, needles, capsys):
    code, _, err = run(args, capsys)
    assert code == 2
    assert_one_line_error(code, err, *needles)


def test_report_with_an_illegal_layout_writes_nothing(tmp_path, capsys):
    out = tmp_path / "rep"
    code, _, err = run(["report", *MLP, *MESH, "--layouts", "batch:rows;hidden:rows", "--no-execute", "--no-search",
                        "--out", str(out), "--quiet"], capsys)
    assert code == 2 and not out.exists()
    assert_one_line_error(code, err, "--layouts", "illegal")


def test_hardware_file_without_link(tmp_path, capsys):
    bad = tmp_path / "nolink.json"
    bad.write_text('{"name": "x", "peak_flops": {"float32": 1e12}, "hbm_bytes": 1e9, "hbm_bandwidth": 1e11}')
    code, _, err = run(["predict", *MLP, *MESH, "--hardware", str(bad)], capsys)
    assert code == 2
    assert_one_line_error(code, err, "--hardware", "nolink.json", "missing required field(s) ['link']")
    bad.write_text("{oops")
    code, _, err = run(["predict", *MLP, *MESH, "--hardware", str(bad)], capsys)
    assert_one_line_error(code, err, "nolink.json", "is not valid JSON")


def test_user_function_that_raises(tmp_path, monkeypatch, capsys):
    (tmp_path / "raising_models.py").write_text(textwrap.dedent("""
        def broken():
            return 1 / 0
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = run(["predict", "raising_models:broken", "--mesh", "all:8"], capsys)
    assert code == 2
    assert_one_line_error(code, err, "raising_models:broken raised ZeroDivisionError: division by zero",
                          "--traceback")


def test_strict_failure_is_a_one_line_error(capsys):
    # --tolerance 0 with a layout that sums partial products across devices: float rounding
    # makes the sharded result differ from the reference, so --strict must fail
    code, out, err = run(["execute", *MLP, *MESH, "--layout", "hidden:cols", "--repeats", "1", "--strict",
                          "--tolerance", "0"], capsys)
    assert "max abs error" in out  # the run is still shown
    assert code == 2
    assert_one_line_error(code, err, "--strict", "above --tolerance 0", "raise --tolerance")


def test_memory_limit_is_the_one_displayed(capsys):
    code, out, _ = run(["search", *MLP, *MESH, "--memory-limit", "1GiB"], capsys)
    assert code == 0 and "of 1 GiB (--memory-limit)" in out and "HBM" not in out
    data = run_json(["search", *MLP, *MESH, "--memory-limit", "1GB"], capsys)
    assert data["memory_limit_bytes"] == 1e9 and data["cost"]["memory_bytes"] <= 1e9
    code, out, _ = run(["search", *MLP, *MESH], capsys)
    assert "(HBM of tpu-v3)" in out


@pytest.mark.parametrize("args", [
    ["predict", *MLP, *MESH, "--layout", "batch:rows"],
    ["search", *MLP, *MESH],
    ["table1", "--batch", "256", "--d-io", "64", "--d-hidden", "256"],
], ids=["predict", "search", "table1"])
def test_every_output_names_its_hardware(args, capsys):
    code, out, _ = run(args, capsys)
    assert code == 0 and "hardware tpu-v3 (default; choose with --hardware)" in out
    code, out, _ = run(args + ["--hardware", "tpu-v4"], capsys)
    assert code == 0 and "hardware tpu-v4" in out and "(default" not in out


def test_hardware_listing_marks_the_default(capsys):
    code, out, _ = run(["hardware"], capsys)
    assert code == 0 and "tpu-v3 (default)" in out and out.count("(default)") == 1


# ------------------------------------------------------ measure in the loop (issue 12.6)
SMALL = ["mlp", "--batch", "256", "--d-io", "128", "--d-hidden", "512"]


def test_search_verify_prints_the_table_and_the_winner(capsys):
    code, out, err = run(["search", *SMALL, *MESH, "--verify", "3", "--repeats", "2",
                          "--no-weight-update-sharding"], capsys)
    assert code == 0, err
    assert "measured fastest of the 3 best predicted layouts" in out
    assert "hardware cpu: the local devices' profile" in out  # not the default target tpu-v3
    assert "predicted" in out and "measured" in out and "XLA memory" in out and "winner: #" in out
    table = out[out.index("verified:"):out.index("winner:")]
    assert len([line for line in table.splitlines() if line.rstrip().endswith(" ok")]) == 3
    assert len([line for line in table.splitlines() if line.lstrip().startswith("* ")]) == 1


def test_search_verify_json(capsys):
    data = run_json(["search", *SMALL, *MESH, "--verify", "2", "--repeats", "2", "--hardware", "cpu"], capsys)
    rows = data["verified"]
    assert len(rows) == 2 and all(r["ok"] and r["error"] == "" for r in rows)
    assert [r["chosen"] for r in rows].count(True) == 1
    chosen = next(r for r in rows if r["chosen"])
    assert chosen["layout"] == data["layout"]
    assert chosen["measured_time_s"] == min(r["measured_time_s"] for r in rows)
    assert all(len(r["measured_times_s"]) == 2 for r in rows)
    # the compiled step's memory per device, at most the search's limit (else the row is an OverMemory error)
    assert all(0 < r["xla_memory_bytes"] <= data["memory_limit_bytes"] for r in rows)
    assert data["hardware"] == "cpu"


def test_search_verify_table_writes_storage_layouts_compactly(capsys):
    # with weight-update sharding the table shows each layout with the storage entry its
    # parameters share once, as '*'; what it shows plans as the layout the JSON gives in full
    from autolayout import models, predict
    args = ["search", *SMALL, *MESH, "--verify", "2", "--repeats", "1", "--hardware", "cpu"]
    code, out, err = run(args, capsys)
    assert code == 0, err
    table = out[out.index("verified:"):out.index("winner:")].splitlines()[3:5]
    shown = [line.lstrip(" *").split()[1] for line in table]
    full = [r["layout"] for r in run_json(args, capsys)["verified"]]
    assert any("|*:" in s for s in shown) and all(len(s) <= len(f) for s, f in zip(shown, full))
    assert shown != full
    g = models.mlp(batch=256, d_io=128, d_hidden=512)
    for s, f in zip(shown, full):
        a, b = (predict(g, "rows:2,cols:4", x, hardware="cpu") for x in (s, f))
        assert (a.time_s, a.memory_bytes, a.comm_s) == (b.time_s, b.memory_bytes, b.comm_s)


@pytest.mark.parametrize("args, needles", [
    (["--verify", "0"], ["--verify", "positive integer", "'0'"]),
    (["--verify", "-3"], ["--verify", "positive integer", "'-3'"]),
    (["--verify", "two"], ["--verify"]),
    (["--verify", "2", "--hardware", "tpu-v4"], ["--verify 2 runs the layouts on these cpu devices",
                                                 "--hardware tpu-v4 is the built-in profile of other hardware",
                                                 "Give --hardware cpu"]),
], ids=["zero", "negative", "not-a-number", "other-hardware"])
def test_search_verify_bad_arguments(args, needles, capsys):
    code, _, err = run(["search", *SMALL, *MESH, *args], capsys)
    assert code == 2
    assert_one_line_error(code, err, *needles)


def test_search_verify_needs_a_mesh(capsys):
    code, _, err = run(["search", *SMALL, "--num-devices", "8", "--verify", "2"], capsys)
    assert code == 2
    assert_one_line_error(code, err, "--verify 2 runs layouts on a mesh: give --mesh")
