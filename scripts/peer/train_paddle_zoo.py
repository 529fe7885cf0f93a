#!/usr/bin/env python3
"""PaddlePaddle running one of PaddleRec's own networks (models/rank/<model>) on GPUBox's
generated data: PaddleRec's StaticModel (its static_model.py: create_feeds, net,
create_optimizer, as its tools/static_trainer.py calls them) or, for a folder with only a
dygraph_model.py (dcn_v2), its DygraphModel's layer, loss and optimizer built as a static
program; fed by Paddle's InMemoryDataset (MultiSlot text through slot_to_multislot.py) and
trained with Executor.train_from_dataset, as train_paddle.py trains the DNN.

  python3 train_paddle_zoo.py --paddlerec DIR --model deepfm --train_dir D [--test_dir T]
                              --threads N --epochs E --batch 512 --table_rows R --json OUT.json

The folder's config.yaml is read unchanged except the shapes of the data (sparse_inputs_slots =
slots + 1, dense_input_dim, sparse_feature_number and feature_number = table_rows + dense, num_field =
slots + dense, or slots where the folder's num_field counts the sparse slots only, as dlrm's) and the
batch: the network, its
widths, optimizer and learning rate are PaddleRec's. Per epoch: the wall time of
train_from_dataset alone (data already in memory), the examples, the AUC of the predictions made
while training (the network's own auc op, its state reset each epoch) and the held-out AUC
(infer_from_dataset on the same program cloned for test) when --test_dir is given.
"""
import argparse
import contextlib
import importlib
import inspect
import json
import os
import sys
import time

import numpy as np
import paddle
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train_paddle import auc_from_stats, files_of, train_epoch  # noqa: E402


def flat_config(path, overrides=None):
    """PaddleRec's config as its envs.load_yaml gives it: one dict of dotted keys."""
    with open(path) as f:
        tree = yaml.safe_load(f)
    out = {}

    def walk(node, prefix):
        for key, value in node.items():
            name = prefix + str(key)
            if isinstance(value, dict):
                walk(value, name + ".")
            out[name] = value

    walk(tree, "")
    out.update(overrides or {})
    return out


class Config(dict):
    def get(self, key, default=None):  # PaddleRec's models call config.get("a.b", default)
        return dict.get(self, key, default)


def field_of(var, dense_dim):
    """The slot_to_multislot.py field a feed variable reads: label, dense, a slot number, or
    (autoint, logistic_regression) one index or value per field of the line."""
    name = var.name
    if name in ("label", "click"):
        return "label"
    if name in ("feat_index", "sparse_input"):
        return "feat_index"
    if name == "feat_value" or (name == "dense_input" and var.shape[-1] != dense_dim):
        return "feat_value"  # logistic_regression's dense_input is num_field wide: the values
    if name in ("dense_input", "dense_feature"):
        return "dense"
    digits = name[1:] if name.startswith("C") else name
    if not digits.isdigit():
        sys.exit("train_paddle_zoo: feed variable '%s' is neither the label, the dense input nor "
                 "a slot (C<n> or <n>)" % name)
    return digits


def build_static(model_dir, config):
    """PaddleRec's StaticModel: feeds, the network (with its auc op), the loss's optimizer."""
    static_model = importlib.import_module("static_model")
    model = static_model.StaticModel(config)
    feeds = model.create_feeds()
    model.net(feeds)
    test_prog = paddle.static.default_main_program().clone(for_test=True)
    model.create_optimizer()
    return feeds, test_prog


@contextlib.contextmanager
def batch_dim_reshape():
    """A dygraph net's paddle.reshape(x, [x.shape[0], -1]) (fat_deepffm's DNN) under the static
    graph, where x.shape[0] is the unknown batch (-1): two -1s, which reshape refuses; 0 (keep
    x's dimension 0) says the same."""
    reshape = paddle.reshape

    def batch_reshape(x, shape, name=None):
        if isinstance(shape, (list, tuple)) and list(shape).count(-1) > 1 and shape[0] == -1:
            shape = [0] + list(shape[1:])
        return reshape(x, shape, name=name)

    paddle.reshape = batch_reshape
    try:
        yield
    finally:
        paddle.reshape = reshape


def build_dygraph_as_static(config, slots):
    """A folder without static_model.py (dcn_v2): its DygraphModel's layer, loss and optimizer
    on static feeds named as PaddleRec's other criteo networks name them."""
    dygraph_model = importlib.import_module("dygraph_model")
    dm = dygraph_model.DygraphModel()
    dense = paddle.static.data(name="dense_input",
                               shape=[None, config["hyper_parameters.dense_input_dim"]],
                               dtype="float32")
    sparse = [paddle.static.data(name="C%d" % i, shape=[None, 1], dtype="int64")
              for i in range(1, slots + 1)]
    label = paddle.static.data(name="label", shape=[None, 1], dtype="int64")
    layer = dm.create_model(config)
    with batch_dim_reshape():
        if len(inspect.signature(layer.forward).parameters) == 1:
            # flen's net takes the sparse list alone and reads [1:14], [14:17], [17:] of it (its
            # avazu reader's first column is no field): the label stands in as that first, which
            # is not read by the net.
            pred = layer([label] + sparse)
        else:
            pred = layer(sparse, dense)
    loss = dm.create_loss(pred, label)
    paddle.static.auc(input=paddle.concat([1 - pred, pred], axis=1), label=label, slide_steps=0)
    test_prog = paddle.static.default_main_program().clone(for_test=True)
    dm.create_optimizer(layer, config).minimize(loss)
    return [label] + sparse + [dense], test_prog


def restart_ffm_dense(program, scope, place, dense, k, seed):
    """PaddleRec's ffm starts its dense features' weights at 1: dense_w_one [D] (first order) and
    dense_w [1, D, F*k] (each dense field's factors, times the feature's value). With F = 39
    fields the 78 dense-dense pairs alone add 9 x_i x_j each: on features in [0, 1] the first
    logit is 59..328, sigmoid gives exactly 1.0 in fp32, its gradient is 0 and nothing learns
    (AUC 0.5000). GPUBox starts them as its wide part (0) and its sparse factors (normal, std
    0.1/sqrt(k), PaddleRec's own scale for the sparse ones); this gives Paddle the same start."""
    rng = np.random.default_rng(seed)
    found = {}
    for param in program.all_parameters():
        shape = tuple(param.shape)
        if shape == (dense,):
            found["first"] = param.name
        elif len(shape) == 3 and shape[:2] == (1, dense):
            found["factors"] = param.name
    if sorted(found) != ["factors", "first"]:
        sys.exit("train_paddle_zoo: --ffm_init gpubox found no dense weights [%d] and "
                 "[1, %d, F*k] in the program: %s" % (dense, dense, found))
    for role, name in sorted(found.items()):
        tensor = scope.find_var(name).get_tensor()
        shape = np.array(tensor).shape
        if role == "first":
            value = np.zeros(shape, dtype=np.float32)
        else:
            value = rng.normal(0.0, 0.1 / np.sqrt(k), size=shape).astype(np.float32)
        tensor.set(value, place)
        print("paddle ffm: %s (%s, %s) restarted as GPUBox's" % (
            name, role, "x".join(map(str, shape))), flush=True)


def auc_states(program):
    for op in program.global_block().ops:
        if op.type == "auc":
            return op.input("StatPos")[0], op.input("StatNeg")[0]
    sys.exit("train_paddle_zoo: the network builds no auc op")


def main():
    ap = argparse.ArgumentParser(description="PaddlePaddle running a PaddleRec network")
    ap.add_argument("--paddlerec", required=True, help="a PaddleRec checkout")
    ap.add_argument("--model", required=True, help="a folder of models/rank")
    ap.add_argument("--train_dir", required=True)
    ap.add_argument("--test_dir", default="")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--slots", type=int, default=26)
    ap.add_argument("--dense", type=int, default=13)
    ap.add_argument("--table_rows", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", required=True)
    ap.add_argument("--ffm_init", choices=("paddlerec", "gpubox"), default="paddlerec",
                    help="ffm only: the dense features' weights as PaddleRec's net.py starts them "
                    "(first-order 1, factors 1) or as GPUBox does (first-order 0, factors "
                    "N(0, 0.1/sqrt(k)), the sparse factors' scale)")
    args = ap.parse_args()
    if args.ffm_init != "paddlerec" and args.model != "ffm":
        sys.exit("train_paddle_zoo: --ffm_init is for --model ffm")
    model_dir = os.path.join(args.paddlerec, "models", "rank", args.model)
    if not os.path.isfile(os.path.join(model_dir, "config.yaml")):
        sys.exit("train_paddle_zoo: %s has no config.yaml" % model_dir)
    config_path = os.path.join(model_dir, "config.yaml")
    shapes = {
        "hyper_parameters.sparse_inputs_slots": args.slots + 1,
        "hyper_parameters.dense_input_dim": args.dense,
        # + dense: the feat_index networks' (autoint, logistic_regression) slot keys come after
        # the dense fields' indices 1 .. dense (slot_to_multislot.py)
        "hyper_parameters.sparse_feature_number": args.table_rows + args.dense,
        "hyper_parameters.feature_number": args.table_rows + args.dense,  # autoint's name
        "runner.train_batch_size": args.batch}
    # num_field counts what the folder's config counts: every field of a line (autoint,
    # logistic_regression: its sparse slots and dense features) or the sparse ones only (dlrm's
    # interaction: 26 vectors besides the bottom MLP's).
    own = flat_config(config_path)
    if args.model == "flen":
        # flen's DNN reads sparse_inputs_slots fields' embeddings: the slots its net concatenates
        # (user [1:14], item [14:17], context [17:] of its list), no dense input.
        shapes["hyper_parameters.sparse_inputs_slots"] = args.slots
    if "hyper_parameters.num_field" in own:
        own_sparse = int(own.get("hyper_parameters.sparse_inputs_slots", args.slots + 1)) - 1
        every_field = int(own["hyper_parameters.num_field"]) > own_sparse
        shapes["hyper_parameters.num_field"] = args.slots + (args.dense if every_field else 0)
    config = Config(flat_config(config_path, shapes))
    sys.path.insert(0, model_dir)  # its static_model.py imports its net.py

    paddle.enable_static()
    paddle.seed(args.seed)
    main_prog, startup = paddle.static.Program(), paddle.static.Program()
    main_prog.random_seed = startup.random_seed = args.seed + 1
    with paddle.static.program_guard(main_prog, startup):
        if os.path.isfile(os.path.join(model_dir, "static_model.py")):
            feeds, test_prog = build_static(model_dir, config)
        else:
            feeds, test_prog = build_dygraph_as_static(config, args.slots)
    place = paddle.CPUPlace()
    exe = paddle.static.Executor(place)
    exe.run(startup)
    scope = paddle.static.global_scope()
    if args.ffm_init == "gpubox":
        restart_ffm_dense(main_prog, scope, place, args.dense,
                          int(config["hyper_parameters.sparse_feature_dim"]), args.seed)
    stat_pos, stat_neg = auc_states(main_prog)

    def reset_auc():
        for name in (stat_pos, stat_neg):
            t = scope.find_var(name).get_tensor()
            t.set(np.zeros(np.array(t).shape, dtype=np.array(t).dtype), place)

    def read_auc():
        pos = np.array(scope.find_var(stat_pos).get_tensor())
        neg = np.array(scope.find_var(stat_neg).get_tensor())
        return auc_from_stats(pos, neg), int(pos.sum() + neg.sum())

    fields = ",".join(field_of(v, args.dense) for v in feeds)
    pipe = "%s %s --slots %d --dense %d --table_rows %d --fields %s" % (
        sys.executable, os.path.join(HERE, "slot_to_multislot.py"), args.slots, args.dense,
        args.table_rows, fields)

    def dataset(files):
        ds = paddle.distributed.InMemoryDataset()
        ds.init(batch_size=args.batch, thread_num=args.threads, use_var=feeds, pipe_command=pipe)
        ds.set_filelist(files)
        t0 = time.time()
        ds.load_into_memory()
        return ds, time.time() - t0

    train_ds, load_s = dataset(files_of(args.train_dir))
    n_train = int(train_ds.get_memory_data_size())
    test_ds = dataset(files_of(args.test_dir))[0] if args.test_dir else None
    print("paddle %s: loaded %d train instances in %.2f s (%d threads)" % (
        args.model, n_train, load_s, args.threads), flush=True)
    result = {"system": "paddle", "paddle_version": paddle.__version__, "model": args.model,
              "threads": args.threads, "batch": args.batch, "table_rows": args.table_rows,
              "train_instances": n_train, "load_seconds": load_s, "epochs": []}
    for epoch in range(1, args.epochs + 1):
        row = train_epoch(exe, scope, main_prog, test_prog, train_ds, test_ds, args.threads,
                          epoch, n_train, reset_auc, read_auc)
        secs, auc = row["train_seconds"], row["auc"]
        result["epochs"].append(row)
        print("paddle %s epoch: %d, train_seconds: %.3f, ips: %.1f example/sec, auc: %.6f%s" % (
            args.model, epoch, secs, row["ips"], auc,
            (", test auc: %.6f" % row["test_auc"]) if "test_auc" in row else ""), flush=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
