"""The transform chain a generated model records in ``metadata_props["onnax.transforms"]``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import onnx

from onnax.testing._models import ValidationInputError, metadata

TRANSFORMS_KEY = "onnax.transforms"
DERIVATIVES = ("jvp", "vjp", "grad")


@dataclass(frozen=True)
class Step:
    """One recorded transform call."""

    transform: str
    inputs: list[str] = field(default_factory=list)  # jvp/vjp/grad selections
    outputs: list[str] = field(default_factory=list)
    in_axes: dict[str, int | None] = field(default_factory=dict)  # vmap, by runtime input name
    out_axes: list[int | None] = field(default_factory=list)  # None: the same for every example
    axis_name: str = ""
    onnax_version: str = ""

    def call(self, inner: str) -> str:
        """This step applied to ``inner``, written as the Python call."""
        if self.transform == "vmap":
            return (
                f"vmap({inner}, in_axes={self.in_axes!r}, out_axes={self.out_axes!r}, "
                f"axis_name={self.axis_name!r})"
            )
        if self.transform == "grad":
            out = self.outputs[0] if self.outputs else None
            return f"grad({inner}, inputs={self.inputs!r}, output={out!r})"
        return f"{self.transform}({inner}, inputs={self.inputs!r}, outputs={self.outputs!r})"


def _names(raw: object, what: str) -> list[str]:
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        raise ValidationInputError(f"{TRANSFORMS_KEY}: '{what}' must be a list of names, got {raw!r}")
    return list(raw)


def parse_chain(model: onnx.ModelProto) -> list[Step]:
    """The recorded steps, first applied first; ``[]`` when the model records none."""
    text = metadata(model, TRANSFORMS_KEY)
    if text is None:
        return []
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValidationInputError(
            f"metadata_props['{TRANSFORMS_KEY}'] is not valid JSON ({err}). Fix: regenerate the model with "
            "onnax (the record must be what onnax wrote)"
        ) from err
    if not isinstance(raw, list):
        raise ValidationInputError(f"metadata_props['{TRANSFORMS_KEY}'] must be a JSON list of steps")
    steps = []
    for i, item in enumerate(raw):
        if isinstance(item, dict) and item.get("transform") in ("scan", "step"):
            raise ValidationInputError(
                f"{TRANSFORMS_KEY} step {i} is {item['transform']}, which validate does not replay yet. "
                "Fix: compare the sequence model with a loop of the step model in ONNX Runtime (feed each "
                "step's state outputs back), as tests/python/control_flow/test_sequences.py does"
            )
        if isinstance(item, dict) and item.get("transform") in ("jacfwd", "jacrev", "hessian"):
            raise ValidationInputError(
                f"{TRANSFORMS_KEY} step {i} is {item['transform']}, which validate does not replay yet "
                "(jacfwd, jacrev and hessian are tested against JAX in onnax's own suite). Fix: validate "
                "the jvp/vjp/grad the Jacobian is built from, or compare with jax.jacfwd/jacrev yourself"
            )
        if not isinstance(item, dict) or item.get("transform") not in ("vmap", *DERIVATIVES):
            raise ValidationInputError(
                f"{TRANSFORMS_KEY} step {i} is {item!r}; expected an object with 'transform' one of "
                "vmap, jvp, vjp, grad. Fix: regenerate the model with onnax"
            )
        version = str(item.get("onnax_version", ""))
        if item["transform"] == "vmap":
            axes = item.get("in_axes", {})
            outs = item.get("out_axes", [])
            if not isinstance(axes, dict) or not isinstance(outs, list):
                raise ValidationInputError(f"{TRANSFORMS_KEY} step {i} (vmap): malformed in_axes/out_axes")
            steps.append(
                Step(
                    "vmap",
                    in_axes={str(k): (None if v is None else int(v)) for k, v in axes.items()},
                    out_axes=[None if a is None else int(a) for a in outs],
                    axis_name=str(item.get("axis_name", "")),
                    onnax_version=version,
                )
            )
        else:
            steps.append(
                Step(
                    item["transform"],
                    inputs=_names(item.get("inputs"), "inputs"),
                    outputs=_names(item.get("outputs"), "outputs"),
                    onnax_version=version,
                )
            )
    if any(step.transform != "vmap" for step in steps) and _has_surrogates(model.graph):
        raise ValidationInputError(
            "the generated model differentiates spikes by surrogate gradients (nodes marked "
            "metadata_props['onnax.surrogate']), which validate's references (JAX, finite differences) "
            "do not model: they would disagree at every spike. Fix: validate the model differentiated "
            "without a surrogate, or compare with JAX using the same surrogate (docs/stateful.md)"
        )
    return steps


def _has_surrogates(graph: onnx.GraphProto) -> bool:
    for node in graph.node:
        if any(p.key == "onnax.surrogate" for p in node.metadata_props):
            return True
        for a in node.attribute:
            if a.HasField("g") and _has_surrogates(a.g):
                return True
            if any(_has_surrogates(g) for g in a.graphs):
                return True
    return False


def describe_chain(steps: list[Step]) -> str:
    call = "f"
    for s in steps:
        call = s.call(call)
    return call
