"""gpubox.load: a trained model for predictions, through gpubox_serve's own predictor."""

from __future__ import annotations

import os
import tempfile
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from gpubox import _core, _logs
from gpubox.config import Config

PathLike = Union[str, "os.PathLike[str]"]


def _slot_csr(column: Any, n: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """One slot column (an id per row, or a list of ids per row) as (keys, offsets)."""
    values = np.asarray(column) if not hasattr(column, "to_numpy") else column.to_numpy()
    if values.ndim == 1 and values.dtype != object:
        keys = values.astype(np.uint64)
        return keys, np.arange(n + 1, dtype=np.int64)
    if values.ndim == 2:  # a fixed number of ids per row
        keys = values.astype(np.uint64).reshape(-1)
        return keys, np.arange(n + 1, dtype=np.int64) * values.shape[1]
    rows = [np.atleast_1d(np.asarray(v if v is not None else [], dtype=np.uint64)) for v in values]
    lengths = np.fromiter((r.size for r in rows), dtype=np.int64, count=len(rows))
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    keys = np.concatenate(rows) if rows else np.zeros(0, dtype=np.uint64)
    if len(rows) != n:
        raise ValueError(f"slot {name}: {len(rows)} rows, the label or first column has {n}")
    return keys.astype(np.uint64), offsets


def _dense_matrix(column: Any, n: int, dense_dim: int, name: str) -> np.ndarray:
    """The dense features as an n x dense_dim float32 matrix."""
    if dense_dim == 0:
        return np.zeros((n, 0), dtype=np.float32)
    if column is None:
        raise ValueError(f"the model reads {dense_dim} dense values per instance: give a "
                         f"'{name}' column (a list per row) or an n x {dense_dim} array")
    values = column.to_numpy() if hasattr(column, "to_numpy") else column
    matrix = np.asarray(list(values) if getattr(values, "dtype", None) == object else values,
                        dtype=np.float32)
    if matrix.shape != (n, dense_dim):
        raise ValueError(f"'{name}': shape {matrix.shape}, the model needs ({n}, {dense_dim})")
    return np.ascontiguousarray(matrix)


class Model:
    """A serving model in memory (what gpubox_serve loads), predicting on this process's card."""

    def __init__(self, core: _core.ServingModel) -> None:
        self._core = core

    @property
    def slot_names(self) -> list[str]:
        """The sparse slots, in the model's order (the columns predict() reads)."""
        return list(self._core.slot_names)

    @property
    def dense_name(self) -> str:
        """The dense features' name in slot text (the dense column predict() reads)."""
        return self._core.dense_name

    @property
    def dense_dim(self) -> int:
        return self._core.dense_dim

    @property
    def rows(self) -> int:
        """Sparse rows held (keys not held read as a new key would, as in --mode infer)."""
        return self._core.rows

    def predict(
        self,
        data: Union[str, Sequence[str], Mapping[str, Any], Any],
        dense: Optional[Any] = None,
    ) -> np.ndarray:
        """Predicted click probabilities, one float32 per instance, in order.

        ``data`` is a pandas DataFrame or a mapping of columns: one column per slot name
        (:attr:`slot_names`; an id per row or a list of ids per row; a slot left out has no
        id; id 0 is padding) and the dense features (column :attr:`dense_name`, a list per row,
        or ``dense=`` an n x dense_dim array); other columns (the label) are ignored. Or slot
        text: a string of lines, or a list of lines, as gpubox_serve and the data files take.
        The same instances give what ``gpubox_train --mode infer`` and gpubox_serve give.
        """
        try:
            return self._predict(data, dense)
        finally:
            _logs.flush()

    def _predict(self, data: Any, dense: Optional[Any]) -> np.ndarray:
        if isinstance(data, str):
            return self._core.predict_text(data)
        if isinstance(data, (list, tuple)) and (not data or isinstance(data[0], str)):
            return self._core.predict_text("\n".join(data))
        columns = list(data.keys()) if hasattr(data, "keys") else []
        if not columns:
            raise TypeError("predict takes a DataFrame, a mapping of columns, or slot text")
        n = len(data[columns[0]])
        keys, offsets = [], []
        for slot in self.slot_names:
            if slot in columns:
                k, o = _slot_csr(data[slot], n, slot)
            else:  # no id in this slot
                k, o = np.zeros(0, dtype=np.uint64), np.zeros(n + 1, dtype=np.int64)
            keys.append(k)
            offsets.append(o)
        dense_column = dense if dense is not None else (
            data[self.dense_name] if self.dense_name in columns else None)
        matrix = _dense_matrix(dense_column, n, self.dense_dim, self.dense_name)
        return self._core.predict(keys, offsets, matrix)


def load(path: PathLike, config: Optional[Config] = None, *, card_threads: int = 0) -> Model:
    """Loads a model for :meth:`Model.predict`.

    ``path`` is an export (``gpubox_train --mode export``'s --out folder: what gpubox_serve
    loads), or a save (``model_save_path/<pass>``), which is exported in memory first as
    ``--mode export`` would: that needs the ``config`` it was trained with. ``card_threads``:
    host threads of the cpu backend's card (0 = the machine's cores).
    """
    try:
        return _load(os.fspath(path), config, card_threads)
    finally:
        _logs.flush()


def _load(path: str, config: Optional[Config], card_threads: int) -> Model:
    if os.path.exists(os.path.join(path, "MODEL_MANIFEST")):
        if config is None:
            raise ValueError(f"{path} is a save: gpubox.load needs the config it was trained "
                             "with (config=...) to export it, or give an export folder")
        with tempfile.TemporaryDirectory(prefix="gpubox-export-") as tmp:
            out = os.path.join(tmp, "model")
            _core.export_save(config._loaded, path, out)
            return Model(_core.ServingModel(out, card_threads))
    return Model(_core.ServingModel(path, card_threads))
