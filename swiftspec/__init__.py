"""swiftspec: single-request LLM decoding as fast as the GPUs allow (SwiftSpec-style
disaggregated, asynchronous tree speculation), with a simulator that plans it."""

__version__ = "0.1.0"
