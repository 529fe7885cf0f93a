"""gpubox.train's progress: the on_progress callback, and the bar only where someone watches."""

from __future__ import annotations

import io
import pathlib
import sys
import types
from typing import Any

import pytest
from conftest import planted_config

import gpubox
from gpubox import _progress


def _config(planted: dict[str, Any], out: pathlib.Path) -> gpubox.Config:
    # 2 passes of 5,000 lines in batches of 256: 20 steps each.
    return planted_config(planted, out, **{"runner.epochs": 2, "runner.test_data_dir": "",
                                           "runner.train_data_dir": planted["test"],
                                           "runner.model_save_path": ""})


def test_the_callback_gets_each_pass_to_its_last_step_and_no_bar_off_a_terminal(
        planted: dict[str, Any], tmp_path: pathlib.Path, capfd: pytest.CaptureFixture) -> None:
    seen: list[gpubox.StepProgress] = []
    assert not _progress.interactive()  # pytest's captured stderr is no terminal
    gpubox.train(_config(planted, tmp_path), on_progress=seen.append)
    assert {p.pass_id for p in seen} == {0, 1}
    for pass_id in (0, 1):
        steps = [p for p in seen if p.pass_id == pass_id]
        assert [p.step for p in steps] == sorted({p.step for p in steps})  # counting up
        assert steps[-1].step == steps[-1].steps == 20  # ceil(5000 / 256)
        assert 0.5 < steps[-1].auc <= 1.0 and steps[-1].examples_per_second > 0
    # No bar by default off a terminal: neither the engine's redrawn line nor the package's.
    err = capfd.readouterr().err
    assert "/20 steps (" not in err, err
    assert "\r" not in err


def test_the_plain_bar_when_asked_for(planted: dict[str, Any], tmp_path: pathlib.Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(_progress, "_tqdm", lambda: None)  # as without tqdm installed
    gpubox.train(_config(planted, tmp_path), progress=True)
    lines = stream.getvalue().split("\n")
    # One line per pass, redrawn in place, ending at its last step.
    assert lines[0].split("\r")[-1].startswith("pass 0: 20/20 steps (100.0%), ")
    assert lines[1].split("\r")[-1].startswith("pass 1: 20/20 steps (100.0%), ")
    assert "auc: " in lines[0]
    assert gpubox.train(_config(planted, tmp_path), progress=False) is not None
    assert stream.getvalue().count("pass 0: 20/20") == 1  # progress=False: no bar


def test_tqdm_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []

    class FakeTqdm:  # tqdm's interface as ProgressBar uses it
        def __init__(self, total: int, desc: str, **kwargs: Any) -> None:
            self.total, self.desc, self.n, self.closed, self.postfix = total, desc, 0, False, {}
            made.append(self)

        def update(self, n: int) -> None:
            self.n += n

        def set_postfix(self, refresh: bool = True, **postfix: Any) -> None:
            self.postfix = postfix

        def close(self) -> None:
            self.closed = True

    auto = types.ModuleType("tqdm.auto")
    auto.tqdm = FakeTqdm  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tqdm", types.ModuleType("tqdm"))
    monkeypatch.setitem(sys.modules, "tqdm.auto", auto)
    bar = _progress.ProgressBar(io.StringIO())
    for step in (3, 7, 10):
        bar.update(_progress.StepProgress(0, step, 10, 1000.0, 0.7, 0.1 * step))
    bar.update(_progress.StepProgress(1, 4, 10, 1000.0, float("nan"), 0.4))
    bar.close()
    assert [(b.desc, b.total, b.n, b.closed) for b in made] == [("pass 0", 10, 10, True),
                                                               ("pass 1", 10, 4, True)]
    assert made[0].postfix == {"auc": "0.7000", "ips": "1000"}
    assert made[1].postfix["auc"] == "nan"


def test_an_exception_in_on_progress_stops_the_run(
        planted: dict[str, Any], tmp_path: pathlib.Path) -> None:
    config = planted_config(planted, tmp_path, **{"runner.epochs": 3, "runner.test_data_dir": "",
                                                  "runner.train_data_dir": planted["test"]})
    passes: list[int] = []

    def fail_at_the_end_of_pass_0(p: gpubox.StepProgress) -> None:
        if p.step == p.steps:
            raise ValueError(f"stop in pass {p.pass_id}")

    with pytest.raises(ValueError, match="stop in pass 0"):
        gpubox.train(config, on_pass=lambda p: passes.append(p.pass_id),
                     on_progress=fail_at_the_end_of_pass_0)
    # Pass 0 had done its steps: it ends and is saved, and the run stops before pass 1. No
    # callback runs after one raised (pass 0's on_pass neither).
    assert passes == []
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["0"]


def test_an_exception_in_on_progress_mid_pass_stops_that_pass_unsaved(
        planted: dict[str, Any], tmp_path: pathlib.Path) -> None:
    # 625 steps of 64, every one reported (print_interval 1: a fast machine may run the pass
    # in less than the progress period of 0.25 s).
    config = planted_config(planted, tmp_path, **{"runner.epochs": 2, "runner.test_data_dir": "",
                                                  "runner.train_batch_size": 64,
                                                  "runner.print_interval": 1})
    seen: list[gpubox.StepProgress] = []

    def fail_mid_pass(p: gpubox.StepProgress) -> None:
        seen.append(p)
        raise ValueError(f"stop at step {p.step} of {p.steps}")

    with pytest.raises(ValueError, match="stop at step"):
        gpubox.train(config, on_progress=fail_mid_pass)
    assert len(seen) == 1 and seen[0].pass_id == 0 and seen[0].step < seen[0].steps
    model = tmp_path / "model"
    assert not model.exists() or not any(model.iterdir())  # pass 0 stopped: nothing saved
