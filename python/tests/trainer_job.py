"""One trainer process of a multi-trainer job (test_multi_trainer.py starts several).

argv[1] is a JSON object: "overrides" (the config's), "frame" (a data folder whose files,
concatenated in order, become the DataFrame trained instead of runner.train_data_dir; null:
the files), "raise_on_pass" (this trainer's on_pass raises ValueError at that pass),
"pid_file" (where this process writes its id), "interrupt" ({"pid_file", "pass", "step"}:
trainer 0's progress callback sends SIGINT, as Ctrl-C, to the process of that id once that
step of that pass is done), "interrupt_after_pass" ({"pass", "after_s", "reads_file"}: this
trainer sends itself SIGINT that many seconds after the first read through
test_stop_reads.slow_pipe_marking(reads_file) that begins after that pass's on_pass) and "out"
(where the result goes: JSON with the passes' metrics and the exception raised, if any). The process environment says which trainer it is (PADDLE_*).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys
import time
import traceback
from typing import Any

from conftest import CONFIG, read_slot_text
from test_stop_reads import Interrupter, reads_begun

import gpubox


def frame_of(folder: pathlib.Path) -> Any:
    import pandas

    parts = sorted(p for p in folder.iterdir() if p.name.startswith("part-"))
    return pandas.concat([pandas.DataFrame(read_slot_text(p)) for p in parts],
                         ignore_index=True)


def main() -> None:
    job = json.loads(sys.argv[1])
    config = gpubox.Config.from_yaml(CONFIG, job["overrides"])
    data = None
    if job.get("frame"):
        data = gpubox.Dataset.from_frame(frame_of(pathlib.Path(job["frame"])), config)
    passes: list[dict[str, Any]] = []
    sent: list[float] = []  # the step (interrupt) or the time (interrupt_after_pass) it was sent
    interrupters: list[Interrupter] = []
    if job.get("pid_file"):
        pathlib.Path(job["pid_file"]).write_text(str(os.getpid()))

    def on_pass(p: gpubox.PassMetrics) -> None:
        passes.append({"pass": p.pass_id, "examples": p.metrics.examples, "auc": p.auc,
                       "logloss": p.logloss})
        after = job.get("interrupt_after_pass")
        if after and after["pass"] == p.pass_id:
            # Timed from the next read's start, not from here: a loaded machine may take longer
            # than after_s to reach it.
            started = pathlib.Path(after["reads_file"])
            interrupters.append(Interrupter(after["after_s"], started,
                                            reads=reads_begun(started) + 1))
        if job.get("raise_on_pass") == p.pass_id:
            raise ValueError(f"on_pass raised at pass {p.pass_id}")

    def on_progress(p: gpubox.StepProgress) -> None:
        stop = job.get("interrupt")
        if stop and not sent and p.pass_id == stop["pass"] and p.step >= stop["step"]:
            sent.append(p.step)
            os.kill(int(pathlib.Path(stop["pid_file"]).read_text()), signal.SIGINT)

    error = None
    try:
        gpubox.train(config, on_pass, train_data=data, progress=False, threads_per_card=1,
                     on_progress=on_progress if job.get("interrupt") else None)
    except BaseException as e:  # noqa: B902 (KeyboardInterrupt is an outcome here)
        error = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    returned = time.monotonic()
    for interrupter in interrupters:
        interrupter.stop()
        sent.extend(interrupter.sent)
    pathlib.Path(job["out"]).write_text(json.dumps({"passes": passes, "error": error, "sent": sent,
                                                    "returned": returned}))


if __name__ == "__main__":
    main()
