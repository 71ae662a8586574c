"""MILP-SPLIT, the scalable solver: cut the graph into a chain of modules, solve each module
exactly, join them by dynamic programming (split.py has the method; its docstring lists the
modules of this package).
"""
