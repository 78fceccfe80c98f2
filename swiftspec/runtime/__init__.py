"""The runtime: model code, weights, KV caches, draft trees, verification, engines."""
