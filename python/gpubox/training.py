"""gpubox.train: ``gpubox_train --mode train`` from Python, metrics as Python objects."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import numpy as np

from gpubox import _args, _core, _logs, _progress
from gpubox._progress import StepProgress
from gpubox.config import Config
from gpubox.data import Dataset


@dataclass(frozen=True)
class Metrics:
    """A pass's or an evaluation's metrics (NaN where undefined, e.g. AUC of one class)."""

    examples: float
    positives: float
    auc: float
    logloss: float
    ne: float
    actual_ctr: float
    predicted_ctr: float
    copc: float
    mae: float
    rmse: float

    @classmethod
    def _from(cls, d: dict[str, float]) -> "Metrics":
        return cls(**d)


@dataclass(frozen=True)
class PassMetrics:
    """One training pass: what its pass line and its JSON line in runner.metrics_path say."""

    pass_id: int
    seconds: float
    cards: int
    metrics: Metrics
    #: The pass line's other fields (pass-manager counters, ne_after_warmup, ...), in order.
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def auc(self) -> float:
        return self.metrics.auc

    @property
    def logloss(self) -> float:
        return self.metrics.logloss

    @property
    def ips(self) -> float:
        """Examples per second over all cards (the pass line's ips)."""
        return self.metrics.examples / self.seconds if self.seconds > 0 else float("nan")

    @classmethod
    def _from(cls, d: dict[str, Any]) -> "PassMetrics":
        return cls(d["pass"], d["seconds"], d["cards"], Metrics._from(d["metrics"]), d["extra"])


@dataclass(frozen=True)
class EpochMetrics:
    """One epoch: its passes' metrics merged, and runner.test_data_dir's (None without it)."""

    epoch: int
    train: Metrics
    test: Optional[Metrics]

    @classmethod
    def _from(cls, d: dict[str, Any]) -> "EpochMetrics":
        test = Metrics._from(d["test"]) if d["test"] is not None else None
        return cls(d["epoch"], Metrics._from(d["train"]), test)


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train` returns: the passes trained and the epochs ended, in order."""

    passes: list[PassMetrics]
    epochs: list[EpochMetrics]


def train(
    config: Config,
    on_pass: Optional[Callable[[PassMetrics], None]] = None,
    *,
    on_epoch: Optional[Callable[[EpochMetrics], None]] = None,
    load: Union[str, "os.PathLike[str]"] = "",
    threads_per_card: int = 0,
    train_data: Optional[Dataset] = None,
    test_data: Optional[Dataset] = None,
    progress: Optional[bool] = None,
    on_progress: Optional[Callable[[StepProgress], None]] = None,
) -> TrainResult:
    """Runs every pass of ``config`` as ``gpubox_train --config ... --mode train`` does.

    The same schedule (runner.sync_mode; cards from FLAGS_selected_gpus, servers from
    PADDLE_PSERVERS_IP_PORT_LIST, as the binary reads them), the same pass lines on stdout, JSON
    lines, saves and resume. ``load`` is ``--load``; ``threads_per_card`` is
    ``--threads_per_card`` (cpu backend). ``train_data`` (a :class:`gpubox.data.Dataset`)
    replaces runner.train_data_dir and pass_dirs (each epoch is one pass over it), ``test_data``
    runner.test_data_dir. ``on_pass`` is called after each pass (its save, when
    saving, is complete by then), ``on_epoch`` after each epoch's test evaluation.

    ``progress``: a bar per pass (steps done of the pass's, examples/s, running AUC: tqdm when
    installed, else one line on stderr); ``None`` shows it when stderr is a terminal or in a
    notebook. ``on_progress`` gets the same figures (:class:`StepProgress`) about 4 times a
    second and after each pass's last step, on an engine thread (the GIL held for the call).

    The GIL is released while the engine runs. Ctrl-C stops the run between two steps, in
    every mode (gpubox: all cards after the same step; async, sync and geo: the training
    threads push what they hold, so the servers keep every applied update), or while a pass's
    data or the test data is read (within a few thousand lines of each reader): the pass it
    stops is not saved, the last complete save is left intact, and KeyboardInterrupt is
    raised; ``runner.resume: auto`` continues from that save. With several trainer processes
    a stop in one of them ends every trainer after the same pass: the stopped one raises
    KeyboardInterrupt, the others return the passes they trained (a stop between passes is
    carried out in the next pass's first step, that pass unsaved).

    An exception raised by a callback is raised again here, as it was; no callback is called
    after it, and the run stops the same way: at the next step (``on_progress``), or right
    after the callback (``on_pass``: that pass's save is complete; its epoch's test evaluation
    is stopped as it begins). Engine errors raise :class:`gpubox.EngineError` with the text
    gpubox_train prints after ``gpubox_train:``.
    """
    for name, value in (("on_pass", on_pass), ("on_epoch", on_epoch),
                        ("on_progress", on_progress)):
        _args.callback(name, value)
    _args.threads("threads_per_card", threads_per_card)
    show = _progress.interactive() if progress is None else progress
    bar = _progress.ProgressBar() if show else None

    def progress_callback(d: dict[str, Any]) -> None:
        p = StepProgress._from(d)
        if bar is not None:
            bar.update(p)
        if on_progress is not None:
            on_progress(p)

    def pass_callback(d: dict[str, Any]) -> None:
        if bar is not None:
            bar.close()
        _logs.flush()
        if on_pass is not None:
            on_pass(PassMetrics._from(d))

    def epoch_callback(d: dict[str, Any]) -> None:
        if on_epoch is not None:
            on_epoch(EpochMetrics._from(d))

    try:
        raw = _core.train(
            config._loaded,
            load=os.fspath(load),
            threads_per_card=threads_per_card,
            on_pass=pass_callback,
            on_epoch=epoch_callback,
            train_data=train_data.name if train_data is not None else "",
            test_data=test_data.name if test_data is not None else "",
            on_progress=progress_callback if bar is not None or on_progress else None,
        )
    finally:
        if bar is not None:
            bar.close()
        _logs.flush()
    return TrainResult(
        passes=[PassMetrics._from(d) for d in raw["passes"]],
        epochs=[EpochMetrics._from(d) for d in raw["epochs"]],
    )


@dataclass(frozen=True)
class EvalResult:
    """What :func:`evaluate` returns: the metrics, and per instance (in file order) the labels
    and predictions when asked for (empty arrays otherwise)."""

    metrics: Metrics
    labels: np.ndarray
    predictions: np.ndarray


def evaluate(
    config: Config,
    load: Union[str, "os.PathLike[str]"] = "",
    data_dir: Union[str, "os.PathLike[str]", Dataset] = "",
    *,
    predictions: bool = False,
    threads_per_card: int = 0,
) -> EvalResult:
    """Evaluates the save ``load`` on ``data_dir`` (default runner.test_data_dir) as
    ``gpubox_train --mode infer --load LOAD --infer_data_dir DATA_DIR`` does, through the same
    library call (``data_dir`` may be a :class:`gpubox.data.Dataset`), on the schedule and
    cards the config and environment give. ``load=""``: the saves runner.infer_load_path names,
    each evaluated in turn; the last one's result is returned. ``predictions=True`` keeps each
    instance's label and prediction (``--predictions_out``). The GIL is released while it
    runs; Ctrl-C stops it while it reads the data (in a PS mode also between batches) with
    KeyboardInterrupt; engine errors raise :class:`gpubox.EngineError` with gpubox_train's
    text."""
    _args.threads("threads_per_card", threads_per_card)
    data = data_dir.name if isinstance(data_dir, Dataset) else os.fspath(data_dir)
    try:
        raw = _core.evaluate(config._loaded, os.fspath(load), data,
                             keep_predictions=predictions, threads_per_card=threads_per_card)
    finally:
        _logs.flush()
    return EvalResult(Metrics._from(raw["metrics"]), raw["labels"], raw["predictions"])
