"""The simulator: latency model, acceptance model, SimPy engine, tree DP, search. It imports nothing of
`swiftspec.runtime` (no torch): planning runs anywhere."""
