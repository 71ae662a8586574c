"""The shared core: units, file I/O, atomic writes, processes, the cluster spec and the plan file."""
