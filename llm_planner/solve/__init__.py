"""Placement solvers over a PlacementProblem (numbers, no torch).

The base (problem, schedule, errors, options, fit) is shared by the sub-packages,
each built on the ones before it: bounds (lower bounds), baselines (heuristics),
milp (the exact MILP), split (MILP-SPLIT); api (`solve(problem, options)`) is on
top. docs/architecture.md has the layers.
"""
