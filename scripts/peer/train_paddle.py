#!/usr/bin/env python3
"""PaddlePaddle peer of GPUBox's configs/config_gpubox.yaml DNN, on Paddle's own static-graph path:
InMemoryDataset (MultiSlot feed through a pipe_command) + Executor.train_from_dataset.

  python3 train_paddle.py --train_dir D [--test_dir T] --threads N --epochs E --batch 512
                          --table_rows R --json OUT.json

Model (as GPUBox's dnn): 26 sparse slots pooled by sum from ONE shared table of width 9
(GPUBox: 1 embed_w + 8 embedx per key), concatenated with the 13 dense features (247 inputs),
fc 512-256-128-32 ReLU, a 1-wide logit, sigmoid log loss. Dense
parameters: N(0, 1/in) weights, zero biases (GPUBox's init), Adam lr 0.001 b1 0.9 b2 0.999 eps 1e-8.
Loss: summed over the batch (reduction="sum") for the backward pass;
dense gradients divided by the batch size (= mean-loss gradients, GPUBox's dense scale), sparse
gradients left per instance (GPUBox pushes each occurrence's own instance gradient).
Sparse table: Paddle Adagrad on sparse (SelectedRows) gradients with lr = 0.05*sqrt(3) and
initial accumulator 3.0, i.e. the step lr*sqrt(3/(3+G)) of GPUBox's adagrad (lr 0.05,
initial_g2sum 3, G from 0) except that Paddle's G is per float and includes the current gradient,
GPUBox's G is the mean over the row part and excludes it, and that a key's gradient here is the
SUM over its occurrences in the batch where GPUBox (Paddle's PS rule) takes their MEAN. Table
initialised as GPUBox's rows: column 0 (embed_w) 0, the 8 others U(-1e-4, 1e-4). Differences
that remain are listed in the report of scripts/bench_peer_paddle.sh.
Per epoch: the wall time of train_from_dataset alone (data already in memory), the examples, and
the AUC of the predictions made while training (Paddle's auc op state, reset each epoch), plus
the held-out AUC (infer_from_dataset) when --test_dir is given.
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import numpy as np
import paddle

HERE = os.path.dirname(os.path.abspath(__file__))


def auc_from_stats(pos, neg):
    """Area under ROC from Paddle's auc-op bucket histograms (positives/negatives by score bucket)."""
    pos = np.asarray(pos, dtype=np.float64).ravel()
    neg = np.asarray(neg, dtype=np.float64).ravel()
    pos, neg = pos[::-1], neg[::-1]  # from the highest score bucket down
    cum_pos = np.cumsum(pos)
    cum_neg = np.cumsum(neg)
    tot_pos, tot_neg = cum_pos[-1], cum_neg[-1]
    if tot_pos == 0 or tot_neg == 0:
        return float("nan")
    prev_pos = cum_pos - pos
    area = np.sum(neg * (prev_pos + cum_pos) / 2.0)
    return float(area / (tot_pos * tot_neg))


def build(args):
    init_normal = paddle.nn.initializer.Normal
    label = paddle.static.data(name="click", shape=[-1, 1], dtype="int64")
    dense = paddle.static.data(name="dense_feature", shape=[-1, args.dense], dtype="float32")
    sparse = [paddle.static.data(name=str(s), shape=[-1, 1], dtype="int64", lod_level=1)
              for s in range(1, args.slots + 1)]
    emb_attr = paddle.ParamAttr(
        name="SparseFeatFactors",
        initializer=paddle.nn.initializer.Uniform(-args.emb_init_range, args.emb_init_range))
    pooled = []
    for var in sparse:
        emb = paddle.static.nn.embedding(input=var, size=[args.table_rows, args.emb_dim],
                                         is_sparse=True, param_attr=emb_attr)
        # lookup_table_v2 gives [keys, 1, dim] carrying the slot's LoD; sum-pool per instance.
        pool = paddle.static.nn.sequence_lod.sequence_pool(input=emb, pool_type="sum")
        pooled.append(paddle.reshape(pool, [-1, args.emb_dim]))
    x = paddle.concat(pooled + [dense], axis=1)
    in_dim = args.slots * args.emb_dim + args.dense
    sizes = [int(s) for s in args.fc_sizes.split(",")] + [1]
    for i, out in enumerate(sizes):
        x = paddle.static.nn.fc(
            x, size=out, activation=("relu" if i + 1 < len(sizes) else None),
            weight_attr=paddle.ParamAttr(name="fc%d.w" % i,
                                         initializer=init_normal(0.0, 1.0 / math.sqrt(in_dim))),
            bias_attr=paddle.ParamAttr(name="fc%d.b" % i,
                                       initializer=paddle.nn.initializer.Constant(0.0)))
        in_dim = out
    logit = x
    labelf = paddle.cast(label, "float32")
    # Summed over the batch (reduction="sum"; the function's default is the batch MEAN, which
    # divided every gradient by the batch size: the sparse steps came out 512 times too small and
    # the dense gradients, divided by the batch size once more below, fell under Adam's
    # epsilon), so the sparse gradients are each instance's own gradient, the scale GPUBox
    # pushes to its per-key optimizer; the dense gradients are divided by the batch size after
    # the backward pass (main()), i.e. they are those of the mean loss, as in GPUBox.
    loss = paddle.nn.functional.binary_cross_entropy_with_logits(logit, labelf, reduction="sum")
    prob = paddle.nn.functional.sigmoid(logit)
    prob2 = paddle.concat([1.0 - prob, prob], axis=1)
    _, _, auc_states = paddle.static.auc(input=prob2, label=label, num_thresholds=2**20 - 1,
                                         slide_steps=0)
    batch_size = paddle.cast(paddle.shape(label)[0], "float32")
    return [label, dense] + sparse, loss, batch_size, auc_states


def train_epoch(exe, scope, main_prog, test_prog, train_ds, test_ds, threads, epoch, n_train,
                reset_auc, read_auc):
    """One timed train_from_dataset over train_ds (the AUC of its predictions from the program's
    auc state, reset first), then the held-out AUC over test_ds when given: the epoch's row."""
    reset_auc()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.time()
    exe.train_from_dataset(program=main_prog, dataset=train_ds, scope=scope, thread=threads,
                           debug=False)
    secs = time.time() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    auc, counted = read_auc()
    row = {"epoch": epoch, "train_seconds": secs, "examples": n_train, "ips": n_train / secs,
           "cpu_seconds": (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime),
           "auc": auc, "auc_counted": counted}
    if test_ds is not None:
        reset_auc()
        exe.infer_from_dataset(program=test_prog, dataset=test_ds, scope=scope, thread=threads,
                               debug=False)
        row["test_auc"], row["test_counted"] = read_auc()
    return row


def make_dataset(args, use_vars, files):
    ds = paddle.distributed.InMemoryDataset()
    pipe = "%s %s --slots %d --dense %d --table_rows %d" % (
        sys.executable, os.path.join(HERE, "slot_to_multislot.py"), args.slots, args.dense,
        args.table_rows)
    ds.init(batch_size=args.batch, thread_num=args.threads, use_var=use_vars, pipe_command=pipe)
    ds.set_filelist(files)
    t0 = time.time()
    ds.load_into_memory()
    return ds, time.time() - t0


def files_of(d):
    fs = sorted(os.path.join(d, f) for f in os.listdir(d) if f.startswith("part-"))
    if not fs:
        sys.exit("train_paddle: no part-* files in %s" % d)
    return fs


def main():
    ap = argparse.ArgumentParser(description="PaddlePaddle peer of GPUBox's DNN")
    ap.add_argument("--train_dir", required=True)
    ap.add_argument("--test_dir", default="")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--slots", type=int, default=26)
    ap.add_argument("--dense", type=int, default=13)
    ap.add_argument("--emb_dim", type=int, default=9)
    ap.add_argument("--fc_sizes", default="512,256,128,32")
    ap.add_argument("--table_rows", type=int, required=True)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--sparse_lr", type=float, default=0.05 * math.sqrt(3.0))
    ap.add_argument("--sparse_init_g2sum", type=float, default=3.0)
    ap.add_argument("--emb_init_range", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    for name in ("threads", "epochs", "batch", "table_rows"):
        if getattr(args, name) <= 0:
            sys.exit("train_paddle: --%s must be positive, got %d" % (name, getattr(args, name)))

    paddle.enable_static()
    paddle.seed(args.seed)
    main_prog, startup = paddle.static.Program(), paddle.static.Program()
    main_prog.random_seed = startup.random_seed = args.seed + 1
    with paddle.static.program_guard(main_prog, startup):
        use_vars, loss, batch_size, auc_states = build(args)
        test_prog = main_prog.clone(for_test=True)
        params_grads = paddle.static.append_backward(loss)
        sparse_pg = [(p, g) for p, g in params_grads if p.name == "SparseFeatFactors"]
        dense_pg = [(p, paddle.divide(g, batch_size)) for p, g in params_grads
                    if p.name != "SparseFeatFactors"]
        paddle.optimizer.Adagrad(
            learning_rate=args.sparse_lr, epsilon=1e-8,
            initial_accumulator_value=args.sparse_init_g2sum).apply_gradients(sparse_pg)
        paddle.optimizer.Adam(learning_rate=args.lr, beta1=0.9, beta2=0.999,
                              epsilon=1e-8).apply_gradients(dense_pg)

    place = paddle.CPUPlace()
    exe = paddle.static.Executor(place)
    exe.run(startup)
    scope = paddle.static.global_scope()
    table = scope.find_var("SparseFeatFactors").get_tensor()
    init = np.array(table)
    init[:, 0] = 0.0  # embed_w starts at 0 (GPUBox: initial_range 0)
    table.set(init, place)
    del init

    def reset_auc():
        for v in auc_states:
            t = scope.find_var(v.name).get_tensor()
            t.set(np.zeros(np.array(t).shape, dtype=np.array(t).dtype), place)

    def read_auc():
        pos = np.array(scope.find_var(auc_states[0].name).get_tensor())
        neg = np.array(scope.find_var(auc_states[1].name).get_tensor())
        return auc_from_stats(pos, neg), int(pos.sum() + neg.sum())

    train_ds, load_s = make_dataset(args, use_vars, files_of(args.train_dir))
    n_train = int(train_ds.get_memory_data_size())
    print("paddle: loaded %d train instances in %.2f s (%d threads)" % (n_train, load_s, args.threads),
          flush=True)
    test_ds = None
    if args.test_dir:
        test_ds, _ = make_dataset(args, use_vars, files_of(args.test_dir))

    result = {"system": "paddle", "paddle_version": paddle.__version__, "threads": args.threads,
              "batch": args.batch, "table_rows": args.table_rows, "train_instances": n_train,
              "load_seconds": load_s, "epochs": []}
    for epoch in range(1, args.epochs + 1):
        row = train_epoch(exe, scope, main_prog, test_prog, train_ds, test_ds, args.threads,
                          epoch, n_train, reset_auc, read_auc)
        secs, cpu, auc = row["train_seconds"], row["cpu_seconds"], row["auc"]
        result["epochs"].append(row)
        print("paddle epoch: %d, train_seconds: %.3f, cpu_seconds: %.3f, ips: %.1f example/sec, "
              "auc: %.6f%s" % (epoch, secs, cpu, row["ips"], auc,
            (", test auc: %.6f" % row["test_auc"]) if "test_auc" in row else ""), flush=True)
    train_ds.release_memory()
    if test_ds is not None:
        test_ds.release_memory()
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
