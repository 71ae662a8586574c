"""Solver backends behind one interface: HiGHS by default, Gurobi when licensed."""
