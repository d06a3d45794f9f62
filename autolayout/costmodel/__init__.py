"""Cost model: per-device time and memory of a graph under a layout (DESIGN §4)."""
from autolayout.costmodel.hardware import Hardware, Link, get_hardware, known_hardware
from autolayout.costmodel.predict import Cost, layouts_table, predict
from autolayout.costmodel.rules import Collective, OpCost, op_cost

__all__ = ["Collective", "Cost", "Hardware", "Link", "OpCost", "get_hardware", "known_hardware",
           "layouts_table", "op_cost", "predict"]
