"""The package version, in a module of its own so that every layer can read it without
importing :mod:`autolayout` (whose ``__init__`` imports every layer)."""

__version__ = "0.1.0"
