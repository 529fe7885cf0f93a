#!/usr/bin/env bash
# scripts/quality_sparse_storage.sh — issue 15's quality check of hyper_parameters.sparse_storage
# on the planted data of configs/config_synthetic.yaml: fp32, fp16 and bf16 sparse rows, the same
# run otherwise (1 card, batch 512, EPOCHS passes), and the test AUC of each against fp32's and
# the planted model's (test/oracle.json). The aim: fp16 and bf16 within 0.002 of fp32. Each run's
# "bytes per key" start lines (card and host tiers) are printed with it.
#
#   scripts/quality_sparse_storage.sh [--bin build/bin] [--data output/synthetic] [--epochs 1]
#
# Logs and metrics go to DATA/quality/. The small, fast version is disk_tier_quality_test's
# SixteenBitStorageTrainsLikeFp32.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib/quality_data.sh
quality_options "$@"
quality_planted_data
out="$data/quality"
mkdir -p "$out"

# "host (row R), card" from the start lines `host tier: ... per key in memory H bytes (row R, ...`
# and `card tier: ... per key up to C bytes`.
bytes_per_key() {
  local host card
  host=$(grep -o 'per key in memory [0-9.]* bytes (row [0-9]*' "$1" | head -1 |
    sed 's/per key in memory \([0-9.]*\) bytes (row \([0-9]*\)/\1 (row \2)/')
  card=$(grep -o 'per key up to [0-9]* bytes' "$1" | head -1 | cut -d' ' -f5)
  echo "$host, $card"
}

run() {  # storage
  local storage=$1 start
  start=$(date +%s)
  FLAGS_selected_gpus=0 "$bin/gpubox_train" --config configs/config_synthetic.yaml \
    -o runner.train_data_dir="$data/train" -o runner.test_data_dir="$data/test" \
    -o runner.model_save_path= -o runner.epochs="$epochs" -o runner.train_batch_size=512 \
    -o hyper_parameters.sparse_storage="$storage" \
    -o runner.metrics_path="$out/storage_$storage.jsonl" >"$out/storage_$storage.log" 2>&1
  printf '| %s | %s | %s | %s | %ds | %s |\n' "$storage" \
    "$(grep -o 'test auc: [0-9.]*' "$out/storage_$storage.log" | tail -1 | cut -d' ' -f3)" \
    "$(bytes_per_key "$out/storage_$storage.log")" \
    "$(grep -o '[0-9.]* example/sec' "$out/storage_$storage.log" | tail -1)" \
    "$(($(date +%s) - start))" "$(cut -d' ' -f1-3 /proc/loadavg)"
}

echo "planted model: $(cat "$data/test/oracle.json")"
echo "| sparse_storage | test auc | host tier bytes per key (row), card tier | last progress rate | wall | load after |"
echo "|---|---|---|---|---|---|"
run fp32
run fp16
run bf16
