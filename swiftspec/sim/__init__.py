"""The simulator: latency model, acceptance model, SimPy engine, tree DP, search."""
