"""Appending a measured table to benchmarks/RESULTS.md, with where it was measured."""

from __future__ import annotations

import datetime
import platform
import sys
from pathlib import Path

import jax


def record(script: str, description: str, table: str) -> Path:
    """Append `table` under a heading naming the script, date, machine, device and
    the exact command line that produced it."""
    device = jax.devices()[0]
    command = " ".join(["python", f"benchmarks/{script}", *sys.argv[1:]])
    header = (
        f"\n## {script} — {datetime.date.today()} — {platform.node() or 'host'}\n\n"
        f"Device: {device.platform} ({device.device_kind}), {jax.device_count()} "
        f"device(s), jax {jax.__version__}, {platform.machine()}.\n"
        f"Command: `{command}`\n{description}\n\n"
    )
    path = Path(__file__).with_name("RESULTS.md")
    with path.open("a") as f:
        f.write(header + table + "\n")
    print(f"appended to {path}")
    return path
