"""The rank runtime: builds one rank's share of a planned model and runs it under MPI.

Entry point (the launcher starts one process per device of the plan):

    mpiexec -f hostfile -n R python -m mpi4py -m llm_planner.runtime rank_table.json

Modules: `table` (the rank table file, shared with llm_planner.launch.plan_launch),
`decoder_tasks` (torch-free checks of decoder plans, used by the launcher too),
`gpt` + `gpt_run` (decoder stages and the generation pipeline), `graph` +
`graph_run` (fx graph partitioning and its run), `weights` (seeded or
checkpoint parameters), `comm` (tensor transfers; with `rank.main`, the only code that imports mpi4py),
`report` (measurements and the JSON run report), `rank` (a rank's life and
failure handling). Importing this package imports neither torch nor mpi4py.
"""
