"""``python -m autolayout.report [--all] ...``: the ``autolayout report`` command.

Run as a script only (nothing imports this module), so the command line layer it calls
stays above the report layer.
"""
import sys

from autolayout.cli import main

sys.exit(main(["report", *sys.argv[1:]]))
