"""Ctrl-C while a pass's data or the test data is read: the read stops within a few thousand
lines, KeyboardInterrupt is raised, and the last complete save is left intact."""

from __future__ import annotations

import os
import pathlib
import signal
import threading
import time
from typing import Any

import pytest
from conftest import planted_config, read_slot_text

import gpubox

# Each file read through a pipe that sleeps 50 ms every 500 lines: the 40,000 training lines
# take >= 4 s on one reader (runner.thread_num 1). A reader looks at the stop flag every 4,096
# lines: a stop within ~0.5 s here (a few ms reading files).
SLOW_PIPE = "awk '{print} NR % 500 == 0 {system(\"sleep 0.05\")}'"


def interrupt_in(seconds: float, sent: list[float]) -> threading.Timer:
    """SIGINT to this process (as Ctrl-C) `seconds` from now; the time it was sent in `sent`."""

    def send() -> None:
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(seconds, send)
    timer.start()
    return timer


def test_ctrl_c_stops_reading_a_pass(planted: dict[str, Any], tmp_path: pathlib.Path,
                                     caplog: pytest.LogCaptureFixture) -> None:
    config = planted_config(planted, tmp_path, **{
        "runner.epochs": 1, "runner.test_data_dir": "", "runner.pipe_command": SLOW_PIPE,
        "runner.train_data_dir": planted["train"]})
    sent: list[float] = []
    timer = interrupt_in(0.3, sent)
    gpubox.log_to_python()
    try:
        with caplog.at_level("INFO", logger="gpubox"), pytest.raises(KeyboardInterrupt):
            gpubox.train(config, progress=False)
    finally:
        gpubox.log_to_python(enabled=False)
        timer.cancel()
    returned = time.monotonic()
    assert sent and returned - sent[0] < 1.5, returned - sent[0]  # the read takes >= 4 s
    messages = [r.getMessage() for r in caplog.records if r.name == "gpubox"]
    assert any("reading pass 0 stopped as asked" in m for m in messages), messages
    assert not (tmp_path / "model").exists()


def test_ctrl_c_stops_reading_the_test_data(planted: dict[str, Any],
                                            tmp_path: pathlib.Path) -> None:
    # (The PS modes' read and evaluation stops: test_multi_trainer.py, against a server.)
    config = planted_config(planted, tmp_path, **{"runner.epochs": 2,
                                                  "runner.pipe_command": SLOW_PIPE,
                                                  "runner.test_data_dir": planted["train"]})
    (part,) = [p for p in planted["test"].iterdir() if p.name.startswith("part-")]
    train_data = gpubox.Dataset.from_frame(read_slot_text(part), config)  # no pipe: quick
    sent: list[float] = []
    timers: list[threading.Timer] = []

    def on_pass(p: gpubox.PassMetrics) -> None:  # pass 0 saved; its epoch's test read next
        timers.append(interrupt_in(0.3, sent))

    try:
        with pytest.raises(KeyboardInterrupt):
            gpubox.train(config, on_pass, train_data=train_data, progress=False)
    finally:
        for t in timers:
            t.cancel()
    returned = time.monotonic()
    assert sent and returned - sent[0] < 1.5, returned - sent[0]  # the read takes >= 4 s
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["0"]
    assert (tmp_path / "model" / "0" / "MODEL_MANIFEST").is_file()


def test_ctrl_c_stops_an_evaluations_read(trained: dict[str, Any], planted: dict[str, Any],
                                          tmp_path: pathlib.Path) -> None:
    config = gpubox.Config.from_yaml(trained["config"].path, {"runner.pipe_command": SLOW_PIPE},
                                     override_list=trained["config"].overrides)
    sent: list[float] = []
    timer = interrupt_in(0.3, sent)
    try:
        with pytest.raises(KeyboardInterrupt):
            gpubox.evaluate(config, trained["out"] / "model" / "2", planted["train"])
    finally:
        timer.cancel()
    assert sent and time.monotonic() - sent[0] < 1.5  # the read takes >= 4 s
