#!/usr/bin/env bash
# scripts/gpu_lease_check.sh BUNDLE.tar.xz OUT_DIR
#
# The first-GPU-run checklist (scripts/gpu_check.sh) for a short lease of a GPU machine: the bundle
# (scripts/bundle_cuda.sh) is unpacked to a temporary folder and gpu_check.sh runs in bounded
# phases, the most telling first, so that a lease cut short still brings back what ran:
#   train  items 1, 2, 7, 8, 9 (device query, libraries, step counts, benchmark, varying keys) on 1 card
#   pred   item 10: an evaluation keeping its predictions (--mode infer --predictions_out), with
#          step graphs, without, and on a cpu build when GPUBOX_LEASE_CPU_BIN names one
#   tests  the step's unit tests first (--tests, in that order), each under --test-timeout, then
#          item 3b: the layer tests with every layer GEMM on the fallback (GPUBOX_FORCE_GEMM_FALLBACK=1)
#   san    compute-sanitizer over a few step tests (only when GPUBOX_LEASE_SAN_S > 0)
#   all    with GPUBOX_LEASE_ALL_P=P (> 0), instead of `tests`: every test binary of the bundle, P at
#          a time on the one machine (the longest first when GPUBOX_LEASE_ORDER names a file of test
#          names, e.g. the names of a build's Testing/Temporary/CTestCostData.txt sorted by cost), each
#          under GPUBOX_LEASE_ALL_TEST_S (60), the phase under GPUBOX_LEASE_TESTS_S; gc/all/ gets each
#          binary's log and summary.txt (rc, seconds, gtest's totals; CUT: still running at the limit).
#          The first lease's sequential phase ran 25 of 84 binaries in 220 s; in parallel all fit.
# When the machine's cuBLAS or NCCL do not resolve from the default paths (ldd says "not found"),
# they are looked for under /usr/local/cuda*, /usr/lib*, /opt and Python's nvidia packages, and the
# folders found are put on LD_LIBRARY_PATH (the console says which).
# Each phase is killed at its limit (the gpubox processes it left with it). OUT_DIR gets each
# phase's console log, nvidia-smi's output and gc.tgz with every phase's gpu_check folder (its files
# under 2 MiB: a lease brings back at most 16 MiB a file; gc/large_files.txt names those left out,
# such as generated data, saves and predictions, with their sizes); the
# scripts/gpu_check.sh beside this script (with its parts, scripts/gpu_check/*.sh, and
# scripts/lib/gpu_check_lib.sh) replaces the bundle's, so a fix to the checklist needs no new bundle.
# Limits in seconds, from the environment: GPUBOX_LEASE_TRAIN_S (150), GPUBOX_LEASE_PRED_S (90),
# GPUBOX_LEASE_TESTS_S (170), GPUBOX_LEASE_SAN_S (0), GPUBOX_LEASE_NCU_S (0: no ncu phase; else ncu's
# per-graph and per-node GPU times of gpubox_bench step, into gc/ncu/, half the limit each); GPUBOX_LEASE_LINES (400000) training lines;
# GPUBOX_LEASE_TESTS and GPUBOX_LEASE_SAN_TESTS: comma-separated test binaries; GPUBOX_LEASE_CPU_BIN:
# a cpu build's bin/ (its gpubox_train and the libraries it needs must run there), item 10's
# reference.
set -u
(($# == 2)) || { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
tarball="$1" out="$2"
here="$(cd "$(dirname "$0")" && pwd)"
t0=$(date +%s)
elapsed() { echo $(($(date +%s) - t0)); }
[ -f "$tarball" ] || { echo "gpu_lease_check: no bundle '$tarball'" >&2; exit 1; }
for var in GPUBOX_LEASE_TRAIN_S GPUBOX_LEASE_PRED_S GPUBOX_LEASE_TESTS_S GPUBOX_LEASE_SAN_S GPUBOX_LEASE_NCU_S \
           GPUBOX_LEASE_LINES GPUBOX_LEASE_ALL_P GPUBOX_LEASE_ALL_TEST_S; do
  [[ "${!var:-0}" =~ ^[0-9]+$ ]] || { echo "gpu_lease_check: $var must be a whole number, got '${!var}'" >&2; exit 2; }
done
mkdir -p "$out" || exit 1
work="$(mktemp -d "${TMPDIR:-/tmp}/gpubox-lease.XXXXXX")"
tar xJf "$tarball" -C "$work" || { echo "gpu_lease_check: cannot extract '$tarball'" >&2; exit 1; }
bundle="$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'gpubox-cuda-*' | head -n 1)"
[ -n "$bundle" ] || { echo "gpu_lease_check: '$tarball' holds no gpubox-cuda-* folder" >&2; exit 1; }
cp "$here/gpu_check.sh" "$bundle/scripts/gpu_check.sh"
mkdir -p "$bundle/scripts/gpu_check" "$bundle/scripts/lib"
cp "$here"/gpu_check/*.sh "$bundle/scripts/gpu_check/"
cp "$here/lib/gpu_check_lib.sh" "$bundle/scripts/lib/gpu_check_lib.sh"
echo "bundle $bundle unpacked in $(elapsed) s"
# The tests open the build machine's source folder (test_paths.txt): gpu_check.sh links it to the
# bundle when it is absent; when it exists here (the repository copied to the same path), its
# build-cuda/ is pointed at the bundle's binaries instead.
src="$(awk -F'\t' '$1 == "source_dir" { print $2 }' "$bundle/test_paths.txt" 2>/dev/null)"
if [ -n "$src" ] && [ -d "$src/configs" ] && [ ! -e "$src/build-cuda" ]; then
  mkdir -p "$src/build-cuda" && ln -s "$bundle/bin" "$src/build-cuda/bin" && echo "linked $src/build-cuda/bin -> $bundle/bin"
fi
# cuBLAS / NCCL: the H200 lease's image had them in /usr/local/cuda/targets/x86_64-linux/lib and
# /usr/lib/x86_64-linux-gnu.
for lib in $(ldd "$bundle/bin/gpubox_train" 2>/dev/null | awk '/not found/ { print $1 }' | grep -E 'cublas|nccl'); do
  found="$(find /usr/local/cuda*/ /usr/lib /usr/lib64 /opt -name "$lib" 2>/dev/null | head -n 1)"
  echo "library $lib: ${found:-NOT FOUND (item 2 of gpu_check says so)}"
  [ -z "$found" ] || LD_LIBRARY_PATH="$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
done
nvidia-smi > "$out/smi.txt" 2>&1
head -n 15 "$out/smi.txt"

# phase NAME SECONDS GPU_CHECK_ARGS...
phase() {
  local name="$1" secs="$2" rc=0
  shift 2
  echo "==== phase $name (limit $secs s) at $(elapsed) s"
  timeout -k 5 "$secs" "$bundle/scripts/gpu_check.sh" --out "$work/gc/$name" --cards 1 --hang-timeout 45 "$@" \
    > "$out/$name.log" 2>&1 || rc=$?
  echo "rc=$rc at $(elapsed) s" >> "$out/$name.log"
  pkill -9 -f "$bundle/bin/" 2>/dev/null
  grep -E '^(PASS|FAIL|SKIP) ' "$work/gc/$name/summary.txt" 2>/dev/null || tail -n 25 "$out/$name.log"
}
step_tests="device_test,hash_table_test,hash_table_wait_free_test,card_store_test,row_pool_test,key_dedup_test,segment_reduce_test"
step_tests+=",heter_comm_test,heter_comm_padded_test,comm_test,comm_alloc_test,step_accounting_test,trainer_nn_test"
step_tests+=",trainer_metrics_test,trainer_multicard_test,pass_manager_test,pass_prefetch_test,trainer_integration_test"
step_tests+=",collective_test,planted_models_test,divergence_test,resume_test,save_load_test,sparse_table_test"
# Item 3b (the layer tests on the GEMM fallback) runs in the tests phase only.
skip_rest=(--skip-nsys --skip-nccl --skip-gemm-fallback)
phase train "${GPUBOX_LEASE_TRAIN_S:-150}" --skip-tests --skip-sanitizer "${skip_rest[@]}" --skip-predictions \
  --lines "${GPUBOX_LEASE_LINES:-400000}" --run-timeout 70
cpu_bin=()
[ -z "${GPUBOX_LEASE_CPU_BIN:-}" ] || cpu_bin=(--cpu-bin "$GPUBOX_LEASE_CPU_BIN")
phase pred "${GPUBOX_LEASE_PRED_S:-90}" --skip-tests --skip-sanitizer "${skip_rest[@]}" --skip-step --skip-bench \
  --skip-varying --lines "${GPUBOX_LEASE_LINES:-400000}" --batch 512 --run-timeout 40 "${cpu_bin[@]}"
# all_tests P PER_TEST_S PHASE_S: every bin/*_test, P at a time, into gc/all/.
all_tests() {
  local dir="$work/gc/all" order="${GPUBOX_LEASE_ORDER:-/dev/null}"
  mkdir -p "$dir"
  [ -f "$order" ] || order=/dev/null
  echo "==== phase all ($1 at a time, $2 s each, limit $3 s) at $(elapsed) s"
  # The tests' compiled-in source folder (test_paths.txt), linked to the bundle for the phase.
  local linked=0
  if [ -n "$src" ] && [ ! -e "$src" ]; then
    mkdir -p "$(dirname "$src")" && ln -s "$bundle" "$src" && linked=1
  fi
  # shellcheck disable=SC2016 # the per-binary script expands its variables itself
  (cd "$bundle" && for f in bin/*_test; do echo "${f#bin/}"; done |
    awk 'NR == FNR { rank[$1] = NR; next } { print (($1 in rank) ? rank[$1] : 100000), $1 }' "$order" - |
    sort -n | cut -d' ' -f2 |
    GPUBOX_DEVICE_CHECK=1 DIR="$dir" T="$2" timeout -k 3 "$3" xargs -P "$1" -I{} bash -c '
      echo {} >> "$DIR/started.txt"; s=$(date +%s); timeout -k 3 "$T" bin/{} > "$DIR/{}.log" 2>&1; rc=$?
      printf "%-40s rc=%-3s %4ss %s\n" {} $rc $(($(date +%s) - s)) \
        "$(grep -E "^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]+ test" "$DIR/{}.log" | tr -s " " | tr "\n" " ")" >> "$DIR/summary.txt"')
  pkill -9 -f "$bundle/bin/" 2>/dev/null
  local t
  while read -r t; do
    grep -q "^$t " "$dir/summary.txt" 2>/dev/null || echo "$t CUT at the phase's limit" >> "$dir/summary.txt"
  done < <(cat "$dir/started.txt" 2>/dev/null)
  ((linked)) && rm -f "$src"
  sort -o "$dir/summary.txt" "$dir/summary.txt" 2>/dev/null
  grep -v ' rc=0 ' "$dir/summary.txt" 2>/dev/null | head -n 40
  echo "$(grep -c ' rc=0 ' "$dir/summary.txt" 2>/dev/null) of $(wc -l < "$dir/summary.txt") binaries passed"
}
if ((${GPUBOX_LEASE_ALL_P:-0} > 0)); then
  all_tests "$GPUBOX_LEASE_ALL_P" "${GPUBOX_LEASE_ALL_TEST_S:-60}" "${GPUBOX_LEASE_TESTS_S:-170}" | tee "$out/all.log"
else
  phase tests "${GPUBOX_LEASE_TESTS_S:-170}" --skip-sanitizer --skip-nsys --skip-nccl --skip-step --skip-bench --skip-varying \
    --skip-predictions \
    --test-timeout 40 --tests "${GPUBOX_LEASE_TESTS:-$step_tests}"
  grep -E ' ok | FAILED |SKIPPED' "$out/tests.log" | head -n 40
fi
if ((${GPUBOX_LEASE_SAN_S:-0} > 0)); then
  phase san "$GPUBOX_LEASE_SAN_S" --skip-tests "${skip_rest[@]}" --skip-step --skip-bench --skip-varying --skip-predictions \
    --sanitizer-timeout 40 --sanitizer-tests "${GPUBOX_LEASE_SAN_TESTS:-device_test,heter_comm_padded_test,step_accounting_test}"
fi
# ncu: the GPU time of one replayed step graph, and of each of its nodes (kernels profiled one by
# one), against the step's wall time that item 7 reports; gpubox_bench step, 1 card, batch 512.
# ncu times each workload alone, launched by itself: its figures are upper bounds, read as ranks
# (the H200's node profile of 2026-12-04 summed to more than the step's wall time).
if ((${GPUBOX_LEASE_NCU_S:-0} > 0)); then
  echo "==== phase ncu (limit $GPUBOX_LEASE_NCU_S s) at $(elapsed) s"
  ncu="$(command -v ncu || true)"
  for candidate in /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu; do
    [ -n "$ncu" ] || [ ! -x "$candidate" ] || ncu="$candidate"
  done
  mkdir -p "$work/gc/ncu"
  if [ -z "$ncu" ]; then
    echo "ncu: not found" | tee "$work/gc/ncu/none.txt"
  else
    half=$((GPUBOX_LEASE_NCU_S / 2))
    for how in graph node; do
      timeout -k 5 "$half" "$ncu" --graph-profiling "$how" --metrics gpu__time_duration.sum --clock-control none \
        --cache-control none --csv --page raw "$bundle/bin/gpubox_bench" step --cards 1 --batch 512 --steps 8 \
        --no_predictions > "$work/gc/ncu/$how.csv" 2> "$work/gc/ncu/$how.err"
      echo "ncu $how: rc=$? at $(elapsed) s, $(wc -l < "$work/gc/ncu/$how.csv") lines"
      pkill -9 -f "$bundle/bin/" 2>/dev/null
      # The summary (by name, then the last steps node by node) and the raw file gzipped: a node
      # profile's raw file is megabytes, over what gc.tgz carries (the first try lost it).
      python3 "$here/lib/ncu_summary.py" "$work/gc/ncu/$how.csv" > "$work/gc/ncu/$how.summary.txt" 2>&1
      gzip -9 "$work/gc/ncu/$how.csv"
    done
  fi
fi
# The logs, summaries and tables fit; data, saves and predictions (megabytes each) stay behind, named.
(cd "$work" && find gc -type f -size +2048k -printf '%s\t%p\n' > gc/large_files.txt &&
  find gc -type f -size -2049k -print0 | tar czf "$out/gc.tgz" --null -T -) 2>/dev/null
rm -rf "$work"
echo "done in $(elapsed) s: $out"
