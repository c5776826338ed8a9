"""The public transforms."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from onnax import _core
from onnax._models import ModelT, store_inputs, transform

if TYPE_CHECKING:
    import onnx
AxisSpec = int | None


def vmap(
    model: ModelT,
    in_axes: AxisSpec | Sequence[AxisSpec] | Mapping[str, AxisSpec] = 0,
    out_axes: AxisSpec | Sequence[AxisSpec] = 0,
    axis_name: str | None = None,
    stored: Mapping[str, Any] | None = None,
) -> ModelT:
    """Map ``model`` over a new batch axis.

    Args:
        model: an ``onnx_ir.Model`` or ``onnx.ModelProto``; the result is the same kind.
        in_axes: where each runtime graph input carries the batch axis. An int applies to all
            inputs; a sequence gives one entry per graph input in order; a mapping selects by
            input name (unnamed inputs are shared). ``None`` keeps an input shared by all
            examples. Initializers are shared unless the mapping gives one an axis: then it
            becomes a batched graph input (an ensemble: one weight set per example).
        out_axes: where each output carries the batch axis: an int for all outputs or one
            per output. ``None`` keeps an output that is the same for every example unbatched
            (an error if it depends on a batched input).
        axis_name: ``dim_param`` of the new batch dimension (default ``"batch"``, made unique
            in the model).
        stored: values (NumPy arrays, the batch axis where ``in_axes`` puts it) for batched
            inputs to keep stored in the result as initializers instead of feeding them: an
            ensemble's stacked weight sets.

    Returns:
        A new model computing ``f`` for every example; primal names are unchanged.

    Raises:
        OnnaxError: for unsupported operators, bad axes or selections, unsupported opsets.
    """
    all_inputs: AxisSpec = 0
    positional: list[AxisSpec] | None = None
    by_name: dict[str, AxisSpec] | None = None
    if in_axes is None or isinstance(in_axes, int):
        _check_axis(in_axes, "in_axes")
        all_inputs = in_axes
    elif isinstance(in_axes, Mapping):
        by_name = {}
        for name, axis in in_axes.items():
            _check_axis(axis, f"in_axes[{name!r}]")
            by_name[str(name)] = axis
    elif isinstance(in_axes, Sequence) and not isinstance(in_axes, str):
        positional = []
        for i, axis in enumerate(in_axes):
            _check_axis(axis, f"in_axes[{i}]")
            positional.append(axis)
    else:
        raise TypeError(
            "in_axes must be an int, None, a sequence of them (one per runtime input) or a mapping "
            f"from input names to them, got {in_axes!r}"
        )
    if (
        out_axes is not None
        and not isinstance(out_axes, int)
        and not (isinstance(out_axes, Sequence) and not isinstance(out_axes, str))
    ):
        raise TypeError(
            f"out_axes must be an int, None or a sequence of them (one per output), got {out_axes!r}"
        )
    outs: list[AxisSpec] = [out_axes] if out_axes is None or isinstance(out_axes, int) else list(out_axes)
    for i, axis in enumerate(outs):
        _check_axis(axis, f"out_axes[{i}]")
    name = axis_name or ""
    _check_name(name, "axis_name")
    if stored is not None and not isinstance(stored, Mapping):
        raise TypeError(f"stored must map input names to arrays, got {type(stored).__name__}")
    result = transform(model, lambda data: _core.vmap(data, all_inputs, positional, by_name, outs, name))
    return store_inputs(result, stored) if stored else result


def _check_axis(axis: Any, what: str) -> None:
    if axis is not None and (not isinstance(axis, int) or isinstance(axis, bool)):
        raise TypeError(f"{what} must be an int or None, got {axis!r}")
    if axis is not None:
        _check_int64(axis, what)


def _check_int64(value: int, what: str) -> None:
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"{what} is {value}, beyond the 64-bit integers any axis or opset lies in")


def _check_output(output: str | None) -> None:
    if output is not None and not isinstance(output, str):
        raise TypeError(f"output must be a graph name (str), got {output!r}")
    if output is not None:
        _check_name(output, "output")


def _check_name(name: str, what: str) -> None:
    if "\x00" in name:
        raise ValueError(f"{what} {name!r} contains a NUL character, which no ONNX name does")


Names = Sequence[str] | None


def _names(value: Names, what: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        raise TypeError(
            f"{what} must be a sequence of graph names, got the string {value!r}; use [{value!r}]"
        )
    names = list(value)
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"{what} must contain graph names (str), got {n!r}")
        _check_name(n, f"{what} entry")
    return names


Surrogates = str | Sequence[str] | None


def with_surrogates(model: ModelT, surrogate: str | Sequence[str]) -> ModelT:
    """``model`` with its spikes marked for a surrogate derivative (the forward pass unchanged).

    A spike is a Cast or Where of a comparison (Greater, GreaterOrEqual, Less, LessOrEqual), as
    spiking networks write the Heaviside step, or a Sign; its derivative is zero almost
    everywhere. Marked, jvp/vjp/grad differentiate it as ``g(x)`` of the comparison's margin
    ``x = a - b``, with ``g`` as spyx's surrogates define it: ``"superspike:k=25"`` (alias
    fast_sigmoid; 1/(1+k|x|)^2), ``"arctan:k=2"`` (1/(pi(1+(k pi x)^2))), ``"triangular:k=2"``
    (max(0, 1-|kx|)), ``"boxcar:width=2,height=0.5"``, ``"tanh:k=1"`` (1-tanh(kx)^2),
    ``"straight_through"`` (1). ``"VALUE=KIND..."`` applies to the spike producing VALUE only.
    The derivative functions take ``surrogate=`` to do this first."""
    specs = [surrogate] if isinstance(surrogate, str) else list(surrogate)
    for spec in specs:
        if not isinstance(spec, str):
            raise TypeError(f"surrogate must be a string such as 'superspike:k=25', got {spec!r}")
    return transform(model, lambda data: _core.with_surrogates(data, specs))


def _surrogates(model: ModelT, surrogate: Surrogates) -> ModelT:
    return model if surrogate is None else with_surrogates(model, surrogate)


def jvp(
    model: ModelT, inputs: Names = None, outputs: Names = None, *, surrogate: Surrogates = None
) -> ModelT:
    """Forward-mode derivative (Jacobian-vector product) of ``model``.

    Appends one tangent input per selected input (same shape and dtype, ``<input>_tangent``)
    and returns all primal outputs, then the tangents of the selected outputs
    (``<output>_tangent``). By default the FLOAT/DOUBLE runtime inputs are selected; the
    outputs default to the derivatives an earlier onnax transform generated (so
    ``jvp(grad(f), inputs=["w"])`` appends a Hessian-vector product), else every float output.
    """
    selected = _names(inputs, "inputs"), _names(outputs, "outputs")
    return transform(_surrogates(model, surrogate), lambda data: _core.jvp(data, *selected))


def vjp(
    model: ModelT, inputs: Names = None, outputs: Names = None, *, surrogate: Surrogates = None
) -> ModelT:
    """Reverse-mode derivative (vector-Jacobian product) of ``model``.

    Appends one cotangent input per selected output (``<output>_cotangent``) and returns all
    primal outputs, then the cotangents of the selected inputs (``<input>_cotangent``).
    """
    selected = _names(inputs, "inputs"), _names(outputs, "outputs")
    return transform(_surrogates(model, surrogate), lambda data: _core.vjp(data, *selected))


def grad(
    model: ModelT, inputs: Names = None, output: str | None = None, *, surrogate: Surrogates = None
) -> ModelT:
    """Gradient of one rank-0 output with an implicit unit seed.

    Returns all primal outputs, then ``<input>_grad`` for every selected input. ``output``
    defaults to the model's only rank-0 float output.
    """
    _check_output(output)
    selected = _names(inputs, "inputs")
    return transform(_surrogates(model, surrogate), lambda data: _core.grad(data, selected, output))


def jacfwd(model: ModelT, inputs: Names = None, outputs: Names = None) -> ModelT:
    """Jacobians of ``model`` in forward mode, as ``jax.jacfwd`` lays them out.

    Returns all primal outputs, then for each selected output ``y`` and input ``x`` (outputs
    outer, inputs inner) an output ``<y>_jacobian_<x>`` of shape ``y.shape + x.shape``. One
    graph: ``jvp`` vmapped over a basis of input tangents, so its cost grows with the selected
    inputs' size (prefer ``jacrev`` for few outputs and many inputs). Selections default as
    ``jvp``'s do.
    """
    selected = _names(inputs, "inputs"), _names(outputs, "outputs")
    return transform(model, lambda data: _core.jacobian(data, *selected, True))


def jacrev(model: ModelT, inputs: Names = None, outputs: Names = None) -> ModelT:
    """Jacobians of ``model`` in reverse mode, as ``jax.jacrev`` lays them out.

    The same outputs and numbers as ``jacfwd``: ``vjp`` vmapped over a basis of output
    cotangents, so its cost grows with the selected outputs' size. Selections default as
    ``vjp``'s do.
    """
    selected = _names(inputs, "inputs"), _names(outputs, "outputs")
    return transform(model, lambda data: _core.jacobian(data, *selected, False))


def linearize(model: ModelT, inputs: Names = None, outputs: Names = None) -> tuple[ModelT, ModelT]:
    """``jvp`` split in two, as ``jax.linearize``: returns ``(primal, linear)``.

    ``primal`` maps the model's inputs to all its outputs, then the residuals (the primal values
    the derivative reads). ``linear`` maps those residuals (inputs named as ``primal``'s extra
    outputs) and one ``<input>_tangent`` per selected input to the ``<output>_tangent`` of the
    selected outputs, and is linear in the tangents: run ``primal`` once and ``linear`` for as
    many tangents as needed. Selections default as ``jvp``'s do.
    """
    selected = _names(inputs, "inputs"), _names(outputs, "outputs")
    primal = transform(model, lambda data: _core.linearize(data, *selected, True))
    linear = transform(model, lambda data: _core.linearize(data, *selected, False))
    return primal, linear


def hessian(model: ModelT, inputs: Names = None, output: str | None = None) -> ModelT:
    """Hessian of one output, ``jacfwd(jacrev(f))`` as ``jax.hessian`` defines it.

    Returns all primal outputs, the Jacobians ``<y>_jacobian_<a>``, then for every pair of
    selected inputs an output ``<y>_hessian_<a>_<b>`` of shape ``y.shape + a.shape + b.shape``.
    ``output`` defaults to the model's only float output.
    """
    _check_output(output)
    selected = _names(inputs, "inputs")
    return transform(model, lambda data: _core.hessian(data, selected, output))


def register_rule(
    op: str | None = None,
    domain: str = "",
    *,
    body: onnx.FunctionProto | None = None,
    jvp: onnx.FunctionProto | None = None,
    node: str | None = None,
    vjp: onnx.FunctionProto | None = None,
) -> None:
    """Gives onnax a rule it lacks, or replaces one, for every later transform in this process.

    Args:
        op, domain: the operator the rule is for (a custom domain, a contrib op onnax lacks, or
            a standard op whose derivative you want to replace).
        body: an ``onnx.FunctionProto`` defining the operator in operators onnax has rules for
            (inputs and outputs as the operator's): every transform runs through it, as through
            a model-local function; jvp/vjp/grad keep the operator itself when ``jvp`` is given.
        jvp: an ``onnx.FunctionProto`` computing the operator's JVP (JAX's ``custom_jvp``):
            inputs are the operator's inputs then one tangent per input (zeros where an input has
            none), outputs the tangents of its outputs, linear in the input tangents; reverse mode
            transposes it. The node itself stays in the result.
        node: apply the JVP (or VJP) to the node of this name only (any operator); ``op`` is
            then ignored.
        vjp: an ``onnx.FunctionProto`` computing the operator's VJP (JAX's ``custom_vjp``): inputs
            are the operator's inputs then one cotangent per output (zeros where an output has
            none), outputs one cotangent per input. Reverse mode (vjp, grad, jacrev) uses it and
            keeps the node; forward mode needs ``jvp`` or ``body``. Not inside Loop/Scan bodies
            (their reverse mode transposes a JVP).
    """
    if node is None and not isinstance(op, str):
        raise TypeError(f"op must be the operator's type (str), got {op!r}")
    functions: list[bytes | None] = []
    for what, f in (("body", body), ("jvp", jvp), ("vjp", vjp)):
        if f is None:
            functions.append(None)
            continue
        if not hasattr(f, "SerializeToString") or type(f).__name__ != "FunctionProto":
            raise TypeError(f"{what} must be an onnx.FunctionProto, got {type(f).__name__}")
        functions.append(f.SerializeToString())
    _core.register_rule(domain, op or "", node or "", functions[0], functions[1], functions[2])


def clear_rules() -> None:
    """Forgets every rule registered with ``register_rule``."""
    _core.clear_rules()


def stop_gradient(model: ModelT, values: Sequence[str]) -> ModelT:
    """``model`` with ``values`` (main-graph node outputs or inputs) marked so that ``jvp``,
    ``vjp``, ``grad`` and ``train_step`` treat them as constants, as JAX's ``lax.stop_gradient``
    does: their derivative is cut, their values are unchanged. The marks live in
    ``metadata_props["onnax.stop_gradient"]`` and hold through later transforms."""
    names = _names(values, "values") or []
    return transform(model, lambda data: _core.stop_gradient(data, names))


def convert_opset(model: ModelT, target: int) -> ModelT:
    """``model`` at ai.onnx opset ``target`` (for runtimes that support only older opsets).

    Transforms of a model below opset 18 already return it at its own opset when every node
    they wrote has a form there (else at 18, with a notice); this converts to another opset.
    Older targets move inputs back to the attributes that opset wants (Reduce* axes,
    Squeeze/Unsqueeze axes, Split sizes, Shape's start/end) and check every node against that
    opset's schema; newer ones use ONNX's version converter.

    Raises:
        OnnaxError: naming the first node that has no form at ``target``.
    """
    if isinstance(target, bool) or not isinstance(target, int):
        raise TypeError(f"target must be an int opset version, got {target!r}")
    _check_int64(target, "target")
    return transform(model, lambda data: _core.convert_opset(data, target))
