"""The placement problem in numbers, below every solver and check: `placement` (PlacementProblem,
build_problem), `schedule` (the list scheduler that times an assignment into a Plan), `fit` (whether
anything fits in memory) and `options` (a solve's options)."""
