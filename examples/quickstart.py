#!/usr/bin/env python3
"""GPUBox from Python in one page: a small CTR DataFrame, train, evaluate, predict.

    pip install ./python                  # once (docs/python.md)
    python3 examples/quickstart.py [--out quickstart-out] [--rows 20000]

Makes a DataFrame of clicks from a planted logistic model over 8 sparse slots (Zipf-popular ids)
and 3 dense features, trains the config_gpubox.yaml DNN on it for 3 epochs (no data files: the
rows go to the engine's InMemoryDataset), evaluates held-out rows, predicts a few, and plots
the AUC per pass when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np
import pandas as pd

import gpubox

REPO = pathlib.Path(__file__).resolve().parents[1]
SLOTS = [str(s) for s in range(1, 9)]


def ctr_frame(rows: int, seed: int, weights: np.random.Generator) -> pd.DataFrame:
    """Rows of a planted model: one Zipf-drawn id per slot, 3 dense values, a click drawn from
    the logistic of the ids' planted weights (the same `weights` stream gives the same model)."""
    rng = np.random.default_rng(seed)
    planted = weights.normal(0, 1, size=(len(SLOTS), 1000))
    frame = {}
    logit = np.full(rows, -1.2)
    for s, slot in enumerate(SLOTS):
        ids = np.minimum(rng.zipf(1.5, rows), 1000) - 1
        frame[slot] = ids + 1 + s * 1000  # ids of different slots are different keys
        logit += planted[s, ids]
    dense = rng.random((rows, 3), dtype=np.float32)
    logit += 2 * (dense[:, 0] - 0.5)
    frame["dense_feature"] = list(dense)
    frame["click"] = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return pd.DataFrame(frame)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="quickstart-out", type=pathlib.Path)
    parser.add_argument("--rows", default=20000, type=int)
    args = parser.parse_args()
    print(f"gpubox {gpubox.__version__} ({gpubox.backend} backend)")
    train_df = ctr_frame(args.rows, 1, np.random.default_rng(7))
    test_df = ctr_frame(5000, 2, np.random.default_rng(7))  # held out, same planted model

    config = gpubox.Config.from_yaml(REPO / "configs" / "config_gpubox.yaml", {
        "runner.model_save_path": args.out / "model",
        "runner.metrics_path": args.out / "metrics.jsonl",
        "runner.epochs": 3,
        "runner.resume": "off",
        "runner.train_batch_size": 256,
        "hyper_parameters.sparse_inputs_slots": len(SLOTS) + 1,  # PaddleRec counts the label
        "hyper_parameters.dense_input_dim": 3,
        "hyper_parameters.fc_sizes": [128, 64],
    })
    train_data = gpubox.Dataset.from_frame(train_df, config)
    test_data = gpubox.Dataset.from_frame(test_df, config)
    result = gpubox.train(config, on_pass=lambda p: print(f"  pass {p.pass_id}: auc {p.auc:.4f}"),
                          train_data=train_data, test_data=test_data)
    last_save = args.out / "model" / str(result.passes[-1].pass_id)
    held_out = gpubox.evaluate(config, last_save, test_data)
    print(f"held-out AUC {held_out.metrics.auc:.4f}")

    model = gpubox.load(last_save, config)
    print("predictions:", model.predict(test_df.head(5)))

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
    plt.xlabel("pass")
    plt.ylabel("AUC")
    plt.legend()
    plt.savefig(args.out / "auc.png")
    print(f"plot: {args.out / 'auc.png'}")


if __name__ == "__main__":
    main()
