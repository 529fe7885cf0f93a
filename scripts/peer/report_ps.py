#!/usr/bin/env python3
"""The table of `scripts/bench_peer_paddle.sh --mode ps`: GPUBox's async, sync and geo modes
(scripts/launch.sh) against PaddlePaddle's fleet ParameterServer (train_paddle_ps.py), one run.

  python3 report_ps.py --runs RUNS.tsv --epochs E --oracle O.json [--test_oracle T.json]
                       --out report_ps.md [--meta LINE ...]

RUNS.tsv: system (gpubox|paddle), schedule (async|sync|geo), load average before, run folder,
and optionally why the run failed (a Paddle run that wrote no result: its row says so).
GPUBox's folder holds trainer 0's metrics.jsonl and trainer t's metrics.trainer<t>.jsonl (one
line per pass, test lines per epoch) and server_wire (the largest
bytes sent + received on the server's connections, from ss); Paddle's holds paddle.worker<i>.json.
examples/s of a job: the examples all its workers trained in the timed (last) epoch over the
slowest worker's training seconds of it (data in memory, load excluded, both systems).
"""
import argparse
import glob
import json
import time
import os
import sys


SCHEDULES = ("async", "sync", "geo")


def die(msg):
    sys.exit("report_ps: " + msg)


def gpubox_row(folder, epoch):
    # Every trainer's file (runner.metrics_path: trainer 0's, metrics.trainer<t>.jsonl beside it).
    lines = []
    for name in sorted(glob.glob(os.path.join(folder, "metrics*.jsonl"))):
        with open(name) as f:
            lines += [json.loads(line) for line in f]
    passes = [r for r in lines if r.get("pass") == epoch - 1]
    tests = [r["test_auc"] for r in lines if r.get("epoch") == epoch - 1 and "test_auc" in r]
    if not passes:
        die("no pass %d in %s/metrics*.jsonl" % (epoch - 1, folder))
    examples = sum(p["examples"] for p in passes)
    secs = max(p["train_seconds"] for p in passes)
    all_examples = sum(r.get("examples", 0) for r in lines if "pass" in r)  # every pass, trainer
    wire = None
    io = os.path.join(folder, "server_wire")
    if os.path.exists(io):
        wire = int(open(io).read().split()[0]) / max(all_examples, 1)
    return {"workers": len(passes), "examples": examples, "seconds": secs,
            "ips": examples / secs, "train_auc": sum(p["auc"] for p in passes) / len(passes),
            "test_auc": sum(tests) / len(tests) if tests else None, "wire": wire}


def paddle_row(folder, epoch):
    files = sorted(glob.glob(os.path.join(folder, "paddle.worker*.json")))
    if not files:
        die("no paddle.worker*.json in %s" % folder)
    ws = [json.load(open(f)) for f in files]
    rows = [w["epochs"][epoch - 1] for w in ws]
    examples = sum(r["examples"] for r in rows)
    secs = max(r["train_seconds"] for r in rows)
    wire = sum(e["wire_bytes"] for w in ws for e in w["epochs"]) / max(
        sum(e["examples"] for w in ws for e in w["epochs"]), 1)
    tests = [r["test_auc"] for r in rows if "test_auc" in r]
    return {"workers": len(ws), "examples": examples, "seconds": secs, "ips": examples / secs,
            "train_auc": sum(r["auc"] for r in rows) / len(rows),
            "test_auc": tests[0] if tests else None, "wire": wire}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--oracle", required=True)
    ap.add_argument("--test_oracle", default="")
    ap.add_argument("--meta", action="append", default=[])
    ap.add_argument("--out", required=True)
    ap.add_argument("--json", default="", help="also write the figures here, as JSON")
    a = ap.parse_args()
    e = a.epochs
    runs = [line.rstrip("\n").split("\t") for line in open(a.runs) if line.strip()]
    res = {}
    failed = {}
    for run in runs:
        system, sched, load, folder = run[:4]
        if len(run) > 4 and run[4]:
            failed[(system, sched)] = "%s (load %s)" % (run[4], load)
            continue
        r = gpubox_row(folder, e) if system == "gpubox" else paddle_row(folder, e)
        r["load"] = load
        res[(system, sched)] = r
    oracle = json.load(open(a.oracle))
    test_oracle = json.load(open(a.test_oracle)) if a.test_oracle else None

    def auc(x):
        return "-" if x is None else "%.4f" % x

    L = ["# GPUBox PS modes vs PaddlePaddle's ParameterServer (CPU), same data, same model", ""]
    L += ["- " + m for m in a.meta]
    L.append("- data: %d training lines (planted-model AUC %.4f)%s" % (
        oracle["lines"], oracle["auc"],
        ", %d held-out lines (planted-model AUC %.4f)" % (test_oracle["lines"], test_oracle["auc"])
        if test_oracle else ""))
    L.append("- timed: epoch %d of %d (the earlier ones warm up); examples/s = the examples of all "
             "workers in it / the slowest worker's training seconds (data in memory)" % (e, e))
    L.append("- held-out AUC after epoch %d: GPUBox the mean over its workers' evaluations, "
             "Paddle worker 0's (a forward program pruned to the auc op, pulling the servers' rows)"
             % e)
    L.append("- wire bytes per trained example, every epoch: GPUBox the bytes sent + received on "
             "gpubox_server's TCP connections over the whole job (ss, sampled every 0.2 s; the "
             "held-out pulls included: an upper bound), Paddle "
             "each worker's rchar+wchar during train_from_dataset (brpc socket readv/writev)")
    L.append("")
    L.append("| mode | system | load before | examples/s | GPUBox / Paddle | train AUC | "
             "held-out AUC | wire bytes / example |")
    L.append("|---|---|---|---:|---:|---:|---:|---:|")
    for sched in SCHEDULES:
        g, p = res.get(("gpubox", sched)), res.get(("paddle", sched))
        for name, r in (("GPUBox", g), ("Paddle", p)):
            why = failed.get((name.lower(), sched))
            if why:
                L.append("| %s | %s | failed: %s | - | - | - | - | - |" % (sched, name, why.replace("|", "/")))
            if r is None:
                continue
            ratio = "%.2fx" % (g["ips"] / p["ips"]) if (name == "GPUBox" and g and p) else ""
            L.append("| %s | %s | %s | %.0f | %s | %s | %s | %s |" % (
                sched, name, r["load"], r["ips"], ratio, auc(r["train_auc"]), auc(r["test_auc"]),
                "-" if r["wire"] is None else "%.0f" % r["wire"]))
    text = "\n".join(L) + "\n"
    with open(a.out, "w") as f:
        f.write(text)
    if a.json:  # the table's figures, for scripts/bench_table.py ingest
        modes = {}
        for sched in SCHEDULES:
            g, p = res.get(("gpubox", sched)), res.get(("paddle", sched))
            if g and p:
                modes[sched] = {"gpubox_examples_per_s": g["ips"], "paddle_examples_per_s": p["ips"],
                                "gpubox_test_auc": g["test_auc"], "paddle_test_auc": p["test_auc"],
                                "load": "%s / %s" % (g["load"].split()[0], p["load"].split()[0])}
        command = next((m[len("command: "):] for m in a.meta if m.startswith("command: ")), "")
        with open(a.json, "w") as f:
            json.dump({"kind": "bench_peer_paddle.sh", "mode": "ps", "epochs": e,
                       "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "command": command, "modes": modes}, f, indent=1)


if __name__ == "__main__":
    main()
