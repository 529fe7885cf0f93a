"""gpubox.data: training and evaluation data from NumPy arrays or a pandas DataFrame, without
files: the instances go to the engine's InMemoryDataset as a file's would."""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Sequence, Union

from gpubox import _core
from gpubox._columns import columns_of
from gpubox.config import Config


class Dataset:
    """Instances held by the engine, for ``gpubox.train(train_data=..., test_data=...)`` and
    ``gpubox.evaluate(..., data=...)``; built with :meth:`from_frame`.

    They are the instances the same rows give as slot text (the label, the slot ids in the
    config's slot order with id 0 dropped, the dense values), in row order; the engine copies
    them for each pass that reads them. The memory is freed with :meth:`release` or when the
    object goes away."""

    def __init__(self, name: str, size: int) -> None:
        self._name: Optional[str] = name
        self.size = size

    @classmethod
    def from_frame(cls, data: Any, config: Config, *, dense: Optional[Any] = None) -> "Dataset":
        """Rows of a pandas DataFrame or a mapping of columns: the label column
        (runner.label_name, 0 or 1), one column per slot of the config (an id per row, a list
        of ids per row, or an n x k array; a slot without a column has no id) and the dense
        values (the runner.dense_name column, a list per row, or ``dense=`` an n x dense_dim
        array). Other columns are ignored."""
        loaded = config._loaded
        keys, offsets, matrix, labels = columns_of(
            data, loaded.slot_names, loaded.dense_name, loaded.dense_dim, dense=dense,
            label_name=loaded.label_name)
        if len(matrix) == 0:
            raise ValueError("the frame has no rows: a data set needs at least one instance")
        return cls(_core.register_data(loaded, keys, offsets, matrix, labels), len(matrix))

    @property
    def name(self) -> str:
        """The name the engine knows it by ("memory:<n>")."""
        if self._name is None:
            raise ValueError("this Dataset was released")
        return self._name

    def release(self) -> None:
        """Frees the instances (a run under way keeps its copy)."""
        if self._name is not None:
            _core.release_data(self._name)
            self._name = None

    def __len__(self) -> int:
        return self.size

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # interpreter shutdown: the module may be gone
            pass


def stat(
    config: Config,
    sources: Sequence[Union[str, "os.PathLike[str]", Dataset]] = (),
) -> dict[str, Any]:
    """What ``gpubox_data stat --config ... --json`` reports (files, lines, instances, skipped
    lines by reason, unique keys, positives, bytes, seconds, MB/s, ...) for ``sources``: data
    folders or files, or Datasets; by default the config's training data (runner.pass_dirs, else
    runner.train_data_dir). Loads them exactly as training would; a load that fails (as
    gpubox_data stat exits 1) raises :class:`gpubox.EngineError` with its error."""
    names = [s.name if isinstance(s, Dataset) else os.fspath(s) for s in sources]
    return json.loads(_core.stat(config._loaded, names))
