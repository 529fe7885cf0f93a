"""GPUBox from Python: the same engine as the gpubox_* binaries, driven from a notebook.

    import gpubox
    config = gpubox.Config.from_yaml("configs/config_gpubox.yaml", {"runner.epochs": 2})
    result = gpubox.train(config, on_pass=lambda p: print(p.pass_id, p.auc))
    held_out = gpubox.evaluate(config, "output/model_dnn/1")    # --mode infer of one save
    model = gpubox.load("output/model_dnn/1", config=config)   # a save, or an export folder
    predictions = model.predict(df)                         # NumPy float32, one per row

Every call goes to the engine's own code (``gpubox._core``): the config loader and its errors,
``gpubox_train``'s schedules, ``gpubox_serve``'s predictor.
"""

from __future__ import annotations

import os

# As the binaries do first thing in main (heterps/device/card.hpp, use_passive_cpu_waits):
# OpenMP threads that spin while waiting starve the other simulated cards on the cpu backend
# (measured 4-5x slower training), and libgomp reads its wait policy once, when it loads with
# the extension below; CUDA modules load eagerly (card_setup.hpp). A user's setting wins; a
# libgomp another module loaded before gpubox keeps the policy it read then.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")
os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")

from gpubox import _core, data  # noqa: E402
from gpubox._logs import log_to_python  # noqa: E402
from gpubox.config import Config  # noqa: E402
from gpubox.data import Dataset  # noqa: E402
from gpubox.model import Model, load  # noqa: E402
from gpubox.training import (  # noqa: E402
    EpochMetrics,
    EvalResult,
    Metrics,
    PassMetrics,
    StepProgress,
    TrainResult,
    evaluate,
    train,
)

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
    "StepProgress",
    "TrainResult",
    "__version__",
    "backend",
    "data",
    "evaluate",
    "load",
    "log_to_python",
    "train",
]
