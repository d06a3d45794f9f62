"""Command line: ``autolayout demo``.

Errors of autolayout (all ValueError subclasses, e.g. LayoutError) are printed
as one line ``autolayout: error: ...`` with exit code 2, like argparse's own
usage errors, so users see the message rather than a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from autolayout import __version__

PROG = "autolayout"


def _run_demo(args: argparse.Namespace) -> int:
    # Imported lazily: the demo pulls in jax and the whole pipeline, which
    # `autolayout --help` should not pay for.
    try:
        demo = importlib.import_module("autolayout.demo")
    except ModuleNotFoundError as exc:
        if exc.name != "autolayout.demo":
            raise  # a missing dependency inside the demo: report that, not "no demo"
        raise ValueError("the demo is not available in this installation (no module autolayout.demo)") from exc
    result = demo.run()
    return result if isinstance(result, int) else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Choose how to split every named tensor dimension across a processor mesh.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument(
        "--traceback", action="store_true", help="show the full traceback on errors (for debugging)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo = sub.add_parser("demo", help="run the end-to-end demo (trace, predict, search, execute)")
    demo.set_defaults(func=_run_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``autolayout`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:
        if args.traceback:
            raise
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
