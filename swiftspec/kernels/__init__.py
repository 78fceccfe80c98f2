"""Triton kernels of the decode step; their pure-torch references are in `reference` (shared with the
model's eager path). Kernels import nothing of `swiftspec.runtime`."""
