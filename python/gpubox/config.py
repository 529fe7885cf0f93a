"""gpubox.Config: a config_gpubox.yaml loaded by the engine's own loader (common/config)."""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional, Sequence, Union

from gpubox import _core

PathLike = Union[str, "os.PathLike[str]"]


def _override_value(value: Any, in_list: bool = False) -> str:
    """The text of one ``-o key=value`` value: YAML spellings for bools and lists. A string in
    a list is a quoted YAML string (a path holding ", " was split into two paths, quotes were
    lost); bytes are refused (their text was "b'...'")."""
    if isinstance(value, (bytes, bytearray)):
        raise TypeError(f"a config value is text, not bytes: {value!r} (decode it)")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_override_value(v, in_list=True) for v in value) + "]"
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if in_list and isinstance(value, str):
        return json.dumps(value)  # a YAML double-quoted string
    return str(value)


class Config:
    """A config as ``gpubox_train --config PATH -o key=value ...`` loads it.

    Built with :meth:`from_yaml`; immutable. The key table, defaults, path resolution and error
    texts are the binaries' (``gpubox_train --print_config_keys`` lists every key).
    """

    def __init__(self, loaded: _core.LoadedConfig) -> None:
        self._loaded = loaded

    @classmethod
    def from_yaml(
        cls,
        path: PathLike,
        overrides: Optional[Mapping[str, Any]] = None,
        *,
        override_list: Sequence[str] = (),
    ) -> "Config":
        """Loads ``path`` with ``overrides`` applied in order (as ``-o key=value``).

        ``overrides`` maps keys to values (``{"runner.epochs": 2, "hyper_parameters.fc_sizes":
        [64, 32]}``); ``override_list`` takes ready ``"key=value"`` strings, applied after them.
        Relative paths in the file resolve against its folder, in overrides against the working
        directory. Raises :class:`gpubox.ConfigError` with the text gpubox_train prints after
        ``gpubox_train:``.
        """
        for key, value in (overrides or {}).items():
            if value is None:  # str(None) would be the path or name "None"
                raise _core.ConfigError(f"{key}: None is not a value (leave the key out for its "
                                        "default, or give \"\" for an empty path)")
        items = [f"{key}={_override_value(value)}" for key, value in (overrides or {}).items()]
        items.extend(override_list)
        return cls(_core.load_config(os.fspath(path), items))

    @property
    def path(self) -> str:
        """The YAML file it was loaded from."""
        return self._loaded.path

    @property
    def overrides(self) -> list[str]:
        """The ``key=value`` overrides applied, in order."""
        return list(self._loaded.overrides)

    @property
    def model(self) -> str:
        """The network (hyper_parameters.model or the PaddleRec model folder's)."""
        return self._loaded.model

    @property
    def sync_mode(self) -> str:
        """runner.sync_mode: gpubox, async, sync or geo."""
        return self._loaded.sync_mode

    @property
    def train_data_dir(self) -> str:
        """runner.train_data_dir, resolved ("" when unset)."""
        return self._loaded.train_data_dir

    @property
    def test_data_dir(self) -> str:
        """runner.test_data_dir, resolved ("" when unset)."""
        return self._loaded.test_data_dir

    @property
    def model_save_path(self) -> str:
        """runner.model_save_path ("" when unset): saves land in <path>/<pass>."""
        return self._loaded.model_save_path

    @property
    def metrics_path(self) -> str:
        """runner.metrics_path: one JSON line per pass is appended there."""
        return self._loaded.metrics_path

    @property
    def epochs(self) -> int:
        """runner.epochs."""
        return self._loaded.epochs

    def __repr__(self) -> str:
        return f"gpubox.Config({self.path!r}, overrides={self.overrides!r})"
