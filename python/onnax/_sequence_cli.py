"""``onnax signature ... --zeros STATE0.npz``: the signature command with the zero initial
states written as NumPy arrays, so this form lives in the Python command (the JSON alone is
the C++ command's)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

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
        if not eq or not name or not size.isdigit():
            raise ValueError(f"--dim '{e}' is not NAME=SIZE with a size >= 0. Fix: e.g. --dim batch=2")
        dims[name] = int(size)
    return dims


def main(argv: list[str]) -> int:
    import numpy as np

    from onnax import OnnaxError
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
        with open(args.model, "rb") as f:
            data = f.read()
        constants = args.constants.split(",") if args.constants else []
        text = signature_text(_parse(args.model, data), state=_state(args.state), constants=constants)
        sig = signature_from_json(json.loads(text))
        dims = _dims(args.dim)
        known = {d for shape in sig.state_shapes if shape for d in shape if isinstance(d, str)}
        unknown = sorted(set(dims) - known)
        if unknown:
            raise ValueError(
                f"--dim names {unknown}, which no state's shape has (symbolic dims: {sorted(known)}). "
                "Fix: give the sizes of those dims"
            )
        zeros = sig.zeros(dims=dims)
        if args.output:
            with open(args.output, "w") as f:
                f.write(text)
        else:
            sys.stdout.write(text)
        with open(args.zeros, "wb") as f:  # (np.savez on a name would append .npz)
            np.savez(f, **zeros)  # type: ignore[arg-type]
    except IsADirectoryError as err:
        print(f"onnax: error: '{err.filename}' is a directory. Fix: name a file", file=sys.stderr)
        return 1
    except FileNotFoundError as err:
        print(f"onnax: error: '{err.filename}' does not exist. Fix: check the path", file=sys.stderr)
        return 1
    except MemoryError:
        print(
            "onnax: error: the zero states do not fit in memory. Fix: check the --dim sizes", file=sys.stderr
        )
        return 1
    except (OSError, ValueError, OnnaxError) as err:
        print(f"onnax: error: {err}", file=sys.stderr)
        return 1
    print(f"onnax: wrote {args.zeros}", file=sys.stderr)
    return 0


def _parse(path: str, data: bytes) -> onnx.ModelProto:
    import onnx
    from google.protobuf.message import DecodeError

    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError as err:
        raise ValueError(
            f"'{path}' is not a valid ONNX model ({err}). Fix: re-export it, or check that the file is "
            "complete"
        ) from None
    return model
