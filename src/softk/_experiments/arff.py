"""Read a dense ARFF file into a float64 matrix (the Mulan data sets are dense).

A thin layer over :func:`scipy.io.arff.loadarff` that fixes what it leaves raw:
attribute names keep their ARFF escapes (``'Swainson\\'s Thrush'``) and nominal
values come back as bytes.  Nominal attributes are returned as their numeric
codes, i.e. the value itself when it reads as a number (birds' ``location``
``{2,10,1,...}`` → 2.0, 10.0, 1.0, ...; label columns ``{0,1}`` → 0.0/1.0), as
the sparsemax authors' converter did; a nominal value that is not a number gets
its 0-based index in the declared list.  Missing values (``?``) are rejected
rather than silently imputed.
"""

from __future__ import annotations

import os

import numpy as np


def _unescape(name: str) -> str:
    return name.replace("\\'", "'").replace('\\"', '"')


def _nominal_column(values, declared) -> np.ndarray:
    strings = [v.decode() if isinstance(v, bytes) else str(v) for v in values]
    if "?" in strings:
        raise ValueError("missing nominal value '?' (not supported: no imputation)")
    try:
        return np.array([float(s) for s in strings], dtype=np.float64)
    except ValueError:
        index = {d: i for i, d in enumerate(declared)}
        return np.array([index[s] for s in strings], dtype=np.float64)


def read_arff(path) -> tuple[list[str], np.ndarray]:
    """(attribute names, data as an (n_rows, n_attributes) float64 array)."""
    from scipy.io import arff  # scipy is needed by the experiments only

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"ARFF file not found: {path}")
    try:
        data, meta = arff.loadarff(path)
    except StopIteration:  # scipy's reader on an empty file
        raise ValueError(f"{path}: empty, not an ARFF file") from None
    except (ValueError, arff.ArffError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    names = meta.names()
    cols = []
    for name in names:
        kind, declared = meta[name]
        if kind == "nominal":
            cols.append(_nominal_column(data[name], declared))
        elif kind == "numeric":
            col = np.asarray(data[name], dtype=np.float64)
            if np.isnan(col).any():
                raise ValueError(f"{path}: attribute {name!r} has missing values ('?'), not supported")
            cols.append(col)
        else:
            raise ValueError(f"{path}: attribute {name!r} has type {kind!r}; only numeric and nominal are supported")
    matrix = np.column_stack(cols) if cols else np.zeros((len(data), 0))
    return [_unescape(n) for n in names], matrix
