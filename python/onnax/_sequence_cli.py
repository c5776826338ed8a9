"""``onnax signature ... --zeros STATE0.npz``: the signature command with the zero initial
states written as NumPy arrays, so this form lives in the Python command (the JSON alone is
the C++ command's)."""

from __future__ import annotations

import argparse
import json
import os
import sys

USAGE = (
    "onnax signature MODEL.onnx [--state h,c | h=h_next,...] [--constants w] [-o SIG.json] "
    "--zeros STATE0.npz [--dim batch=2 ...]"
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="onnax signature", usage=USAGE)
    p.description = (
        "The model's flat signature as JSON (stdout, or -o), and zero initial states as an .npz of "
        "arrays named as the state inputs."
    )
    p.add_argument("model", help="a step or sequence model")
    p.add_argument("--state", help="the state inputs (and their next-value outputs), as scan reads them")
    p.add_argument("--constants", help="inputs that are the same at every step")
    p.add_argument("-o", "--output", help="write the JSON here instead of stdout")
    p.add_argument("--zeros", required=True, help="where to write the zero initial states (.npz)")
    p.add_argument("--dim", action="append", default=[], help="NAME=SIZE for a symbolic dim of the state")
    return p


def _state(text: str | None) -> list[str] | dict[str, str | None] | None:
    if text is None:
        return None
    if text == "none":
        return []
    items = text.split(",")
    if any(not s for s in items):
        raise ValueError(f"--state '{text}' has an empty entry. Fix: name each state input once")
    if not any("=" in s for s in items):
        return items
    pairs: dict[str, str | None] = {}
    for s in items:
        name, _, out = s.partition("=")
        pairs[name] = out or None
    return pairs


def _dims(entries: list[str]) -> dict[str, int]:
    dims = {}
    for e in entries:
        name, eq, size = e.partition("=")
        if not eq or not name or not size.lstrip("-").isdigit() or int(size) < 0:
            raise ValueError(f"--dim '{e}' is not NAME=SIZE with a size >= 0. Fix: e.g. --dim batch=2")
        dims[name] = int(size)
    return dims


def main(argv: list[str]) -> int:
    import numpy as np
    import onnx

    from onnax.sequences import signature_from_json, signature_text

    args = _parser().parse_args(argv)
    written = {os.path.realpath(p) for p in (args.output, args.zeros) if p}
    if os.path.realpath(args.model) in written:
        print(
            f"onnax: -o/--zeros names the input '{args.model}'; onnax never overwrites its input",
            file=sys.stderr,
        )
        return 2
    try:
        constants = args.constants.split(",") if args.constants else []
        text = signature_text(onnx.load(args.model), state=_state(args.state), constants=constants)
        zeros = signature_from_json(json.loads(text)).zeros(dims=_dims(args.dim))
        if args.output:
            with open(args.output, "w") as f:
                f.write(text)
        else:
            sys.stdout.write(text)
        np.savez(args.zeros, **zeros)  # type: ignore[arg-type]
    except (OSError, ValueError) as err:
        print(f"onnax: error: {err}", file=sys.stderr)
        return 1
    print(f"onnax: wrote {args.zeros}", file=sys.stderr)
    return 0
