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
#   sanitizer/  4. compute-sanitizer memcheck and racecheck over the hash table, card store, row
#                  pool, dense model and metrics tests (when compute-sanitizer is installed)
#   nccl/       5. a 2-card training run with NCCL_DEBUG=INFO (needs 2 GPUs): the transports
#                  NCCL chose (P2P or via host) are extracted to nccl/transports.txt
#   nsys/       6. an nsys profile of one training pass on Zipf data, 1 GPU (when nsys exists),
#                  with its kernel / API / memcpy summaries
#   step/       7. `gpubox_bench step --json` per card count: host syncs, allocations, copies,
#                  launches and collectives per training step (limits: <= 2 syncs, 0 allocations,
#                  0 pageable copies, 4 collectives) and examples/s
#   bench/      8. a benchmark per card count: gpubox_train on generated data with
#                  FLAGS_selected_gpus=0 / 0,1 / 0,1,2,3 / ... up to the GPUs present: cards,
#                  examples/s, per card, scaling ips(C) / (C * ips(1)), AUC (results.tsv)
#   summary.txt one line per item: PASS, FAIL or SKIP with the reason. Works on 1 GPU (what
#               needs more is skipped) and on 8.
#
# usage: scripts/gpu_check.sh [--cards 1,2,4] [--lines N] [--epochs E] [--batch B] [--max-steps S]
#                             [--out DIR] [--skip-tests] [--skip-sanitizer] [--skip-nccl]
#                             [--skip-nsys] [--skip-step] [--skip-bench] [--test-timeout S]
#                             [--sanitizer-timeout S] [--run-timeout S] [--keep-data]
#                             [--no-link] [--bin DIR]
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
# Some tests open files through absolute paths of the machine that built the bundle (its source
# folder's configs/, its build-cuda/bin/ tools); test_paths.txt lists them. When that source folder
# does not exist here, a symlink to the bundle is made in its place for the run and removed on exit.
# Exit status: 0 when no item failed (skipped items are fine).
set -euo pipefail

usage() { sed -n '/^# usage:/,/^# Exit status/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }
die() { echo "gpu_check: error: $*" >&2; exit 1; }
note() { echo "gpu_check: $*"; }

root="$(cd "$(dirname "$0")/.." && pwd)"
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
    -h|--help) usage 0 ;;
    *) echo "gpu_check: unknown argument '$1'" >&2; usage ;;
  esac
done
for pair in "--lines:$lines" "--epochs:$epochs" "--batch:$batch" "--max-steps:$max_steps" \
            "--test-timeout:$test_timeout" "--sanitizer-timeout:$sanitizer_timeout" \
            "--run-timeout:$run_timeout"; do
  [[ "${pair#*:}" =~ ^[1-9][0-9]*$ ]] || die "${pair%%:*} must be a positive whole number, got '${pair#*:}'"
done
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
child=""
made_link=""
made_dirs=()
cleanup() {
  if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null || true; wait "$child" 2>/dev/null || true; fi
  if [ -n "$made_link" ] && [ -L "$made_link" ]; then rm -f "$made_link"; fi
  local i
  for ((i = ${#made_dirs[@]} - 1; i >= 0; i--)); do rmdir "${made_dirs[$i]}" 2>/dev/null || true; done
  if ((!keep_data)) && [ -d "$data" ]; then rm -rf "$data"; fi
}
trap cleanup EXIT
trap 'echo "gpu_check: interrupted" >&2; exit 130' INT TERM

# run_limited LIMIT LOG CMD...: CMD under timeout (in folder $RUN_CWD when set), output to LOG;
# interruptible (the EXIT trap stops it); returns its status.
run_limited() {
  local limit="$1" log="$2" rc=0
  shift 2
  (cd "${RUN_CWD:-.}" && exec timeout -k 10 "$limit" "$@") >"$log" 2>&1 </dev/null &
  child=$!
  wait "$child" || rc=$?
  child=""
  return "$rc"
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
    [ -x "$f" ] && [ -f "$f" ] || continue
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
  echo "$missing" | sed 's/^/  /'
  record FAIL "shared libraries" "unresolved: $(awk '{ print $1 }' <<<"$missing" | sort -u | paste -sd' ')"
  die "unresolved shared libraries (above). libcuda.so.1 comes with the NVIDIA driver; libcublas.so.13 and
  libcublasLt.so.13 with the CUDA 13 toolkit (or pip nvidia-cublas); libnccl.so.2 with NCCL 2 (libnccl2 package
  or pip nvidia-nccl-cu13). Install them or put their folder in LD_LIBRARY_PATH. A 'version ... not found' line
  means this system's glibc/libstdc++ is older than the bundle needs (see MANIFEST.txt)."
fi
for f in "$bin"/gpubox_train; do
  ldd "$f" | awk '{ printf "  %-26s %s\n", $1, $3 }' | grep -E 'cud|cublas|nccl|'"$root"'/lib' || true
done
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
  for t in "$bin"/*_test; do
    [ -x "$t" ] || continue
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
      why="exit $rc"; ((rc == 124 || rc == 137)) && why="timed out after ${test_timeout}s"
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

# ---- 4. compute-sanitizer ------------------------------------------------------------------------
sanitize_targets=(hash_table_test card_store_test row_pool_test trainer_nn_test trainer_metrics_test)
if ((run_sanitizer)); then
  echo
  echo "================ 4. compute-sanitizer (memcheck, racecheck)"
  sanitizer="$(first_tool compute-sanitizer)"
  if ((ngpu == 0)); then
    record SKIP "compute-sanitizer" "no GPU"
  elif [ -z "$sanitizer" ]; then
    record SKIP "compute-sanitizer" "compute-sanitizer is not installed (CUDA toolkit's bin/)"
  else
    mkdir -p "$out/sanitizer"
    for tool in memcheck racecheck; do
      for name in "${sanitize_targets[@]}"; do
        [ -x "$bin/$name" ] || { record SKIP "$tool $name" "no bin/$name"; continue; }
        log="$out/sanitizer/$tool.$name.log"
        rc=0
        note "$tool $name"
        GPUBOX_DEVICE_CHECK=1 TMPDIR="$out/sanitizer" run_limited "$sanitizer_timeout" "$log" "$sanitizer" \
            --tool "$tool" --error-exitcode 97 --log-file "$log.report" "$bin/$name" --gtest_color=no || rc=$?
        errors="$(grep -m1 -o 'ERROR SUMMARY: [0-9]* error[s]*\|RACECHECK SUMMARY: [0-9]* hazard[s]*[^.]*' "$log.report" "$log" 2>/dev/null | head -n 1 || true)"
        if ((rc == 0)); then
          record PASS "$tool $name" "${errors:-no errors}"
        elif ((rc == 124 || rc == 137)); then
          record FAIL "$tool $name" "timed out after ${sanitizer_timeout}s (sanitizer/$tool.$name.log)"
        else
          record FAIL "$tool $name" "exit $rc: ${errors:-see the log} (sanitizer/$tool.$name.log*)"
        fi
      done
    done
  fi
else
  record SKIP "compute-sanitizer" "--skip-sanitizer"
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
  FLAGS_selected_gpus="$(seq -s, 0 $((cards - 1)))" run_limited "$run_timeout" "$log" "$bin/gpubox_train" \
      --config "$root/configs/config_synthetic.yaml" -o runner.train_data_dir="$data/train" \
      -o runner.test_data_dir= -o runner.model_save_path= -o runner.save_mode=none \
      -o runner.epochs=1 -o runner.train_batch_size="$batch" "$@"
}
# Card counts the machine has (a cpu build with --cards simulates them).
max_cards="$ngpu"
if ((ngpu == 0)) && [ -n "$cards_arg" ]; then max_cards="$(tr ',' '\n' <<<"$cards_arg" | sort -n | tail -n 1)"; fi

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
    # Which transport NCCL took between the two GPUs (P2P/CUMEM, P2P/IPC, SHM, via host ...).
    grep -E 'via P2P|via SHM|via NET|P2P/|Channel [0-9]+/[0-9]+ : ' "$out/nccl/train.log" | sort -u > "$out/nccl/transports.txt" || true
    grep -E '^pass: ' "$out/nccl/train.log" | sed 's/, ne:.*//; s/^/  /' || true
    if ((rc == 0)) && grep -q '^pass: 0' "$out/nccl/train.log"; then
      record PASS "2-card run" "$(grep -c . "$out/nccl/transports.txt" || true) NCCL transport lines (nccl/transports.txt)"
    else
      tail -n 8 "$out/nccl/train.log" | sed 's/^/  | /'
      record FAIL "2-card run" "exit $rc (nccl/train.log)"
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
  if ((ngpu == 0)); then
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
      record PASS "nsys profile" "nsys/one_pass.nsys-rep, summaries in nsys/stats.txt"
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
      record FAIL "step counts, $c card(s)" "exit $rc (step/step.$c.log)"
      continue
    fi
    echo "$line" >> "$out/step/step.jsonl"
    num() { grep -o "\"$1\": [-0-9.e+]*" <<<"$line" | awk '{ print $2 }'; }
    printf '  %d card(s): host_syncs %s, allocations %s, pageable_copies %s, pinned_copies %s, launches %s, collectives %s per step; %s examples/s\n' \
        "$c" "$(num host_syncs_per_step)" "$(num allocations_per_step)" "$(num pageable_copies_per_step)" \
        "$(num pinned_copies_per_step)" "$(num launches_per_step)" "$(num collectives_per_step)" "$(num examples_per_sec)"
    verdict="$(awk -v s="$(num host_syncs_per_step)" -v a="$(num allocations_per_step)" \
                   -v p="$(num pageable_copies_per_step)" -v k="$(num collectives_per_step)" 'BEGIN {
      bad = ""
      if (s > 2) bad = bad " host_syncs " s " > 2;"
      if (a > 0) bad = bad " allocations " a " > 0;"
      if (p > 0) bad = bad " pageable_copies " p " > 0;"
      if (k != 4) bad = bad " collectives " k " != 4;"
      print bad }')"
    if [ -z "$verdict" ]; then
      record PASS "step counts, $c card(s)" "syncs $(num host_syncs_per_step), allocations 0, pageable 0, collectives 4, $(num examples_per_sec) ex/s"
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
  steps_one=$(( (lines + batch - 1) / batch * epochs ))
  ((steps_one <= max_steps)) || die "--lines $lines x --epochs $epochs at --batch $batch is $steps_one steps on one card, over --max-steps $max_steps"
  make_data
  oracle="$(grep -o '"auc": [0-9.]*' "$data/test/oracle.json" | head -n 1 | awk '{ print $2 }' || true)"
  # jnum FILE KEY: KEY of the last per-pass JSON object in FILE.
  jnum() { grep '"pass":' "$1" | tail -n 1 | grep -o "\"$2\": [-0-9.e+]*" | awk '{ print $2 }' || true; }
  results="$out/results.tsv"
  printf 'cards\tips\tips_per_card\tscaling\tauc\ttest_auc\tload_s\tbegin_pass_s\ttrain_s\tend_pass_s\tsteps_per_pass\n' > "$results"
  base_ips="" base_cards=""
  for c in "${counts[@]}"; do
    sel="$(seq -s, 0 $((c - 1)))"
    metrics="$out/bench/metrics.$c.jsonl"
    rm -f "$metrics"
    note "training on $c card(s): FLAGS_selected_gpus=$sel, $epochs passes of $lines lines, batch $batch per card"
    rc=0
    FLAGS_selected_gpus="$sel" run_limited "$run_timeout" "$out/bench/train.$c.log" "$bin/gpubox_train" \
        --config "$root/configs/config_synthetic.yaml" \
        -o runner.train_data_dir="$data/train" -o runner.test_data_dir="$data/test" \
        -o runner.model_save_path= -o runner.save_mode=none -o runner.metrics_path="$metrics" \
        -o runner.epochs="$epochs" -o runner.train_batch_size="$batch" || rc=$?
    grep -E '^pass: |test auc' "$out/bench/train.$c.log" | sed 's/, ne:.*ips_per_card/, ... ips_per_card/; s/^/  /' || true
    if ((rc != 0)) || [ ! -s "$metrics" ]; then
      echo "  FAILED (exit $rc): last lines of $out/bench/train.$c.log:"; tail -n 8 "$out/bench/train.$c.log" | sed 's/^/  | /'
      printf '%s\tFAILED\t\t\t\t\t\t\t\t\t\n' "$c" >> "$results"
      record FAIL "benchmark, $c card(s)" "exit $rc (bench/train.$c.log)"; continue
    fi
    ips="$(jnum "$metrics" ips)"
    if [ -z "$base_ips" ]; then base_ips="$ips"; base_cards="$c"; fi
    test_auc="$(grep '"test_auc":' "$metrics" | tail -n 1 | grep -o '"test_auc": [0-9.]*' | awk '{ print $2 }' || true)"
    awk -v c="$c" -v ips="$ips" -v b="$base_ips" -v bc="$base_cards" -v auc="$(jnum "$metrics" auc)" \
        -v tauc="${test_auc:-}" -v l="$(jnum "$metrics" load_seconds)" -v bp="$(jnum "$metrics" begin_pass_seconds)" \
        -v tr="$(jnum "$metrics" train_seconds)" -v ep="$(jnum "$metrics" end_pass_seconds)" \
        -v steps="$(( (lines + batch * c - 1) / (batch * c) ))" 'BEGIN {
          printf "%d\t%.0f\t%.0f\t%.3f\t%.4f\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%d\n",
                 c, ips, ips / c, (ips / c) / (b / bc), auc, tauc, l, bp, tr, ep, steps }' >> "$results"
    record PASS "benchmark, $c card(s)" "$(printf '%.0f' "$ips") examples/s, train AUC $(jnum "$metrics" auc) (results.tsv)"
  done
  echo
  if [ "${base_cards:-1}" = 1 ]; then base_note="ips(C) / (C * ips(1))"; else base_note="per-card ips relative to $base_cards cards"; fi
  cfg="$root/configs/config_synthetic.yaml"
  model="$(sed -n 's/^ *model: *\([a-z_]*\).*/\1/p' "$cfg" | head -n 1)"
  fc="$(sed -n 's/^ *fc_sizes: *\(\[[^]]*\]\).*/\1/p' "$cfg" | head -n 1)"
  sparse_opt="$(sed -n '/sparse_optimizer:/,$ s/^ *class: *\([a-z_]*\).*/\1/p' "$cfg" | head -n 1)"
  echo "GPUBox gpubox_train, configs/config_synthetic.yaml (model $model, fc $fc, sparse $sparse_opt), $lines lines,"
  echo "batch $batch per card; figures of the last of $epochs passes (keys already on the cards); scaling = $base_note"
  ((ngpu > 0)) || echo "(no GPU listed by nvidia-smi: with a cpu build (--bin) the simulated cards share this machine's cores)"
  awk -F'\t' -v oracle="${oracle:-n/a}" '
    NR == 1 { printf "| %5s | %12s | %10s | %7s | %9s | %8s | %-28s |\n", "cards", "examples/s", "per card", "scaling", "train AUC", "test AUC", "pass s: load/begin/train/end"
              printf "|%s|%s|%s|%s|%s|%s|%s|\n", "------:", "-------------:", "-----------:", "--------:", "----------:", "---------:", "------------------------------"; next }
    $2 == "FAILED" { printf "| %5s | %12s | %10s | %7s | %9s | %8s | %-28s |\n", $1, "FAILED", "", "", "", "", ""; next }
    { printf "| %5d | %12.0f | %10.0f | %6.0f%% | %9.4f | %8s | %-28s |\n", $1, $2, $3, 100 * $4, $5, $6, $7 " / " $8 " / " $9 " / " $10 }
    END { printf "planted model (oracle) AUC on the held-out data: %s\n", oracle }' "$results"
  echo "(results: $results; logs and per-pass metrics: $out/bench/)"
else
  record SKIP "benchmark" "$( ((run_bench)) && echo "no card count" || echo "--skip-bench")"
fi

echo
echo "================ summary ($summary)"
cat "$summary"
if ((failures)); then
  echo "gpu_check: FAILED ($failures item(s); details in $out)"
  exit 1
fi
echo "gpu_check: all passed (skipped items say why)"
