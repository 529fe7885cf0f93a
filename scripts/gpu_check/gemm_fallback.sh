# shellcheck shell=bash
# scripts/gpu_check/gemm_fallback.sh: item 3b, the layer tests with every layer GEMM on cuBLASLt's
# fallback path (GPUBOX_FORCE_GEMM_FALLBACK=1: a plain cublasGemmEx and the element-wise kernels
# for bias, ReLU and its mask), which a GPU whose cuBLASLt has every algorithm never takes.
# Sourced by scripts/gpu_check.sh (after its options are read), in its order; uses and sets its
# variables. Needs bash.

# ---- 3b. layer tests on the GEMM fallback -------------------------------------------------------
if ((run_gemm_fallback)); then
  echo
  echo "================ 3b. layer tests on the GEMM fallback (GPUBOX_FORCE_GEMM_FALLBACK=1: $gemm_fallback_tests)"
  IFS=, read -r -a fallback_bins <<<"$gemm_fallback_tests"
  mkdir -p "$out/gemm_fallback"
  for name in "${fallback_bins[@]}"; do
    item="GEMM fallback $name"
    if ((dry_run)); then
      would_run "$item" env GPUBOX_FORCE_GEMM_FALLBACK=1 GPUBOX_DEVICE_CHECK=1 "$bin/$name" --gtest_color=no
      continue
    elif ((ngpu == 0)); then
      record SKIP "$item" "no GPU (the cpu backend has no cuBLASLt to fall back from)"
      continue
    elif [ ! -x "$bin/$name" ]; then
      record FAIL "$item" "$bin/$name is not an executable"
      continue
    fi
    work="$out/gemm_fallback/$name.work"
    log="$out/gemm_fallback/$name.log"
    mkdir -p "$work"
    rc=0
    GPUBOX_FORCE_GEMM_FALLBACK=1 GPUBOX_DEVICE_CHECK=1 RUN_CWD="$work" TMPDIR="$work" \
      run_limited "$test_timeout" "$log" "$bin/$name" --gtest_color=no || rc=$?
    rm -rf "$work"
    totals="$(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]+ test' "$log" | tr '\n' ' ' || true)"
    if ((rc != 0)); then
      grep -m1 -A1 ': Failure$' "$log" | sed 's/^/  | /' || true
      record FAIL "$item" "$(why_failed "$rc" "$test_timeout"); $totals(gemm_fallback/$name.log)"
    elif ! grep -q 'GPUBOX_FORCE_GEMM_FALLBACK=1: every layer GEMM runs as a plain cublasGemmEx' "$log"; then
      # Passing proves nothing unless the layers' GEMMs were made with the switch on.
      record FAIL "$item" "passed, but the switch was never logged: no layer GEMM took it (gemm_fallback/$name.log)"
    else
      record PASS "$item" "${totals}every layer GEMM a plain cublasGemmEx + element-wise kernels"
    fi
  done
else
  record SKIP "GEMM fallback" "--skip-gemm-fallback"
fi
