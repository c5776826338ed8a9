"""Shared oracles and model builders of the Python tests (finite differences, loops over
examples, ONNX Runtime runs, JAX references)."""
