"""Lower bounds on the optimum of a PlacementProblem, valid for both objectives.

Every bound is in the units of the problem's objective (seconds of makespan for
"latency", seconds per sample for "throughput"); no plan can do better.
Modules, each built on the ones before it: times (task times, the critical path),
classes (device classes and the memory rows the LPs share), load (the
load-balance LP and LP(s)), path_rows and path_refine (the rows of the path LP),
path_lp (the path LP), shard_count (CP(s) against LP(s)), partition (a graph copy
per shard), combined (`lower_bound`, the best of them). docs/objectives.md
explains them.
"""
