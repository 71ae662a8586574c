"""Starting ranks with mpiexec: `plan_launch` (a plan's ranks: hostfile, rank table, checks),
`mpiexec_run` (waiting for mpiexec, naming what failed, stopping everything) and `profile_run`
(the profiling job, on this machine or one rank per device under mpiexec)."""
