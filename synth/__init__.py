"""The synthesizer: distributed instruction set, A* search, ratio LP and the standard baselines."""
