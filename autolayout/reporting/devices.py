"""Which devices run a mesh, and getting 8 virtual CPU devices before jax starts."""
from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["ensure_cpu_devices", "devices_for", "platform_hardware"]

DEFAULT_CPU_DEVICES = 8


def ensure_cpu_devices(n: int = DEFAULT_CPU_DEVICES) -> None:
    """Ask jax for ``n`` virtual CPU devices, if it is still possible and the user has not chosen.

    Sets ``JAX_NUM_CPU_DEVICES`` when jax is not imported yet; if it is imported but no
    backend has started, updates ``jax_num_cpu_devices``. Leaves everything alone when the
    user set ``JAX_NUM_CPU_DEVICES`` or ``--xla_force_host_platform_device_count`` (their
    choice), or when jax's backends already run (too late: the count is fixed).
    Accelerators (TPU, GPU) are unaffected: this only sizes the CPU backend.
    """
    n = max(int(n), 1)
    if "JAX_NUM_CPU_DEVICES" in os.environ or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    if "jax" not in sys.modules:
        os.environ["JAX_NUM_CPU_DEVICES"] = str(n)
        return
    try:
        from jax._src import xla_bridge

        if xla_bridge.backends_are_initialized():
            return
        import jax

        jax.config.update("jax_num_cpu_devices", n)
    except (ImportError, AttributeError):  # jax moved its private xla_bridge API: the user's jax decides
        return


def devices_for(n: int) -> tuple[list[Any] | None, str]:
    """``(devices, note)``: the default backend's devices if it has ``n``, else the CPU ones
    if they suffice, else ``(None, why)``."""
    import jax

    default = jax.devices()
    if len(default) >= n:
        return list(default[:n]), ""
    try:
        cpu = jax.devices("cpu")
    except RuntimeError:
        cpu = []
    if len(cpu) >= n:
        note = (f"the {default[0].platform} backend has {len(default)} device(s); running on "
                f"{n} virtual CPU devices instead") if default[0].platform != "cpu" else ""
        return list(cpu[:n]), note
    return None, (f"this mesh needs {n} devices but jax has {len(default)} {default[0].platform} device(s); "
                  f"set JAX_NUM_CPU_DEVICES={n} before jax starts to run it on virtual CPU devices")


def platform_hardware(devices: list[Any]) -> Any:
    """The built-in profile for ``devices`` (``cpu`` for CPUs or when unknown)."""
    from autolayout.costmodel.profiles import get_hardware

    kind = str(getattr(devices[0], "device_kind", "")).lower() if devices else ""
    for key, name in (("h200", "h200"), ("h100", "h100"), ("v6", "tpu-v6e"), ("v5p", "tpu-v5p"),
                      ("v5", "tpu-v5e"), ("v4", "tpu-v4"), ("v3", "tpu-v3"), ("v2", "tpu-v2")):
        if key in kind:
            return get_hardware(name)
    return get_hardware("cpu")


# Bounds no single CPU device reaches (a 2-socket server core does ~1e11 FLOP/s, ~2e10 B/s).
_CPU_PLAUSIBLE = {"peak_flops": 2e12, "hbm_bandwidth": 1e12, "link_bandwidth": 1e12}


def calibrated(mesh: Any, devices: list, quick: bool = True, attempts: int = 2) -> tuple[Any, str]:
    """``(profile, note)`` from ``autolayout.calibrate`` with a plausibility check on CPU devices.

    Timing differences on a loaded machine can come out near zero and turn into absurd
    rates; such a profile (or a calibration that raised
    :class:`~autolayout.exec.calibrate.CalibrationError`) is measured again, up to
    ``attempts`` times. ``note`` says when a first attempt was discarded and why.

    Raises:
        CalibrationError: every attempt failed or was implausible; the message has the
            measured figures and the fix. Nothing is swapped for a built-in profile: the
            caller decides, and says so.
    """
    from autolayout.exec import calibrate
    from autolayout.exec.calibrate import CalibrationError

    whys = []
    for _ in range(max(int(attempts), 1)):
        try:
            hw = calibrate(mesh, quick=quick, devices=devices)
        except CalibrationError as exc:
            whys.append(str(exc))
            continue
        if devices[0].platform != "cpu":
            return hw, ""
        peak = hw.peak("float32")
        link = max([hw.link.bandwidth] + [l.bandwidth for _, l in hw.axis_links])
        if peak <= _CPU_PLAUSIBLE["peak_flops"] and hw.hbm_bandwidth <= _CPU_PLAUSIBLE["hbm_bandwidth"] \
                and link <= _CPU_PLAUSIBLE["link_bandwidth"]:
            note = ("calibration measured again: " + " | ".join(whys)) if whys else ""
            return hw, note
        whys.append(f"implausible {peak / 1e9:.3g} GFLOP/s, {hw.hbm_bandwidth / 1e9:.3g} GB/s memory or "
                    f"{link / 1e9:.3g} GB/s link bandwidth per CPU device (bounds {_CPU_PLAUSIBLE}: timing noise)")
    raise CalibrationError(f"calibrating mesh {mesh} on {len(devices)} {devices[0].platform} devices failed "
                           f"{len(whys)} time(s): " + " | ".join(whys) + "; calibrate on a quieter machine "
                           "(quick=False, more repeats), or pass a profile measured earlier")
