"""onnax: JAX-style transformations of ONNX graphs (vmap, jvp, vjp, grad).

Every transform takes an ``onnx_ir.Model`` or an ``onnx.ModelProto`` and returns a new model
of the same kind; the source is never modified. The work happens in the C++ core; models
cross into it as serialized bytes, their large float weights held back (onnax._models).
"""

from __future__ import annotations

from onnax._core import OnnaxError
from onnax._core import version as _core_version
from onnax.training import (
    add_loss,
    apply_params,
    constants_to_initializers,
    feedback,
    initial_state,
    parameters,
    select_params,
    train_step,
)
from onnax.transforms import convert_opset, grad, jvp, stop_gradient, vjp, vmap

__all__ = [
    "OnnaxError",
    "__version__",
    "add_loss",
    "apply_params",
    "constants_to_initializers",
    "convert_opset",
    "feedback",
    "grad",
    "initial_state",
    "jvp",
    "parameters",
    "select_params",
    "stop_gradient",
    "train_step",
    "vjp",
    "vmap",
]

__version__: str = _core_version()
