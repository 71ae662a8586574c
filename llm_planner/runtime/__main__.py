"""`python -m mpi4py -m llm_planner.runtime RANK_TABLE.json`: run this process's rank."""

import sys

from llm_planner.runtime.rank import main

if __name__ == "__main__":
    sys.exit(main())
