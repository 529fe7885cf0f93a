#!/usr/bin/env python3
"""GPUBox from Python in one page: generate a small CTR data set, train, evaluate, predict.

    pip install ./python                  # once (see README)
    python3 examples/quickstart.py [--out quickstart-out] [--lines 20000]

Generates planted-model data with gpubox_data (its planted AUC is the ceiling), trains the
config_gpubox.yaml DNN on it for 3 epochs, evaluates the last save, predicts a few instances
given as a pandas DataFrame (or a dict of columns without pandas), and plots the AUC per pass
when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess

import gpubox

REPO = pathlib.Path(__file__).resolve().parents[1]


def gpubox_data() -> str:
    """The gpubox_data binary: on PATH, else in $GPUBOX_BUILD_DIR/bin or the repo's build/."""
    found = shutil.which("gpubox_data")
    build = pathlib.Path(os.environ.get("GPUBOX_BUILD_DIR", REPO / "build"))
    return found or str(build / "bin" / "gpubox_data")


def generate(out: pathlib.Path, lines: int) -> float:
    """Train and held-out data of one planted model; returns the planted model's AUC."""
    common = ["--seed", "7", "--slots", "8", "--dense", "3", "--vocab", "10000", "--zipf", "2.0",
              "--factor_dim", "1"]
    subprocess.run([gpubox_data(), "gen", "--out", str(out / "train"), "--lines", str(lines),
                    "--files", "4", *common], check=True, capture_output=True)
    subprocess.run([gpubox_data(), "gen", "--out", str(out / "test"), "--lines", "5000",
                    "--first_line", str(lines), *common], check=True, capture_output=True)
    return json.loads((out / "test" / "oracle.json").read_text())["auc"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="quickstart-out", type=pathlib.Path)
    parser.add_argument("--lines", default=20000, type=int)
    args = parser.parse_args()
    print(f"gpubox {gpubox.__version__} ({gpubox.backend} backend)")
    planted_auc = generate(args.out, args.lines)

    config = gpubox.Config.from_yaml(REPO / "configs" / "config_gpubox.yaml", {
        "runner.train_data_dir": args.out / "train",
        "runner.test_data_dir": args.out / "test",
        "runner.model_save_path": args.out / "model",
        "runner.metrics_path": args.out / "metrics.jsonl",
        "runner.epochs": 3,
        "runner.resume": "off",
        "runner.train_batch_size": 256,
        "runner.print_interval": 1000000,
        "hyper_parameters.sparse_inputs_slots": 9,  # 8 slots, plus the label as PaddleRec counts
        "hyper_parameters.dense_input_dim": 3,
        "hyper_parameters.fc_sizes": [128, 64],
    })
    result = gpubox.train(config, on_pass=lambda p: print(f"  pass {p.pass_id}: auc {p.auc:.4f}"))
    last_save = args.out / "model" / str(result.passes[-1].pass_id)
    held_out = gpubox.evaluate(config, last_save)
    print(f"held-out AUC {held_out.metrics.auc:.4f} (the planted model's: {planted_auc:.4f})")

    model = gpubox.load(last_save, config)
    columns = {"1": [1, 2], "2": [10001, 10002], "3": [[20007], [20003, 20001]],
               "dense_feature": [[0.9, 0.6, 0.6], [0.5, 0.1, 0.0]]}  # slots 4-8 left out
    try:
        import pandas

        frame = pandas.DataFrame(columns)
    except ImportError:
        frame = columns
    print("predictions:", model.predict(frame))

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    plt.plot([p.pass_id for p in result.passes], [p.auc for p in result.passes], "o-",
             label="training")
    plt.plot([e.epoch for e in result.epochs], [e.test.auc for e in result.epochs], "s-",
             label="held out")
    plt.axhline(planted_auc, linestyle="--", label="planted model")
    plt.xlabel("pass")
    plt.ylabel("AUC")
    plt.legend()
    plt.savefig(args.out / "auc.png")
    print(f"plot: {args.out / 'auc.png'}")


if __name__ == "__main__":
    main()
