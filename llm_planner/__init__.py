"""llm_planner: placement and scheduling of neural networks on heterogeneous clusters."""

__version__ = "0.1.0"
