"""A small results table: prints, saves (CSV, npz) and selects rows."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class Table:
    """Rows of a study as named columns of equal length (NumPy arrays), with the
    study's settings in `meta`.

    `print(table)` shows it; `table.save(stem)` writes `stem.csv` and `stem.npz`;
    `table["max_error"]` is a column; `table.where(formulation="UK")` selects rows.
    """

    columns: dict[str, Any]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    title: str = ""

    def __post_init__(self):
        columns = {name: np.asarray(c) for name, c in self.columns.items()}
        lengths = {len(c) for c in columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"Table: columns of different lengths {sorted(lengths)}")
        object.__setattr__(self, "columns", columns)

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()), ()))

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.columns)

    def where(self, **equal) -> Table:
        """The rows whose columns equal the given values."""
        keep = np.ones(len(self), bool)
        for name, value in equal.items():
            keep &= self.columns[name] == value
        return Table({k: v[keep] for k, v in self.columns.items()}, self.meta,
                     self.title)

    def __str__(self) -> str:
        def fmt(x):
            if isinstance(x, (float, np.floating)):
                plain = x == 0 or (np.isfinite(x) and 1e-2 <= abs(x) < 1e4)
                return f"{x:.4g}" if plain else f"{x:.2e}"
            return str(x)

        cells = [[fmt(x) for x in row] for row in zip(*self.columns.values())]
        widths = [max([len(n)] + [len(r[i]) for r in cells])
                  for i, n in enumerate(self.columns)]
        line = "  ".join(n.rjust(w) for n, w in zip(self.columns, widths))
        body = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
        head = [self.title] if self.title else []
        return "\n".join(head + [line, "-" * len(line)] + body)

    def to_csv(self, path) -> Path:
        """Write the rows as CSV (a header line, then one line per row)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(self.names)
            for row in zip(*self.columns.values()):
                writer.writerow([repr(float(x)) if isinstance(x, np.floating) else x
                                 for x in row])
        return path

    def to_npz(self, path) -> Path:
        """Write the columns (and the numeric/str settings of `meta`, prefixed
        `meta_`) as a NumPy `.npz` archive."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {f"meta_{k}": np.asarray(v) for k, v in self.meta.items()
                if isinstance(v, (int, float, str, np.ndarray, list, tuple))}
        np.savez(path, **self.columns, **meta)
        return path

    def save(self, stem) -> tuple[Path, Path]:
        """Write `stem.csv` and `stem.npz`; returns both paths. The extensions are
        appended to the whole name (`"out/study_dt0.01"` writes
        `out/study_dt0.01.csv`); a stem ending in `.csv` or `.npz` loses it."""
        return (self.to_csv(with_extension(stem, ".csv")),
                self.to_npz(with_extension(stem, ".npz")))


_EXTENSIONS = (".csv", ".npz", ".png")


def with_extension(stem, extension: str) -> Path:
    """`stem` + `extension`, keeping every dot of the stem's name (`Path.with_suffix`
    would replace the part after its last dot: `study_dt0.01` and `study_dt0.02`
    would both become `study_dt0.csv`)."""
    stem = Path(stem)
    name = stem.stem if stem.suffix in _EXTENSIONS else stem.name
    return stem.with_name(name + extension)
