"""``MODEL`` on the command line: what to trace.

Three forms:

* a zoo name (``mlp``, ``transformer_lm``, ``moe``, ``llama``), whose keyword arguments become
  options generated from the function's signature (``--d-model 512 --heads 8``); sizes
  not given take :data:`ZOO_DEFAULTS` (small enough to trace in a second);
* a JSON or YAML config file::

      {"model": "transformer_lm", "sizes": {"d_model": 512, "heads": 8}}

  ``model`` is a zoo name or ``package.module:function``; sizes may also be given as
  top-level keys; command-line options override the file;
* ``package.module:function`` (or ``path/to/file.py:function``): your own function that
  returns a traced :class:`~autolayout.graph.Graph` (e.g. ``autolayout.trace(step, ...)``);
  its keyword parameters become options the same way.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import inspect
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NoReturn

from autolayout.models import MODELS, default_sizes, invalid_sizes

__all__ = ["ZOO_DEFAULTS", "ModelError", "ModelSpec", "OneLineParser", "model_options_help", "resolve_model"]


class ModelError(ValueError):
    """``MODEL`` cannot be resolved, its options are wrong, or it does not return a Graph."""


# Sizes the command line uses when an option is not given: the zoo functions' own defaults
# (autolayout.models is their one source; CPU-friendly, divisible by meshes of up to 8 devices).
ZOO_DEFAULTS: dict[str, dict[str, Any]] = {name: default_sizes(name) for name in MODELS}


@dataclass
class ModelSpec:
    """A resolved ``MODEL``: the function to call, its keyword arguments and a label."""

    label: str
    fn: Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self) -> Any:
        """Call the function and check that it returned a Graph."""
        from autolayout.graph import Graph

        try:
            graph = self.fn(**self.kwargs)
        except TypeError as exc:
            raise ModelError(f"{self.label}: {exc}") from exc
        except ValueError:
            raise  # autolayout's own errors (TraceError, LayoutError, ...) say what is wrong already
        except Exception as exc:  # noqa: BLE001  (the user's code: any error, re-raised with its name)
            raise ModelError(f"MODEL {self.label} raised {type(exc).__name__}: {' '.join(str(exc).split())} "
                             "(fix the function, or rerun with --traceback to see where it failed)") from exc
        if not isinstance(graph, Graph):
            raise ModelError(
                f"{self.label} returned {type(graph).__name__}, not an autolayout Graph; return "
                "autolayout.trace(fn, *args, dims=...) from it")
        return graph

    def describe(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.kwargs.items())
        return f"{self.label}({args})"


# ----------------------------------------------------------------------------- options
def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _kind(p: inspect.Parameter) -> str:
    ann = p.annotation
    ann = getattr(ann, "__name__", ann) if not isinstance(ann, str) else ann
    if ann in ("int", "float", "bool", "str"):
        return ann
    if p.default is not inspect.Parameter.empty and p.default is not None:
        return type(p.default).__name__ if type(p.default) in (int, float, bool, str) else "value"
    return "value"


def _value(text: str) -> Any:
    """An option of unknown type: int, then float, then the string itself."""
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line errors: ``autolayout search: error: ... (see 'autolayout search --help')``.

    The command line's parser and the MODEL options' parsers both use it.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see '{self.prog} --help')\n")


def _params(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [p for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def option_parser(fn: Callable[..., Any], prog: str) -> argparse.ArgumentParser:
    """An argparse parser with one option per keyword parameter of ``fn``."""
    parser = OneLineParser(prog=prog, add_help=False, allow_abbrev=False)
    for p in _params(fn):
        kind = _kind(p)
        dest = p.name
        if kind == "bool":
            parser.add_argument(_option(p.name), dest=dest, action=argparse.BooleanOptionalAction, default=None)
        else:
            conv = {"int": int, "float": float, "str": str}.get(kind, _value)
            parser.add_argument(_option(p.name), dest=dest, type=conv, default=None, metavar=kind.upper())
    return parser


def model_options_help(fn: Callable[..., Any], defaults: dict[str, Any] | None = None) -> str:
    """``--d-model INT (64) --heads INT (4) ...`` for a help epilog."""
    defaults = defaults or {}
    parts = []
    for p in _params(fn):
        kind = _kind(p)
        default = defaults.get(p.name, p.default)
        shown = "" if default is inspect.Parameter.empty else f"={default}"
        flag = f"--[no-]{p.name.replace('_', '-')}" if kind == "bool" else _option(p.name)
        parts.append(f"{flag}{shown}")
    return " ".join(parts)


def _zoo_name(fn: Callable[..., Any]) -> str | None:
    return next((name for name, f in MODELS.items() if f is fn), None)


def _config_values(path: Path, data: dict[str, Any], fn: Callable[..., Any]) -> dict[str, tuple[str, Any]]:
    """The config's keyword arguments as ``{name: (key as written, value)}``, each checked against
    ``fn``'s signature: an ``int`` parameter takes an integer (a zoo size a positive one), a ``float``
    a number, a ``bool`` true/false, a ``str`` a string."""
    values: dict[str, tuple[str, Any]] = {}
    for section in ("sizes", "kwargs"):
        block = data.get(section) or {}
        if not isinstance(block, dict):
            raise ModelError(f"config {path}: '{section}' must be a mapping of parameter to value, e.g. "
                             f'{{"{section}": {{"batch": 64}}}}, not {type(block).__name__}')
        values.update({k: (f"{section}.{k}", v) for k, v in block.items()})
    values.update({k: (k, v) for k, v in data.items() if k not in ("model", "sizes", "kwargs")})
    params = {p.name: p for p in _params(fn)}
    expected = {"int": ((int,), "an integer"), "float": ((int, float), "a number"), "bool": ((bool,), "true or false"),
                "str": ((str,), "a string")}
    for name, (key, value) in values.items():
        if name not in params:
            continue
        types, what = expected.get(_kind(params[name]), ((object,), ""))
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise ModelError(f"config {path}: {key} is {value!r} ({type(value).__name__}); expected {what}, "
                             "fix the value in the file")
    zoo = _zoo_name(fn)
    if zoo is not None:
        for name, value in invalid_sizes(zoo, {k: v for k, (_, v) in values.items()}):
            raise ModelError(f"config {path}: {values[name][0]} is {value!r}; a dimension size must be a positive "
                             f"integer (e.g. {default_sizes(zoo)[name]}), fix the value in the file")
    return values


def _check_sizes(spec: ModelSpec, given: dict[str, Any]) -> None:
    """A zoo model's size options given on the command line must be positive integers."""
    zoo = _zoo_name(spec.fn)
    if zoo is None:
        return
    for name, value in invalid_sizes(zoo, given):
        raise ModelError(f"{_option(name)} {value!r}: a dimension size must be a positive integer; give e.g. "
                         f"{_option(name)} {default_sizes(zoo)[name]}")


def _check_required(spec: ModelSpec) -> None:
    missing = [p.name for p in _params(spec.fn)
               if p.default is inspect.Parameter.empty and p.name not in spec.kwargs]
    if missing:
        raise ModelError(f"{spec.label} needs {', '.join(_option(m) for m in missing)}")


# ------------------------------------------------------------------------------ resolve
def _zoo() -> dict[str, Callable[..., Any]]:
    from autolayout import models
    return dict(models.MODELS)


def _import_function(target: str) -> Callable[..., Any]:
    mod_name, _, fn_name = target.rpartition(":")
    if not mod_name or not fn_name:
        raise ModelError(f"cannot read {target!r}: expected 'package.module:function'")
    try:
        if mod_name.endswith(".py") or os.sep in mod_name or "/" in mod_name:
            path = Path(mod_name)
            if not path.is_file():
                raise ModelError(f"no file {mod_name!r} (from MODEL {target!r})")
            spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules.setdefault(path.stem, module)
            spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())  # user modules next to where the command runs
            module = importlib.import_module(mod_name)
    except ModelError:
        raise
    except ImportError as exc:
        raise ModelError(f"cannot import module {mod_name!r} for MODEL {target!r}: {exc}") from exc
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ModelError(f"module {mod_name!r} has no function {fn_name!r} (MODEL {target!r})")
    return fn


def _load_config(path: Path) -> dict[str, Any]:
    text = path.read_text()
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as exc:
            raise ModelError(f"{path} is YAML but no yaml module is installed (pip install pyyaml), "
                             "or write the config as JSON") from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ModelError(f"cannot read YAML config {path}: {' '.join(str(exc).split())}") from exc
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ModelError(f"cannot read JSON config {path}: {exc}") from exc
    if not isinstance(data, dict) or "model" not in data:
        raise ModelError(f"config {path} must be a mapping with a 'model' key, e.g. "
                         '{"model": "transformer_lm", "sizes": {"d_model": 512}}')
    return data


def resolve_model(model: str) -> ModelSpec:
    """The function and default keyword arguments ``MODEL`` names (options not applied yet)."""
    zoo = _zoo()
    if model in zoo:
        return ModelSpec(model, zoo[model], dict(ZOO_DEFAULTS.get(model, {})))
    path = Path(model)
    if path.suffix.lower() in (".json", ".yaml", ".yml") or (path.is_file() and ":" not in model):
        if not path.is_file():
            raise ModelError(f"config file {model!r} does not exist")
        data = _load_config(path)
        inner = resolve_model(str(data["model"]))
        sizes = {k: v for k, (_, v) in _config_values(path, data, inner.fn).items()}
        known = {p.name for p in _params(inner.fn)}
        unknown = sorted(set(sizes) - known)
        if unknown and known:
            raise ModelError(f"config {path}: {inner.label} has no parameter(s) {unknown}; "
                             f"it takes {sorted(known)}")
        inner.kwargs.update(sizes)
        inner.label = f"{inner.label} (from {path.name})"
        return inner
    if ":" in model:
        return ModelSpec(model, _import_function(model), {})
    close = difflib.get_close_matches(model, list(zoo), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ModelError(
        f"unknown model {model!r}.{hint} Give a zoo model ({', '.join(zoo)}), a JSON/YAML config file, "
        "or 'package.module:function' returning a traced Graph")


def apply_options(spec: ModelSpec, extra: list[str], prog: str = "autolayout") -> ModelSpec:
    """Parse the model's own options (``--d-model 512``) from ``extra`` into ``spec.kwargs``."""
    parser = option_parser(spec.fn, prog)
    ns, rest = parser.parse_known_args(extra)
    if rest:
        known = " ".join(_option(p.name) for p in _params(spec.fn)) or "(none)"
        raise ModelError(f"unrecognized argument(s) {' '.join(rest)} for {spec.label}; its options: {known}")
    given = {k: v for k, v in vars(ns).items() if v is not None}
    _check_sizes(spec, given)
    spec.kwargs.update(given)
    _check_required(spec)
    return spec
