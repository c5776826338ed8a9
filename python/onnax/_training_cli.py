"""``onnax init-state`` and ``onnax apply-params``: the training commands that read or write
NumPy ``.npz`` files, so they live in the Python command."""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnx

USAGE = {
    "init-state": "onnax init-state LOSS.onnx STEP.onnx -o STATE.npz",
    "apply-params": "onnax apply-params MODEL.onnx PARAMS.npz -o TRAINED.onnx",
}


def _parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"onnax {command}", usage=USAGE[command])
    if command == "init-state":
        p.description = (
            "The first values of a training step's fed-back inputs (parameters as stored in the loss "
            "model, zero optimizer state, step 0) as an .npz of arrays named as the step's inputs."
        )
        p.add_argument("loss", help="the loss model the step was made from")
        p.add_argument("step", help="the step onnax train-step wrote")
    else:
        p.description = (
            "MODEL with the arrays of PARAMS.npz in place of its initializers (or Constant-node "
            "tensors) of the same names: trained parameters written back. Other arrays in the file "
            "(optimizer state, step) are ignored when --ignore-unknown is given."
        )
        p.add_argument("model", help="the model to write the parameters into (never modified)")
        p.add_argument("params", help="an .npz of arrays named as the model's tensors")
        p.add_argument("--ignore-unknown", action="store_true", help="skip arrays the model does not store")
    p.add_argument("-o", "--output", required=True, help="where to write the result")
    return p


def main(command: str, argv: list[str]) -> int:
    import onnax

    args = _parser(command).parse_args(argv)
    inputs = [args.loss, args.step] if command == "init-state" else [args.model, args.params]
    if os.path.realpath(args.output) in {os.path.realpath(p) for p in inputs}:
        print(
            f"onnax: -o '{args.output}' is one of the inputs; onnax never overwrites its input",
            file=sys.stderr,
        )
        return 2
    try:
        if command == "init-state":
            state = onnax.initial_state(onnx.load(args.loss), onnx.load(args.step))
            np.savez(args.output, **state)  # type: ignore[arg-type]
        else:
            model = onnx.load(args.model)
            with np.load(args.params) as data:
                params = {k: data[k] for k in data.files}
            if args.ignore_unknown:
                stored = onnax.training.stored_names(model)
                params = {k: v for k, v in params.items() if k in stored}
            onnx.save(onnax.apply_params(model, params), args.output)
    except (OSError, ValueError) as err:
        print(f"onnax: error: {err}", file=sys.stderr)
        return 1
    print(f"onnax: wrote {args.output}", file=sys.stderr)
    return 0
