# shellcheck shell=bash
# scripts/gpu_check/predictions.sh: item 10, an evaluation that keeps its predictions
# (`gpubox_train --mode infer --predictions_out`): the step's copy of the predictions into the
# pinned block of its ring slot, captured in the evaluation step's graph, and the zero-row graph
# of a card whose last batch is empty. One pass is trained and saved on the varying-keys data
# (item 9's) on the most cards; then on 1 card and on the most, that save evaluates two data sets:
#   varying  item 9's data (keys per line vary, so does every batch's key count)
#   edge     cards x batch x 2 + cards - 1 lines of the same kind: in the last round every card
#            but the last gets 1 line and the last card none (on 1 card, batch x 2 + 1 lines: a
#            last batch of 1 line)
# each three ways, and the predictions files are compared line by line:
#   graphs   bin/'s gpubox_train (on a GPU: every step one replayed CUDA graph)
#   eager    the same with GPUBOX_STEP_GRAPHS=0: must equal `graphs` bit for bit (same kernels,
#            same order; the file prints each float as the shortest text that reads back to it)
#   cpu      a cpu build's gpubox_train (--cpu-bin; on simulated cards): the labels equal and
#            every prediction within 1e-4 of `graphs` (fp32 both ways, only the GEMMs' summation
#            order differs; a prediction copied from the wrong slot or step is off by far more)
# Every file holds one line per instance of its data set. Sourced by scripts/gpu_check.sh (after
# its options are read), in its order; uses and sets its variables. Needs bash.

predictions_tolerance=1e-4

# edge_lines CARDS: the edge data set's lines for CARDS cards.
edge_lines() {
  echo $(($1 * batch * 2 + ($1 > 1 ? $1 - 1 : 1)))
}
# make_edge_data CARDS: the edge data set for CARDS cards (seed 3, --keys-per-slot keys a slot).
make_edge_data() {
  local cards="$1" n dir="$data/edge.$1.$batch"  # --keep-data may reuse it with another --batch
  n="$(edge_lines "$cards")"
  [ -d "$dir" ] && return 0
  note "generating $n lines for $cards card(s) (gpubox_data gen, seed 3): a last batch of 1 line$( ((cards > 1)) && echo " on every card but the last, none on the last")"
  run_limited "$run_timeout" "$out/predictions/gen.edge.$cards.log" "$bin/gpubox_data" gen --out "$dir" \
      --lines "$n" --files 1 --seed 3 --zipf 1.1 --keys_per_slot "$keys_per_slot" ||
      die "gpubox_data gen (edge data) failed: $(tail -n 3 "$out/predictions/gen.edge.$cards.log")"
}

# infer_predictions BIN CARDS DATA PREDICTIONS LOG [ENV...]: BIN's gpubox_train --mode infer of the
# saved pass on DATA, on CARDS cards, writing PREDICTIONS.
infer_predictions() {
  local b="$1" cards="$2" dir="$3" preds="$4" log="$5"
  shift 5
  FLAGS_selected_gpus="$(seq -s, 0 $((cards - 1)))" run_training "$run_timeout" "$log" env "$@" \
      "$b/gpubox_train" --config "$root/configs/config_synthetic.yaml" --mode infer \
      --load "$out/predictions/model/0" --infer_data_dir "$dir" --predictions_out "$preds" \
      -o runner.infer_batch_size="$batch" -o runner.metrics_path=
}

# check_predictions CARDS NAME DATA LINES: the three evaluations of DATA (LINES instances) on
# CARDS cards, recorded as one item.
check_predictions() {
  local cards="$1" name="$2" dir="$3" lines_in="$4" base rc=0 got why="" compared
  base="$out/predictions/$name.$cards"
  infer_predictions "$bin" "$cards" "$dir" "$base.graphs.txt" "$base.graphs.log" || rc=$?
  if ((rc != 0)); then
    tail -n 8 "$base.graphs.log" | sed 's/^/  | /'
    record FAIL "predictions, $cards card(s), $name" "$(why_failed "$rc" "$run_timeout") (predictions/$name.$cards.graphs.log)"
    return 0
  fi
  if [ ! -f "$base.graphs.txt" ]; then
    record FAIL "predictions, $cards card(s), $name" "exit 0 without writing $base.graphs.txt"
    return 0
  fi
  got="$(wc -l < "$base.graphs.txt")"
  ((got == lines_in)) || why="$got predictions for $lines_in lines; "
  awk '!($2 >= 0 && $2 <= 1) { exit 1 }' "$base.graphs.txt" || why+="a prediction outside [0, 1]; "
  rc=0
  infer_predictions "$bin" "$cards" "$dir" "$base.eager.txt" "$base.eager.log" GPUBOX_STEP_GRAPHS=0 || rc=$?
  if ((rc != 0)); then
    why+="the eager run: $(why_failed "$rc" "$run_timeout"); "
  elif ! compared="$(gc_compare_predictions "$base.graphs.txt" "$base.eager.txt" 0)"; then
    why+="graphs against eager (GPUBOX_STEP_GRAPHS=0): $compared; "
  fi
  local against_cpu="no cpu build to compare with"
  if [ -n "$cpu_bin" ]; then
    rc=0
    infer_predictions "$cpu_bin" "$cards" "$dir" "$base.cpu.txt" "$base.cpu.log" || rc=$?
    if ((rc != 0)); then
      why+="the cpu build's run: $(why_failed "$rc" "$run_timeout"); "
    elif compared="$(gc_compare_predictions "$base.graphs.txt" "$base.cpu.txt" "$predictions_tolerance")"; then
      against_cpu="against the cpu build: $compared <= $predictions_tolerance"
    else
      why+="against the cpu build: $compared; "
    fi
  fi
  if [ -n "$why" ]; then
    record FAIL "predictions, $cards card(s), $name" "${why%; } (predictions/$name.$cards.*)"
  else
    record PASS "predictions, $cards card(s), $name" "$got predictions; graphs = eager exactly; $against_cpu"
  fi
}

if ((run_predictions)) && ((${#counts[@]} > 0)); then
  echo
  echo "================ 10. evaluation keeping its predictions (gpubox_train --mode infer --predictions_out)"
  make_varying_data
  mkdir -p "$out/predictions"
  most="$(printf '%s\n' "${counts[@]}" | sort -n | tail -n 1)"
  if [ -n "$cpu_bin" ]; then
    note "reference: the cpu build in $cpu_bin ($("$cpu_bin/gpubox_train" --version 2>&1 | head -n 1))"
  fi
  rm -rf "$out/predictions/model"
  rc=0
  FLAGS_selected_gpus="$(seq -s, 0 $((most - 1)))" run_training "$run_timeout" "$out/predictions/train.log" \
      "$bin/gpubox_train" --config "$root/configs/config_synthetic.yaml" -o runner.train_data_dir="$data/varying" \
      -o runner.test_data_dir= -o runner.model_save_path="$out/predictions/model" -o runner.save_mode=base \
      -o runner.resume=off -o runner.metrics_path= -o runner.epochs=1 -o runner.train_batch_size="$batch" || rc=$?
  if ((rc != 0)) || [ ! -d "$out/predictions/model/0" ]; then
    tail -n 8 "$out/predictions/train.log" | sed 's/^/  | /'
    record FAIL "predictions" "training the pass to evaluate: $(why_failed "$rc" "$run_timeout") (predictions/train.log)"
  else
    pred_counts=(1)
    [ "$most" = 1 ] || pred_counts+=("$most")
    for c in "${pred_counts[@]}"; do
      check_predictions "$c" varying "$data/varying" "$(cat "$data/varying"/part-* | wc -l)"
      make_edge_data "$c"
      check_predictions "$c" edge "$data/edge.$c.$batch" "$(edge_lines "$c")"
    done
    [ -n "$cpu_bin" ] || record SKIP "predictions against a cpu build" "${cpu_bin_problem:-no cpu build: give --cpu-bin DIR (its gpubox_train)}"
  fi
else
  record SKIP "predictions" "$( ((run_predictions)) && echo "no card count" || echo "--skip-predictions")"
fi
