"""Baseline planners: what a user would do instead of solving the MILP.

single (one device per task: single-device, even-split, memory-greedy, heft,
data-parallel), tensor_parallel (the Megatron layouts over tensor-parallel groups),
baseline_set (all of them, and the best), common (the pieces they share).
"""
