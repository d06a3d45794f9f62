"""Execution backend: run a layout for real and hold it against the cost model (DESIGN §6).

* :func:`execute` lowers a traced :class:`~autolayout.graph.Graph` to one jitted
  ``jax.shard_map`` program whose collectives are exactly those
  :func:`~autolayout.costmodel.predict.predict` lists (or, with
  ``backend="gspmd"``, lets XLA's SPMD partitioner choose them), checks the
  outputs against an unsharded reference, parses the program's collectives and
  times the step: an :class:`Execution`.
* :func:`calibrate` measures a :class:`~autolayout.costmodel.hardware.Hardware`
  profile (matmul throughput, memory bandwidth, alpha/beta per mesh axis) on the
  devices at hand.

Multi-host (TPU pods, multi-node GPU)
-------------------------------------
Nothing in the lowering is single-host: the program is one SPMD ``shard_map``
over a ``jax.sharding.Mesh``, and each collective is a named-axis collective.
On a multi-host system:

1. call ``jax.distributed.initialize()`` on every host first (on Cloud TPU and
   SLURM/Open MPI clusters without arguments; otherwise pass
   ``coordinator_address``, ``num_processes`` and ``process_id``);
2. build the mesh over the *global* device list so that fast axes stay within a
   host, e.g. ``jax.make_mesh((hosts, 8), ("dcn", "ici"),
   axis_types=(AxisType.Auto,) * 2)`` or
   ``jax.experimental.mesh_utils.create_hybrid_device_mesh``, and pass that
   ``jax.sharding.Mesh`` as ``mesh`` (give the ``dcn`` axis its slow link in the
   hardware profile: ``hw.with_axis_link("dcn", SLOW_LINKS[hw.name])``);
3. run the same script on every host: ``execute(graph, jmesh, layout,
   args=...)`` with the same ``args`` (or ``seed``) everywhere. Each host only
   holds the blocks of its addressable devices once the inputs are placed with
   the layout's ``NamedSharding``; the reference run (``reference=True``) needs
   the whole model on one host, so pass ``reference=False`` for models that do
   not fit, and compare ``collectives_match`` and timings only.

Set ``JAX_NUM_CPU_DEVICES=8`` (before importing jax) to try any of this on one
machine with 8 virtual CPU devices.
"""
from __future__ import annotations

from autolayout.exec.calibrate import calibrate
from autolayout.exec.runner import ArgumentError, Execution, NotEnoughDevicesError, OutputMismatchError, execute
from autolayout.exec.hlo import HloCollective, parse_collectives
from autolayout.exec.local_ops import LoweringError

__all__ = [
    "ArgumentError",
    "Execution",
    "HloCollective",
    "LoweringError",
    "NotEnoughDevicesError",
    "OutputMismatchError",
    "calibrate",
    "execute",
    "parse_collectives",
]
