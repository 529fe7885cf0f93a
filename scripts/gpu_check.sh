#!/usr/bin/env bash
# gpu_check.sh — the first-GPU-run checklist. Run inside an unpacked GPUBox CUDA bundle
# (scripts/bundle_cuda.sh makes it) on a GPU machine; one command checks that machine end to end
# and writes everything under one output folder (--out):
#   device/     1. nvidia-smi (summary, -q, topo -m)
#               2. the shared libraries of bin/ resolve (bundle lib/ + the driver, cuBLAS, NCCL),
#                  then `gpubox_bench devices`: the peer-access matrix GPUBox grants
#                  (cudaMemPoolSetAccess between every pair of GPUs that can)
#   tests/      3. the CUDA build's unit tests (every bin/*_test, GPUBOX_DEVICE_CHECK=1); tests
#                  needing more GPUs than the machine has skip and say so
#   sanitizer/  4. compute-sanitizer memcheck, racecheck, initcheck and synccheck over the step
#                  tests (hash table, card store, row pool, HeterComm, segment reduce, dense
#                  model, metrics, step accounting; --sanitizer-tests), and memcheck on a 2-GPU
#                  training run on data with varying keys (needs 2 GPUs). Source lines in the
#                  reports need a build with -lineinfo (GPUBOX_CUDA_LINEINFO, on in bundle_cuda.sh's build)
#   nccl/       5. a 2-card training run with NCCL_DEBUG=INFO (needs 2 GPUs): the transports
#                  NCCL chose go to nccl/transports.txt and must all be P2P on one node (not SHM,
#                  not NET), over NVLink (graph type NVL) when nvidia-smi topo shows NVLink
#   nsys/       6. an nsys profile of one training pass on Zipf data, 1 GPU (when nsys exists),
#                  with its kernel / API / memcpy summaries and the time per GPUBox NVTX range
#                  (the step's phases, begin_pass, end_pass, the next pass's card work)
#   step/       7. `gpubox_bench step --json` per card count: host syncs, allocations, copies,
#                  launches and collectives per training step (limits: <= 2 syncs, 0 allocations,
#                  0 pageable copies, 4 collectives; no allocation or pinned regrowth in any step
#                  of the first pass either), step time p50/p99, the card memory
#                  high-water mark and examples/s
#   bench/      8. a benchmark per card count: gpubox_train on generated data with
#                  FLAGS_selected_gpus=0 / 0,1 / 0,1,2,3 / ... up to the GPUs present: cards,
#                  examples/s, per card, scaling ips(C) / (C * ips(1)), AUC, step time p50/p99,
#                  card memory high-water mark (the device layer's; with a GPU also nvidia-smi's
#                  memory.used, sampled) (results.tsv)
#   varying/    9. training on data whose keys per line vary (gpubox_data gen --keys_per_slot,
#                  --keys-per-slot) on 1 card and on the most cards, every step's buffers sized
#                  before the pass (pass_step_allocations 0); with --soak S also a soak run on
#                  the most cards for S seconds, pass after pass, on that data
#   summary.txt one line per item: PASS, FAIL or SKIP with the reason. Works on 1 GPU (what
#               needs more is skipped) and on 8.
# A training run whose output stays silent for --hang-timeout seconds, or any run or test past its
# limit, is stopped after the stacks of every thread of it (gdb, else eu-stack, plus the kernel's view
# of each thread), the kernel's NVIDIA Xid lines (dmesg) and nvidia-smi are written next to its
# log (<log>.hang.txt); it counts as FAIL.
#
# usage: scripts/gpu_check.sh [--cards 1,2,4] [--lines N] [--epochs E] [--batch B] [--max-steps S]
#                             [--out DIR] [--skip-tests] [--skip-sanitizer] [--skip-nccl]
#                             [--skip-nsys] [--skip-step] [--skip-bench] [--test-timeout S]
#                             [--sanitizer-timeout S] [--run-timeout S] [--keep-data]
#                             [--no-link] [--bin DIR] [--keys-per-slot MIN:MAX] [--skip-varying]
#                             [--soak S] [--hang-timeout S] [--sanitizer-tests LIST] [--tests LIST]
#                             [--dry-run]
#   --cards LIST      card counts to benchmark (default: 1, 2, 4, ... and the number of GPUs present)
#   --lines N         training lines generated (default 1000000; held-out test set: N/10 more)
#   --epochs E        passes over the data per run (default 2; the table shows the last pass, whose
#                     keys are already on the cards, and the test AUC after it)
#   --batch B         instances per card per step (default 2048, runner.train_batch_size)
#   --max-steps S     refuse runs longer than S steps on one card (default 5000)
#   --out DIR         the output folder (default ./gpu_check.<UTC time>)
#   --skip-*          leave out an item (it shows as SKIP in summary.txt)
#   --test-timeout S  limit per test binary (default 600); --sanitizer-timeout S: per sanitized
#                     test binary (default 3600); --run-timeout S: per training run (default 900)
#   --keep-data       keep the generated data (default: deleted on exit; it lives under --out)
#   --no-link         do not create the tests' compiled-in source path (see below); those tests are skipped
#   --bin DIR         take the binaries from DIR instead of the bundle's bin/ (e.g. a cpu build, with
#                     --cards: then the "cards" are simulated, no GPU is needed, and the items that
#                     need a GPU are skipped)
#   --keys-per-slot MIN:MAX  keys in each slot of a line of item 9's data (default 0:3)
#   --soak S          item 9 also trains on the most cards for S seconds, pass after pass, and
#                     reports step times and memory of the first and last pass (default 0: none)
#   --hang-timeout S  seconds a gpubox_train run may print nothing before it counts as hung
#                     (default 300; tests, sanitized runs, nsys, gpubox_bench: only their limit)
#   --sanitizer-tests LIST  comma-separated test binaries item 4 sanitizes (default: the step's)
#   --tests LIST      comma-separated test binaries item 3 runs, in that order (default: every bin/*_test,
#                     by name); a short lease runs the step's tests first this way
#   --dry-run         run what needs no GPU (data, training and step counts on --bin's simulated
#                     cards) and print the commands of what needs one instead of running them
# Some tests open files through absolute paths of the machine that built the bundle (its source
# folder's configs/, its build-cuda/bin/ tools); test_paths.txt lists them. When that source folder
# does not exist here, a symlink to the bundle is made in its place for the run and removed on exit.
# Exit status: 0 when no item failed (skipped items are fine).
set -euo pipefail

usage() { sed -n '/^# usage:/,/^# Exit status/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }
die() { echo "gpu_check: error: $*" >&2; exit 1; }
note() { echo "gpu_check: $*"; }

root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/lib/gpu_check_lib.sh
. "$root/scripts/lib/gpu_check_lib.sh"
bin="$root/bin"
custom_bin=0
cards_arg=""
lines=1000000
epochs=2
batch=2048
max_steps=5000
out=""
run_tests=1
run_sanitizer=1
run_nccl=1
run_nsys=1
run_step=1
run_bench=1
test_timeout=600
sanitizer_timeout=3600
run_timeout=900
keep_data=0
link=1
keys_per_slot="0:3"
soak_seconds=0
hang_timeout=300
only_tests=""
sanitizer_tests="hash_table_test,card_store_test,row_pool_test,device_test,key_dedup_test,heter_comm_test,segment_reduce_test,trainer_nn_test,trainer_metrics_test,step_accounting_test"
dry_run=0
run_varying=1
need_value() { (($2 >= 2)) || die "$1 needs a value"; }
while (($#)); do
  case "$1" in
    --cards) need_value "$1" $#; cards_arg="$2"; shift 2 ;;
    --lines) need_value "$1" $#; lines="$2"; shift 2 ;;
    --epochs) need_value "$1" $#; epochs="$2"; shift 2 ;;
    --batch) need_value "$1" $#; batch="$2"; shift 2 ;;
    --max-steps) need_value "$1" $#; max_steps="$2"; shift 2 ;;
    --out) need_value "$1" $#; out="$2"; shift 2 ;;
    --skip-tests) run_tests=0; shift ;;
    --skip-sanitizer) run_sanitizer=0; shift ;;
    --skip-nccl) run_nccl=0; shift ;;
    --skip-nsys) run_nsys=0; shift ;;
    --skip-step) run_step=0; shift ;;
    --skip-bench) run_bench=0; shift ;;
    --test-timeout) need_value "$1" $#; test_timeout="$2"; shift 2 ;;
    --sanitizer-timeout) need_value "$1" $#; sanitizer_timeout="$2"; shift 2 ;;
    --run-timeout) need_value "$1" $#; run_timeout="$2"; shift 2 ;;
    --keep-data) keep_data=1; shift ;;
    --no-link) link=0; shift ;;
    --bin) need_value "$1" $#; bin="$2"; custom_bin=1; shift 2 ;;
    --keys-per-slot) need_value "$1" $#; keys_per_slot="$2"; shift 2 ;;
    --soak) need_value "$1" $#; soak_seconds="$2"; shift 2 ;;
    --hang-timeout) need_value "$1" $#; hang_timeout="$2"; shift 2 ;;
    --sanitizer-tests) need_value "$1" $#; sanitizer_tests="$2"; shift 2 ;;
    --tests) need_value "$1" $#; only_tests="$2"; shift 2 ;;
    --skip-varying) run_varying=0; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "gpu_check: unknown argument '$1'" >&2; usage ;;
  esac
done
for pair in "--lines:$lines" "--epochs:$epochs" "--batch:$batch" "--max-steps:$max_steps" \
            "--test-timeout:$test_timeout" "--sanitizer-timeout:$sanitizer_timeout" \
            "--run-timeout:$run_timeout" "--hang-timeout:$hang_timeout"; do
  [[ "${pair#*:}" =~ ^[1-9][0-9]*$ ]] || die "${pair%%:*} must be a positive whole number, got '${pair#*:}'"
done
[[ "$soak_seconds" =~ ^[0-9]+$ ]] || die "--soak must be a whole number of seconds, got '$soak_seconds'"
[[ "$keys_per_slot" =~ ^[0-9]+(:[0-9]+)?$ ]] || die "--keys-per-slot must look like 0:3, got '$keys_per_slot'"
[[ "$sanitizer_tests" =~ ^[A-Za-z0-9_]+(,[A-Za-z0-9_]+)*$ ]] || die "--sanitizer-tests must look like a_test,b_test, got '$sanitizer_tests'"
if ((dry_run)) && [ -z "$cards_arg" ] && ! command -v nvidia-smi >/dev/null 2>&1; then cards_arg="1,2"; fi
if [ -n "$cards_arg" ]; then
  [[ "$cards_arg" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "--cards must look like 1,2,4, got '$cards_arg'"
fi
if ((!custom_bin)) && [ ! -d "$bin" ]; then
  die "no bin/ in $root: run the copy of this script inside a bundle (scripts/bundle_cuda.sh makes one), or give --bin DIR"
fi
[ -d "$bin" ] || die "--bin '$bin' is not a folder"
bin="$(cd "$bin" && pwd)"
for t in gpubox_train gpubox_data gpubox_bench; do [ -x "$bin/$t" ] || die "$bin/$t is missing"; done
[ -f "$root/configs/config_synthetic.yaml" ] || die "$root/configs/config_synthetic.yaml is missing (not a GPUBox bundle?)"
[ -n "$out" ] || out="$PWD/gpu_check.$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out" || die "--out '$out': cannot create the folder"
out="$(cd "$out" && pwd)"
data="$out/data"
summary="$out/summary.txt"
: > "$summary"

# ---- cleanup: the running child, the compiled-in-path symlink, generated data ------------------
made_link=""
made_dirs=()
cleanup() {
  gc_stop_child
  gc_gpu_memory_stop /dev/null >/dev/null
  if [ -n "$made_link" ] && [ -L "$made_link" ]; then rm -f "$made_link"; fi
  local i
  for ((i = ${#made_dirs[@]} - 1; i >= 0; i--)); do rmdir "${made_dirs[$i]}" 2>/dev/null || true; done
  if ((!keep_data)) && [ -d "$data" ]; then rm -rf "$data"; fi
}
trap cleanup EXIT
trap 'echo "gpu_check: interrupted" >&2; exit 130' INT TERM

# run_limited LIMIT LOG CMD...: CMD (in folder $RUN_CWD when set), output to LOG, stopped past
# LIMIT seconds (status 124) or, when $RUN_HANG is set, after RUN_HANG seconds of silence (125),
# every thread's stack first written to LOG.hang.txt (gc_run_watched); interruptible (the EXIT
# trap stops it); returns its status. run_training: the same with --hang-timeout's silence check,
# for gpubox_train runs, which print a progress line every runner.print_interval steps (tests,
# sanitized runs, nsys and gpubox_bench may stay silent long: only their limit applies).
run_limited() {
  gc_run_watched "$1" "${RUN_HANG:-0}" "$2" "${@:3}"
}
run_training() {
  RUN_HANG="$hang_timeout" run_limited "$@"
}
# why_failed RC LIMIT: what a status of run_limited means.
why_failed() {
  case "$1" in
    124) echo "timed out after ${2}s, stacks in the log's .hang.txt" ;;
    125) echo "hung (no output for ${hang_timeout}s), stacks in the log's .hang.txt" ;;
    *) echo "exit $1" ;;
  esac
}
# would_run ITEM CMD...: --dry-run's stand-in for an item that needs a GPU: prints the command.
would_run() {
  local item="$1"
  shift
  echo "gpu_check: dry run: would run: $(printf '%q ' "$@")"
  record SKIP "$item" "dry run (command printed above)"
}

# record STATUS ITEM DETAIL: one line of summary.txt (PASS, FAIL or SKIP).
failures=0
record() {
  printf '%-4s  %-34s  %s\n' "$1" "$2" "$3" >> "$summary"
  [ "$1" != FAIL ] || failures=$((failures + 1))
}
# first_tool NAME: NAME from PATH or the usual CUDA toolkit folders ("" when absent).
first_tool() {
  local t
  t="$(command -v "$1" 2>/dev/null || true)"
  if [ -z "$t" ]; then
    for d in "${CUDA_HOME:-}" /usr/local/cuda /usr/local/cuda-13* /opt/nvidia/nsight-systems/*; do
      [ -n "$d" ] && [ -x "$d/bin/$1" ] && { t="$d/bin/$1"; break; }
    done
  fi
  echo "$t"
}

echo "================ GPUBox GPU check  $(date -u +%Y-%m-%dT%H:%M:%SZ)"
if [ -f "$root/MANIFEST.txt" ]; then sed -n '1,5p' "$root/MANIFEST.txt"; fi
echo "host: $(hostname), $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //'), $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) memory"
echo "binaries: $bin"
echo "output: $out"

# ---- 1. GPUs -------------------------------------------------------------------------------------
echo
echo "================ 1. device query"
mkdir -p "$out/device"
ngpu=0
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi | tee "$out/device/nvidia-smi.txt" || die "nvidia-smi failed: is the NVIDIA driver loaded?"
  nvidia-smi -q > "$out/device/nvidia-smi-q.txt" 2>&1 || true
  query="$(nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv,noheader 2>/dev/null ||
           nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader)"
  echo "index, name, compute capability, memory, driver"
  echo "$query" | tee "$out/device/gpus.csv"
  ngpu="$(grep -c . <<<"$query" || true)"
  ((ngpu > 0)) || die "nvidia-smi lists no GPU"
  echo "topology (nvidia-smi topo -m):"
  nvidia-smi topo -m 2>&1 | tee "$out/device/topo.txt" || true
  # The bundle's kernels are built for the archs in MANIFEST.txt (sm_XX + PTX of the newest):
  # a GPU of a lower compute capability cannot run them.
  archs="$(sed -n 's/^cuda archs: *\([0-9;]*\).*/\1/p' "$root/MANIFEST.txt" 2>/dev/null || true)"
  if [ -n "$archs" ] && ((!custom_bin)); then
    min_arch="$(tr ';' '\n' <<<"$archs" | sed 's/[^0-9].*//' | sort -n | head -n 1)"
    while IFS=, read -r idx name cc _; do
      cc="$(tr -d ' .' <<<"$cc")"
      if [[ "$cc" =~ ^[0-9]+$ ]] && ((cc < min_arch)); then
        echo "gpu_check: warning: GPU $idx ($name) has compute capability $cc < $min_arch, the lowest arch" \
             "built into this bundle ($archs): rebuild with scripts/bundle_cuda.sh --archs \"$cc;$archs\"" >&2
      fi
    done <<<"$query"
  fi
  record PASS "device query" "$ngpu GPU(s): $(cut -d, -f2 <<<"$query" | sort | uniq -c | sed 's/^ *//' | paste -sd';')"
elif [ -n "$cards_arg" ]; then
  note "no nvidia-smi: no GPU summary (running --cards $cards_arg on what --bin holds)"
  record SKIP "device query" "no nvidia-smi (no GPU): simulated cards of --bin"
else
  die "no nvidia-smi: this check needs an NVIDIA GPU machine with its driver (or --bin <cpu build> --cards LIST)"
fi

# ---- 2. shared libraries (before anything runs a binary) ------------------------------------------------------------------------
echo
echo "================ 2. shared libraries (bundle lib/ + the machine's driver, cuBLAS, NCCL)"
missing_libs() {  # the "not found" sonames of every binary, and version errors
  local f
  for f in "$bin"/*; do
    if [ ! -x "$f" ] || [ ! -f "$f" ]; then continue; fi
    ldd "$f" 2>&1 | awk '/not found/ { print }' || true
  done | sort -u
}
missing="$(missing_libs)"
if [ -n "$missing" ]; then
  # Look for the missing libraries where CUDA toolkits, NCCL packages and pip wheels put them.
  cands=()
  for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13* /opt/cuda /usr/lib/x86_64-linux-gnu \
           /usr/lib64 /usr/local/lib /usr/local/nccl /opt/nccl; do
    [ -n "$d" ] || continue
    for sub in lib64 lib targets/x86_64-linux/lib ""; do
      [ -d "$d/$sub" ] && cands+=("$d/$sub")
    done
  done
  while IFS= read -r d; do cands+=("$d"); done < <(
    find /usr/lib/python3*/ /usr/local/lib/python3*/ "$HOME"/.local/lib/python3*/ /opt/conda/lib/python3*/ \
         /opt/*/.venv/lib/python3*/ /opt/*/lib/python3*/ \
         -maxdepth 5 -type d -path '*nvidia/*/lib' 2>/dev/null || true)
  extra=""
  while read -r soname _; do
    case "$soname" in lib*.so*) ;; *) continue ;; esac
    for d in "${cands[@]}"; do
      if [ -e "$d/$soname" ]; then
        case ":$extra:" in *":$d:"*) ;; *) extra="${extra:+$extra:}$d" ;; esac
        break
      fi
    done
  done < <(grep -v 'version' <<<"$missing" | awk '{ print $1 }')
  if [ -n "$extra" ]; then
    export LD_LIBRARY_PATH="$root/lib:$extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    note "found the missing libraries under $extra; LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    missing="$(missing_libs)"
  fi
fi
if [ -n "$missing" ]; then
  printf '%s\n' "$missing" | awk '{ print "  " $0 }'
  record FAIL "shared libraries" "unresolved: $(awk '{ print $1 }' <<<"$missing" | sort -u | paste -sd' ')"
  die "unresolved shared libraries (above). libcuda.so.1 comes with the NVIDIA driver; libcublas.so.13 and
  libcublasLt.so.13 with the CUDA 13 toolkit (or pip nvidia-cublas); libnccl.so.2 with NCCL 2 (libnccl2 package
  or pip nvidia-nccl-cu13). Install them or put their folder in LD_LIBRARY_PATH. A 'version ... not found' line
  means this system's glibc/libstdc++ is older than the bundle needs (see MANIFEST.txt)."
fi
ldd "$bin/gpubox_train" | awk '{ printf "  %-26s %s\n", $1, $3 }' | grep -E 'cud|cublas|nccl|'"$root"'/lib' || true
note "every binary's libraries resolve"
record PASS "shared libraries" "every binary's libraries resolve"

echo
echo "================ 2b. peer-access matrix (gpubox_bench devices)"
if run_limited 300 "$out/device/gpubox_devices.txt" "$bin/gpubox_bench" devices &&
   run_limited 300 "$out/device/gpubox_devices.json" "$bin/gpubox_bench" devices --json; then
  cat "$out/device/gpubox_devices.txt"
  if grep -q '"peer_access"' "$out/device/gpubox_devices.json"; then
    zeros="$(grep -o '"peer_access": .*' "$out/device/gpubox_devices.json" | grep -o '0' | wc -l || true)"
    record PASS "peer access matrix" "$( ((zeros == 0)) && echo "every pair direct" || echo "$zeros pair(s) without P2P: NCCL routes them through the host")"
  else
    record PASS "peer access matrix" "simulated cards (cpu build): one host memory"
  fi
else
  tail -n 5 "$out/device/gpubox_devices.txt" | sed 's/^/  | /'
  record FAIL "peer access matrix" "gpubox_bench devices failed (device/gpubox_devices.txt)"
fi

# ---- 3. unit tests -------------------------------------------------------------------------------
declare -A skip_reason=()
if ((run_tests)); then
  echo
  echo "================ 3. unit tests (bin/*_test, GPUBOX_DEVICE_CHECK=1)"
  # Tests that open compiled-in absolute paths of the build machine (test_paths.txt).
  if ((!custom_bin)) && [ -f "$root/test_paths.txt" ]; then
    src="$(awk -F'\t' '$1 == "source_dir" { print $2 }' "$root/test_paths.txt")"
    if [ -n "$src" ] && [ ! -e "$src" ] && [ ! -L "$src" ] && ((link)); then
      parent="$(dirname "$src")"
      missing_parents=()
      p="$parent"
      while [ ! -d "$p" ]; do missing_parents=("$p" "${missing_parents[@]}"); p="$(dirname "$p")"; done
      if mkdir -p "$parent" 2>/dev/null && ln -s "$root" "$src" 2>/dev/null; then
        made_dirs=("${missing_parents[@]}")
        made_link="$src"
        note "linked $src -> $root for the tests' compiled-in paths (removed on exit)"
      else
        note "cannot create $src (permissions?): the tests that need it are skipped"
      fi
    fi
    while IFS=$'\t' read -r macro path test; do
      case "$macro" in '#'*|source_dir|'') continue ;; esac
      probe="$path"
      [ "$macro" = GPUBOX_SOURCE_DIR ] && probe="$path/configs/config_gpubox.yaml"
      if [ ! -e "$probe" ]; then skip_reason["$test"]="needs $probe ($macro, compiled in)"; fi
    done < "$root/test_paths.txt"
  fi
  mkdir -p "$out/tests"
  printf '%-28s %-8s %8s  %s\n' test result seconds detail
  n_pass=0 n_fail=0 n_skip=0 skipped_cases=0
  test_bins=("$bin"/*_test)
  if [ -n "$only_tests" ]; then
    IFS=, read -r -a test_bins <<<"$only_tests"
    test_bins=("${test_bins[@]/#/$bin/}")
  fi
  for t in "${test_bins[@]}"; do
    if [ ! -x "$t" ]; then
      [ -z "$only_tests" ] || record FAIL "test $(basename "$t")" "--tests names $t, which is not an executable"
      continue
    fi
    name="$(basename "$t")"
    if [ -n "${skip_reason[$name]:-}" ]; then
      printf '%-28s %-8s %8s  %s\n' "$name" SKIPPED - "${skip_reason[$name]}"
      n_skip=$((n_skip + 1)); continue
    fi
    work="$out/tests/$name.work"
    mkdir -p "$work"
    start=$(date +%s.%N)
    rc=0
    GPUBOX_DEVICE_CHECK=1 RUN_CWD="$work" TMPDIR="$work" run_limited "$test_timeout" "$out/tests/$name.log" "$t" --gtest_color=no || rc=$?
    secs="$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')"
    rm -rf "$work"
    summary_line="$(grep -E '^\[  PASSED  \]|^\[  SKIPPED \] [0-9]+ test|^\[  FAILED  \] [0-9]+ test' "$out/tests/$name.log" | tr '\n' ' ' || true)"
    skipped_here="$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$out/tests/$name.log" | head -n 1)"
    skipped_cases=$((skipped_cases + ${skipped_here:-0}))
    if ((rc == 0)); then
      printf '%-28s %-8s %8s  %s\n' "$name" ok "$secs" "$summary_line"
      n_pass=$((n_pass + 1))
    else
      why="$(why_failed "$rc" "$test_timeout")"
      printf '%-28s %-8s %8s  %s %s\n' "$name" FAILED "$secs" "$why;" "$summary_line"
      # The first failure message and up to 5 failing test names (all of it is in the log).
      grep -m1 -A1 ': Failure$' "$out/tests/$name.log" | sed 's/^/      | /' || true
      awk '/listed below:/ { f = 1; next } f && /^\[  FAILED  \]/ { n++; if (n <= 5) print "      " $0 }
           END { if (n > 5) printf "      ... and %d more\n", n - 5 }' "$out/tests/$name.log"
      grep -q ': Failure$' "$out/tests/$name.log" || tail -n 5 "$out/tests/$name.log" | sed 's/^/      | /'
      n_fail=$((n_fail + 1))
      record FAIL "test $name" "$why (tests/$name.log)"
    fi
  done
  # Why test cases skipped (card counts the machine lacks, in-process-only cases).
  grep -h -A1 '^\[  SKIPPED \] [A-Za-z]' "$out"/tests/*.log 2>/dev/null | grep -o 'needs [0-9]* GPUs, this machine has [0-9]*\|in-process communicator only' |
    sort | uniq -c | sed 's/^ */  skipped: /' || true
  echo "tests: $n_pass binaries passed, $n_fail failed, $n_skip not run; $skipped_cases test cases skipped (logs: $out/tests/)"
  ((n_fail > 0)) || record PASS "unit tests" "$n_pass binaries passed, $n_skip not run, $skipped_cases cases skipped (see tests/*.log)"
else
  record SKIP "unit tests" "--skip-tests"
fi

# ---- data for the training runs ------------------------------------------------------------------
test_lines=$((lines / 10 > 0 ? lines / 10 : 1))
data_ready=0
make_data() {
  ((data_ready)) && return 0
  mkdir -p "$data" "$out/bench"
  note "generating $lines training + $test_lines held-out lines (gpubox_data gen, seed 1, Zipf 1.1 keys) in $data"
  run_limited "$run_timeout" "$out/bench/gen.log" "$bin/gpubox_data" gen --out "$data/train" --lines "$lines" \
      --files 8 --seed 1 --zipf 1.1 || die "gpubox_data gen failed: $(tail -n 3 "$out/bench/gen.log")"
  run_limited "$run_timeout" "$out/bench/gen_test.log" "$bin/gpubox_data" gen --out "$data/test" \
      --lines "$test_lines" --files 1 --seed 1 --zipf 1.1 --first_line "$lines" ||
      die "gpubox_data gen (test) failed: $(tail -n 3 "$out/bench/gen_test.log")"
  cat "$out/bench/gen.log"
  data_ready=1
}
# train CARDS LOG [extra -o overrides...]: gpubox_train on the generated data, one pass.
train_once() {
  local cards="$1" log="$2"
  shift 2
  FLAGS_selected_gpus="$(seq -s, 0 $((cards - 1)))" run_training "$run_timeout" "$log" "$bin/gpubox_train" \
      --config "$root/configs/config_synthetic.yaml" -o runner.train_data_dir="$data/train" \
      -o runner.test_data_dir= -o runner.model_save_path= -o runner.save_mode=none \
      -o runner.epochs=1 -o runner.train_batch_size="$batch" "$@"
}
# make_varying_data: item 9's data (and the sanitized training run's): --lines / 10 lines whose
# slots hold --keys-per-slot keys each, so the keys per batch vary.
varying_ready=0
make_varying_data() {
  ((varying_ready)) && return 0
  local n=$((lines / 10 > 1000 ? lines / 10 : 1000))
  mkdir -p "$data" "$out/varying"
  note "generating $n lines with --keys_per_slot $keys_per_slot (gpubox_data gen, seed 2) in $data/varying"
  run_limited "$run_timeout" "$out/varying/gen.log" "$bin/gpubox_data" gen --out "$data/varying" --lines "$n" \
      --files 4 --seed 2 --zipf 1.1 --keys_per_slot "$keys_per_slot" ||
      die "gpubox_data gen --keys_per_slot failed: $(tail -n 3 "$out/varying/gen.log")"
  cat "$out/varying/gen.log"
  varying_ready=1
}
# Card counts the machine has (a cpu build with --cards simulates them).
max_cards="$ngpu"
if ((ngpu == 0)) && [ -n "$cards_arg" ]; then max_cards="$(tr ',' '\n' <<<"$cards_arg" | sort -n | tail -n 1)"; fi

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
        "${sanitizer:-compute-sanitizer}" --tool "$tool" --error-exitcode 97 "$@"
    return 0
  fi
  note "$item"
  GPUBOX_DEVICE_CHECK=1 TMPDIR="$out/sanitizer" run_limited "$sanitizer_timeout" "$log" "$sanitizer" \
      --tool "$tool" --error-exitcode 97 --log-file "$log.report" "$@" || rc=$?
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

# ---- 5. 2-card run with NCCL_DEBUG=INFO ----------------------------------------------------------
if ((run_nccl)); then
  echo
  echo "================ 5. 2-card run (NCCL_DEBUG=INFO)"
  if ((max_cards < 2)); then
    record SKIP "2-card run" "needs 2 GPUs, this machine has $max_cards"
  else
    make_data
    mkdir -p "$out/nccl"
    rc=0
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P,GRAPH train_once 2 "$out/nccl/train.log" -o runner.metrics_path="$out/nccl/metrics.jsonl" || rc=$?
    grep -E '^pass: ' "$out/nccl/train.log" | sed 's/, ne:.*//; s/^/  /' || true
    if ((rc == 0)) && grep -q '^pass: 0' "$out/nccl/train.log"; then
      record PASS "2-card run" "nccl/train.log"
    else
      tail -n 8 "$out/nccl/train.log" | sed 's/^/  | /'
      record FAIL "2-card run" "$(why_failed "$rc" "$run_timeout") (nccl/train.log)"
    fi
    # Which transport NCCL took between the two GPUs: on one node every connection must be P2P
    # (NVLink or PCIe), never SHM (through host memory) or NET; NVLink when the topology has it.
    if ((ngpu < 2)); then
      record SKIP "NCCL transports" "simulated cards: no NCCL"
    else
      nvlink=0
      gc_topo_has_nvlink "$out/device/topo.txt" && nvlink=1
      trc=0
      gc_nccl_transports "$out/nccl/train.log" "$nvlink" > "$out/nccl/transports.txt" || trc=$?
      sed 's/^/  /' "$out/nccl/transports.txt"
      found="$(paste -sd';' "$out/nccl/transports.txt" | sed 's/;/, /g')"
      case "$trc" in
        0) record PASS "NCCL transports" "$found" ;;
        2) record FAIL "NCCL transports" "no NCCL connection line in nccl/train.log (NCCL_DEBUG=INFO)" ;;
        *) record FAIL "NCCL transports" "$found: want P2P only$( ((nvlink)) && echo ", over NVLink (graph type NVL)") on one node" ;;
      esac
    fi
  fi
else
  record SKIP "2-card run" "--skip-nccl"
fi

# ---- 6. nsys profile of one pass ----------------------------------------------------------------
if ((run_nsys)); then
  echo
  echo "================ 6. nsys profile of one pass (1 card, Zipf data)"
  nsys="$(first_tool nsys)"
  if ((dry_run)); then
    would_run "nsys profile" "${nsys:-nsys}" profile --trace=cuda,nvtx,osrt --sample=none -o "$out/nsys/one_pass" \
        "$bin/gpubox_train" --config "$root/configs/config_synthetic.yaml" -o runner.epochs=1
  elif ((ngpu == 0)); then
    record SKIP "nsys profile" "no GPU"
  elif [ -z "$nsys" ]; then
    record SKIP "nsys profile" "nsys is not installed (Nsight Systems)"
  else
    make_data
    mkdir -p "$out/nsys"
    rc=0
    FLAGS_selected_gpus=0 run_limited "$run_timeout" "$out/nsys/profile.log" "$nsys" profile \
        --trace=cuda,nvtx,osrt --sample=none --force-overwrite=true -o "$out/nsys/one_pass" \
        "$bin/gpubox_train" --config "$root/configs/config_synthetic.yaml" \
        -o runner.train_data_dir="$data/train" -o runner.test_data_dir= -o runner.model_save_path= \
        -o runner.save_mode=none -o runner.epochs=1 -o runner.train_batch_size="$batch" \
        -o runner.metrics_path= || rc=$?
    if ((rc == 0)); then
      run_limited "$run_timeout" "$out/nsys/stats.txt" "$nsys" stats \
          --report cuda_gpu_kern_sum,cuda_api_sum,cuda_gpu_mem_time_sum --format column \
          "$out/nsys/one_pass.nsys-rep" || true
      # Time per GPUBox NVTX range (device::ProfileRange: the step's phases, the pass boundary);
      # the report is nvtx_sum in current nsys, nvtxsum in older ones.
      run_limited "$run_timeout" "$out/nsys/nvtx.txt" "$nsys" stats --report nvtx_sum --format column \
          "$out/nsys/one_pass.nsys-rep" ||
        run_limited "$run_timeout" "$out/nsys/nvtx.txt" "$nsys" stats --report nvtxsum --format column \
            "$out/nsys/one_pass.nsys-rep" || true
      phases="$(grep -oE 'begin_pass|end_pass|next pass card work|dense forward/backward|dense all-reduce|dense update|upload|pull|push|step' \
                "$out/nsys/nvtx.txt" 2>/dev/null | sort -u | paste -sd, || true)"
      sed -n '1,30p' "$out/nsys/nvtx.txt" 2>/dev/null | sed 's/^/  /' || true
      if [ -n "$phases" ]; then
        record PASS "nsys profile" "nsys/one_pass.nsys-rep; NVTX ranges: $phases (nsys/nvtx.txt)"
      else
        record FAIL "nsys profile" "no GPUBox NVTX range in the profile (nsys/nvtx.txt)"
      fi
    else
      tail -n 5 "$out/nsys/profile.log" | sed 's/^/  | /'
      record FAIL "nsys profile" "exit $rc (nsys/profile.log)"
    fi
  fi
else
  record SKIP "nsys profile" "--skip-nsys"
fi

# Card counts of the step counts and the benchmark.
if [ -n "$cards_arg" ]; then
  IFS=, read -r -a counts <<<"$cards_arg"
else
  counts=()
  for ((c = 1; c <= ngpu; c *= 2)); do counts+=("$c"); done
  ((ngpu == 0)) || [ "${counts[-1]}" = "$ngpu" ] || counts+=("$ngpu")
fi
if ((ngpu > 0)); then
  for c in "${counts[@]}"; do ((c <= ngpu)) || die "--cards asks for $c cards, but nvidia-smi lists $ngpu GPUs"; done
fi

# ---- 7. per-step device counts ------------------------------------------------------------------
if ((run_step)) && ((${#counts[@]} > 0)); then
  echo
  echo "================ 7. per-step device counts (gpubox_bench step --json, default model, batch 512)"
  mkdir -p "$out/step"
  : > "$out/step/step.jsonl"
  for c in "${counts[@]}"; do
    rc=0
    run_limited "$run_timeout" "$out/step/step.$c.log" "$bin/gpubox_bench" step --cards "$c" --json || rc=$?
    line="$(grep '"bench": "step"' "$out/step/step.$c.log" || true)"
    if ((rc != 0)) || [ -z "$line" ]; then
      tail -n 5 "$out/step/step.$c.log" | sed 's/^/  | /'
      record FAIL "step counts, $c card(s)" "$(why_failed "$rc" "$run_timeout") (step/step.$c.log)"
      continue
    fi
    echo "$line" >> "$out/step/step.jsonl"
    num() { grep -o "\"$1\": [-0-9.e+]*" <<<"$line" | awk '{ print $2 }'; }
    printf '  %d card(s): host_syncs %s, allocations %s, pageable_copies %s, pinned_copies %s, launches %s, collectives %s outside graphs, graph launches %s of %s nodes per step; %s examples/s\n' \
        "$c" "$(num host_syncs_per_step)" "$(num allocations_per_step)" "$(num pageable_copies_per_step)" \
        "$(num pinned_copies_per_step)" "$(num launches_per_step)" "$(num collectives_per_step)" \
        "$(num graph_launches_per_step)" "$(num graph_nodes_per_step)" "$(num examples_per_sec)"
    printf '  %d card(s): step time p50 %s ms, p99 %s ms, max %s ms; card memory high-water mark %s MiB\n' \
        "$c" "$(num step_ms_p50)" "$(num step_ms_p99)" "$(num step_ms_max)" "$(num card_memory_peak_mb)"
    # The first pass's steps, its first ones included, are sized before it (no allocation, no
    # pinned regrowth: a cudaFreeHost in a step can deadlock against a peer's NCCL kernel).
    verdict="$(awk -v s="$(num host_syncs_per_step)" -v a="$(num allocations_per_step)" \
                   -v p="$(num pageable_copies_per_step)" -v k="$(num collectives_per_step)" \
                   -v g="$(num graph_launches_per_step)" \
                   -v eg="$(num eval_graph_launches_per_step)" -v el="$(num eval_launches_per_step)" \
                   -v ek="$(num eval_collectives_per_step)" \
                   -v fa="$(num first_pass_step_allocations)" -v fp="$(num first_pass_step_pinned_allocations)" 'BEGIN {
      bad = ""
      if (fa > 0) bad = bad " first pass step allocations " fa " > 0;"
      if (fp > 0) bad = bad " first pass step pinned allocations " fp " > 0;"
      if (s > 2) bad = bad " host_syncs " s " > 2;"
      if (a > 0) bad = bad " allocations " a " > 0;"
      if (p > 0) bad = bad " pageable_copies " p " > 0;"
      # A step is 1 graph launch ("train step": sparse pull, dense step, status copy, sparse
      # push, dense update), every collective inside it.
      if (g != 1) bad = bad " graph launches " g " != 1;"
      if (k != 0) bad = bad " collectives outside graphs " k " != 0;"
      # An evaluation step too ("eval step": sparse lookup, forward, metrics, the slot copies).
      if (eg != 1) bad = bad " evaluation graph launches " eg " != 1;"
      if (el != 0) bad = bad " evaluation launches outside graphs " el " != 0;"
      if (ek != 0) bad = bad " evaluation collectives outside graphs " ek " != 0;"
      print bad }')"
    if [ -z "$verdict" ]; then
      record PASS "step counts, $c card(s)" "syncs $(num host_syncs_per_step), allocations 0, pageable 0, 1 graph launch of $(num graph_nodes_per_step) nodes (every collective inside), $(num launches_per_step) launches outside, evaluation 1 graph launch of $(num eval_graph_nodes_per_step) nodes, $(num examples_per_sec) ex/s, step p50/p99 $(num step_ms_p50)/$(num step_ms_p99) ms, card memory $(num card_memory_peak_mb) MiB"
    else
      record FAIL "step counts, $c card(s)" "$verdict (step/step.jsonl)"
    fi
  done
else
  record SKIP "step counts" "$( ((run_step)) && echo "no card count" || echo "--skip-step")"
fi

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

echo
echo "================ summary ($summary)"
cat "$summary"
if ((failures)); then
  echo "gpu_check: FAILED ($failures item(s); details in $out)"
  exit 1
fi
echo "gpu_check: all passed (skipped items say why)"
