"""The exact MILP: milp (the formulation in its docstring, and the solve), model (one method
per constraint family), costs (cost pieces and transfer-cost groups), symmetry (the rows that
break device symmetry), warm (warm-start plans), backends (HiGHS, Gurobi: one interface).
"""
