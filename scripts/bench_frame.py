#!/usr/bin/env python3
"""gpubox.train from a pandas DataFrame against gpubox_train on the same rows in files, one run
(issue 33's measure), and the DataFrame -> data set conversion against the engine reading the
same rows from text.

  python3 scripts/bench_frame.py [--lines N] [--epochs E] [--bin build/bin] [--work DIR]

Needs the gpubox package importable (pip install ./python, or GPUBOX_BUILD_DIR=build pip
install ./python into a venv). Generates N lines (gpubox_data gen: 26 slots x 1 key, 13 dense),
reads them into a DataFrame (one column per slot, the dense values as one list column, the
label), then:
  - conversion: gpubox.Dataset.from_frame's seconds against gpubox.data.stat's (the engine
    loading the same file as training does: parse, dedup, count), as rows/s each;
  - training: the same config (configs/config_gpubox.yaml, 2 simulated cards, no shuffle, no
    save) run by gpubox_train on the files and by gpubox.train on the DataFrame's Dataset, the
    last pass's examples/s of each (earlier passes warm up).
Not part of the tests; prints a markdown table and the load average before each run.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pandas as pd

import gpubox

REPO = pathlib.Path(__file__).resolve().parents[1]


def load_avg() -> str:
    return " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])


def frame_of(path: pathlib.Path, slots: int) -> pd.DataFrame:
    """The generated slot text as columns: "1" .. "<slots>" (one id a row: gen writes one key per
    slot), dense_feature (a list a row), click."""
    ids = {str(s): [] for s in range(1, slots + 1)}
    dense, click = [], []
    for line in path.read_text().splitlines():
        row = []
        for token in line.split():
            name, _, value = token.partition(":")
            if name == "click":
                click.append(float(value))
            elif name == "dense_feature":
                row.append(float(value))
            else:
                ids[name].append(int(value))
        dense.append(np.asarray(row, dtype=np.float32))
    frame = {name: np.asarray(v, dtype=np.uint64) for name, v in ids.items()}
    frame["dense_feature"] = dense
    frame["click"] = np.asarray(click, dtype=np.float32)
    return pd.DataFrame(frame)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=200000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--bin", default=str(REPO / "build" / "bin"))
    ap.add_argument("--work", default="/tmp/gpubox-bench-frame")
    a = ap.parse_args()
    if a.lines <= 0 or a.epochs <= 0:
        sys.exit("bench_frame: --lines and --epochs must be positive")
    work = pathlib.Path(a.work)
    train = work / "train"
    if not (train / "part-00000").exists():
        subprocess.run([f"{a.bin}/gpubox_data", "gen", "--out", str(train), "--lines",
                        str(a.lines), "--files", "1", "--seed", "1"], check=True,
                       stdout=subprocess.DEVNULL)
    keys = [f"runner.train_data_dir={train}", f"runner.epochs={a.epochs}", "runner.shuffle=false",
            "runner.save_mode=none", "runner.model_save_path=", "runner.test_data_dir="]
    os.environ["FLAGS_selected_gpus"] = "0,1"
    config = gpubox.Config.from_yaml(str(REPO / "configs" / "config_gpubox.yaml"),
                                     dict(k.split("=", 1) for k in keys) |
                                     {"runner.metrics_path": str(work / "py.jsonl")})

    t0 = time.perf_counter()
    df = frame_of(train / "part-00000", 26)
    parse_s = time.perf_counter() - t0
    rows = len(df)
    load_conv = load_avg()
    t0 = time.perf_counter()
    data = gpubox.Dataset.from_frame(df, config)
    frame_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    stat = gpubox.data.stat(config)
    text_s = time.perf_counter() - t0
    text_mb = stat.get("bytes", 0) / 1e6

    load_bin = load_avg()
    metrics = work / "bin.jsonl"
    metrics.unlink(missing_ok=True)
    subprocess.run([f"{a.bin}/gpubox_train", "--config",
                    str(REPO / "configs" / "config_gpubox.yaml")] + [x for k in keys for x in ("-o", k)] +
                   ["-o", f"runner.metrics_path={metrics}"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    passes = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    bin_ips = passes[-1]["examples"] / passes[-1]["seconds"]

    load_py = load_avg()
    result = gpubox.train(config, train_data=data, progress=False)
    py_ips = result.passes[-1].ips

    print(f"rows: {rows} (gpubox_data gen, 26 slots x 1 key, 13 dense); "
          f"text to DataFrame in Python (not the engine's): {parse_s:.2f} s")
    print()
    print("| what | rows/s or examples/s | against | ratio | load average |")
    print("|---|---:|---|---:|---|")
    print(f"| Dataset.from_frame (DataFrame -> engine) | {rows / frame_s:,.0f} rows/s | the engine "
          f"reading the same rows from text (gpubox.data.stat, {text_mb:.1f} MB): "
          f"{rows / text_s:,.0f} rows/s | {text_s / frame_s:.2f}x | {load_conv} |")
    print(f"| gpubox.train from the DataFrame, pass {len(result.passes) - 1} | {py_ips:,.0f} "
          f"examples/s | gpubox_train on the files, same pass: {bin_ips:,.0f} examples/s | "
          f"{py_ips / bin_ips:.3f} | {load_bin} / {load_py} |")


if __name__ == "__main__":
    main()
