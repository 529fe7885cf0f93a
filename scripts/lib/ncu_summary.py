"""Summarise ncu's `--csv --page raw` output of one metric, gpu__time_duration.sum.

usage: python3 ncu_summary.py RAW.csv [LAST]
Prints the workloads profiled (graphs or kernels) grouped by name, the costliest first (share of
the total, count, median), then the last LAST (default 120) in launch order: with
--graph-profiling node, the nodes of the last steps one by one. scripts/gpu_lease_check.sh's ncu
phase writes it beside the gzipped raw file (the raw file of a node profile is megabytes).
"""
import collections
import csv
import statistics
import sys

METRIC = "gpu__time_duration.sum"


def main():
    path = sys.argv[1]
    last = int(sys.argv[2]) if len(sys.argv) > 2 else 120
    with open(path, errors="replace") as f:
        rows = list(csv.reader(line for line in f if line.startswith('"')))
    if len(rows) < 3:
        print(f"{path}: no profiled workloads")
        return
    header, units, body = rows[0], rows[1], rows[2:]
    if METRIC not in header:
        print(f"{path}: no column {METRIC}")
        return
    at, unit = header.index(METRIC), units[header.index(METRIC)]
    name_at = header.index("Kernel Name") if "Kernel Name" in header else 4
    times = [(r[name_at], float(r[at].replace(",", ""))) for r in body if len(r) > at]
    by_name = collections.defaultdict(list)
    for name, t in times:
        by_name[name[:100]].append(t)
    total = sum(t for _, t in times) or 1.0
    print(f"{len(times)} profiled workloads, {METRIC} in {unit}, total {total:.0f}")
    for name, ts in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        print(f"{100 * sum(ts) / total:5.1f}%  n={len(ts):5d}  median={statistics.median(ts):10.0f}  {name}")
    print(f"\nthe last {last} in launch order:")
    for i, (name, t) in enumerate(times[-last:]):
        print(f"{i:4d} {t:10.0f}  {name[:110]}")


if __name__ == "__main__":
    main()
