#!/usr/bin/env bash
# bash tests/scripts/paddlerec_sweep_test.sh REPO BUILD_DIR
# scripts/paddlerec_sweep.sh on a small PaddleRec-like tree (models/rank/<name>/*.yaml beside
# the shipped sample): each outcome is told apart and counted, the config files stay unchanged,
# and --out's header names the commits and the run time (what scripts/sweep_table.py reads).
#   dnn/config.yaml      trains (data folder relative to the config, as PaddleRec ships it)
#   dnn/bigdata.yaml     trains on the sample (its data folder does not exist)
#   dnn/typo.yaml        refused: the unknown key named
#   dnn/init.yaml        loads, training fails (model_init_path names no save)
#   dnn/static.yaml      trains from the save dnn/config.yaml writes (its model_init_path)
#   dnn/piped.yaml       trains through its pipe_command's reader, named from the model folder
#   dnn/rooted.yaml      trains through its pipe_command's reader, named from PaddleRec's root
#                        (a stand-in `paddle` module makes Paddle importable: the readers run)
#   difm/config.yaml     refused: the folder names a network GPUBox does not build
set -euo pipefail
repo="$1"
build="$2"
work="$(mktemp -d "${TMPDIR:-/tmp}/paddlerec_sweep_test_XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; cat "$work/out.md" >&2 || true; exit 1; }

rank="$work/PaddleRec/models/rank"
for model in dnn difm; do
  mkdir -p "$rank/$model/data/sample_data/train"
  cp "$repo/configs/data/sample_data/train/sample_train.txt" "$rank/$model/data/sample_data/train/"
done
config() {  # FILE DATA_DIR [EXTRA YAML LINE]
  printf 'runner:\n  train_data_dir: "%s"\n  train_batch_size: 16\n  epochs: 3\n%s\nhyper_parameters:\n  fc_sizes: [8]\n' \
    "$2" "${3:-}" >"$1"
}
config "$rank/dnn/config.yaml" data/sample_data/train '  model_save_path: "saves"'
config "$rank/dnn/static.yaml" data/sample_data/train '  model_init_path: "saves/0"'
printf 'import sys\nsys.stdout.write(sys.stdin.read())\n' >"$rank/dnn/passthrough.py"
config "$rank/dnn/piped.yaml" data/sample_data/train '  pipe_command: "python3 passthrough.py"'
config "$rank/dnn/rooted.yaml" data/sample_data/train \
  '  pipe_command: "python3 models/rank/dnn/passthrough.py"'
mkdir -p "$work/stand-in/paddle" && : >"$work/stand-in/paddle/__init__.py"
config "$rank/dnn/bigdata.yaml" ../../../datasets/criteo/slot_train_data_full
config "$rank/dnn/typo.yaml" data/sample_data/train "  thred_num: 2"
config "$rank/dnn/init.yaml" data/sample_data/train '  model_init_path: "output_model/0"'
config "$rank/difm/config.yaml" data/sample_data/train
sums="$(cat "$rank"/*/*.yaml | md5sum)"

PYTHONPATH="$work/stand-in" GPUBOX_BUILD_DIR="$build" bash "$repo/scripts/paddlerec_sweep.sh" "$work/PaddleRec" \
  --families "dnn difm" --timeout 120 --work "$work/runs" --out "$work/out.tsv" >"$work/out.md" 2>&1 ||
  fail "the sweep exited nonzero"
outcome() { awk -F'\t' -v c="$1" '$1 == c { print $2 }' "$work/out.tsv"; }
[ "$(outcome dnn/config.yaml)" = trains ] || fail "dnn/config.yaml should train"
[ "$(outcome dnn/bigdata.yaml)" = trains ] || fail "dnn/bigdata.yaml should train on the sample"
[ "$(outcome dnn/typo.yaml)" = refused ] || fail "dnn/typo.yaml should be refused"
grep -q "typo.yaml.*unknown key.*runner.thred_num.*runner.thread_num" "$work/out.md" ||
  fail "the refusal of typo.yaml names neither the key nor its correction"
[ "$(outcome dnn/init.yaml)" = loads ] || fail "dnn/init.yaml should load and fail to train"
[ "$(outcome dnn/static.yaml)" = trains ] || fail "dnn/static.yaml should train from config.yaml's save"
[ "$(outcome dnn/piped.yaml)" = trains ] || fail "dnn/piped.yaml's reader should run"
[ "$(outcome dnn/rooted.yaml)" = trains ] || fail "dnn/rooted.yaml's reader should run"
grep -q "^# paddle: importable$" "$work/out.tsv" || fail "the stand-in paddle was not importable"
grep -q "static.yaml.*from config.yaml's save" "$work/out.md" || fail "static.yaml's start is not said"
for key in paddlerec gpubox date paddle timeout seconds; do
  grep -q "^# $key: ." "$work/out.tsv" || fail "--out has no '# $key:' line"
done
[ "$(outcome difm/config.yaml)" = refused ] || fail "difm/config.yaml should be refused"
grep -q "difm/config.yaml.*network 'difm'" "$work/out.md" || fail "the difm refusal does not say why"
grep -q "^8 configs: 5 train the network their folder names, 1 load only, 2 refused$" \
  "$work/out.md" || fail "wrong counts"
[ "$(cat "$rank"/*/*.yaml | md5sum)" = "$sums" ] || fail "the sweep changed a config"
[ ! -e "$rank/dnn/output_model" ] && [ ! -e "$rank/dnn/log" ] || fail "the sweep wrote into the tree"
echo "paddlerec_sweep_test: ok"
