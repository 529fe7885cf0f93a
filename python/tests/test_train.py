"""gpubox.train: gpubox_train's schedule from Python, to the planted model's AUC."""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import signal
import threading
import time
from typing import Any

import pytest
from conftest import CONFIG, PLANTED_TOLERANCE, planted_config, run_binary

import gpubox


def test_reaches_the_planted_auc(trained: dict[str, Any], planted: dict[str, Any]) -> None:
    result: gpubox.TrainResult = trained["result"]
    assert [p.pass_id for p in result.passes] == [0, 1, 2]
    assert [e.epoch for e in result.epochs] == [0, 1, 2]
    assert trained["seen"] == result.passes  # on_pass saw each pass, as returned
    test_auc = result.epochs[-1].test.auc
    assert test_auc > planted["oracle"]["auc"] - PLANTED_TOLERANCE
    assert all(p.metrics.examples == 40000 for p in result.passes)


def test_metrics_are_the_json_lines(trained: dict[str, Any]) -> None:
    lines = [json.loads(line) for line in
             (trained["out"] / "metrics.jsonl").read_text().splitlines()]
    passes = [line for line in lines if "pass" in line]
    tests = [line for line in lines if "test_auc" in line]
    for got, want in zip(trained["result"].passes, passes):
        # The JSON lines print 10 significant digits.
        assert got.auc == pytest.approx(want["auc"], rel=1e-9)
        assert got.logloss == pytest.approx(want["logloss"], rel=1e-9)
        assert got.metrics.examples == want["examples"]
    assert len(passes) == 3 and len(tests) == 3
    for got, want in zip(trained["result"].epochs, tests):
        assert got.test.auc == pytest.approx(want["test_auc"], rel=1e-9)


def test_engine_errors_are_the_binarys(tmp_path: pathlib.Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    overrides = {"runner.train_data_dir": empty, "runner.metrics_path": "",
                 "runner.model_save_path": ""}
    binary = run_binary("gpubox_train", "--config", str(CONFIG),
                        *[a for k, v in overrides.items() for a in ("-o", f"{k}={v}")])
    assert binary.returncode == 1
    with pytest.raises(gpubox.EngineError) as raised:
        gpubox.train(gpubox.Config.from_yaml(CONFIG, overrides))
    assert f"gpubox_train: {raised.value}" in binary.stderr.splitlines()


def test_ctrl_c_stops_between_passes_and_keeps_the_last_save(
        planted: dict[str, Any], tmp_path: pathlib.Path) -> None:
    small = {"runner.epochs": 3, "runner.test_data_dir": "",
             "runner.train_data_dir": planted["test"]}  # 5,000 lines: quick passes
    config = planted_config(planted, tmp_path, **small)
    seen: list[int] = []

    def interrupt_after_first(p: gpubox.PassMetrics) -> None:
        seen.append(p.pass_id)
        os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C in a terminal or a notebook

    with pytest.raises(KeyboardInterrupt):
        gpubox.train(config, on_pass=interrupt_after_first)
    assert seen == [0]
    saves = sorted(p.name for p in (tmp_path / "model").iterdir())
    assert saves == ["0"]
    assert (tmp_path / "model" / "0" / "MODEL_MANIFEST").is_file()
    # The save is complete: a resume continues from it with pass 1.
    resumed = gpubox.train(planted_config(planted, tmp_path, **small, **{"runner.resume": "auto"}))
    assert [p.pass_id for p in resumed.passes] == [1, 2]


def test_ctrl_c_stops_a_pass_between_steps_and_keeps_the_last_save(
        planted: dict[str, Any], tmp_path: pathlib.Path) -> None:
    # Passes of 40,000 lines in batches of 64 (625 steps): seconds each, long enough to stop in.
    # Every step reported (print_interval 1): on a fast machine the first timed report may
    # otherwise come late in the pass.
    config = planted_config(planted, tmp_path, **{"runner.epochs": 3, "runner.test_data_dir": "",
                                                  "runner.train_batch_size": 64,
                                                  "runner.print_interval": 1})
    passes: list[gpubox.PassMetrics] = []
    steps: list[gpubox.StepProgress] = []
    sent: list[float] = []

    def interrupt_in_pass_1(p: gpubox.StepProgress) -> None:
        steps.append(p)
        if p.pass_id == 1 and not sent and p.step >= 5:
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C, in the middle of the pass

    with pytest.raises(KeyboardInterrupt):
        gpubox.train(config, on_pass=passes.append, on_progress=interrupt_in_pass_1)
    returned = time.monotonic()
    assert [p.pass_id for p in passes] == [0] and sent
    # Stopped a step or so after the signal, not at the pass's end: within a fraction of pass
    # 0's time (which includes reading the data; pass 1 reads it ahead).
    assert returned - sent[0] < 0.25 * passes[0].seconds, (returned - sent[0], passes[0].seconds)
    in_pass_1 = [p.step for p in steps if p.pass_id == 1]
    assert in_pass_1 and in_pass_1[-1] < in_pass_1[0] + 50 < steps[0].steps
    # No save of the stopped pass, not even begun; pass 0's is complete: a resume trains pass
    # 1 again from it.
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["0"]
    assert (tmp_path / "model" / "0" / "MODEL_MANIFEST").is_file()
    resumed = gpubox.train(planted_config(planted, tmp_path, **{
        "runner.epochs": 3, "runner.test_data_dir": "", "runner.train_batch_size": 64,
        "runner.resume": "auto"}))
    assert [p.pass_id for p in resumed.passes] == [1, 2]
    assert all(p.metrics.examples == 40000 for p in resumed.passes)


def test_arguments_of_a_wrong_type_or_range_are_refused_before_anything_trains(
        planted: dict[str, Any], tmp_path: pathlib.Path) -> None:
    # on_pass=5 raised only when pass 0 had trained and saved; threads_per_card=-1 ran.
    config = planted_config(planted, tmp_path, **{"runner.epochs": 1, "runner.test_data_dir": ""})
    with pytest.raises(TypeError, match="on_pass must be a callable or None, got int 5"):
        gpubox.train(config, on_pass=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="on_progress must be a callable or None"):
        gpubox.train(config, on_progress="print")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"threads_per_card must be in \[0, 4096\]"):
        gpubox.train(config, threads_per_card=-1)
    with pytest.raises(TypeError, match="threads_per_card must be a whole number"):
        gpubox.evaluate(config, threads_per_card=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"card_threads must be in \[0, 4096\]"):
        gpubox.load(tmp_path, card_threads=-1)
    assert not (tmp_path / "model").exists()


def test_a_callbacks_exception_stops_the_run(planted: dict[str, Any],
                                             tmp_path: pathlib.Path) -> None:
    config = planted_config(planted, tmp_path, **{"runner.epochs": 2, "runner.test_data_dir": "",
                                                  "runner.train_data_dir": planted["test"]})

    def fail(p: gpubox.PassMetrics) -> None:
        raise ValueError(f"stop at {p.pass_id}")

    with pytest.raises(ValueError, match="stop at 0"):
        gpubox.train(config, on_pass=fail)
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["0"]


@pytest.mark.parametrize("raising", ["on_pass", "on_epoch", "on_progress"])
def test_a_callback_raising_ends_the_run_with_its_exception(
        planted: dict[str, Any], tmp_path: pathlib.Path, raising: str) -> None:
    # After a callback raises, no callback is called again; the run stops at the next step
    # (on_progress: pass 0 unsaved) or right after the callback (pass 0 saved, its epoch's test
    # evaluation stopped as it begins), and the exception is raised as it was, traceback and
    # all. The saves are complete: a resume trains on from them.
    # Every step reported (print_interval 1): a pass shorter than the progress period would
    # otherwise report only its last step.
    small = {"runner.epochs": 3, "runner.train_data_dir": planted["test"],
             "runner.train_batch_size": 64, "runner.print_interval": 1}
    config = planted_config(planted, tmp_path, **small)
    calls: list[str] = []

    class Planted(Exception):
        pass

    def callback(name: str) -> Any:
        def call(_: Any) -> None:
            calls.append(name)
            if name == raising:
                raise Planted(name)
        return call

    with pytest.raises(Planted, match=raising) as raised:
        gpubox.train(config, callback("on_pass"), on_epoch=callback("on_epoch"),
                     on_progress=callback("on_progress"))
    assert raised.traceback[-1].name == "call"  # raised where the callback raised it
    assert calls[-1] == raising and calls.count(raising) == 1
    saved = [] if raising == "on_progress" else ["0"]
    model = tmp_path / "model"
    assert (sorted(p.name for p in model.iterdir()) if model.exists() else []) == saved
    if raising == "on_pass":  # the epoch's test evaluation was stopped: no test line
        assert "on_epoch" not in calls
        assert "test_auc" not in (tmp_path / "metrics.jsonl").read_text()
    resumed = gpubox.train(planted_config(planted, tmp_path, **small, **{"runner.resume": "auto"}))
    assert [p.pass_id for p in resumed.passes] == ([1, 2] if saved else [0, 1, 2])


def test_engine_logs_through_python_logging(planted: dict[str, Any], tmp_path: pathlib.Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    config = planted_config(planted, tmp_path, **{"runner.epochs": 1, "runner.test_data_dir": "",
                                                  "runner.train_data_dir": planted["test"]})
    gpubox.log_to_python()
    try:
        with caplog.at_level("INFO", logger="gpubox"):
            gpubox.train(config)
    finally:
        gpubox.log_to_python(enabled=False)
    messages = [r.getMessage() for r in caplog.records if r.name == "gpubox"]
    assert any(m.startswith("runner.metrics_path: appending to ") for m in messages), messages
    assert all(r.gpubox_line.startswith(("I", "W", "E", "D")) for r in caplog.records
               if r.name == "gpubox")


def test_the_gil_is_released_while_the_engine_trains(planted: dict[str, Any],
                                                     tmp_path: pathlib.Path) -> None:
    # The reader's pipe waits (up to ~20 s) for a file that only a Python thread makes, once
    # the pipe has begun: held through the run, the GIL would keep that thread out until the
    # pipe gave up. (Counting a ticker's sleeps against the run's seconds instead failed under
    # load: a warm run took 0.03 s, too short for the 20 ticks asked.)
    waiting, go, seen = tmp_path / "waiting", tmp_path / "go", tmp_path / "seen"
    pipe = (f"touch {shlex.quote(str(waiting))}; i=0; "
            f"while [ ! -e {shlex.quote(str(go))} ] && [ $i -lt 2000 ]; do sleep 0.01; "
            f"i=$((i + 1)); done; [ -e {shlex.quote(str(go))} ] && touch {shlex.quote(str(seen))}; "
            "cat")
    config = planted_config(planted, tmp_path, **{"runner.epochs": 1, "runner.test_data_dir": "",
                                                  "runner.train_data_dir": planted["test"],
                                                  "runner.model_save_path": "",
                                                  "runner.pipe_command": pipe})
    done = threading.Event()

    def let_the_reader_go() -> None:  # runs only when the main thread lets go of the GIL
        while not waiting.exists() and not done.is_set():
            time.sleep(0.001)
        go.touch()

    helper = threading.Thread(target=let_the_reader_go)
    helper.start()
    try:
        result = gpubox.train(config, progress=False)
    finally:
        done.set()
        helper.join()
    assert waiting.exists() and seen.exists(), "the pipe gave up: the GIL was held"
    assert [p.metrics.examples for p in result.passes] == [5000]
