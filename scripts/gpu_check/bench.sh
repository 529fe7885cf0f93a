# shellcheck shell=bash
# scripts/gpu_check/bench.sh: item 8, the benchmark per card count (results.tsv).
# Sourced by scripts/gpu_check.sh (after its options are read), in its order; uses and sets its
# variables. Needs bash.

# ---- 8. per-card-count benchmark ---------------------------------------------------------------
if ((run_bench)) && ((${#counts[@]} > 0)); then
  echo
  echo "================ 8. benchmark per card count"
  steps_one=$(( ((lines + batch - 1) / batch) * epochs ))
  ((steps_one <= max_steps)) || die "--lines $lines x --epochs $epochs at --batch $batch is $steps_one steps on one card, over --max-steps $max_steps"
  make_data
  oracle="$(grep -o '"auc": [0-9.]*' "$data/test/oracle.json" | head -n 1 | awk '{ print $2 }' || true)"
  jnum() { gc_last_pass_number "$@"; }
  results="$out/results.tsv"
  printf 'cards\tips\tips_per_card\tscaling\tauc\ttest_auc\tload_s\tbegin_pass_s\ttrain_s\tend_pass_s\tsteps_per_pass\tstep_ms_p50\tstep_ms_p99\tcard_memory_peak_mb\tgpu_memory_used_mib\n' > "$results"
  base_ips="" base_cards=""
  for c in "${counts[@]}"; do
    sel="$(seq -s, 0 $((c - 1)))"
    metrics="$out/bench/metrics.$c.jsonl"
    rm -f "$metrics"
    note "training on $c card(s): FLAGS_selected_gpus=$sel, $epochs passes of $lines lines, batch $batch per card"
    rc=0
    gc_gpu_memory_start "$out/bench/gpu_memory.$c.csv"
    FLAGS_selected_gpus="$sel" run_training "$run_timeout" "$out/bench/train.$c.log" "$bin/gpubox_train" \
        --config "$root/configs/config_synthetic.yaml" \
        -o runner.train_data_dir="$data/train" -o runner.test_data_dir="$data/test" \
        -o runner.model_save_path= -o runner.save_mode=none -o runner.metrics_path="$metrics" \
        -o runner.epochs="$epochs" -o runner.train_batch_size="$batch" || rc=$?
    # nvidia-smi's view (NCCL's and cuBLAS's memory included): the highest memory.used of a GPU.
    gpu_peak="$(gc_gpu_memory_stop "$out/bench/gpu_memory.$c.csv" | grep -oE '[0-9]+ MiB' | sort -n | tail -n 1 | awk '{ print $1 }' || true)"
    grep -E '^pass: |test auc' "$out/bench/train.$c.log" | sed 's/, ne:.*ips_per_card/, ... ips_per_card/; s/^/  /' || true
    if ((rc != 0)) || [ ! -s "$metrics" ]; then
      echo "  FAILED (exit $rc): last lines of $out/bench/train.$c.log:"; tail -n 8 "$out/bench/train.$c.log" | sed 's/^/  | /'
      printf '%s\tFAILED\t\t\t\t\t\t\t\t\t\t\t\t\t\n' "$c" >> "$results"
      record FAIL "benchmark, $c card(s)" "$(why_failed "$rc" "$run_timeout") (bench/train.$c.log)"; continue
    fi
    ips="$(jnum "$metrics" ips)"
    if [ -z "$base_ips" ]; then base_ips="$ips"; base_cards="$c"; fi
    test_auc="$(grep '"test_auc":' "$metrics" | tail -n 1 | grep -o '"test_auc": [0-9.]*' | awk '{ print $2 }' || true)"
    awk -v c="$c" -v ips="$ips" -v b="$base_ips" -v bc="$base_cards" -v auc="$(jnum "$metrics" auc)" \
        -v tauc="${test_auc:-}" -v l="$(jnum "$metrics" load_seconds)" -v bp="$(jnum "$metrics" begin_pass_seconds)" \
        -v tr="$(jnum "$metrics" train_seconds)" -v ep="$(jnum "$metrics" end_pass_seconds)" \
        -v steps="$(( (lines + batch * c - 1) / (batch * c) ))" -v p50="$(jnum "$metrics" step_ms_p50)" \
        -v p99="$(jnum "$metrics" step_ms_p99)" -v mem="$(jnum "$metrics" card_memory_peak_mb)" -v gmem="${gpu_peak:-}" 'BEGIN {
          printf "%d\t%.0f\t%.0f\t%.3f\t%.4f\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%d\t%.3f\t%.3f\t%.1f\t%s\n",
                 c, ips, ips / c, (ips / c) / (b / bc), auc, tauc, l, bp, tr, ep, steps, p50, p99, mem, gmem }' >> "$results"
    record PASS "benchmark, $c card(s)" "$(printf '%.0f' "$ips") examples/s, train AUC $(jnum "$metrics" auc) (results.tsv)"
  done
  echo
  if [ "${base_cards:-1}" = 1 ]; then base_note="ips(C) / (C * ips(1))"; else base_note="per-card ips relative to $base_cards cards"; fi
  cfg="$root/configs/config_synthetic.yaml"
  model="$(sed -n 's/^ *model: *\([a-z_]*\).*/\1/p' "$cfg" | head -n 1)"
  fc="$(sed -n 's/^ *fc_sizes: *\(\[[^]]*\]\).*/\1/p' "$cfg" | head -n 1)"
  sparse_opt="$(sed -n '/sparse_optimizer:/,$ s/^ *class: *\([a-z_]*\).*/\1/p' "$cfg" | head -n 1)"
  echo "GPUBox gpubox_train, configs/config_synthetic.yaml (model $model, fc $fc, sparse $sparse_opt), $lines lines,"
  echo "batch $batch per card; figures of the last of $epochs passes (keys already on the cards); scaling = $base_note;"
  echo "step ms: wall time per steady step of that pass; card mem: the device layer's high-water mark per card"
  echo "(smi: nvidia-smi's highest memory.used of a GPU during the run, NCCL and cuBLAS included)"
  ((ngpu > 0)) || echo "(no GPU listed by nvidia-smi: with a cpu build (--bin) the simulated cards share this machine's cores)"
  awk -F'\t' -v oracle="${oracle:-n/a}" '
    NR == 1 { printf "| %5s | %12s | %10s | %7s | %9s | %8s | %-28s | %-17s | %-13s |\n", "cards", "examples/s", "per card", "scaling", "train AUC", "test AUC", "pass s: load/begin/train/end", "step ms p50/p99", "card mem MiB"
              printf "|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n", "------:", "-------------:", "-----------:", "--------:", "----------:", "---------:", "------------------------------", "-------------------", "---------------"; next }
    $2 == "FAILED" { printf "| %5s | %12s | %10s | %7s | %9s | %8s | %-28s | %-17s | %-13s |\n", $1, "FAILED", "", "", "", "", "", "", ""; next }
    { printf "| %5d | %12.0f | %10.0f | %6.0f%% | %9.4f | %8s | %-28s | %-17s | %-13s |\n", $1, $2, $3, 100 * $4, $5, $6, $7 " / " $8 " / " $9 " / " $10, $12 " / " $13, $14 ($15 != "" ? " (smi " $15 ")" : "") }
    END { printf "planted model (oracle) AUC on the held-out data: %s\n", oracle }' "$results"
  echo "(results: $results; logs and per-pass metrics: $out/bench/)"
else
  record SKIP "benchmark" "$( ((run_bench)) && echo "no card count" || echo "--skip-bench")"
fi
