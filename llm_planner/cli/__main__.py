"""`python -m llm_planner.cli ...`: the command line."""

from llm_planner.cli.main import main

raise SystemExit(main())
