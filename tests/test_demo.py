"""``autolayout demo`` runs and shows the traced graph of the built-in transformer.

The full demo (calibration and four layouts compiled and run on 8 devices, about a
minute) is what CI runs as ``autolayout demo``; these tests run it without execution.
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
