"""Which built-in profile describes the devices at hand: one exact table of JAX device kinds."""
from __future__ import annotations

from typing import Any

from autolayout.costmodel.hardware import Hardware

from autolayout.costmodel.profiles import PROFILES

__all__ = ["DEVICE_KINDS", "UnknownDeviceError", "hardware_for_device"]

# JAX device kinds (``jax.Device.device_kind``) of the built-in profiles, matched exactly:
# the one table that detection reads. TPU kinds as jax 0.10.2 names them in
# jax/_src/pallas/mosaic/tpu_info.py: "TPU v5" is v5p (not v5e, which is "TPU v5 lite");
# "TPU v4 lite" (v4i) has no profile. GPU kinds are the CUDA device names (what
# nvidia-smi shows): "NVIDIA H100 80GB HBM3" is the SXM5 part the h100 profile describes
# (the PCIe and NVL parts have other clocks, memory and links: no profile); "NVIDIA H200"
# is the SXM H200. JAX's CPU devices are "cpu".
DEVICE_KINDS: dict[str, str] = {
    "TPU v2": "tpu-v2",
    "TPU v3": "tpu-v3",
    "TPU v4": "tpu-v4",
    "TPU v5 lite": "tpu-v5e", "TPU v5e": "tpu-v5e",
    "TPU v5": "tpu-v5p", "TPU v5p": "tpu-v5p",
    "TPU v6 lite": "tpu-v6e", "TPU v6e": "tpu-v6e",
    "NVIDIA H100 80GB HBM3": "h100",
    "NVIDIA H200": "h200",
    "cpu": "cpu",
}


class UnknownDeviceError(ValueError):
    """The devices' kind has no built-in profile (and none was given)."""


def hardware_for_device(device: Any) -> Hardware:
    """The built-in profile of a JAX device, by its exact ``device_kind`` (:data:`DEVICE_KINDS`).

    Raises:
        UnknownDeviceError: the kind is not in the table; the message names it and how to
            pass a profile instead.

    >>> hardware_for_device(type("D", (), {"device_kind": "TPU v5"})()).name
    'tpu-v5p'
    """
    kind = str(getattr(device, "device_kind", ""))
    if kind not in DEVICE_KINDS:
        raise UnknownDeviceError(
            f"no built-in hardware profile for device kind {kind!r} (known kinds: "
            f"{', '.join(repr(k) for k in DEVICE_KINDS)}); pass hardware= a profile name "
            f"({', '.join(PROFILES)}), a Hardware, or a JSON profile measured on these devices with "
            "'autolayout calibrate --out profile.json' (CLI: --hardware profile.json)")
    return PROFILES[DEVICE_KINDS[kind]]
