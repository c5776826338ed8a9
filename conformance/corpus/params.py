"""Finding a framework's parameters among an export's initializers.

Exporters store parameters as initializers under their own names (jax2onnx: ``const_0``,
``kernel_oih_0``, ...; torch.onnx: the module path), sometimes transposed (Conv kernels HWIO
-> OIHW) or reshaped (attention kernels ``(in, heads, head_dim)`` -> ``(in, heads *
head_dim)``). Each parameter is located by value, trying every axis permutation followed by a
reshape; derivatives are mapped through the same permutation and reshape.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper


@dataclass(frozen=True)
class ParamSite:
    """Where a parameter lives in the ONNX file: ``init = reshape(transpose(p, perm))``."""

    index: int  # position among the framework's parameters
    path: str  # the framework's name for it (tree path, module path)
    init: str
    perm: tuple[int, ...]
    shape: tuple[int, ...]

    def to_onnx(self, value: Any) -> np.ndarray:
        return np.transpose(np.asarray(value), self.perm).reshape(self.shape)


def locate_params(
    paths: Sequence[str], leaves: Sequence[np.ndarray], proto: onnx.ModelProto
) -> tuple[list[ParamSite], list[str]]:
    """Finds each parameter's initializer; returns the sites and the paths not found."""
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    sites: list[ParamSite] = []
    missing: list[str] = []
    for i, (path, leaf) in enumerate(zip(paths, leaves, strict=True)):
        leaf = np.asarray(leaf)
        found = []
        for name, val in inits.items():
            if val.size != leaf.size or val.dtype != leaf.dtype:
                continue
            for perm in itertools.permutations(range(leaf.ndim)):
                if np.array_equal(np.transpose(leaf, perm).reshape(val.shape), val):
                    found.append(ParamSite(i, path, name, perm, tuple(val.shape)))
                    break
        if len(found) > 1:
            raise RuntimeError(f"parameter {path} matches several initializers: {[f.init for f in found]}")
        if found:
            sites.append(found[0])
        else:
            missing.append(path)
    taken = [s.init for s in sites]
    if len(set(taken)) != len(taken):
        raise RuntimeError(
            f"several parameters match the same initializer: {taken}; make their values distinct"
        )
    return sites, missing
