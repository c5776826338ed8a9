"""Losses, training steps, DP-SGD and gradient accumulation against independent references:
losses written from their definitions in JAX float64, gradients by jax.grad / jax.vmap of the
same MLP written in jax.numpy, optimizer updates by optax, all run side by side with the ONNX
graphs onnax writes (executed by ONNX Runtime)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from oracles.training_oracle import (
    PARAMS,
    StepRunner,
    as64,
    jax_loss,
    mlp_jax,
    mlp_model,
    mlp_values,
    reduce_loss,
    run,
)

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

onnax = pytest.importorskip("onnax")

RTOL, ATOL = 2e-5, 2e-6  # float32 graphs against float64 references


def classifier(
    rng: np.random.Generator, n: int = 6
) -> tuple[onnx.ModelProto, dict[str, np.ndarray], np.ndarray]:
    values = mlp_values(rng)
    return mlp_model(values), values, rng.standard_normal((n, 4)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Losses


LOSS_CASES: list[tuple[str, dict[str, Any]]] = [
    ("mse", {}),
    ("mse", {"reduction": "sum"}),
    ("l1", {}),
    ("huber", {"huber_delta": 0.7}),
    ("binary_cross_entropy_with_logits", {}),
    ("softmax_cross_entropy", {}),
    ("softmax_cross_entropy", {"label_smoothing": 0.1}),
    ("softmax_cross_entropy", {"ignore_index": -100}),
    ("softmax_cross_entropy", {"probabilities": True, "label_smoothing": 0.2}),
    ("softmax_cross_entropy", {"example_weights": True, "reduction": "sum"}),
    ("nll", {}),
    ("mse", {"example_weights": True}),
    ("cross_entropy", {}),
    ("cross_entropy", {"probabilities": True, "label_smoothing": 0.1}),
    ("binary_cross_entropy", {}),
]

# The op a model ends with for a loss that reads probabilities or log-probabilities.
HEADS = {"nll": "LogSoftmax", "cross_entropy": "Softmax", "binary_cross_entropy": "Sigmoid"}


def _labels(kind: str, o: dict[str, Any], y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if kind in ("softmax_cross_entropy", "nll", "cross_entropy") and not o.get("probabilities"):
        t = rng.integers(0, y.shape[-1], size=y.shape[:-1]).astype(np.int64)
        if "ignore_index" in o:
            t[1] = o["ignore_index"]
        return t
    if o.get("probabilities"):
        p = rng.uniform(0.1, 1.0, size=y.shape)
        return (p / p.sum(-1, keepdims=True)).astype(np.float32)
    if kind.startswith("binary_cross_entropy"):
        return rng.uniform(0, 1, size=y.shape).astype(np.float32)
    return rng.standard_normal(y.shape).astype(np.float32)


@pytest.mark.parametrize(
    ("kind", "o"), LOSS_CASES, ids=[f"{k}-{'-'.join(o) or 'plain'}" for k, o in LOSS_CASES]
)
def test_loss_value_and_parameter_gradients_match_jax(kind: str, o: dict[str, Any]) -> None:
    rng = np.random.default_rng(0)
    model, values, x = classifier(rng)
    if kind in HEADS:  # the model outputs (log-)probabilities
        head = HEADS[kind]
        attrs: dict[str, Any] = {} if head == "Sigmoid" else {"axis": -1}
        model.graph.node.append(onnx.helper.make_node(head, ["y"], ["p"], **attrs))
        model.graph.output[0].name = "p"
    loss_model = onnax.add_loss(model, kind, **o)
    assert [i.name for i in loss_model.graph.input][-1 - o.get("example_weights", 0)] == "label"
    assert loss_model.graph.output[0].name == "loss"

    y = mlp_jax(as64(values), x.astype(np.float64))
    t = _labels(kind, o, np.asarray(y), rng)
    w = np.asarray(rng.uniform(0.5, 2.0, size=x.shape[0]), np.float32)
    feeds = {"x": x, "label": t, "example_weight": w}
    element = jax_loss(kind, **o)

    def loss(params: dict[str, Any]) -> Any:
        out = mlp_jax(params, x.astype(np.float64))
        if kind == "nll":
            out = jax.nn.log_softmax(out, axis=-1)
        if kind == "cross_entropy":
            out = jax.nn.softmax(out, axis=-1)
        if kind == "binary_cross_entropy":
            out = jax.nn.sigmoid(out)
        tt = t if t.dtype == np.int64 else t.astype(np.float64)
        mask = (t != o["ignore_index"]) if "ignore_index" in o else None
        weights = w.astype(np.float64) if o.get("example_weights") else None
        return reduce_loss(element(out, tt), mask, weights, o.get("reduction", "mean"))

    expected = float(loss(as64(values)))
    got = run(loss_model, feeds)
    np.testing.assert_allclose(got["loss"], expected, rtol=RTOL, atol=ATOL)

    g = onnax.grad(loss_model, inputs=list(PARAMS), output="loss")
    got_g = run(g, feeds)
    want_g = jax.grad(loss)(as64(values))
    for p in PARAMS:
        np.testing.assert_allclose(got_g[f"{p}_grad"], want_g[p], rtol=1e-4, atol=1e-5, err_msg=p)


def test_binary_cross_entropy_is_stable_for_large_logits() -> None:
    x = onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, ["N"])
    model = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Identity", ["z"], ["y"])],
            "id",
            [x],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N"])],
        ),
        opset_imports=[onnx.helper.make_opsetid("", 18)],
        ir_version=10,
    )
    loss_model = onnax.add_loss(model, "binary_cross_entropy_with_logits", reduction="sum")
    z = np.array([-80.0, -30.0, 0.0, 30.0, 80.0], np.float32)
    t = np.array([1.0, 0.0, 0.5, 1.0, 0.0], np.float32)
    got = run(loss_model, {"z": z, "label": t})["loss"]
    z64, t64 = z.astype(np.float64), t.astype(np.float64)
    expected = np.sum(np.logaddexp(0.0, z64) - z64 * t64)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    grad = run(onnax.grad(loss_model, inputs=["z"]), {"z": z, "label": t})["z_grad"]
    np.testing.assert_allclose(grad, 1 / (1 + np.exp(-z64)) - t64, atol=1e-6)


def test_class_axis_one_and_symbolic_label_dims() -> None:
    """Logits [N, C, T] (PyTorch's layout) with class_axis=1: the label is [N, T], dims kept."""
    nodes = [onnx.helper.make_node("Identity", ["z"], ["y"])]
    vi = onnx.helper.make_tensor_value_info
    model = onnx.helper.make_model(
        onnx.helper.make_graph(nodes, "id", [vi("z", 1, ["N", 5, "T"])], [vi("y", 1, ["N", 5, "T"])]),
        opset_imports=[onnx.helper.make_opsetid("", 18)],
        ir_version=10,
    )
    loss_model = onnax.add_loss(model, "softmax_cross_entropy", class_axis=1)
    label = loss_model.graph.input[-1]
    assert label.type.tensor_type.elem_type == onnx.TensorProto.INT64
    assert [d.dim_param or d.dim_value for d in label.type.tensor_type.shape.dim] == ["N", "T"]
    rng = np.random.default_rng(1)
    z = rng.standard_normal((2, 5, 3)).astype(np.float32)
    t = rng.integers(0, 5, size=(2, 3))
    logp = jax.nn.log_softmax(z.astype(np.float64), axis=1)
    expected = -np.mean(np.take_along_axis(np.asarray(logp), t[:, None, :], axis=1))
    np.testing.assert_allclose(run(loss_model, {"z": z, "label": t})["loss"], expected, rtol=1e-6)


def test_loss_diagnostics() -> None:
    model, _, _ = classifier(np.random.default_rng(0))
    with pytest.raises(onnax.OnnaxError, match=r"'nope' is not a graph output; outputs: \['y'\]"):
        onnax.add_loss(model, "mse", output="nope")
    with pytest.raises(onnax.OnnaxError, match=r"already has a value named 'x'.*Fix"):
        onnax.add_loss(model, "mse", label_name="x")
    with pytest.raises(onnax.OnnaxError, match=r"class_axis 2 is out of range.*\[-2, 1\]"):
        onnax.add_loss(model, "softmax_cross_entropy", class_axis=2)
    with pytest.raises(onnax.OnnaxError, match="ignore_index applies to class-index labels"):
        onnax.add_loss(model, "mse", ignore_index=0)
    with pytest.raises(ValueError, match="kind must be one of"):
        onnax.add_loss(model, "hinge")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Parameter selection


def test_select_params_by_globs_regex_size_and_exclusion() -> None:
    model, _, _ = classifier(np.random.default_rng(0))
    assert onnax.select_params(model) == ["W1", "b1", "W2", "b2"]
    assert onnax.select_params(model, "W*") == ["W1", "W2"]
    assert onnax.select_params(model, "re:b[0-9]") == ["b1", "b2"]
    assert onnax.select_params(model, "all", exclude="b*") == ["W1", "W2"]
    assert onnax.select_params(model, min_size=10) == ["W1", "W2"]
    assert onnax.select_params(model, ["b2", "W1"]) == ["W1", "b2"]  # graph order
    with pytest.raises(onnax.OnnaxError, match=r"'conv\*' matches none of .*\['W1', 'b1', 'W2', 'b2'\]"):
        onnax.select_params(model, "conv*")
    with pytest.raises(onnax.OnnaxError, match="not a valid regular expression"):
        onnax.select_params(model, "re:(")
    with pytest.raises(onnax.OnnaxError, match="leave no parameter"):
        onnax.select_params(model, "all", exclude="*")


def test_constant_weights_become_parameters() -> None:
    """jax2onnx writes weights as Constant nodes: they can be promoted, trained and written back."""
    rng = np.random.default_rng(2)
    values = mlp_values(rng)
    model = mlp_model(values)
    w1 = model.graph.initializer[0]
    del model.graph.initializer[0]
    model.graph.node.insert(0, onnx.helper.make_node("Constant", [], ["W1"], value=w1))
    with pytest.raises(onnax.OnnaxError, match=r"'W1\*' matches none"):
        onnax.select_params(model, "W1*")
    promoted = onnax.constants_to_initializers(model)
    assert onnax.select_params(promoted) == ["b1", "W2", "b2", "W1"]
    trained = onnax.apply_params(model, {"W1": np.zeros_like(values["W1"])})
    x = rng.standard_normal((3, 4)).astype(np.float32)
    expected = np.tanh(values["b1"]) @ values["W2"] + values["b2"]
    np.testing.assert_allclose(run(trained, {"x": x})["y"], np.broadcast_to(expected, (3, 3)), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Training steps against optax

OPTIMIZERS: list[tuple[str, dict[str, Any]]] = [
    ("sgd", {"learning_rate": 0.1}),
    ("sgd", {"learning_rate": 0.05, "momentum": 0.9}),
    ("sgd", {"learning_rate": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("adam", {"learning_rate": 0.01, "weight_decay": 0.001}),
    ("adamw", {"learning_rate": 0.01, "weight_decay": 0.1, "no_decay": ["b*"]}),
    ("adamw", {"learning_rate": 0.01, "clip_norm": 0.5}),
]


def optax_transform(kind: str, o: dict[str, Any]) -> Any:
    lr = o["learning_rate"]
    wd = o.get("weight_decay", 0.0)
    decay_mask = {p: not (p.startswith("b") and "no_decay" in o) for p in PARAMS}
    chain = [optax.clip_by_global_norm(o["clip_norm"])] if o.get("clip_norm") else []
    if kind == "sgd":
        if wd:
            chain.append(optax.add_decayed_weights(wd))
        chain.append(optax.sgd(lr, momentum=o.get("momentum") or None, nesterov=o.get("nesterov", False)))
    elif kind == "adam":
        if wd:
            chain.append(optax.add_decayed_weights(wd))
        chain.append(optax.adam(lr, b1=0.9, b2=0.999, eps=1e-8))
    else:
        chain.append(optax.adamw(lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=wd, mask=decay_mask))
    return optax.chain(*chain)


@pytest.mark.parametrize(("kind", "o"), OPTIMIZERS, ids=[f"{k}-{'-'.join(o)}" for k, o in OPTIMIZERS])
def test_train_step_matches_optax(kind: str, o: dict[str, Any]) -> None:
    rng = np.random.default_rng(3)
    model, values, _ = classifier(rng)
    loss_model = onnax.add_loss(model, "softmax_cross_entropy")
    step = onnax.train_step(loss_model, optimizer=kind, **o)  # type: ignore[arg-type]
    runner = StepRunner(step, onnax.initial_state(loss_model, step))
    element = jax_loss("softmax_cross_entropy")

    def loss(params: dict[str, Any], x: Any, t: Any) -> Any:
        return jnp.mean(element(mlp_jax(params, x), t))

    tx = optax_transform(kind, o)
    params = as64(values)
    opt_state = tx.init(params)
    for _ in range(5):
        x = rng.standard_normal((8, 4)).astype(np.float32)
        t = rng.integers(0, 3, size=8)
        out = runner({"x": x, "label": t})
        value, grads = jax.value_and_grad(loss)(params, x.astype(np.float64), t)
        np.testing.assert_allclose(out["loss"], value, rtol=1e-5)
        if o.get("clip_norm"):
            norm = np.sqrt(sum(np.sum(np.asarray(g) ** 2) for g in grads.values()))
            np.testing.assert_allclose(out["grad_norm"], norm, rtol=1e-5)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    for p in PARAMS:
        np.testing.assert_allclose(runner.state[p], params[p], rtol=1e-4, atol=1e-5, err_msg=p)
    assert int(runner.state["step"]) == 5


def test_adamw_loss_curve_over_50_steps_matches_optax() -> None:
    rng = np.random.default_rng(4)
    model, values, _ = classifier(rng)
    loss_model = onnax.add_loss(model, "mse")
    step = onnax.train_step(loss_model, optimizer="adamw", learning_rate=0.02, weight_decay=0.01)
    runner = StepRunner(step, onnax.initial_state(loss_model, step))
    x = rng.standard_normal((16, 4)).astype(np.float32)
    t = rng.standard_normal((16, 3)).astype(np.float32)

    def loss(params: dict[str, Any]) -> Any:
        return jnp.mean((mlp_jax(params, x.astype(np.float64)) - t) ** 2)

    tx = optax.adamw(0.02, weight_decay=0.01)
    params = as64(values)
    opt_state = tx.init(params)
    ours, theirs = [], []
    for _ in range(50):
        ours.append(float(runner({"x": x, "label": t})["loss"]))
        value, grads = jax.value_and_grad(loss)(params)
        theirs.append(float(value))
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    np.testing.assert_allclose(ours, theirs, rtol=2e-4)
    assert theirs[-1] < 0.5 * theirs[0]


def test_learning_rate_is_an_input_the_state_carries() -> None:
    rng = np.random.default_rng(5)
    model, values, x = classifier(rng)
    loss_model = onnax.add_loss(model, "mse")
    step = onnax.train_step(loss_model, optimizer="sgd", learning_rate=0.1)
    state = onnax.initial_state(loss_model, step)
    assert state["learning_rate"].dtype == np.float32 and float(state["learning_rate"]) == pytest.approx(0.1)
    t = rng.standard_normal((x.shape[0], 3)).astype(np.float32)
    default = run(step, {**state, "x": x, "label": t})
    halved = run(step, {**state, "x": x, "label": t, "learning_rate": np.array(0.05, np.float32)})
    grads = run(onnax.grad(loss_model, inputs=list(PARAMS)), {"x": x, "label": t})
    for p in PARAMS:
        np.testing.assert_allclose(
            default[f"{p}_new"], values[p] - 0.1 * grads[f"{p}_grad"], rtol=1e-6, atol=1e-7
        )
        np.testing.assert_allclose(
            halved[f"{p}_new"], values[p] - 0.05 * grads[f"{p}_grad"], rtol=1e-6, atol=1e-7
        )


# ---------------------------------------------------------------------------------------------
# DP-SGD and accumulation


def test_dp_sgd_step_matches_numpy_clip_sum_noise() -> None:
    rng = np.random.default_rng(6)
    model, values, _ = classifier(rng)
    loss_model = onnax.add_loss(model, "softmax_cross_entropy")
    clip, sigma, lr = 0.3, 1.1, 0.1
    step = onnax.train_step(
        loss_model, optimizer="sgd", learning_rate=lr, dp_clip_norm=clip, noise_multiplier=sigma
    )
    state = onnax.initial_state(loss_model, step)
    x = rng.standard_normal((7, 4)).astype(np.float32)
    t = rng.integers(0, 3, size=7)
    noise = {f"{p}_noise": rng.standard_normal(values[p].shape).astype(np.float32) for p in PARAMS}
    out = run(step, {**state, **noise, "x": x, "label": t})

    element = jax_loss("softmax_cross_entropy")

    def example_loss(params: dict[str, Any], xi: Any, ti: Any) -> Any:
        return jnp.mean(element(mlp_jax(params, xi[None]), ti[None]))

    params = as64(values)
    per_example = jax.vmap(jax.grad(example_loss), in_axes=(None, 0, 0))(params, x.astype(np.float64), t)
    norms = np.sqrt(sum(np.sum(np.asarray(per_example[p]).reshape(7, -1) ** 2, axis=1) for p in PARAMS))
    np.testing.assert_allclose(out["per_example_grad_norm"], norms, rtol=1e-5)
    factor = np.minimum(1.0, clip / norms)
    for p in PARAMS:
        g = np.asarray(per_example[p])
        clipped_sum = np.tensordot(factor, g, axes=1)
        private = (clipped_sum + sigma * clip * noise[f"{p}_noise"]) / 7
        np.testing.assert_allclose(out[f"{p}_new"], params[p] - lr * private, rtol=1e-5, atol=1e-6, err_msg=p)
    losses = jax.vmap(example_loss, in_axes=(None, 0, 0))(params, x.astype(np.float64), t)
    np.testing.assert_allclose(out["loss"], np.mean(losses), rtol=1e-5)


def test_dp_sgd_refuses_a_fixed_batch_size() -> None:
    rng = np.random.default_rng(0)
    model, _, _ = classifier(rng)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 8
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 8
    loss_model = onnax.add_loss(model, "mse")
    with pytest.raises(onnax.OnnaxError, match=r"fixed batch size of 8 on axis 0.*symbolic"):
        onnax.train_step(loss_model, dp_clip_norm=1.0, noise_multiplier=1.0)


def test_accumulate_then_apply_equals_one_step_on_the_whole_batch() -> None:
    rng = np.random.default_rng(7)
    model, _, _ = classifier(rng)
    loss_model = onnax.add_loss(model, "mse")
    opts: dict[str, Any] = {"optimizer": "adam", "learning_rate": 0.01}
    whole = onnax.train_step(loss_model, **opts)
    acc = onnax.train_step(loss_model, form="accumulate", **opts)
    apply = onnax.train_step(loss_model, form="apply", **opts)
    x = rng.standard_normal((12, 4)).astype(np.float32)
    t = rng.standard_normal((12, 3)).astype(np.float32)

    expected = run(whole, {**onnax.initial_state(loss_model, whole), "x": x, "label": t})
    acc_runner = StepRunner(acc, onnax.initial_state(loss_model, acc))
    for k in range(3):
        acc_runner({"x": x[4 * k : 4 * k + 4], "label": t[4 * k : 4 * k + 4]})
    assert int(acc_runner.state["accumulated"]) == 3
    apply_state = {**onnax.initial_state(loss_model, apply), **acc_runner.state}
    out = run(apply, apply_state)
    for p in PARAMS:
        np.testing.assert_allclose(out[f"{p}_new"], expected[f"{p}_new"], rtol=1e-5, atol=1e-6, err_msg=p)
        np.testing.assert_array_equal(out[f"{p}_grad_sum_new"], 0)
    assert {i for i, _ in onnax.feedback(acc)} >= {f"{p}_grad_sum" for p in PARAMS}


def test_initial_state_model_equals_python_initial_state(tmp_path: Any) -> None:
    import subprocess
    import sys

    rng = np.random.default_rng(8)
    model, _, _ = classifier(rng)
    onnx.save(model, tmp_path / "mlp.onnx")
    onnax_cmd = [sys.executable, "-m", "onnax"]
    subprocess.run(
        [*onnax_cmd, "loss", str(tmp_path / "mlp.onnx"), "-o", str(tmp_path / "loss.onnx"), "--kind", "mse"],
        check=True,
    )
    subprocess.run(
        [
            *onnax_cmd,
            "train-step",
            str(tmp_path / "loss.onnx"),
            "-o",
            str(tmp_path / "step.onnx"),
            "--params",
            "W*,b*",
            "--optimizer",
            "adam",
            "--lr",
            "0.01",
            "--init",
            str(tmp_path / "init.onnx"),
        ],
        check=True,
    )
    loss_model = onnx.load(tmp_path / "loss.onnx")
    step = onnx.load(tmp_path / "step.onnx")
    # The command line and Python write the same bytes.
    assert (
        step.SerializeToString()
        == onnax.train_step(
            onnax.add_loss(model, "mse"), ["W*", "b*"], optimizer="adam", learning_rate=0.01
        ).SerializeToString()
    )
    from_model = run(onnx.load(tmp_path / "init.onnx"), {})
    from_python = onnax.initial_state(loss_model, step)
    assert set(from_model) == set(from_python)
    for k, v in from_python.items():
        np.testing.assert_array_equal(from_model[k], v, err_msg=k)
        assert from_model[k].dtype == v.dtype
    onnx.checker.check_model(step, full_check=True)


def test_trained_values_written_back_reproduce_the_step_forward() -> None:
    rng = np.random.default_rng(9)
    model, _, x = classifier(rng)
    loss_model = onnax.add_loss(model, "mse")
    step = onnax.train_step(loss_model, optimizer="adamw", learning_rate=0.05)
    runner = StepRunner(step, onnax.initial_state(loss_model, step))
    t = rng.standard_normal((x.shape[0], 3)).astype(np.float32)
    for _ in range(3):
        runner({"x": x, "label": t})
    trained = onnax.apply_params(model, {p: runner.state[p] for p in PARAMS})
    y = run(trained, {"x": x})["y"]
    np.testing.assert_allclose(
        y, np.asarray(mlp_jax(as64(runner.state), x.astype(np.float64))), rtol=1e-5, atol=1e-6
    )
    # The source is never modified.
    np.testing.assert_array_equal(
        onnx.numpy_helper.to_array(model.graph.initializer[0]),
        onnx.numpy_helper.to_array(mlp_model(mlp_values(np.random.default_rng(9))).graph.initializer[0]),
    )


# ---------------------------------------------------------------------------------------------
# Real exports (the corpus's jax2onnx and torch.onnx models, each with its own loss output)


@pytest.mark.parametrize("name", ["jax_mlp", "torch_mlp", "jax_transformer", "torch_transformer"])
def test_adamw_curve_on_exported_models_matches_optax_on_the_interpreted_graph(name: str) -> None:
    """50 AdamW steps of the step onnax writes for an exported model, against optax driving
    jax.grad of the same ONNX graph interpreted op by op in JAX float64."""
    import json
    from pathlib import Path

    from onnax.testing._jax_reference import interpret

    corpus = Path(__file__).resolve().parents[3] / "conformance" / "corpus" / "models"
    model = onnx.load(corpus / f"{name}.onnx")
    params = json.loads((corpus / f"{name}.json").read_text())["params"]
    step = onnax.train_step(model, params, optimizer="adamw", learning_rate=0.01, weight_decay=0.01)
    runner = StepRunner(step, onnax.initial_state(model, step))
    rng = np.random.default_rng(12)
    feeds = {}
    for vi in model.graph.input:
        if vi.name in {t.name for t in model.graph.initializer}:
            continue
        dims = [d.dim_value or 4 for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.standard_normal(dims).astype(np.float32)

    f = interpret(model)
    loss_of = jax.jit(jax.value_and_grad(lambda p: f({**p, **feeds})[0]))
    stored = onnax.initial_state(model, step)
    ps = {p: np.asarray(stored[p], np.float64) for p in params}
    tx = optax.adamw(0.01, weight_decay=0.01)
    opt_state = tx.init(ps)
    ours, theirs = [], []
    for _ in range(50):
        ours.append(float(runner(feeds)["loss"]))
        value, grads = loss_of(ps)
        theirs.append(float(value))
        updates, opt_state = tx.update(grads, opt_state, ps)
        ps = optax.apply_updates(ps, updates)
    np.testing.assert_allclose(ours, theirs, rtol=2e-3, atol=1e-5)
    assert theirs[-1] < theirs[0]


def test_stop_gradient_cuts_the_derivative_through_a_marked_value() -> None:
    """The residual block y = h W2 + b2 with h = tanh(x W1 + b1) marked: gradients against
    jax.lax.stop_gradient in the same place; the mark holds through jvp(grad(f))."""
    rng = np.random.default_rng(13)
    model, values, x = classifier(rng)
    loss_model = onnax.add_loss(model, "mse")
    marked = onnax.stop_gradient(loss_model, ["h"])
    t = rng.standard_normal((x.shape[0], 3)).astype(np.float32)

    def loss(params: dict[str, Any]) -> Any:
        h = jax.lax.stop_gradient(jnp.tanh(x.astype(np.float64) @ params["W1"] + params["b1"]))
        return jnp.mean((h @ params["W2"] + params["b2"] - t) ** 2)

    g = onnax.grad(marked, inputs=list(PARAMS))
    got = run(g, {"x": x, "label": t})
    want = jax.grad(loss)(as64(values))
    for p in PARAMS:
        np.testing.assert_allclose(got[f"{p}_grad"], want[p], rtol=1e-5, atol=1e-7, err_msg=p)
    assert not np.any(got["W1_grad"])
    # Hessian-vector product of the marked loss: forward over reverse keeps the mark.
    v = {p: rng.standard_normal(values[p].shape).astype(np.float32) for p in PARAMS}
    hvp = run(
        onnax.jvp(g, inputs=list(PARAMS)), {"x": x, "label": t, **{f"{p}_tangent": v[p] for p in PARAMS}}
    )
    _, want_hvp = jax.jvp(jax.grad(loss), (as64(values),), (as64(v),))
    for p in PARAMS:
        np.testing.assert_allclose(hvp[f"{p}_grad_tangent"], want_hvp[p], rtol=1e-4, atol=1e-6, err_msg=p)
    # The values themselves are unchanged.
    np.testing.assert_allclose(got["loss"], run(loss_model, {"x": x, "label": t})["loss"], rtol=1e-7)
    with pytest.raises(onnax.OnnaxError, match=r"'nope' is not a value of the model's main graph"):
        onnax.stop_gradient(loss_model, ["nope"])
    with pytest.raises(onnax.OnnaxError, match=r"input 'x' is selected for differentiation but marked"):
        onnax.grad(onnax.stop_gradient(loss_model, ["x"]), inputs=["x"])


def test_dp_sgd_noise_drawn_in_the_graph_is_standard_normal_scaled() -> None:
    """With noise_seed the step draws its own noise: the update's difference from the noise-free
    clipped mean, times B / (sigma C), is standard normal, and changes from run to run."""
    rng = np.random.default_rng(14)
    model, values, _ = classifier(rng)
    loss_model = onnax.add_loss(model, "softmax_cross_entropy", keep_outputs=False)
    assert [o.name for o in loss_model.graph.output] == ["loss"]
    opts: dict[str, Any] = {
        "optimizer": "sgd",
        "learning_rate": 1.0,
        "dp_clip_norm": 0.5,
        "noise_multiplier": 2.0,
    }
    seeded = onnax.train_step(loss_model, noise_seed=7, **opts)
    assert not [i.name for i in seeded.graph.input if i.name.endswith("_noise")]
    exact = onnax.train_step(loss_model, **opts)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    t = rng.integers(0, 3, size=5)
    state = onnax.initial_state(loss_model, exact)
    zeros = {f"{p}_noise": np.zeros_like(values[p]) for p in PARAMS}
    clean = run(exact, {**state, **zeros, "x": x, "label": t})
    runner = StepRunner(seeded, state)
    draws = []
    for _ in range(2):
        runner.state = dict(state)
        out = runner({"x": x, "label": t})
        draws.append(
            np.concatenate([(clean[f"{p}_new"] - out[f"{p}_new"]).ravel() * 5 / (2.0 * 0.5) for p in PARAMS])
        )
    for z in draws:
        assert abs(float(np.mean(z))) < 0.5 and 0.6 < float(np.std(z)) < 1.5, (np.mean(z), np.std(z))
    assert not np.allclose(draws[0], draws[1])


# ---------------------------------------------------------------------------------------------
# What a newcomer gets wrong


def test_labels_of_the_wrong_size_or_sign_fail_when_the_step_runs() -> None:
    rng = np.random.default_rng(15)
    model, _, x = classifier(rng, n=8)
    for kind, bad in (
        ("softmax_cross_entropy", np.array([0, 1, 2, 0, 1, 2], np.int64)),  # 6 labels, 8 examples
        ("softmax_cross_entropy", np.array([-1, 0, 1, 2, 0, 1, 2, 0], np.int64)),  # below 0
        ("mse", np.zeros((1, 1), np.float32)),  # would broadcast over the batch
    ):
        loss_model = onnax.add_loss(model, kind)
        with pytest.raises(Exception, match=r"(?i)reshape|out of range|index"):
            run(loss_model, {"x": x, "label": bad})
    # An ignored label below 0 is fine.
    loss_model = onnax.add_loss(model, "softmax_cross_entropy", ignore_index=-100)
    t = np.array([-100, 0, 1, 2, 0, 1, 2, 0], np.int64)
    logp = np.asarray(
        jax.nn.log_softmax(mlp_jax(as64(mlp_values(np.random.default_rng(15))), x.astype(np.float64)))
    )
    expected = -np.mean(logp[np.arange(1, 8), t[1:]])
    np.testing.assert_allclose(run(loss_model, {"x": x, "label": t})["loss"], expected, rtol=1e-5)


def test_a_loss_for_logits_on_a_softmax_output_is_pointed_out() -> None:
    model, _, _ = classifier(np.random.default_rng(16))
    model.graph.node.append(onnx.helper.make_node("Softmax", ["y"], ["p"], axis=-1))
    model.graph.output[0].name = "p"
    with pytest.warns(
        UserWarning, match=r"computed by Softmax, but softmax_cross_entropy reads logits.*cross_entropy"
    ):
        onnax.add_loss(model, "softmax_cross_entropy")


def test_step_option_and_selection_diagnostics() -> None:
    model, _, _ = classifier(np.random.default_rng(17))
    loss_model = onnax.add_loss(model, "mse")
    with pytest.raises(onnax.OnnaxError, match="momentum and Nesterov's variant belong to SGD"):
        onnax.train_step(loss_model, optimizer="adamw", momentum=0.9)
    with pytest.raises(onnax.OnnaxError, match="beta1, beta2 and epsilon belong to Adam"):
        onnax.train_step(loss_model, optimizer="sgd", beta1=0.5)
    with pytest.raises(onnax.OnnaxError, match=r"no-decay entry '\*norm\*' matches none.*whole names"):
        onnax.train_step(loss_model, weight_decay=0.01, no_decay=["*norm*"])
    with pytest.raises(onnax.OnnaxError, match=r"no rank-0 float output to minimize.*attach a loss first"):
        onnax.train_step(model)
    with pytest.raises(onnax.OnnaxError, match=r"'logits' is not an output.*--loss / loss="):
        onnax.train_step(loss_model, loss="logits")
    with pytest.raises(onnax.OnnaxError, match=r"named 'y'.*--label-name / label_name"):
        onnax.add_loss(model, "mse", label_name="y")
    seq = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("SequenceConstruct", ["x"], ["probs"])],
            "zipmap_like",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3])],
            [onnx.helper.make_tensor_sequence_value_info("probs", onnx.TensorProto.FLOAT, None)],
        ),
        opset_imports=[onnx.helper.make_opsetid("", 18)],
        ir_version=10,
    )
    with pytest.raises(onnax.OnnaxError, match=r"'probs' is a sequence, not a tensor.*zipmap"):
        onnax.add_loss(seq, "softmax_cross_entropy")


def test_apply_with_nothing_accumulated_changes_nothing() -> None:
    rng = np.random.default_rng(18)
    model, values, _ = classifier(rng)
    loss_model = onnax.add_loss(model, "mse")
    apply = onnax.train_step(loss_model, optimizer="adamw", weight_decay=0.1, clip_norm=1.0, form="apply")
    state = onnax.initial_state(loss_model, apply)
    out = run(apply, state)
    for p in PARAMS:
        np.testing.assert_array_equal(out[f"{p}_new"], values[p])
        np.testing.assert_array_equal(out[f"{p}_m_new"], 0)
    assert int(out["step_new"]) == 0


def test_dp_sgd_step_keeps_the_model_outputs_per_example() -> None:
    rng = np.random.default_rng(19)
    model, values, x = classifier(rng)
    loss_model = onnax.add_loss(model, "mse")
    step = onnax.train_step(loss_model, optimizer="sgd", dp_clip_norm=1.0, noise_multiplier=0.0)
    assert not [i.name for i in step.graph.input if i.name.endswith("_noise")]  # no noise, no inputs
    names = [o.name for o in step.graph.output]
    assert names[:3] == ["loss", "y", "per_example_grad_norm"]
    dims = [d.dim_param or d.dim_value for d in step.graph.output[2].type.tensor_type.shape.dim]
    assert len(dims) == 1 and dims[0] == step.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    state = onnax.initial_state(loss_model, step)
    zeros = {f"{p}_noise": np.zeros_like(values[p]) for p in PARAMS}
    t = rng.standard_normal((x.shape[0], 3)).astype(np.float32)
    out = run(step, {**state, **zeros, "x": x, "label": t})
    np.testing.assert_allclose(
        out["y"], np.asarray(mlp_jax(as64(values), x.astype(np.float64))), rtol=1e-5, atol=1e-6
    )


def test_dp_sgd_shares_scalar_inputs_between_examples() -> None:
    """A rank-0 input (jax2onnx's `deterministic` flag, a temperature) is no per-example data:
    DP-SGD shares it instead of refusing the model; a scale s on the logits checks it is used."""
    rng = np.random.default_rng(20)
    model, values, x = classifier(rng)
    model.graph.input.append(onnx.helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, []))
    model.graph.node[-1].output[0] = "y_raw"
    model.graph.node.append(onnx.helper.make_node("Mul", ["y_raw", "s"], ["y"]))
    loss_model = onnax.add_loss(model, "mse")
    step = onnax.train_step(
        loss_model, optimizer="sgd", learning_rate=0.1, dp_clip_norm=1e6, noise_multiplier=0.0
    )
    state = onnax.initial_state(loss_model, step)
    t = rng.standard_normal((x.shape[0], 3)).astype(np.float32)
    zeros = {f"{p}_noise": np.zeros_like(values[p]) for p in PARAMS}
    s = np.array(0.5, np.float32)
    out = run(step, {**state, **zeros, "x": x, "label": t, "s": s})
    # With a clip bound no example reaches, DP-SGD is plain SGD on the mean loss.
    grads = jax.grad(lambda p: jnp.mean((0.5 * mlp_jax(p, x.astype(np.float64)) - t) ** 2))(as64(values))
    for p in PARAMS:
        np.testing.assert_allclose(
            out[f"{p}_new"], values[p] - 0.1 * grads[p], rtol=1e-5, atol=1e-6, err_msg=p
        )


def test_in_graph_noise_at_opset_22_points_to_noise_inputs() -> None:
    """ONNX Runtime 1.31 has no RandomNormalLike kernel from opset 22 on: the step says so."""
    model, _, _ = classifier(np.random.default_rng(21))
    model.opset_import[0].version = 22
    loss_model = onnax.add_loss(model, "mse")
    with pytest.warns(
        UserWarning, match=r"RandomNormalLike at opset 22.*feed the noise as <param>_noise inputs"
    ):
        onnax.train_step(loss_model, dp_clip_norm=1.0, noise_multiplier=1.0, noise_seed=3)
