"""gpubox.load: a trained model for predictions, through gpubox_serve's own predictor."""

from __future__ import annotations

import os
import tempfile
import warnings
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from gpubox import _args, _core, _logs
from gpubox._columns import columns_of
from gpubox.config import Config

PathLike = Union[str, "os.PathLike[str]"]


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

    @property
    def precision(self) -> str:
        """What the dense net computes in, ``"fp32"`` or ``"bf16"``: the ``precision=``
        :func:`load` was given, else the one the model was trained in (:attr:`trained_precision`);
        ``"fp32"`` where bf16 was asked but the network or the card has no bf16 path."""
        return self._core.precision

    @property
    def trained_precision(self) -> str:
        """The dense precision the model was trained in, as its export records it."""
        return self._core.trained_precision

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
        The same instances give what ``gpubox_train --mode infer`` and gpubox_serve give. In
        bf16, bit for bit only in the same batches: this computes in batches of 4096
        instances, --mode infer in ``runner.infer_batch_size``, gpubox_serve in its
        micro-batches, and another batch may round a bf16 activation the other way.
        """
        try:
            return self._predict(data, dense)
        finally:
            _logs.flush()

    def _predict(self, data: Any, dense: Optional[Any]) -> np.ndarray:
        if isinstance(data, str):
            return self._core.predict_text(data)
        if isinstance(data, (list, tuple)) and (not data or isinstance(data[0], str)):
            # One prediction per element: an element holding a line break was two lines, and
            # its prediction count no longer matched the list's.
            for i, line in enumerate(data):
                if not isinstance(line, str) or "\n" in line.rstrip("\r\n"):
                    raise ValueError(f"predict: element {i} of the list is "
                                     f"{'not text' if not isinstance(line, str) else 'several lines'}"
                                     "; give one line per element (or the lines as one text)")
            return self._core.predict_text("\n".join(line.rstrip("\r\n") for line in data))
        keys, offsets, matrix, _ = columns_of(data, self.slot_names, self.dense_name,
                                              self.dense_dim, dense=dense)
        if len(matrix) == 0:  # no instance, no prediction
            return np.zeros(0, dtype=np.float32)
        return self._core.predict(keys, offsets, matrix)


def load(path: PathLike, config: Optional[Config] = None, *, card_threads: int = 0,
         precision: Optional[str] = None) -> Model:
    """Loads a model for :meth:`Model.predict`.

    ``path`` is an export (``gpubox_train --mode export``'s --out folder: what gpubox_serve
    loads), or a save (``model_save_path/<pass>``), which is exported in memory first as
    ``--mode export`` would: that needs the ``config`` it was trained with. ``card_threads``:
    host threads of the cpu backend's card (0 = the machine's cores). ``precision``: what the
    dense net computes in, ``"fp32"`` or ``"bf16"`` (gpubox_serve's ``--precision``); None: the
    one the model was trained in. bf16 runs in fp32, logged, where the network or the card has
    no bf16 path (:attr:`Model.precision` says which).
    """
    _args.threads("card_threads", card_threads)
    try:
        return _load(os.fspath(path), config, card_threads, precision)
    finally:
        _logs.flush()


def _load(path: str, config: Optional[Config], card_threads: int,
          precision: Optional[str]) -> Model:
    if os.path.exists(os.path.join(path, "MODEL_MANIFEST")):
        if config is None:
            raise ValueError(f"{path} is a save: gpubox.load needs the config it was trained "
                             "with (config=...) to export it, or give an export folder")
        with tempfile.TemporaryDirectory(prefix="gpubox-export-") as tmp:
            out = os.path.join(tmp, "model")
            _core.export_save(config._loaded, path, out)
            return Model(_core.ServingModel(out, card_threads, precision))
    # Loaded first, so that a path that is no export (a mistyped folder) fails without a warning.
    model = Model(_core.ServingModel(path, card_threads, precision))
    if config is not None:
        # An export carries its own network: a config given beside it was read for nothing.
        warnings.warn(f"{path} is an export: it carries its network and rules; the config given "
                      "is not used (it is for a save, model_save_path/<pass>)", stacklevel=3)
    return model
