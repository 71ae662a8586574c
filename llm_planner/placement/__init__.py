"""The placement planner: the problem, the exact MILP, MILP-SPLIT, baselines, bounds and its verifier."""
