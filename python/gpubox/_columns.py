"""Columns (a DataFrame's, or a mapping of array-likes) as the engine's instance arrays."""

from __future__ import annotations

import itertools
import warnings
from typing import Any, Optional, Sequence

import numpy as np


def _as_keys(values: np.ndarray, name: str) -> np.ndarray:
    """Integer ids as keys; floats (pandas' missing values are NaN) and negative ids are an
    error naming the slot, not keys made of their bits."""
    if values.size and values.dtype.kind not in "iu":
        raise ValueError(f"slot {name}: ids must be integers, got dtype {values.dtype} "
                         "(a missing id is None or an empty list, not NaN)")
    if values.size and values.dtype.kind == "i" and values.min() < 0:
        raise ValueError(f"slot {name}: ids must be >= 0, got {values.min()}")
    return values.astype(np.uint64)


_MAX_KEY = 2**64 - 1


def _check_rows(rows: Any, name: str) -> None:
    """A row is an id, a list (tuple, array) of ids or None; anything else, though len() and
    iteration take some of it (True read as id 1, b"17" as ids 49 and 55, a dict as its keys,
    pandas' NA failing with "no len()"), is refused naming its row."""
    for i, v in enumerate(rows):
        if v is None or (isinstance(v, (int, np.integer, list, tuple, np.ndarray))
                         and not isinstance(v, (bool, np.bool_))):
            continue
        raise ValueError(f"slot {name}: row {i} holds {v!r}; a row is an id, a list of ids "
                         "or None")
    # In lists of ids too ([[True], [6]] became ids 1 and 6 through NumPy).
    inner = next((x for v in rows if isinstance(v, (list, tuple)) for x in v
                  if isinstance(x, (bool, np.bool_, float, np.floating, str, bytes))), None)
    if inner is not None:
        raise ValueError(f"slot {name}: ids must be integers >= 0, got {inner!r}")


def _numpy_column(column: Any, name: str) -> np.ndarray:
    """A pandas column as NumPy; a nullable integer one (Int64, UInt32 ...) as integers, its
    missing ids named by row (newer pandas gave float64 with NaN for them, refused as "got dtype
    float64" with no word of the NA)."""
    dtype = getattr(column, "dtype", None)
    kind = None if isinstance(dtype, np.dtype) else getattr(dtype, "kind", None)
    if kind not in ("i", "u") or not hasattr(column, "isna"):
        return column.to_numpy()
    missing = np.flatnonzero(np.asarray(column.isna(), dtype=bool))
    if missing.size:
        raise ValueError(f"slot {name}: row {missing[0]} holds <NA>; a row is an id, a list of "
                         "ids or None")
    return column.to_numpy(dtype=np.uint64 if kind == "u" else np.int64)


def _slot_csr(column: Any, n: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """One slot column (an id per row, or a list of ids per row) as (keys, offsets)."""
    if hasattr(column, "columns"):  # a frame's columns of one name come as a frame
        raise ValueError(f"slot {name}: the frame has {len(column.columns)} columns named "
                         f"{name!r}; give each slot one column (a list of ids per row for "
                         "several)")
    if hasattr(column, "to_numpy"):
        values = _numpy_column(column, name)
    else:
        if isinstance(column, (list, tuple)):
            _check_rows(column, name)  # before NumPy turns [True, 6] into ids 1 and 6
        try:
            values = np.asarray(column)
        except ValueError:  # lists of different lengths
            values = np.empty(len(column), dtype=object)
            values[:] = list(column)
    # Every layout's row count first (an id array of another length reached the engine, which
    # said "offsets must rise from 0 to the key count").
    if values.ndim == 0:
        raise ValueError(f"slot {name}: one value, not a column (a list or array of rows)")
    if len(values) != n:
        raise ValueError(f"slot {name}: {len(values)} rows, the first column has {n}")
    if values.ndim == 1 and values.dtype != object:
        keys = _as_keys(values, name)
        return keys, np.arange(n + 1, dtype=np.int64)
    if values.ndim == 2 and values.dtype != object:  # a fixed number of ids per row
        keys = _as_keys(values, name).reshape(-1)
        return keys, np.arange(n + 1, dtype=np.int64) * values.shape[1]
    # A row is an id, a list (or array) of ids, or None (no id): flattened without a NumPy
    # array per row.
    _check_rows(values, name)
    rows = [() if v is None else (v,) if isinstance(v, (int, np.integer)) else v for v in values]
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = list(itertools.chain.from_iterable(rows))
    bad = next((v for v in flat
                if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0
                or v > _MAX_KEY), None)
    if bad is not None:
        raise ValueError(f"slot {name}: ids must be integers in [0, 2^64), got {bad!r}")
    keys = np.fromiter(flat, dtype=np.uint64, count=int(offsets[-1]))
    return keys.astype(np.uint64), offsets


def _dense_matrix(column: Any, n: int, dense_dim: int, name: str) -> np.ndarray:
    """The dense features as an n x dense_dim float32 matrix."""
    if dense_dim == 0:
        return np.zeros((n, 0), dtype=np.float32)
    if column is None:
        raise ValueError(f"the model reads {dense_dim} dense values per instance: give a "
                         f"'{name}' column (a list per row) or an n x {dense_dim} array")
    if n == 0:  # no rows: nothing to read (an empty column's shape says nothing of its width)
        return np.zeros((0, dense_dim), dtype=np.float32)
    values = column.to_numpy() if hasattr(column, "to_numpy") else column
    try:
        raw = np.asarray(list(values) if getattr(values, "dtype", None) == object else values)
    except ValueError:  # rows of unequal length (numpy >= 1.24)
        raw = np.asarray(list(values), dtype=object)
    if raw.dtype == object and raw.ndim == 1:
        odd = next((i for i, row in enumerate(raw)
                    if not hasattr(row, "__len__") or len(row) != dense_dim), 0)
        raise ValueError(f"'{name}': rows of unequal length (row {odd} holds {raw[odd]!r}); the "
                         f"model needs {dense_dim} dense values in every row")
    if raw.dtype.kind not in "biuf":
        # Text ("0.1") or mixed rows: numpy would parse or reject them one way, the files and
        # gpubox_serve (400) another; numbers only.
        raise TypeError(f"'{name}': dense values must be numbers, got dtype {raw.dtype} "
                        f"(first row {list(raw[0]) if raw.ndim > 1 else raw.reshape(-1)[:1]!r})")
    with np.errstate(over="ignore"):  # a value past float32's range is refused below
        matrix = raw.astype(np.float32)
    if matrix.shape != (n, dense_dim):
        raise ValueError(f"'{name}': shape {matrix.shape}, the model needs ({n}, {dense_dim})")
    finite = np.isfinite(matrix)
    if not finite.all():
        row, value = (int(i) for i in np.argwhere(~finite)[0])
        raise ValueError(f"'{name}': row {row}, value {value} is {matrix[row, value]} as float32, "
                         "not a finite number (as the files' bad_dense and gpubox_serve's 400)")
    return np.ascontiguousarray(matrix)


def _labels(column: Any, n: int, name: str) -> np.ndarray:
    """The label column as float32 0/1 values; any other value (2, -1, 0.7, NaN, "1") is an
    error naming the row, as the files' bad_label."""
    values = column.to_numpy() if hasattr(column, "to_numpy") else np.asarray(column)
    if values.dtype.kind not in "biuf":
        raise ValueError(f"label column '{name}': labels are the numbers 0 and 1, got dtype "
                         f"{values.dtype}")
    # Checked before the cast to float32: 0.99999999 and 1e-60 became 1 and 0 (the files refuse
    # them as bad_label).
    exact = np.asarray(values, dtype=np.float64).reshape(-1)
    labels = exact.astype(np.float32)
    if len(labels) != n:
        raise ValueError(f"label column '{name}': {len(labels)} labels, the first column has "
                         f"{n} rows")
    bad = np.flatnonzero((exact != 0) & (exact != 1))
    if bad.size:
        raise ValueError(f"label column '{name}': row {int(bad[0])} holds "
                         f"{values.reshape(-1)[bad[0]]!r}; labels are 0 or 1 (the files' "
                         "bad_label)")
    return labels


def _shown(names: Sequence[Any], most: int = 8) -> str:
    """Names for a message: the first `most`, then how many more."""
    text = ", ".join(repr(x) for x in list(names)[:most])
    return text + (f" and {len(names) - most} more" if len(names) > most else "")


def _check_slot_columns(columns: Sequence[Any], slot_names: Sequence[str],
                        read: Sequence[Optional[str]]) -> None:
    """No slot of the model among the columns is an error (every instance would have no id:
    the file loader refuses such a pass); some slots without a column while other columns go
    unread is warned, naming both (a misspelt or renamed slot column)."""
    missing = [s for s in slot_names if s not in columns]
    if not missing:
        return
    unread = [c for c in columns if c not in slot_names and c not in read]
    numbered = any(not isinstance(c, str) and str(c) in slot_names for c in columns)
    hint = (" (slot names are strings and some columns are named by numbers: "
            "df.columns = df.columns.astype(str))" if numbered else "")
    if len(missing) == len(slot_names):
        raise ValueError(f"none of the model's {len(slot_names)} slots "
                         f"({_shown(slot_names)}) is a column{hint}; columns: {_shown(columns)}")
    if unread:
        warnings.warn(f"{len(missing)} slots have no column, so no id ({_shown(missing)}), "
                      f"while columns {_shown(unread)} are not read{hint}", stacklevel=4)


def _check_same_index(parts: Sequence[Any]) -> None:
    """Pandas columns (Series, a dense DataFrame) of one input must share their index: gpubox
    reads rows in order, where pandas pairs them by index (a mapping of Series, or dense= as a
    DataFrame, of another index was paired row by row, each row with another's values)."""
    first = None
    for part in parts:
        index = getattr(part, "index", None)
        if index is None or callable(index):  # not pandas (a list's index is a method)
            continue
        if first is None:
            first = index
        elif not first.equals(index):
            raise ValueError("the columns' pandas indexes differ (pandas pairs rows by index, "
                             "gpubox reads them in order): align them, e.g. with "
                             ".reset_index(drop=True) on each, or build one DataFrame")


def columns_of(
    data: Any,
    slot_names: Sequence[str],
    dense_name: str,
    dense_dim: int,
    *,
    dense: Optional[Any] = None,
    label_name: Optional[str] = None,
) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, Optional[np.ndarray]]:
    """CSR keys and offsets per slot (in ``slot_names`` order), the n x dense_dim matrix, and
    the labels (``label_name``'s column as float32, or None when not asked for).

    One column per slot name: an id per row, a list of ids per row, or an n x k array; a slot
    without a column has no id. Dense: ``dense`` (n x dense_dim), else the ``dense_name``
    column (a list per row). Other columns are ignored."""
    columns = list(data.keys()) if hasattr(data, "keys") else []
    if not columns:
        raise TypeError("expected a pandas DataFrame or a mapping of columns")
    n = len(data[columns[0]])
    _check_slot_columns(columns, slot_names, [dense_name, label_name])
    _check_same_index([data[c] for c in columns] + ([dense] if dense is not None else []))
    keys, offsets = [], []
    for slot in slot_names:
        if slot in columns:
            k, o = _slot_csr(data[slot], n, slot)
        else:  # no id in this slot
            k, o = np.zeros(0, dtype=np.uint64), np.zeros(n + 1, dtype=np.int64)
        keys.append(k)
        offsets.append(o)
    if dense is not None and dense_name in columns:
        raise ValueError(f"dense values given twice: a '{dense_name}' column and dense=; give "
                         "one (the other would be ignored)")
    dense_column = dense if dense is not None else (
        data[dense_name] if dense_name in columns else None)
    matrix = _dense_matrix(dense_column, n, dense_dim, dense_name)
    labels = None
    if label_name is not None:
        if label_name not in columns:
            raise ValueError(f"no label column '{label_name}' (runner.label_name)")
        labels = _labels(data[label_name], n, label_name)
    return keys, offsets, matrix, labels
