"""The user-facing layer's machinery: formatting, progress, model specs, plots, pages.

* :mod:`~autolayout.reporting.fmt` — numbers, byte sizes, text tables, rank correlation;
* :mod:`~autolayout.reporting.progress` — a tiny progress bar for long steps;
* :mod:`~autolayout.reporting.model_spec` — ``MODEL`` arguments of the command line
  (zoo names with size options, JSON/YAML configs, ``package.module:function``);
* :mod:`~autolayout.reporting.paths` — ``--out`` paths checked before any work;
* :mod:`~autolayout.reporting.devices` — 8 virtual CPU devices before jax starts, which
  devices run a mesh, a calibrated profile with a plausibility check;
* :mod:`~autolayout.reporting.plots` — the matplotlib charts of a report;
* :mod:`~autolayout.reporting.page` — one report directory: ``index.html`` (self-contained),
  ``report.md``, PNGs and CSVs;
* :mod:`~autolayout.reporting.paper` — the paper anchors (Mesh-TensorFlow §8.6/§9,
  weight-update sharding) as data;
* :mod:`~autolayout.reporting.committed` and :mod:`~autolayout.reporting.measured` — the
  reports committed under ``reports/`` (``autolayout report --all``).

The public entry point is :func:`autolayout.report`.
"""
