"""What a bug report or benchmark needs to know about the machine and dependencies."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata


def versions() -> dict[str, str]:
    from onnax import __version__

    out = {"onnax": __version__, "python": sys.version.split()[0]}
    for dist in ("onnx", "onnxruntime", "numpy", "onnx-ir"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def cpu() -> dict[str, object]:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "model": model,
        "machine": platform.machine(),
        "logical_cores": os.cpu_count(),
        "os": platform.platform(),
    }


def source_revision() -> str:
    """The onnax git commit this package runs from ("unknown" outside a git checkout)."""
    try:
        proc = subprocess.run(
            ["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else "unknown"
