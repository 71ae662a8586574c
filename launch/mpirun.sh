#!/usr/bin/env bash
# Run a plan file with a plain mpiexec across the hosts of its cluster spec.
#
#   bash launch/mpirun.sh PLAN.yaml [WORKDIR]
#
# 1. `llm-planner launch PLAN --dry-run` checks the plan against its cluster spec and
#    the model and writes WORKDIR/hostfile (one `host:ranks` line per host of the
#    spec the plan uses), WORKDIR/rank_table.json and WORKDIR/command.txt;
# 2. this script runs that command: the mpiexec of this environment, one rank per
#    device the plan uses; rank 0 writes WORKDIR/run.json.
# On several hosts WORKDIR must be on a shared file system, the same environment
# must exist at the same path on every host, and mpiexec reaches the hosts by ssh.
# `llm-planner launch PLAN` does the same and also names a failing rank, stops
# everything on Ctrl-C and prints the summary; use this script where you want to
# hold the mpiexec command yourself (wrap it, add arguments to command.txt).
set -euo pipefail
plan=${1:?usage: bash launch/mpirun.sh PLAN.yaml [WORKDIR]}
stem=$(basename "${plan%.*}")
workdir=${2:-launch/$stem}
python=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
"$python" -m llm_planner.cli launch "$plan" --dry-run --workdir "$workdir" --report "$workdir/run.json"
echo
# command.txt is one shell-quoted command line (shlex.join); it is split into words by
# Python's shlex, never evaluated by the shell, and run as an array.
mapfile -d '' -t command < <("$python" -c 'import shlex, sys; print(*shlex.split(open(sys.argv[1]).read()), sep="\0", end="\0")' "$workdir/command.txt")
case "${command[0]:-}" in
  */mpiexec | mpiexec) ;;
  *) echo "error: $workdir/command.txt: expected an mpiexec command, got '${command[0]:-}'" >&2; exit 2 ;;
esac
echo "running: $(cat "$workdir/command.txt")"
"${command[@]}"
echo "report: $workdir/run.json"
