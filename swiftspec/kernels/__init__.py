"""Triton kernels; each has a pure-torch reference, a parameterised test and a microbenchmark."""
