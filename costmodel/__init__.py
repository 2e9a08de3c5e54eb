"""The cost model: cluster spec and catalogs, compute, collective and memory costs, and the simulator."""
