#!/usr/bin/env bash
# The pass pipeline's effect (runner.prefetch_passes): trains the default model over PASSES
# generated passes (slices of one planted model, so they share the popular keys and each brings
# new tail keys) with the pipeline off and on, and prints per pass what the pass boundary made
# training wait for: reading the pass (load_seconds: all of it when off, what was left when on)
# and begin_pass (begin_pass_seconds), with the rows begin_pass pulled itself and those it took
# from the staging.
#   scripts/bench_prefetch.sh [--passes N] [--lines N] [--vocab N] [--build DIR] [--out DIR]
set -euo pipefail
passes=4 lines=50000 vocab=1000000 build=build out=output/bench_prefetch
while [[ $# -gt 0 ]]; do
  case "$1" in
    --passes) passes=$2; shift 2 ;;
    --lines) lines=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "bench_prefetch.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$build/bin
[[ -x $bin/gpubox_train && -x $bin/gpubox_data ]] || { echo "no $bin/gpubox_train: build first" >&2; exit 1; }
mkdir -p "$out"
dirs=""
for ((p = 0; p < passes; ++p)); do
  dir=$out/data/pass$p
  if [[ ! -f $dir/oracle.json ]]; then
    "$bin/gpubox_data" gen --out "$dir" --lines "$lines" --files 2 --seed 7 --vocab "$vocab" \
      --first_line $((p * lines)) > /dev/null
  fi
  dirs+="${dirs:+, }$dir"
done
for prefetch in 0 1; do
  rm -f "$out/metrics_$prefetch.jsonl"
  "$bin/gpubox_train" --config "$repo/configs/config_gpubox.yaml" -o "runner.pass_dirs=[$dirs]" \
    -o runner.epochs=1 -o runner.test_data_dir= -o runner.model_save_path= \
    -o runner.prefetch_passes=$prefetch -o "runner.metrics_path=$out/metrics_$prefetch.jsonl" \
    > "$out/train_$prefetch.log" 2>&1
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
runs = {p: [json.loads(l) for l in open(f"{out}/metrics_{p}.jsonl") if '"pass"' in l] for p in (0, 1)}
print("| pass | prefetch | load wait s | begin_pass s | boundary s | pulled | prefetched | train s |")
print("|---|---|---|---|---|---|---|---|")
total = {0: 0.0, 1: 0.0}
for p in (0, 1):
    for r in runs[p]:
        boundary = r["load_seconds"] + r["begin_pass_seconds"]
        if r["pass"] > 0:
            total[p] += boundary
        print(f"| {r['pass']} | {p} | {r['load_seconds']:.3f} | {r['begin_pass_seconds']:.3f} | "
              f"{boundary:.3f} | {r['pulled']:.0f} | {r['prefetched']:.0f} | {r['train_seconds']:.2f} |")
ratio = total[1] / total[0] if total[0] > 0 else float("nan")
print(f"\npasses after the first: visible boundary {total[0]:.3f} s off, {total[1]:.3f} s on "
      f"({100 * ratio:.1f}% of off)")
PY
