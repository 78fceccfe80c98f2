"""Triton kernels of the decode step; their pure-torch references are in `reference` (shared with the
model's eager path). Kernels import nothing of `swiftspec.runtime`."""

import os


def interpreting() -> bool:
    """Whether Triton interprets the kernels (TRITON_INTERPRET=1: CPU tensors, no compiled code)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
