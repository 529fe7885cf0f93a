#!/usr/bin/env python3
"""python3 scripts/peer_rounds.py DIR [--md FILE] [--json FILE]

Summarises rounds of scripts/bench_peer_paddle.sh (single mode) run into DIR/r<round>-<model>/
(scripts/bench_peer_rounds.sh makes them): per network and precision, GPUBox's and Paddle's
examples/s of each round's timed epoch, the ratio of each round (the two runs of one round are
minutes apart, so a ratio is taken within a round, never across), their median, and the
held-out AUC of both after the timed epoch. On a shared VM one run's ratio can be off by 1.5x
(BENCHMARKS.md, "dcn and dlrm in fp32 against Paddle on a Zen 4 VM"); the median of rounds is
the figure to quote. Prints the Markdown table; --md and --json write it and the figures.
Standard library only."""
import argparse
import json
import os
import re
import statistics
import sys

ROUND_DIR = re.compile(r"^r(\d+)-(.+)$")
REPORT = re.compile(r"^report_(.+)\.json$")


def collect(directory):
    """{(model, precision): [run, ...]} over DIR's r<round>-<model>/report_<precision>.json, each
    run {round, gpubox, paddle, ratio, gpubox_auc, paddle_auc, load}, by round."""
    runs = {}
    for name in sorted(os.listdir(directory)):
        m = ROUND_DIR.match(name)
        path = os.path.join(directory, name)
        if not m or not os.path.isdir(path):
            continue
        rnd, model = int(m.group(1)), m.group(2)
        found = 0
        for report in sorted(os.listdir(path)):
            r = REPORT.match(report)
            if not r or r.group(1) == "ps":
                continue
            try:
                with open(os.path.join(path, report)) as fh:
                    data = json.load(fh)
            except ValueError as e:  # a report cut short: say which
                raise SystemExit(f"peer_rounds: {os.path.join(path, report)}: not JSON ({e})")
            gpubox, paddle = data.get("gpubox_examples_per_s"), data.get("paddle_examples_per_s")
            if not gpubox or not paddle:
                raise SystemExit(f"peer_rounds: {os.path.join(path, report)}: no examples/s of "
                                 "both systems (a run that failed?)")
            found += 1
            held = [h for h in data.get("held_out", []) if h.get("epoch") == data.get("timed_epoch")]
            runs.setdefault((model, r.group(1)), []).append({
                "round": rnd, "gpubox": gpubox, "paddle": paddle, "ratio": gpubox / paddle,
                "gpubox_auc": held[0].get("gpubox") if held else None,
                "paddle_auc": held[0].get("paddle") if held else None,
                "load": data.get("load", "")})
        if found == 0:
            # A round without its report (a run stopped early) would leave the median over fewer
            # rounds than were run, unsaid.
            raise SystemExit(f"peer_rounds: {path}: no report_<precision>.json (a run that "
                             "failed or was stopped?)")
    for key in runs:
        runs[key].sort(key=lambda run: run["round"])
    return runs


def auc_range(values):
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    lo, hi = min(values), max(values)
    return f"{lo:.4f}" if round(lo, 4) == round(hi, 4) else f"{lo:.4f}–{hi:.4f}"


def summarise(runs):
    """One row per (model, precision): the runs and the median ratio."""
    rows = []
    for (model, precision), each in sorted(runs.items()):
        rows.append({
            "model": model, "precision": precision, "rounds": len(each),
            "gpubox": [r["gpubox"] for r in each], "paddle": [r["paddle"] for r in each],
            "ratios": [r["ratio"] for r in each],
            "median_ratio": statistics.median(r["ratio"] for r in each),
            "gpubox_auc": auc_range(r["gpubox_auc"] for r in each),
            "paddle_auc": auc_range(r["paddle_auc"] for r in each)})
    return rows


def markdown(rows):
    lines = ["| network | precision | GPUBox examples/s | Paddle examples/s | ×Paddle, each round | "
             "median | held-out AUC, GPUBox / Paddle |",
             "|---|---|---|---|---|---:|---|"]
    for row in rows:
        lines.append(
            f"| {row['model']} | {row['precision']} | "
            + " ".join(f"{v:,.0f}" for v in row["gpubox"]) + " | "
            + " ".join(f"{v:,.0f}" for v in row["paddle"]) + " | "
            + " ".join(f"{v:.2f}" for v in row["ratios"])
            + f" | **{row['median_ratio']:.2f}×** | {row['gpubox_auc']} / {row['paddle_auc']} |")
    return "\n".join(lines) + "\n"


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--md")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    runs = collect(args.dir)
    if not runs:
        print(f"peer_rounds: no r<round>-<model>/report_<precision>.json under {args.dir}",
              file=sys.stderr)
        return 1
    rows = summarise(runs)
    table = markdown(rows)
    sys.stdout.write(table)
    if args.md:
        with open(args.md, "w") as fh:
            fh.write(table)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "runs": {f"{m}/{p}": r for (m, p), r in runs.items()}}, fh,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
