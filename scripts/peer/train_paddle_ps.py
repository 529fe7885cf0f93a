#!/usr/bin/env python3
"""PaddlePaddle's own CPU ParameterServer mode on the DNN of train_paddle.py (the peer of GPUBox's
configs/config_ps.yaml), run as PaddleRec's tools/static_ps_trainer.py runs it: one process per
role under `python -m paddle.distributed.launch --server_num S --worker_num W` (fleetrun), the
role from the launcher's environment (fleet.init()), fleet.DistributedStrategy a_sync = True
(async), False (sync: the workers' pushes merged per step on the servers), plus a_sync_configs
k_steps = K for geo, the sparse table a fleet sparse_embedding
(MemorySparseTable on the servers, rows created on first pull), InMemoryDataset +
Executor.train_from_dataset on each worker with its block of the files (fleet.util.get_file_shard).

  python -m paddle.distributed.launch --server_num 1 --worker_num 2 --log_dir LOG \\
      train_paddle_ps.py --mode async|sync|geo [--geo_step K] --train_dir D [--test_dir T] \\
      --threads N --epochs E --batch 512 --json_prefix OUT

Model: 26 sparse slots sum-pooled from ONE table of width 9, 13 dense features, fc
512-256-128-32 ReLU, a 1-wide logit, sigmoid log loss (mean over the batch, PaddleRec's dnn);
dense Adam lr 0.001 (on the servers in async and sync, local with deltas pushed every K steps in geo);
the sparse rule is Paddle's default for a_sync sparse tables (the strategy's
sparse_table_configs: CtrCommonAccessor with its adagrad rule). Each worker writes
OUT.worker<i>.json: per epoch its examples and the wall time of train_from_dataset alone (data
in memory), and on worker 0 the held-out AUC of the servers' model after the epoch (a forward
program pruned to the auc op: pulls, no pushes). The socket bytes of each worker during
train_from_dataset (rchar + wchar of /proc/self/io; brpc reads and writes its sockets with
readv/writev, counted there, and nothing else does I/O while the data set is in memory) are
recorded as the bytes on the wire.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import paddle
import paddle.distributed.fleet as fleet

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# The single-process peer's AUC, data set (MultiSlot through slot_to_multislot.py) and file list.
from train_paddle import auc_from_stats, files_of, make_dataset  # noqa: E402


def io_bytes():
    with open("/proc/self/io") as f:
        v = dict(line.split(":") for line in f.read().strip().splitlines())
    return int(v["rchar"]) + int(v["wchar"])


def build(args):
    label = paddle.static.data(name="click", shape=[-1, 1], dtype="int64")
    dense = paddle.static.data(name="dense_feature", shape=[-1, args.dense], dtype="float32")
    sparse = [paddle.static.data(name=str(s), shape=[-1, 1], dtype="int64", lod_level=1)
              for s in range(1, args.slots + 1)]
    pooled = []
    for var in sparse:
        # PaddleRec's dnn: a sparse-gradient embedding, which fleet's PS passes turn into pulls
        # and pushes of a sparse table on the servers (geo: a local table plus deltas).
        emb = paddle.static.nn.embedding(
            input=var, size=[args.table_rows, args.emb_dim], is_sparse=True,
            param_attr=paddle.ParamAttr(
                name="SparseFeatFactors",
                initializer=paddle.nn.initializer.Uniform(-1e-4, 1e-4)))
        pool = paddle.static.nn.sequence_lod.sequence_pool(input=emb, pool_type="sum")
        pooled.append(paddle.reshape(pool, [-1, args.emb_dim]))
    x = paddle.concat(pooled + [dense], axis=1)
    in_dim = args.slots * args.emb_dim + args.dense
    sizes = [int(s) for s in args.fc_sizes.split(",")] + [1]
    for i, out in enumerate(sizes):
        x = paddle.static.nn.fc(
            x, size=out, activation=("relu" if i + 1 < len(sizes) else None),
            weight_attr=paddle.ParamAttr(
                name="fc%d.w" % i,
                initializer=paddle.nn.initializer.Normal(0.0, 1.0 / math.sqrt(in_dim))),
            bias_attr=paddle.ParamAttr(name="fc%d.b" % i,
                                       initializer=paddle.nn.initializer.Constant(0.0)))
        in_dim = out
    labelf = paddle.cast(label, "float32")
    loss = paddle.nn.functional.binary_cross_entropy_with_logits(x, labelf, reduction="sum")
    prob = paddle.nn.functional.sigmoid(x)
    prob2 = paddle.concat([1.0 - prob, prob], axis=1)
    auc_out, _, auc_states = paddle.static.auc(input=prob2, label=label,
                                               num_thresholds=2**20 - 1, slide_steps=0)
    return [label, dense] + sparse, loss, auc_out, auc_states


def main():
    ap = argparse.ArgumentParser(description="PaddlePaddle ParameterServer peer of GPUBox's PS modes")
    ap.add_argument("--mode", choices=("async", "sync", "geo"), required=True)
    ap.add_argument("--geo_step", type=int, default=100)
    ap.add_argument("--train_dir", required=True)
    ap.add_argument("--test_dir", default="")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--slots", type=int, default=26)
    ap.add_argument("--dense", type=int, default=13)
    ap.add_argument("--emb_dim", type=int, default=9)
    ap.add_argument("--fc_sizes", default="512,256,128,32")
    ap.add_argument("--table_rows", type=int, required=True)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json_prefix", required=True)
    args = ap.parse_args()
    for name in ("threads", "epochs", "batch", "table_rows", "geo_step"):
        if getattr(args, name) <= 0:
            sys.exit("train_paddle_ps: --%s must be positive, got %d" % (name, getattr(args, name)))

    paddle.enable_static()
    paddle.seed(args.seed)
    fleet.init()  # the role (server or worker, its id) from the launcher's environment
    main_prog = paddle.static.default_main_program()
    startup = paddle.static.default_startup_program()
    main_prog.random_seed = startup.random_seed = args.seed + 1
    use_vars, loss, auc_out, auc_states = build(args)
    # fleet's minimize logs str(strategy) (at debug level, formatted anyway), and
    # DistributedStrategy.__repr__ imports google.protobuf.pyext._message, which the protobuf
    # 3.20 wheel of this venv lacks (ImportError); the strategy itself is unaffected.
    fleet.DistributedStrategy.__repr__ = lambda self: "DistributedStrategy(%s)" % args.mode
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = args.mode != "sync"
    strategy.fleet_desc_configs = {"use_cvm": False, "SparseFeatFactors": {
        "sparse_embedx_threshold": 0, "sparse_optimizer": "adagrad", "sparse_learning_rate": 0.05, "sparse_initial_g2sum": 3.0,
        "sparse_initial_range": 1e-4, "sparse_weight_bounds": [-10.0, 10.0]}}
    if args.mode == "geo":
        strategy.a_sync_configs = {"k_steps": args.geo_step}
    opt = paddle.optimizer.Adam(learning_rate=args.lr, beta1=0.9, beta2=0.999, epsilon=1e-8)
    fleet.distributed_optimizer(opt, strategy).minimize(loss)
    # minimize builds the role's own program (pulls and pushes for a worker) and puts it in
    # place of the original: train that one, not the program built above.
    main_prog = loss.block.program
    startup = paddle.static.default_startup_program()

    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return

    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    fleet.init_worker()
    # Forward only, pulls but no pushes: the ops that compute the auc op's outputs.
    test_prog = main_prog._prune(targets=[auc_out])
    scope = paddle.static.global_scope()
    place = paddle.CPUPlace()

    def reset_auc():
        for v in auc_states:
            t = scope.find_var(v.name).get_tensor()
            t.set(np.zeros(np.array(t).shape, dtype=np.array(t).dtype), place)

    def read_auc():  # the accumulated histograms (stat_pos, stat_neg; [0:2] are per batch)
        pos = np.array(scope.find_var(auc_states[2].name).get_tensor())
        neg = np.array(scope.find_var(auc_states[3].name).get_tensor())
        return auc_from_stats(pos, neg), int(pos.sum() + neg.sum())

    wid = fleet.worker_index()
    my_files = fleet.util.get_file_shard(files_of(args.train_dir))
    train_ds, load_s = make_dataset(args, use_vars, my_files)
    n_train = int(train_ds.get_memory_data_size())
    test_ds = None
    if args.test_dir and wid == 0:
        test_ds, _ = make_dataset(args, use_vars, files_of(args.test_dir))
    print("paddle ps worker %d: %d train instances from %d files in %.2f s" %
          (wid, n_train, len(my_files), load_s), flush=True)
    result = {"system": "paddle_ps", "mode": args.mode, "geo_step": args.geo_step,
              "paddle_version": paddle.__version__, "worker": wid,
              "workers": fleet.worker_num(), "threads": args.threads, "batch": args.batch,
              "train_instances": n_train, "load_seconds": load_s, "epochs": []}
    for epoch in range(1, args.epochs + 1):
        fleet.barrier_worker()  # every worker starts the epoch together (the timed window)
        reset_auc()
        b0, t0 = io_bytes(), time.time()
        exe.train_from_dataset(program=main_prog, dataset=train_ds, scope=scope,
                               thread=args.threads, debug=False)
        secs, wire = time.time() - t0, io_bytes() - b0
        auc, _ = read_auc()
        row = {"epoch": epoch, "train_seconds": secs, "examples": n_train,
               "ips": n_train / secs, "wire_bytes": wire, "auc": auc}
        fleet.barrier_worker()  # the held-out AUC of the model every worker has pushed to
        if test_ds is not None:
            reset_auc()
            exe.infer_from_dataset(program=test_prog, dataset=test_ds, scope=scope,
                                   thread=args.threads, debug=False)
            row["test_auc"], row["test_counted"] = read_auc()
        result["epochs"].append(row)
        print("paddle ps worker %d epoch: %d, train_seconds: %.3f, ips: %.1f, wire_bytes: %d, "
              "auc: %.6f%s" % (wid, epoch, secs, row["ips"], wire, auc,
                               (", test auc: %.6f" % row["test_auc"]) if "test_auc" in row else ""),
              flush=True)
    with open("%s.worker%d.json" % (args.json_prefix, wid), "w") as f:
        json.dump(result, f, indent=1)
    fleet.stop_worker()


if __name__ == "__main__":
    main()
