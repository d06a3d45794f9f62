"""Test setup: 8 virtual CPU devices, so sharded code runs on any machine.

The device count must be fixed before anything initialises a jax backend,
hence the environment variable and config update at import time, first thing.
"""
from __future__ import annotations

import os

os.environ["JAX_NUM_CPU_DEVICES"] = "8"
# Default to CPU so the 8 virtual devices are what jax.devices() returns even on
# a machine with one GPU; export JAX_PLATFORMS=cuda (or similar) to override.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (must come after the environment is set)

jax.config.update("jax_num_cpu_devices", 8)

import pytest  # noqa: E402

from autolayout.core import Mesh  # noqa: E402


@pytest.fixture
def mesh_8() -> Mesh:
    """One axis of 8 devices: ``all:8`` (the paper's 1-D mesh)."""
    return Mesh("all:8")


@pytest.fixture
def mesh_2x4() -> Mesh:
    """``rows:2,cols:4``."""
    return Mesh("rows:2,cols:4")


@pytest.fixture
def mesh_2x2x2() -> Mesh:
    """``rows:2,cols:2,planes:2``."""
    return Mesh("rows:2,cols:2,planes:2")


@pytest.fixture
def cpu_devices() -> list:
    """The 8 virtual CPU devices."""
    devices = jax.devices("cpu")
    assert len(devices) == 8, f"expected 8 virtual CPU devices, got {len(devices)}"
    return devices
