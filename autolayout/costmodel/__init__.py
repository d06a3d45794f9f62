"""Cost model: per-device time and memory of a graph under a layout (DESIGN §4, §9).

``plan`` decides, once, where every tensor lives and which collectives each op
runs; ``predict`` prices a plan; the search and the shard_map lowering use the
same plan.
"""
from autolayout.costmodel.hardware import Hardware, Link
from autolayout.costmodel.memory import PeakBuffer
from autolayout.costmodel.profiles import get_hardware, known_hardware
from autolayout.costmodel.placement import Placement, Step
from autolayout.costmodel.plan import OpPlan, Plan, compact_layout, plan
from autolayout.costmodel.predict import Cost, layouts_table, predict, price_plan
from autolayout.costmodel.rules import Collective, OpCost, op_cost

__all__ = ["Collective", "Cost", "Hardware", "Link", "OpCost", "OpPlan", "PeakBuffer", "Placement", "Plan", "Step",
           "compact_layout", "get_hardware", "known_hardware", "layouts_table", "op_cost", "plan", "predict",
           "price_plan"]
