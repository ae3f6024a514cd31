"""Recording a measured table, with where it was measured: every run appended to
benchmarks/HISTORY.md, the latest run of each script kept in benchmarks/RESULTS.md."""

from __future__ import annotations

import datetime
import platform
import re
import sys
from pathlib import Path

import jax

HISTORY = Path(__file__).with_name("HISTORY.md")
RESULTS = Path(__file__).with_name("RESULTS.md")

# A line that opens a section of RESULTS.md, e.g. `<!-- benchmark: throughput.py -->`.
_MARKER = re.compile(r"<!-- benchmark: (.+) -->")


def marker(script: str) -> str:
    """The line that opens `script`'s section in RESULTS.md."""
    return f"<!-- benchmark: {script} -->"


def replace_section(text: str, script: str, entry: str) -> str:
    """`text` (RESULTS.md) with `script`'s section replaced by `entry`: from the line
    `marker(script)` up to the next marker line (of any section) or the end of the
    text. Without such a line, the section is appended at the end."""
    section = marker(script) + "\n" + entry.strip("\n") + "\n"
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if _MARKER.fullmatch(line.strip())]
    for n, i in enumerate(starts):
        if lines[i].strip() == marker(script):
            rest = lines[starts[n + 1]:] if n + 1 < len(starts) else []
            return "".join(lines[:i]) + section + ("\n" if rest else "") + "".join(rest)
    head = text.rstrip("\n")
    return (head + "\n\n" if head else "") + section


def record(script: str, description: str, table: str, *, section: str | None = None
           ) -> Path:
    """Record `table`, measured by `script` (its file name, e.g. "throughput.py"), under
    a heading naming the script, date, machine, device and the exact command line that
    produced it, in two places:

    - appended to benchmarks/HISTORY.md, the append-only log of every recorded run;
    - in benchmarks/RESULTS.md, the page of the latest figures: the entry replaces
      `script`'s section, from the line `<!-- benchmark: script -->` up to the next
      such line (or the end of the file), or is appended as a new section if there
      is none. A section gathering several earlier runs is replaced whole.
      `section` names the section instead of `script` (a script that measures
      several cases keeps one section per case, e.g. "versions.py (projected)").

    Returns the path of RESULTS.md."""
    device = jax.devices()[0]
    command = " ".join(["python", f"benchmarks/{script}", *sys.argv[1:]])
    header = (
        f"\n## {section or script} — {datetime.date.today()} — {platform.node() or 'host'}\n\n"
        f"Device: {device.platform} ({device.device_kind}), {jax.device_count()} "
        f"device(s), jax {jax.__version__}, {platform.machine()}.\n"
        f"Command: `{command}`\n{description}\n\n"
    )
    entry = header + table + "\n"
    with HISTORY.open("a", encoding="utf-8") as f:
        f.write(entry)
    current = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else ""
    key = section or script
    found = any(line.strip() == marker(key) for line in current.splitlines())
    RESULTS.write_text(replace_section(current, key, entry), encoding="utf-8")
    print(f"appended to {HISTORY}; {key}'s section "
          f"{'replaced in' if found else 'added to'} {RESULTS}")
    return RESULTS
