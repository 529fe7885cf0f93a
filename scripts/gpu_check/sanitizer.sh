# shellcheck shell=bash
# scripts/gpu_check/sanitizer.sh: item 4, compute-sanitizer over the step tests and a 2-GPU training run.
# Sourced by scripts/gpu_check.sh (after its options are read), in its order; uses and sets its
# variables. Needs bash.

# ---- 4. compute-sanitizer ------------------------------------------------------------------------
IFS=, read -r -a sanitize_targets <<<"$sanitizer_tests"
sanitizer_tools=(memcheck racecheck initcheck synccheck)
# sanitize ITEM LOG CMD...: CMD under compute-sanitizer --tool $tool (no silence check: a sanitized
# run is 10-100x slower), recorded as ITEM.
sanitize() {
  local item="$1" log="$2" rc=0 errors
  shift 2
  if ((dry_run)); then
    would_run "$item" ${FLAGS_selected_gpus:+env "FLAGS_selected_gpus=$FLAGS_selected_gpus"} \
        "${sanitizer:-compute-sanitizer}" --tool "$tool" --report-api-errors no --error-exitcode 97 "$@"
    return 0
  fi
  note "$item"
  # --report-api-errors no: NCCL probes its kernels with cudaFuncGetAttributes at start and
  # counts "no kernel image" answers as normal (the H200 lease's memcheck counted 148 of them, all
  # from libnccl, and no error of GPUBox's); the code checks every API call's error itself.
  GPUBOX_DEVICE_CHECK=1 TMPDIR="$out/sanitizer" run_limited "$sanitizer_timeout" "$log" "$sanitizer" \
      --tool "$tool" --report-api-errors no --error-exitcode 97 --log-file "$log.report" "$@" || rc=$?
  errors="$(grep -h -m1 -o 'ERROR SUMMARY: [0-9]* error[s]*\|RACECHECK SUMMARY: [0-9]* hazard[s]*[^.]*' "$log.report" "$log" 2>/dev/null | head -n 1 || true)"
  if ((rc == 0)); then
    record PASS "$item" "${errors:-no errors}"
  else
    record FAIL "$item" "$(why_failed "$rc" "$sanitizer_timeout"): ${errors:-see the log} (${log#"$out"/}*)"
  fi
}
if ((run_sanitizer)); then
  echo
  echo "================ 4. compute-sanitizer (${sanitizer_tools[*]})"
  sanitizer="$(first_tool compute-sanitizer)"
  if ((ngpu == 0 && !dry_run)); then
    record SKIP "compute-sanitizer" "no GPU"
  elif [ -z "$sanitizer" ] && ((!dry_run)); then
    record SKIP "compute-sanitizer" "compute-sanitizer is not installed (CUDA toolkit's bin/)"
  else
    mkdir -p "$out/sanitizer"
    lineinfo="$(sed -n 's/^lineinfo: *\([A-Z]*\).*/\1/p' "$root/MANIFEST.txt" 2>/dev/null || true)"
    [ "$lineinfo" != OFF ] || note "this bundle was built without -lineinfo: the reports name no source lines"
    for tool in "${sanitizer_tools[@]}"; do
      for name in "${sanitize_targets[@]}"; do
        [ -x "$bin/$name" ] || { record SKIP "$tool $name" "no bin/$name"; continue; }
        sanitize "$tool $name" "$out/sanitizer/$tool.$name.log" "$bin/$name" --gtest_color=no
      done
    done
    # The whole step on 2 GPUs (NCCL, the pass boundary, varying batch sizes) under memcheck.
    if ((ngpu >= 2 || (dry_run && max_cards >= 2))); then
      make_varying_data
      tool=memcheck
      FLAGS_selected_gpus=0,1 sanitize "memcheck 2-GPU training" "$out/sanitizer/memcheck.train.log" \
          "$bin/gpubox_train" --config "$root/configs/config_synthetic.yaml" \
          -o runner.train_data_dir="$data/varying" -o runner.test_data_dir= -o runner.model_save_path= \
          -o runner.save_mode=none -o runner.epochs=1 -o runner.train_batch_size=512 -o runner.metrics_path=
    else
      record SKIP "memcheck 2-GPU training" "needs 2 GPUs, this machine has $ngpu"
    fi
  fi
else
  record SKIP "compute-sanitizer" "--skip-sanitizer"
fi
