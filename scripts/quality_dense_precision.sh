#!/usr/bin/env bash
# scripts/quality_dense_precision.sh — issue 14's quality check of hyper_parameters.dense_precision
# on the planted data of configs/config_synthetic.yaml: fp32 on 2 cards, bf16 on 1, 2 and 4 cards
# (the same global batch of 512), EPOCHS passes each, and the test AUC of each against the
# planted model's (test/oracle.json). The aims: bf16 within 0.002 of fp32 and within 0.01 of the
# oracle; 1, 2 and 4 cards within 0.003 of each other.
#
#   scripts/quality_dense_precision.sh [--bin build/bin] [--data output/synthetic] [--epochs 1]
#
# bf16 runs where the CPU has bf16 GEMMs (AVX512-BF16/AMX); elsewhere the script sets
# GPUBOX_BF16_EMULATION=1, which runs the bf16 data path with GEMMs in fp32 on bf16 operands
# (the numerics of bf16 hardware up to summation order, slower than fp32). Logs and metrics go to
# DATA/quality/. The small, fast version is trainer_integration_test's Bf16TrainsLikeFp32AndCardsAgree.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib/quality_data.sh
quality_options "$@"
quality_planted_data
emulate=()
if ! grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then emulate=(GPUBOX_BF16_EMULATION=1); fi
out="$data/quality"
mkdir -p "$out"

run() {  # name cards batch precision
  local name=$1 cards=$2 batch=$3 precision=$4 start
  start=$(date +%s)
  local env_vars=(FLAGS_selected_gpus="$(seq -s, 0 $((cards - 1)))")
  [ "$precision" = bf16 ] && env_vars+=(${emulate[@]+"${emulate[@]}"})
  env "${env_vars[@]}" "$bin/gpubox_train" --config configs/config_synthetic.yaml \
    -o runner.train_data_dir="$data/train" -o runner.test_data_dir="$data/test" \
    -o runner.model_save_path= -o runner.epochs="$epochs" -o runner.train_batch_size="$batch" \
    -o hyper_parameters.dense_precision="$precision" \
    -o runner.metrics_path="$out/$name.jsonl" >"$out/$name.log" 2>&1
  printf '| %s | %d x %d | %s | %s | %ds | %s |\n' "$precision" "$cards" "$batch" \
    "$(grep -o 'test auc: [0-9.]*' "$out/$name.log" | tail -1 | cut -d' ' -f3)" \
    "$(grep -o '[0-9.]* example/sec' "$out/$name.log" | tail -1)" "$(($(date +%s) - start))" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"
}

echo "planted model: $(cat "$data/test/oracle.json")"
echo "bf16 GEMMs: ${emulate[*]:-hardware}"
echo "| precision | cards x batch | test auc | last progress rate | wall | load after |"
echo "|---|---|---|---|---|---|"
run fp32_2 2 256 fp32
run bf16_2 2 256 bf16
run bf16_1 1 512 bf16
run bf16_4 4 128 bf16
