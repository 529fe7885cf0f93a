#!/usr/bin/env python3
"""Writes the peer table (GPUBox vs PaddlePaddle) from both systems' per-epoch results.

  python3 report.py --gpubox_metrics M.jsonl --paddle_json P.json --oracle D/train/oracle.json
                    [--test_oracle D/test/oracle.json] --timed_epoch E --meta TEXT ... --out report.md
                    [--json report.json --precision P --load TEXT] [--gpubox_batch G]

--json also writes the table's figures as JSON (scripts/bench_table.py ingest reads it).

GPUBox's seconds for a pass are begin_pass + train + end_pass (its per-pass load is left out,
as Paddle's load_into_memory is done once before the epochs and left out too); the train phase
alone is given as well. Paddle's seconds are the wall time of exe.train_from_dataset.
"""
import argparse
import json
import sys
import time


def die(msg):
    sys.exit("report.py: " + msg)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpubox_metrics", required=True)
    ap.add_argument("--gpubox_test_auc", default="", help="comma list of test AUC per epoch")
    ap.add_argument("--paddle_json", required=True)
    ap.add_argument("--oracle", required=True)
    ap.add_argument("--test_oracle", default="")
    ap.add_argument("--timed_epoch", type=int, required=True)
    ap.add_argument("--meta", action="append", default=[], help="a line of the header (repeatable)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--json", default="", help="also write the figures here, as JSON")
    ap.add_argument("--precision", default="fp32", help="GPUBox's dense_precision (for --json)")
    ap.add_argument("--load", default="", help="load averages of the runs (for --json)")
    ap.add_argument("--gpubox_batch", type=int, default=0,
                    help="GPUBox's batch per card (default: Paddle's batch per thread)")
    a = ap.parse_args()

    with open(a.gpubox_metrics) as f:
        gb = [json.loads(l) for l in f if l.strip()]
    with open(a.paddle_json) as f:
        pd = json.load(f)
    with open(a.oracle) as f:
        oracle = json.load(f)
    test_oracle = None
    if a.test_oracle:
        with open(a.test_oracle) as f:
            test_oracle = json.load(f)
    e = a.timed_epoch
    # GPUBox's passes count from 0 (as PaddleRec's epochs), train_paddle.py's epochs from 1.
    g = [r for r in gb if r.get("pass") == e - 1]
    p = [r for r in pd["epochs"] if r["epoch"] == e]
    if not g:
        die("no pass %d in %s" % (e - 1, a.gpubox_metrics))
    if not p:
        die("no epoch %d in %s" % (e, a.paddle_json))
    g, p = g[-1], p[0]
    g_test = [x for x in a.gpubox_test_auc.split(",") if x]
    g_secs = g["begin_pass_seconds"] + g["train_seconds"] + g["end_pass_seconds"]
    g_ips = g["examples"] / g_secs
    g_train_ips = g["examples"] / g["train_seconds"]
    p_ips = p["ips"]

    def fmt_auc(x):
        return "%.4f" % float(x) if x not in (None, "") else "n/a"

    lines = ["# GPUBox vs PaddlePaddle (CPU), same model, same data, same threads", ""]
    for m in a.meta:
        lines.append("- " + m)
    lines.append("- data: %d training lines (planted-model AUC %.4f)%s" % (
        oracle["lines"], oracle["auc"],
        ", %d held-out lines (planted-model AUC %.4f)" % (test_oracle["lines"], test_oracle["auc"])
        if test_oracle else ""))
    lines.append("- timed: epoch/pass %d of each run only (earlier ones are warm-up); load excluded "
                 "for both" % e)
    lines.append("")
    lines.append("| system | setting | examples | seconds | examples/s | train AUC (epoch %d) | "
                 "held-out AUC (after epoch %d) |" % (e, e))
    lines.append("|---|---|---:|---:|---:|---:|---:|")
    lines.append("| GPUBox | %d simulated card(s) x 1 thread, batch %d per card | %d | %.3f | %.0f | "
                 "%s | %s |" % (g["cards"], a.gpubox_batch or pd["batch"], g["examples"], g_secs, g_ips,
                                fmt_auc(g["auc"]), fmt_auc(g_test[e - 1] if len(g_test) >= e else "")))
    lines.append("| PaddlePaddle %s | train_from_dataset, %d thread(s), batch %d per thread | %d | "
                 "%.3f | %.0f | %s | %s |" % (pd["paddle_version"], pd["threads"], pd["batch"],
                                              p["examples"], p["train_seconds"], p_ips,
                                              fmt_auc(p["auc"]), fmt_auc(p.get("test_auc"))))
    lines.append("| **ratio GPUBox / Paddle** | | | | **%.2fx** | | |" % (g_ips / p_ips))
    lines.append("")
    lines.append("GPUBox seconds = begin_pass + train + end_pass (%.3f + %.3f + %.3f); its train phase "
                 "alone: %.0f examples/s (%.2fx Paddle). Paddle seconds = wall time of "
                 "exe.train_from_dataset." % (g["begin_pass_seconds"], g["train_seconds"],
                                             g["end_pass_seconds"], g_train_ips,
                                             g_train_ips / p_ips))
    if "cpu_seconds" in p:
        lines.append("")
        lines.append("Paddle's timed epoch used %.1f CPU seconds in %.1f s of wall time (%.2f cores "
                     "busy on average, %d threads asked for)." % (
                         p["cpu_seconds"], p["train_seconds"],
                         p["cpu_seconds"] / p["train_seconds"], pd["threads"]))
    lines.append("")
    lines.append("All epochs (held-out AUC after each epoch; change: against the previous epoch):")
    lines.append("")
    lines.append("| epoch | GPUBox examples/s | GPUBox train AUC | GPUBox held-out AUC (change) | "
                 "Paddle examples/s | Paddle train AUC | Paddle held-out AUC (change) | "
                 "held-out GPUBox - Paddle |")
    lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|")

    def held_out(values, i):
        """'A (change)' for epoch index i of a list of held-out AUCs (None where absent)."""
        if i >= len(values) or values[i] is None:
            return "n/a"
        if i == 0 or values[i - 1] is None:
            return "%.4f" % values[i]
        return "%.4f (%+.4f)" % (values[i], values[i] - values[i - 1])

    g_test_f = [float(x) for x in g_test]
    p_test_f = [r.get("test_auc") for r in pd["epochs"]]
    for i, r in enumerate(pd["epochs"]):
        gr = [x for x in gb if x.get("pass") == r["epoch"] - 1]
        if not gr:
            continue
        gr = gr[-1]
        gs = gr["begin_pass_seconds"] + gr["train_seconds"] + gr["end_pass_seconds"]
        diff = ("%+.4f" % (g_test_f[i] - p_test_f[i])
                if i < len(g_test_f) and p_test_f[i] is not None else "n/a")
        lines.append("| %d | %.0f | %.4f | %s | %.0f | %.4f | %s | %s |" % (
            r["epoch"], gr["examples"] / gs, gr["auc"], held_out(g_test_f, i), r["ips"], r["auc"],
            held_out(p_test_f, i), diff))
    text = "\n".join(lines) + "\n"
    with open(a.out, "w") as f:
        f.write(text)
    sys.stdout.write(text)
    if a.json:
        command = next((m[len("command: "):] for m in a.meta if m.startswith("command: ")), "")
        held = [{"epoch": r["epoch"], "gpubox": g_test_f[i] if i < len(g_test_f) else None,
                 "paddle": p_test_f[i]} for i, r in enumerate(pd["epochs"])]
        with open(a.json, "w") as f:
            json.dump({"kind": "bench_peer_paddle.sh", "mode": "gpubox", "precision": a.precision,
                       "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "command": command, "load": a.load, "timed_epoch": e,
                       "gpubox_examples_per_s": g_ips, "paddle_examples_per_s": p_ips,
                       "paddle_version": pd["paddle_version"], "held_out": held}, f, indent=1)


if __name__ == "__main__":
    main()
