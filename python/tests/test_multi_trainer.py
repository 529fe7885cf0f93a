"""Two trainer processes from Python (Gloo on loopback, one gpubox_server for the saves): the
DataFrame split by trainer, and a stop in one trainer ending every trainer after the same pass."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any, Optional

import pytest
from conftest import BIN, CONFIG, PLANTED_OVERRIDES

TESTS = pathlib.Path(__file__).resolve().parent


class Server:
    """A gpubox_server on a free loopback port, holding saves under `data_dir`, its output in
    `log` (a file, not a pipe: nothing reads a pipe after the listening line, and a server
    logging past the pipe's 64 KiB would block mid-job)."""

    def __init__(self, data_dir: pathlib.Path, log: pathlib.Path) -> None:
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [str(BIN / "gpubox_server"), "--port", "0", "--config", str(CONFIG),
                 "--data_dir", str(data_dir)], stdout=out, stderr=subprocess.STDOUT)
        self.endpoint = ""
        deadline = time.monotonic() + 120
        while not self.endpoint and self.proc.poll() is None and time.monotonic() < deadline:
            for line in log.read_text().splitlines(keepends=True):
                # "... listening on 127.0.0.1:PORT (shard ...", once written whole
                if "listening on " in line and line.endswith("\n"):
                    self.endpoint = line.split("listening on ")[1].split()[0]
            time.sleep(0.01)
        if not self.endpoint:
            self.stop()
        assert self.endpoint, "gpubox_server did not start: " + log.read_text()[-2000:]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def run_job(root: pathlib.Path, name: str, overrides: dict[str, Any], trainers: int = 2,
            frame: Optional[pathlib.Path] = None,
            per_trainer: Optional[dict[int, dict[str, Any]]] = None) -> list[dict[str, Any]]:
    """A job of `trainers` processes of trainer_job.py against a fresh server; returns each
    trainer's result (trainer 0's first)."""
    job_dir = root / name
    job_dir.mkdir()
    server = Server(root, job_dir / "server.log")  # the saves go under root/model
    procs = []
    try:
        for t in range(trainers):
            job = {"overrides": {k: str(v) if isinstance(v, pathlib.Path) else v
                                 for k, v in overrides.items()},
                   "frame": str(frame) if frame else None, "out": str(job_dir / f"out.{t}"),
                   "pid_file": str(job_dir / f"pid.{t}"), **(per_trainer or {}).get(t, {})}
            env = dict(os.environ, FLAGS_selected_gpus="0", PADDLE_TRAINER_ID=str(t),
                       PADDLE_TRAINERS_NUM=str(trainers),
                       GPUBOX_RENDEZVOUS=f"file://{job_dir / 'rendezvous'}",
                       PADDLE_PSERVERS_IP_PORT_LIST=server.endpoint,
                       PYTHONPATH=os.pathsep.join([str(TESTS), *sys.path]))
            log = open(job_dir / f"log.{t}", "w")
            procs.append(subprocess.Popen([sys.executable, str(TESTS / "trainer_job.py"),
                                           json.dumps(job)], env=env, stdout=log,
                                          stderr=subprocess.STDOUT, cwd=job_dir))
        for t, proc in enumerate(procs):
            try:
                proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                pytest.fail(f"trainer {t} of job {name} still runs after 300 s: "
                            + (job_dir / f"log.{t}").read_text()[-3000:])
            assert proc.returncode == 0, (job_dir / f"log.{t}").read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.stop()
    return [json.loads((job_dir / f"out.{t}").read_text()) for t in range(trainers)]


def job_overrides(planted: dict[str, Any], out: pathlib.Path, **more: Any) -> dict[str, Any]:
    overrides = dict(PLANTED_OVERRIDES)
    overrides.update({"runner.train_data_dir": planted["train"], "runner.test_data_dir": "",
                      "runner.model_save_path": out / "model", "runner.metrics_path": "",
                      "runner.save_mode": "base", "runner.resume": "off",
                      "runner.epochs": 2})
    overrides.update(more)
    return overrides


def test_two_trainers_split_a_dataframe_as_its_files(planted: dict[str, Any],
                                                     tmp_path: pathlib.Path) -> None:
    pytest.importorskip("pandas")
    overrides = job_overrides(planted, tmp_path, **{"runner.model_save_path": ""})
    from_files = run_job(tmp_path, "files", overrides)
    from_frame = run_job(tmp_path, "frame", overrides, frame=planted["train"])
    for t in range(2):
        assert from_files[t]["error"] is None and from_frame[t]["error"] is None
        # Each trainer trained its share (the frame's rows split as the files are: 2 of 4
        # files each); the job's metrics count every row of the frame once, exactly as the
        # files' run.
        assert [p["examples"] for p in from_frame[t]["passes"]] == [40000, 40000]
        assert from_frame[t]["passes"] == from_files[t]["passes"]


def test_trainers_given_different_dataframes_are_refused(planted: dict[str, Any],
                                                        tmp_path: pathlib.Path) -> None:
    """Each trainer takes its share of its own data set: given different frames (a shard each,
    as one feeds other engines), rows were trained twice or never, and the job returned."""
    pytest.importorskip("pandas")
    overrides = job_overrides(planted, tmp_path, **{"runner.model_save_path": ""})
    results = run_job(tmp_path, "frames", overrides, frame=planted["train"],
                      per_trainer={1: {"frame": str(planted["test"])}})
    for t in range(2):
        error = results[t]["error"] or ""
        assert "were started with different settings: training data files" in error, error
        assert "40000 rows in memory" in error and "5000 rows in memory" in error, error
        assert results[t]["passes"] == []


def test_a_stop_in_one_trainer_ends_every_trainer_after_the_same_pass(
        planted: dict[str, Any], tmp_path: pathlib.Path) -> None:
    overrides = job_overrides(planted, tmp_path, **{"runner.epochs": 3,
                                                    "runner.train_batch_size": 64,
                                                    "runner.print_interval": 1})
    # Trainer 1 is interrupted (Ctrl-C) in the middle of pass 1 (every step reported: on a
    # fast machine the first timed report may come late in the pass).
    results = run_job(tmp_path, "sigint", overrides, per_trainer={
        0: {"interrupt": {"pid_file": str(tmp_path / "sigint" / "pid.1"), "pass": 1,
                          "step": 5}}})
    assert results[0]["sent"], "trainer 0 did not reach pass 1"
    assert results[1]["error"] == "KeyboardInterrupt: "
    assert results[0]["error"] is None  # stopped as asked: it returns the passes it trained
    assert [p["pass"] for p in results[0]["passes"]] == [0]
    assert [p["pass"] for p in results[1]["passes"]] == [0]
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["0"]
    assert (tmp_path / "model" / "0" / "MODEL_MANIFEST").is_file()


def test_a_callback_raising_in_one_trainer_ends_every_trainer_after_that_pass(
        planted: dict[str, Any], tmp_path: pathlib.Path) -> None:
    overrides = job_overrides(planted, tmp_path, **{"runner.epochs": 3})
    results = run_job(tmp_path, "raise", overrides, per_trainer={1: {"raise_on_pass": 0}})
    assert results[1]["error"] == "ValueError: on_pass raised at pass 0"
    assert results[0]["error"] is None
    # Trainer 0 went on into pass 1, where trainer 1's stop vote ended it after a step, unsaved.
    assert [p["pass"] for p in results[0]["passes"]] == [0]
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["0"]
    assert (tmp_path / "model" / "0" / "MODEL_MANIFEST").is_file()


@pytest.mark.parametrize("mode", ["async", "sync", "geo"])
@pytest.mark.parametrize("trainers", [1, 2])
def test_ctrl_c_stops_a_ps_mode_pass_between_steps(planted: dict[str, Any],
                                                   tmp_path: pathlib.Path, mode: str,
                                                   trainers: int) -> None:
    overrides = job_overrides(planted, tmp_path, **{"runner.epochs": 3,
                                                    "runner.sync_mode": mode,
                                                    "runner.train_batch_size": 64,
                                                    "runner.print_interval": 1})
    # At step 5 of pass 1, trainer 0's progress callback (PS modes report their steps through
    # the same progress sink, on trainer 0 only) sends Ctrl-C to the last trainer in sync mode:
    # its step barrier keeps that trainer within a step of trainer 0, so the signal lands in
    # that step, and the other trainers, trainer 0 among them, stop in the same pass on its
    # vote. In async and geo trainer 0 interrupts itself: they keep no step barrier, and
    # trainer 1 runs ahead while trainer 0 saves pass 0, so a signal sent to it could land
    # after it had taken all of pass 1's steps; its stop then rode on pass 2, as designed, and
    # trainer 0 trained pass 1 whole (seen at load 8).
    signalled = trainers - 1 if mode == "sync" else 0
    results = run_job(tmp_path, "ps", overrides, trainers=trainers, per_trainer={
        0: {"interrupt": {"pid_file": str(tmp_path / "ps" / f"pid.{signalled}"), "pass": 1,
                          "step": 5}}})
    assert results[0]["sent"], "trainer 0 did not report step 5 of pass 1"
    assert results[signalled]["error"] == "KeyboardInterrupt: "
    for t in range(trainers):
        assert [p["pass"] for p in results[t]["passes"]] == [0], results[t]
        if t != signalled:
            assert results[t]["error"] is None  # stopped as asked: it returns its passes
    # The signalled trainer stopped a few steps after the signal (sent after trainer 0's step
    # `sent` of the pass's 625 / trainers), unsaved; pass 0's save is complete: a resume
    # trains pass 1 again from it.
    log = (tmp_path / "ps" / f"log.{signalled}").read_text()
    assert "stopped in pass 1 after step " in log, log[-2000:]
    steps_done = int(log.split("stopped in pass 1 after step ")[1].split()[0])
    sent = results[0]["sent"][0]
    assert steps_done < sent + 2 * 16 < 625 // trainers, (steps_done, sent)
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["0"]
    assert (tmp_path / "model" / "0" / "MODEL_MANIFEST").is_file()
    resumed = run_job(tmp_path, "resumed", {**overrides, "runner.resume": "auto"},
                      trainers=trainers)
    for t in range(trainers):
        assert resumed[t]["error"] is None
        assert [p["pass"] for p in resumed[t]["passes"]] == [1, 2]


def test_ctrl_c_stops_a_ps_modes_test_data_read(planted: dict[str, Any],
                                                tmp_path: pathlib.Path) -> None:
    from test_stop_reads import slow_pipe_marking

    started = tmp_path / "read_started"
    overrides = job_overrides(planted, tmp_path, **{
        "runner.sync_mode": "async", "runner.pipe_command": slow_pipe_marking(started),
        "runner.train_data_dir": planted["test"], "runner.test_data_dir": planted["train"]})
    # Ctrl-C 0.3 s after the first read begun after pass 0's save (on_pass): its epoch's test
    # data (>= 4 s).
    (result,) = run_job(tmp_path, "ps", overrides, trainers=1, per_trainer={
        0: {"interrupt_after_pass": {"pass": 0, "after_s": 0.3, "reads_file": str(started)}}})
    assert result["error"] == "KeyboardInterrupt: "
    assert result["sent"] and result["returned"] - result["sent"][0] < 1.5, result
    assert "reading the evaluation data stopped as asked" in (tmp_path / "ps" / "log.0").read_text()
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["0"]
    assert (tmp_path / "model" / "0" / "MODEL_MANIFEST").is_file()
