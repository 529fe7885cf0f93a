#!/usr/bin/env python3
"""PaddlePaddle running a PaddleRec model folder as PaddleRec's own dygraph trainer
(tools/trainer.py) does: its config.yaml unchanged, its DygraphModel (create_model,
create_optimizer, train_forward), its reader (runner.train_reader_path) over the folder's data,
batch runner.train_batch_size, no shuffle; loss.backward(), optimizer.step() per batch. Prints
every step's loss, and per epoch what GPUBox's divergence check judges (trainer/schedule/
divergence.hpp): the mean loss over the steps after the first runner.print_interval, the
instances and positives of those steps, the constant predictor's logloss on them (the entropy of
their click rate) and the ratio of the two.

  python3 paddle_dygraph_steps.py --model_dir PADDLEREC/models/rank/fat_deepffm [--config
          config.yaml] [--seed 0] [--epochs E] [--json OUT.json]

The table: the model's sparse_feature_number rows (fat_deepffm's 1,000,001 x 390 floats, and
Adam's two moments as many) are more than the sample touches; the keys are renumbered 1..U in
order of first appearance (0 stays 0) and the table made U + 1 rows. Same model in distribution:
a row's initial values are independent draws of the same initializer, rows no key reads never
change a prediction, and non-lazy Adam moves a row only after a gradient reached it.
Paddle's log_loss adds epsilon 1e-4 inside its logs (a wrong prediction costs at most 9.2),
GPUBox clips predictions to [1e-7, 1 - 1e-7] (at most 16.1): steady_loss_gpubox_clip is the
same predictions' logloss GPUBox's way, the figure to compare with GPUBox's ne_after_warmup.
"""
import argparse
import importlib
import json
import math
import os
import sys

import numpy as np
import paddle

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_paddle_zoo import Config, flat_config  # noqa: E402  (PaddleRec's config, flattened)


def read_batches(model_dir, config):
    """The reader's instances in file order, keys renumbered (see the module comment)."""
    reader = importlib.import_module(config["runner.train_reader_path"])
    data_dir = os.path.join(model_dir, config["runner.train_data_dir"])
    files = sorted(os.path.join(data_dir, f) for f in os.listdir(data_dir))
    keys = {0: 0}
    rows = []
    for out in reader.RecDataset(files, config):
        sparse = [a.copy() for a in out[:-1]]
        for a in sparse[1:]:  # sparse[0] is the label
            for i, k in enumerate(a):
                a[i] = keys.setdefault(int(k), len(keys))
        rows.append(sparse + [out[-1]])
    return rows, len(keys)


def entropy(ctr):
    if ctr <= 0 or ctr >= 1:
        return float("nan")
    return -(ctr * math.log(ctr) + (1 - ctr) * math.log(1 - ctr))


def gpubox_logloss(p, y):
    p = min(max(p, 1e-7), 1 - 1e-7)
    return -math.log(p) if y else -math.log(1 - p)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model_dir", required=True)
    ap.add_argument("--config", default="config.yaml")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=0, help="0: the config's runner.epochs")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    model_dir = os.path.abspath(args.model_dir)
    config = Config(flat_config(os.path.join(model_dir, args.config)))
    sys.path.insert(0, model_dir)
    rows, table_rows = read_batches(model_dir, config)
    config["hyper_parameters.sparse_feature_number"] = table_rows
    batch = int(config["runner.train_batch_size"])
    warmup = int(config.get("runner.print_interval", 10))
    epochs = args.epochs or int(config.get("runner.epochs", 1))

    paddle.set_device("cpu")
    paddle.seed(args.seed)
    np.random.seed(args.seed)
    dygraph_model = importlib.import_module("dygraph_model").DygraphModel()
    model = dygraph_model.create_model(config)
    optimizer = dygraph_model.create_optimizer(model, config)
    metrics, _ = dygraph_model.create_metrics()
    result = {"model_dir": model_dir, "config": args.config, "seed": args.seed, "batch": batch,
              "table_rows": table_rows, "paddle_version": paddle.__version__, "epochs": []}
    for epoch in range(epochs):
        model.train()
        for m in metrics:
            m.reset()
        losses, clipped, labels = [], [], []
        for step, start in enumerate(range(0, len(rows) - batch + 1, batch)):  # drop_last
            part = rows[start:start + batch]
            batch_data = [paddle.to_tensor(np.stack([r[c] for r in part]))
                          for c in range(len(part[0]))]
            # train_forward's steps, keeping the predictions (it returns only the loss).
            label, sparse, dense = dygraph_model.create_feeds(batch_data, config)
            pred = model.forward(sparse, dense)
            loss = dygraph_model.create_loss(pred, label)
            # A two-class net (dlrm's: logits, softmax cross-entropy) predicts class 1's softmax.
            prob = paddle.nn.functional.softmax(pred)[:, 1:2] if pred.shape[-1] == 2 else pred
            metrics[0].update(preds=paddle.concat(x=[1 - prob, prob], axis=1).numpy(),
                              labels=label.numpy())
            y = [int(v) for v in label.numpy().ravel()]
            p = [float(v) for v in prob.numpy().ravel()]
            loss_v = float(loss.numpy())
            clipped.append(float(np.mean([gpubox_logloss(a, b) for a, b in zip(p, y)])))
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
            losses.append(loss_v)
            labels.append(sum(y) / len(y))
            print("epoch %d step %d: label %s prediction %s loss %.6f" % (
                epoch, step, y if batch > 1 else y[0], p if batch > 1 else "%.6g" % p[0],
                loss_v), flush=True)
        judged = losses[warmup:]
        judged_ctr = float(np.mean(labels[warmup:])) if judged else float("nan")
        steady = float(np.mean(judged)) if judged else float("nan")
        row = {"epoch": epoch, "steps": len(losses), "mean_loss": float(np.mean(losses)),
               "judged_steps": len(judged), "judged_instances": len(judged) * batch,
               "judged_positives": round(judged_ctr * len(judged) * batch),
               "steady_loss": steady, "constant_loss": entropy(judged_ctr),
               "ratio": steady / entropy(judged_ctr),
               "auc": float(metrics[0].accumulate())}
        if judged:
            row["steady_loss_gpubox_clip"] = float(np.mean(clipped[warmup:]))
            row["ratio_gpubox_clip"] = row["steady_loss_gpubox_clip"] / entropy(judged_ctr)
        result["epochs"].append(row)
        print("epoch %d: %s" % (epoch, json.dumps(row)), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
