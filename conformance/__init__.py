"""Conformance harnesses for onnax transforms (not part of the installed package)."""
