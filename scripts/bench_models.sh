#!/usr/bin/env bash
# scripts/bench_models.sh — issue 17's model comparison at full size: dnn, wide_deep, deepfm and dcn_v2
# (configs/config_gpubox.yaml with hyper_parameters.model set, the model sized to the data) on
# planted data with a rank-4 pairwise term (gpubox_data gen), held-out AUC after each epoch
# against the planted model's own (test/oracle.json). The small, fast version is
# planted_models_test (tests/integration).
#
#   scripts/bench_models.sh [--bin build/bin] [--data output/planted_models] [--epochs 2]
#                           [--lines 200000] [--vocab 2000] [--models "dnn wide_deep deepfm dcn_v2"]
#
# Logs and metrics go to DATA/runs/.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=build/bin
data=output/planted_models
epochs=2
lines=200000
vocab=2000
models="dnn wide_deep deepfm dcn_v2"
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --lines) lines="$2"; shift 2 ;;
    --vocab) vocab="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

gen=(--slots 13 --dense 3 --vocab "$vocab" --factor-dim 4 --seed 5 --threads 1)
if [ ! -f "$data/test/oracle.json" ]; then
  "$bin/gpubox_data" gen --out "$data/train" --lines "$lines" --files 4 "${gen[@]}" >/dev/null
  "$bin/gpubox_data" gen --out "$data/test" --lines $((lines / 4)) --files 1 --first_line "$lines" \
    "${gen[@]}" >/dev/null
fi
echo "planted model on the test data: $(grep -o '"auc": [0-9.]*' "$data/test/oracle.json")"
mkdir -p "$data/runs"
for model in $models; do
  log="$data/runs/$model.log"
  "$bin/gpubox_train" --config configs/config_gpubox.yaml \
    -o runner.train_data_dir="$data/train" -o runner.test_data_dir="$data/test" \
    -o runner.epochs="$epochs" -o runner.train_batch_size=512 -o runner.shuffle=false \
    -o runner.model_save_path= -o runner.metrics_path="$data/runs/$model.jsonl" \
    -o hyper_parameters.sparse_inputs_slots=14 -o hyper_parameters.dense_input_dim=3 \
    -o "hyper_parameters.fc_sizes=[128, 64]" -o hyper_parameters.model="$model" >"$log" 2>&1
  echo "$model: $(grep -o 'test auc: [0-9.]*' "$log" | sed 's/test auc: //' | tr '\n' ' ')"
done
