# shellcheck shell=bash
# scripts/gpu_check/varying.sh: item 9, training on data whose keys per line vary, and the soak run.
# Sourced by scripts/gpu_check.sh (after its options are read), in its order; uses and sets its
# variables. Needs bash.

# ---- 9. data whose keys per line vary; the soak run --------------------------------------------
# train_varying CARDS LOG METRICS EPOCHS: gpubox_train on the varying-keys data.
train_varying() {
  FLAGS_selected_gpus="$(seq -s, 0 $(($1 - 1)))" run_training "$run_timeout" "$2" "$bin/gpubox_train" \
      --config "$root/configs/config_synthetic.yaml" -o runner.train_data_dir="$data/varying" \
      -o runner.test_data_dir= -o runner.model_save_path= -o runner.save_mode=none \
      -o runner.metrics_path="$3" -o runner.epochs="$4" -o runner.train_batch_size="$batch" \
      -o runner.print_interval=20
}
if ((run_varying)) && ((${#counts[@]} > 0)); then
  echo
  echo "================ 9. varying keys per line (--keys_per_slot $keys_per_slot)$( ((soak_seconds)) && echo ", soak ${soak_seconds}s")"
  make_varying_data
  most="$(printf '%s\n' "${counts[@]}" | sort -n | tail -n 1)"
  varying_counts=(1)
  [ "$most" = 1 ] || varying_counts+=("$most")
  for c in "${varying_counts[@]}"; do
    metrics="$out/varying/metrics.$c.jsonl"
    rm -f "$metrics"
    rc=0
    train_varying "$c" "$out/varying/train.$c.log" "$metrics" 2 || rc=$?
    grep -E '^pass: ' "$out/varying/train.$c.log" | sed 's/, ne:.*//; s/^/  /' || true
    verdict="$(gc_step_allocations "$metrics")"
    if ((rc != 0)); then
      tail -n 8 "$out/varying/train.$c.log" | sed 's/^/  | /'
      record FAIL "varying keys, $c card(s)" "$(why_failed "$rc" "$run_timeout") (varying/train.$c.log)"
    elif [ -n "$verdict" ]; then
      record FAIL "varying keys, $c card(s)" "steps allocated:$verdict (varying/metrics.$c.jsonl)"
    else
      record PASS "varying keys, $c card(s)" "no step allocated; step p50/p99 $(gc_last_pass_number "$metrics" step_ms_p50)/$(gc_last_pass_number "$metrics" step_ms_p99) ms, card memory $(gc_last_pass_number "$metrics" card_memory_peak_mb) MiB"
    fi
  done
  if ((soak_seconds > 0)); then
    metrics="$out/varying/metrics.soak.jsonl"
    rm -f "$metrics"
    note "soak: $most card(s), passes over the varying-keys data for ${soak_seconds}s"
    rc=0
    gc_gpu_memory_start "$out/varying/gpu_memory.soak.csv"
    GC_LIMIT_ENDS_RUN=1 run_timeout=$soak_seconds train_varying "$most" "$out/varying/train.soak.log" "$metrics" 1000000 || rc=$?
    gpu_peaks="$(gc_gpu_memory_stop "$out/varying/gpu_memory.soak.csv")"
    passes="$(grep -c '"pass":' "$metrics" 2>/dev/null || true)"
    first_p99="$(grep '"pass":' "$metrics" 2>/dev/null | head -n 1 | grep -o '"step_ms_p99": [0-9.e+]*' | awk '{ print $2 }' || true)"
    first_mem="$(grep '"pass":' "$metrics" 2>/dev/null | head -n 1 | grep -o '"card_memory_peak_mb": [0-9.e+]*' | awk '{ print $2 }' || true)"
    detail="${passes:-0} passes; step p99 first/last pass ${first_p99:-?}/$(gc_last_pass_number "$metrics" step_ms_p99) ms; card memory first/last ${first_mem:-?}/$(gc_last_pass_number "$metrics" card_memory_peak_mb) MiB${gpu_peaks:+; nvidia-smi peaks: $gpu_peaks}"
    verdict="$(gc_step_allocations "$metrics")"
    if ((rc != 0)); then
      tail -n 8 "$out/varying/train.soak.log" | sed 's/^/  | /'
      record FAIL "soak, $most card(s)" "$(why_failed "$rc" "$soak_seconds"); $detail (varying/train.soak.log)"
    elif [ -n "$verdict" ]; then
      record FAIL "soak, $most card(s)" "steps allocated:$verdict; $detail"
    else
      record PASS "soak, $most card(s)" "$detail"
    fi
  fi
else
  record SKIP "varying keys" "$( ((run_varying)) && echo "no card count" || echo "--skip-varying")"
fi
