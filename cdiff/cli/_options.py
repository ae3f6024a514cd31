"""The command line's parser, and `cdiff list`: what each name an option takes
means (the models, the MJCF mechanisms, the formulations and the projections),
from the docstrings of what it builds.

The parser itself is `cdiff_cli_entry.build_parser`, outside the package, so that
the console script parses before `cdiff` (and JAX) is imported."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import shutil
import textwrap
from typing import Any

import cdiff.cli._plain_text as _text
import cdiff_cli_entry as _entry
from cdiff.cli._cases import DAE_FORMULATIONS, FORMULATIONS, PROJECTIONS, formulation
from cdiff.models import MJCF_LIBRARY, MODELS


def parser() -> argparse.ArgumentParser:
    """The `cdiff` parser (built by `cdiff_cli_entry`, which parses before `cdiff`
    is imported)."""
    return _entry.build_parser()


def list_all() -> int:
    """`cdiff list`: every model, shipped MJCF mechanism, formulation and
    projection, with a plain-text description wrapped to the terminal."""
    width = max(60, shutil.get_terminal_size((100, 24)).columns - 1)
    print("models:")
    for name, cls in MODELS.items():
        _item(name, _text.summary(cls), width,
              f"default --t1 {cls.default_t1:g} --dt {cls.default_dt:g}")
    print("MJCF mechanisms (cdiff/models/mjcf/; or run any MJCF or URDF file by path):")
    for name, entry in MJCF_LIBRARY.items():
        _item(name, _text.plain(entry.source), width,
              f"reference: {entry.reference_kind}; default --t1 {entry.t1:g} "
              f"--dt {entry.dt:g}")
    print("formulations (DAEs, integrated by cdiff.BDF: "
          + ", ".join(DAE_FORMULATIONS) + "):")
    run_parser = parser()
    built = {name: formulation(run_parser.parse_args(["run", "-", "--formulation",
                                                      name]), run_parser)
             for name in FORMULATIONS}
    for name, text, obj in _listed(built):
        _item(name, text, width, f"cdiff.{obj!r}")
    print("projections (--projection; RK4 wrapped by cdiff.Projected):")
    for name, text, obj in _listed(PROJECTIONS):
        _item(name, text, width, f"cdiff.{obj!r}")
    return 0


#: The width of the name column of `cdiff list`.
_NAME_WIDTH = 22


def _item(name: str, text: str, width: int, detail: str) -> None:
    """One entry of `cdiff list`: the name, then `text` and `detail` wrapped in
    the column after it (from the next line if the name is too long)."""
    indent = " " * (_NAME_WIDTH + 2)
    wrap = functools.partial(textwrap.wrap, width=width - len(indent),
                             break_on_hyphens=False)
    lines = wrap(text) or [""]
    lines += wrap(detail)
    head = f"  {name:<{_NAME_WIDTH}}"
    if len(name) >= _NAME_WIDTH:
        print(f"  {name}")
        head = indent
    print(head + lines[0])
    for line in lines[1:]:
        print(indent + line)


def _listed(entries: dict) -> list[tuple[str, str, Any]]:
    """`(name, description, obj)` for `{name: instance}`: the summary of the
    class, and for a class listed under several names, what tells each apart (the
    later ones as "as FIRST, with ...")."""
    rows, first = [], {}
    for name, obj in entries.items():
        siblings = [o for n, o in entries.items()
                    if n != name and type(o) is type(obj)]
        notes = _option_notes(obj, siblings) if siblings else []
        if type(obj) in first:
            text = f"As {first[type(obj)]}, except: " + " ".join(
                note if note.endswith(".") else note + "." for note in notes)
        else:
            first[type(obj)] = name
            text = " ".join([_text.summary(type(obj)), *notes])
        rows.append((name, text if text.endswith(".") else text + ".", obj))
    return rows


def _option_notes(obj, siblings) -> list[str]:
    """What tells `obj` apart from `siblings` (instances of its class listed under
    other names): for each field whose value differs, the text of its docstring
    on that value (a list item or sentence naming `field=value`), else on the
    argument (a list item naming `field`), else the value itself."""
    doc = inspect.getdoc(type(obj)) or ""
    notes = []
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        if all(_same(value, getattr(s, field.name)) for s in siblings):
            continue
        shown = (f'{field.name}="{value}"' if isinstance(value, str)
                 else f"{field.name}={value!r}")
        notes.append(_value_note(doc, field, value, shown))
    return notes


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # arrays: not an option of a listed entry
        return a is b


def _value_note(doc: str, field, value, shown: str) -> str:
    """The docstring's words on `shown` (`field=value`), in plain text."""
    # A list item that starts with the value: "- `variant="mass"` (eqs. ...): ..."
    for item in _text.list_items(doc):
        if item.startswith(f"`{shown}`"):
            return _text.plain(item)
    # A sentence that names it: "With `mass_weighted=True` both corrections ..."
    for block in doc.split("\n\n"):
        k = block.find(f"`{shown}`")
        if k >= 0:
            start = max(block.rfind(". ", 0, k) + 2, 0) if ". " in block[:k] else 0
            return _text.plain(block[start:][:_text.sentence_end(block[start:])])
    if field.default is not dataclasses.MISSING and _same(value, field.default):
        return f"{shown} (the default)"
    for item in _text.list_items(doc):  # the argument's item: "- `partition`: ..."
        if item.startswith(f"`{field.name}`:"):
            body = item[len(field.name) + 3:].strip()
            body = _text.plain(body[:_text.sentence_end(body)]).rstrip(".")
            return f"{shown} ({field.name}: {body})"
    return shown
