"""Ctrl-C while a pass's data or the test data is read: the read stops within a few thousand
lines, KeyboardInterrupt is raised, and the last complete save is left intact."""

from __future__ import annotations

import os
import pathlib
import shlex
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


def slow_pipe_marking(started: pathlib.Path) -> str:
    """SLOW_PIPE, adding a line to `started` as each file's read begins."""
    return f"echo >> {shlex.quote(str(started))}; {SLOW_PIPE}"


def reads_begun(started: pathlib.Path) -> int:
    return len(started.read_text().splitlines()) if started.exists() else 0


class Interrupter:
    """SIGINT to this process (as Ctrl-C) `seconds` after the `reads`th read through
    slow_pipe_marking(`started`) began (inside the engine); the time it was sent in `sent`.
    Timed from the read, not from the call: a loaded machine may take longer than `seconds` to
    reach the read, and a SIGINT before the engine's handler is in would be Python's own
    KeyboardInterrupt, not a stop of the read. stop() after the run: nothing is sent after it."""

    def __init__(self, seconds: float, started: pathlib.Path, reads: int = 1) -> None:
        self.sent: list[float] = []
        self._done = threading.Event()

        def send() -> None:
            while reads_begun(started) < reads:
                if self._done.wait(0.005):
                    return  # the run ended unread: the test fails on `sent`
            if not self._done.wait(seconds):
                self.sent.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGINT)

        self._thread = threading.Thread(target=send, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def test_ctrl_c_stops_reading_a_pass(planted: dict[str, Any], tmp_path: pathlib.Path,
                                     caplog: pytest.LogCaptureFixture) -> None:
    started = tmp_path / "read_started"
    config = planted_config(planted, tmp_path, **{
        "runner.epochs": 1, "runner.test_data_dir": "",
        "runner.pipe_command": slow_pipe_marking(started),
        "runner.train_data_dir": planted["train"]})
    interrupter = Interrupter(0.3, started)
    gpubox.log_to_python()
    try:
        with caplog.at_level("INFO", logger="gpubox"), pytest.raises(KeyboardInterrupt):
            gpubox.train(config, progress=False)
    finally:
        gpubox.log_to_python(enabled=False)
        interrupter.stop()
    returned = time.monotonic()
    sent = interrupter.sent
    assert sent and returned - sent[0] < 1.5, returned - sent[0]  # the read takes >= 4 s
    messages = [r.getMessage() for r in caplog.records if r.name == "gpubox"]
    assert any("reading pass 0 stopped as asked" in m for m in messages), messages
    assert not (tmp_path / "model").exists()


def test_ctrl_c_stops_reading_the_test_data(planted: dict[str, Any],
                                            tmp_path: pathlib.Path) -> None:
    # (The PS modes' read and evaluation stops: test_multi_trainer.py, against a server.)
    started = tmp_path / "read_started"  # only the test data is read through the pipe
    config = planted_config(planted, tmp_path, **{"runner.epochs": 2,
                                                  "runner.pipe_command": slow_pipe_marking(started),
                                                  "runner.test_data_dir": planted["train"]})
    (part,) = [p for p in planted["test"].iterdir() if p.name.startswith("part-")]
    train_data = gpubox.Dataset.from_frame(read_slot_text(part), config)  # no pipe: quick
    interrupters: list[Interrupter] = []

    def on_pass(p: gpubox.PassMetrics) -> None:
        # Pass 0 saved; its epoch's test read next: the test data's second read (the first,
        # before pass 0, checks its first batch).
        interrupters.append(Interrupter(0.3, started, reads=2))

    try:
        with pytest.raises(KeyboardInterrupt):
            gpubox.train(config, on_pass, train_data=train_data, progress=False)
    finally:
        for interrupter in interrupters:
            interrupter.stop()
    returned = time.monotonic()
    sent = [t for interrupter in interrupters for t in interrupter.sent]
    assert sent and returned - sent[0] < 1.5, returned - sent[0]  # the read takes >= 4 s
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["0"]
    assert (tmp_path / "model" / "0" / "MODEL_MANIFEST").is_file()


def test_ctrl_c_stops_an_evaluations_read(trained: dict[str, Any], planted: dict[str, Any],
                                          tmp_path: pathlib.Path) -> None:
    started = tmp_path / "read_started"
    config = gpubox.Config.from_yaml(trained["config"].path,
                                     {"runner.pipe_command": slow_pipe_marking(started)},
                                     override_list=trained["config"].overrides)
    interrupter = Interrupter(0.3, started)
    try:
        with pytest.raises(KeyboardInterrupt):
            gpubox.evaluate(config, trained["out"] / "model" / "2", planted["train"])
    finally:
        interrupter.stop()
    returned = time.monotonic()
    sent = interrupter.sent
    assert sent and returned - sent[0] < 1.5, returned - sent[0]  # the read takes >= 4 s
