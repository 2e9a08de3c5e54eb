"""The profiler: measures devices and links of a real machine and writes a cluster file."""
