"""``autolayout demo`` runs, shows the traced graph of the built-in transformer, and
writes its report outside the repository.

The full demo (calibration and four layouts compiled and run on 8 devices, about 20 s on
two free cores; ``benchmarks/demo_time.py``) is what CI runs as ``autolayout demo``;
these tests run it without execution.
"""
from __future__ import annotations

from autolayout import cli, demo


def test_demo_runs_and_shows_dims_params_and_classes(capsys):
    assert demo.run(execute=False, calibrate=False) == 0
    text = capsys.readouterr().out
    s = demo.SIZES
    expected = {"batch": s["batch"], "length": s["length"], "length_1": s["length"],
                "d_model": s["d_model"], "heads": s["heads"], "d_kv": s["d_kv"], "d_ff": s["d_ff"],
                "vocab": s["vocab"], "layers": s["n_layers"]}
    for name, size in expected.items():
        assert f"{name}:{size}" in text
    d, f, h, k, L, v, n = (s[x] for x in ("d_model", "d_ff", "heads", "d_kv", "n_layers", "vocab", "length"))
    params = v * d + n * d + L * (4 * d * h * k + 2 * d * f + 4 * d) + 2 * d + d * v
    assert f"parameters: {params:,}" in text
    assert "signature classes" in text and "heaviest contractions" in text
    # the later sections: predictions of the named layouts and the search's choice
    for name, _ in demo.NAMED:
        assert name in text
    assert "OPTIMAL" in text and "skipped (--no-execute)" in text


def test_cli_demo_exits_zero(tmp_path, capsys):
    assert cli.main(["demo", "--no-execute", "--no-calibrate", "--out", str(tmp_path)]) == 0
    assert "autolayout demo" in capsys.readouterr().out
    assert (tmp_path / "index.html").is_file()


def test_cli_demo_writes_a_fresh_directory_outside_the_repository(tmp_path, monkeypatch, capsys):
    """The quickstart must leave the tree clean: the report goes to a new temp directory,
    named in the last line; the committed reports/demo is not touched."""
    import hashlib
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    committed = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (root / "reports" / "demo").iterdir()}
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for _ in range(2):  # every run gets its own directory
        assert cli.main(["demo", "--no-execute", "--no-calibrate", "--quiet"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    finals = [line for line in lines if line.startswith("demo finished in ")]
    assert len(finals) == 2 and lines[-1] == finals[-1]
    paths = [Path(line.split("report: ", 1)[1].split(" (open", 1)[0]) for line in finals]
    assert paths[0] != paths[1]
    for path in paths:
        assert path.name == "index.html" and path.is_file() and path.parent.parent == tmp_path
        assert path.parent.name.startswith("autolayout-demo-")
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (root / "reports" / "demo").iterdir()} == committed


def test_demo_sizes_are_the_zoo_defaults():
    """One source for sizes: the zoo functions' defaults, which the CLI shows too."""
    import inspect

    from autolayout import models
    from autolayout.reporting.model_spec import ZOO_DEFAULTS

    sig = inspect.signature(models.transformer_lm).parameters
    assert demo.SIZES == ZOO_DEFAULTS["transformer_lm"] == {k: sig[k].default for k in demo.SIZES}
    assert models.transformer_lm().dims["d_model"] == sig["d_model"].default
    mlp = inspect.signature(models.mlp).parameters
    assert models.mlp().dims == {"batch": mlp["batch"].default, "io": mlp["d_io"].default,
                                 "hidden": mlp["d_hidden"].default}
    from autolayout.reporting.model_spec import model_options_help
    shown = model_options_help(models.transformer_lm, ZOO_DEFAULTS["transformer_lm"])
    assert f"--d-model={sig['d_model'].default}" in shown and f"--n-layers={sig['n_layers'].default}" in shown


def test_demo_never_turns_on_jax_persistent_cache_and_names_the_users(monkeypatch):
    """On CPU a program loaded from jax's persistent cache can compute wrong numbers
    (tests/test_compile_cache.py): the demo leaves the cache as the user set it."""
    import jax

    before = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    assert demo.compile_cache_dir() == (before[0] or None)
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/somewhere/of/theirs")
    assert demo.compile_cache_dir() == "/somewhere/of/theirs"
    after = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    assert after == before  # left alone


def test_demo_search_measures_its_best_layouts_and_section_6_reuses_them(capsys, monkeypatch):
    """With execution, section 5 runs the VERIFY_K best predicted layouts and keeps the measured
    fastest; section 6 reuses that run for the searched layout (one transformer layer, small
    sizes: the compiles stay short)."""
    from autolayout.exec import verify as verify_module

    calls = []
    real = verify_module.measure

    def measure(graph, mesh, layouts, **kw):
        calls.append([str(lay) for lay in layouts])
        return real(graph, mesh, layouts, **kw)

    monkeypatch.setattr(verify_module, "measure", measure)
    sizes = dict(demo.SIZES, n_layers=1, d_ff=128, vocab=128, length=16)
    assert demo.run(sizes, execute=True, calibrate=False, repeats=2, progress=False) == 0
    text = capsys.readouterr().out
    assert f"the {demo.VERIFY_K} best predicted layouts, each run on 8 CPU devices" in text
    assert "chosen: #" in text and text.count("\n  *  ") == 1
    verified, named = calls  # section 5's k best, then section 6's named layouts only
    assert len(verified) == demo.VERIFY_K and len(named) == len(demo.NAMED)
    assert "(1 of them already ran in section 5: their runs are reused)" in text
    assert "every layout computes the same numbers as the unsharded step" in text
