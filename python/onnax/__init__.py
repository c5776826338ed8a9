"""onnax: JAX-style transformations of ONNX graphs (vmap, jvp, vjp, grad).

Every transform takes an ``onnx_ir.Model`` or an ``onnx.ModelProto`` and returns a new model
of the same kind; the source is never modified. The work happens in the C++ core; models
cross into it as serialized bytes, their large float weights held back (onnax._models).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from onnax._core import LimitError, OnnaxError
from onnax._core import version as _core_version
from onnax._limits import limits

if TYPE_CHECKING:
    from onnax.sequences import Signature, scan, signature, step
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
    from onnax.transforms import (
        clear_rules,
        convert_opset,
        grad,
        hessian,
        jacfwd,
        jacrev,
        jvp,
        linearize,
        register_rule,
        stop_gradient,
        vjp,
        vmap,
        with_surrogates,
    )

# The public functions, imported on first use: they need onnx and NumPy, which take a second
# to import, and the `onnax` command (`onnax version`, the C++ commands) needs neither.
_LAZY = {
    **dict.fromkeys(
        (
            "add_loss",
            "apply_params",
            "constants_to_initializers",
            "feedback",
            "initial_state",
            "parameters",
            "select_params",
            "train_step",
        ),
        "onnax.training",
    ),
    **dict.fromkeys(
        (
            "clear_rules",
            "convert_opset",
            "grad",
            "hessian",
            "jacfwd",
            "jacrev",
            "jvp",
            "linearize",
            "register_rule",
            "stop_gradient",
            "vjp",
            "vmap",
            "with_surrogates",
        ),
        "onnax.transforms",
    ),
    **dict.fromkeys(("Signature", "scan", "signature", "step"), "onnax.sequences"),
}

__all__ = [
    "LimitError",
    "OnnaxError",
    "Signature",
    "__version__",
    "add_loss",
    "apply_params",
    "clear_rules",
    "constants_to_initializers",
    "convert_opset",
    "feedback",
    "grad",
    "hessian",
    "initial_state",
    "jacfwd",
    "jacrev",
    "jvp",
    "limits",
    "linearize",
    "parameters",
    "register_rule",
    "scan",
    "select_params",
    "signature",
    "step",
    "stop_gradient",
    "train_step",
    "vjp",
    "vmap",
    "with_surrogates",
]

__version__: str = _core_version()


if not TYPE_CHECKING:  # (type checkers see the imports above)

    def __getattr__(name: str) -> Any:
        if name in ("training", "transforms", "testing"):  # submodules, as before they were lazy
            return importlib.import_module(f"onnax.{name}")
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'onnax' has no attribute '{name}'")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # (later lookups skip this function)
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
