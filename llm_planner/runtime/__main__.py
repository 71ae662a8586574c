"""`python -m mpi4py -m llm_planner.runtime RANK_TABLE.json`: run this process's rank."""

import os
import sys

from llm_planner.core.procs import die_with_parent
from llm_planner.runtime.rank import main

if __name__ == "__main__":
    die_with_parent(os.getppid())  # mpiexec's proxy: a rank whose proxy was killed stops too
    sys.exit(main())
