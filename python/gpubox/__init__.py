"""GPUBox from Python: the same engine as the gpubox_* binaries, driven from a notebook.

    import gpubox
    config = gpubox.Config.from_yaml("configs/config_gpubox.yaml", {"runner.epochs": 2})
    result = gpubox.train(config, on_pass=lambda p: print(p.pass_id, p.auc))
    held_out = gpubox.evaluate(config, "output_model/1")    # --mode infer of one save
    model = gpubox.load("output_model/1", config=config)   # a save, or an export folder
    predictions = model.predict(df)                         # NumPy float32, one per row

Every call goes to the engine's own code (``gpubox._core``): the config loader and its errors,
``gpubox_train``'s schedules, ``gpubox_serve``'s predictor.
"""

from __future__ import annotations

from gpubox import _core, data
from gpubox._logs import log_to_python
from gpubox.config import Config
from gpubox.data import Dataset
from gpubox.model import Model, load
from gpubox.training import (EpochMetrics, EvalResult, Metrics, PassMetrics, TrainResult,
                             evaluate, train)

ConfigError = _core.ConfigError
EngineError = _core.EngineError

#: The package's version (the engine's: ``gpubox_train --version``).
__version__: str = _core.__version__
#: The device backend the extension was built with: ``"cpu"`` or ``"cuda"``.
backend: str = _core.backend

__all__ = [
    "Config",
    "ConfigError",
    "Dataset",
    "EngineError",
    "EpochMetrics",
    "EvalResult",
    "Metrics",
    "Model",
    "PassMetrics",
    "TrainResult",
    "__version__",
    "backend",
    "data",
    "evaluate",
    "load",
    "log_to_python",
    "train",
]
