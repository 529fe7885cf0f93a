#!/usr/bin/env bash
# gpu_check.sh — run inside an unpacked GPUBox CUDA bundle (scripts/bundle_cuda.sh makes it) on a
# GPU machine; one command checks that machine end to end:
#   1. nvidia-smi summary (GPUs, driver, compute capability, topology)
#   2. the shared libraries of bin/ resolve (bundle lib/ + the machine's driver, cuBLAS and NCCL)
#   3. the CUDA build's unit tests (every bin/*_test)
#   4. a short benchmark per card count: gpubox_data gen writes a small data set, gpubox_train trains
#      it with FLAGS_selected_gpus=0 / 0,1 / 0,1,2,3 / ... up to the GPUs present, and a table of
#      cards, examples/s, examples/s per card, scaling efficiency ips(C) / (C * ips(1)) and AUC.
#
# usage: scripts/gpu_check.sh [--cards 1,2,4] [--lines N] [--epochs E] [--batch B] [--max-steps S]
#                             [--out DIR] [--skip-tests] [--skip-bench] [--test-timeout S]
#                             [--run-timeout S] [--keep-data] [--no-link] [--bin DIR]
#   --cards LIST      card counts to benchmark (default: 1, 2, 4, ... and the number of GPUs present)
#   --lines N         training lines generated (default 1000000; held-out test set: N/10 more)
#   --epochs E        passes over the data per run (default 2; the table shows the last pass, whose
#                     keys are already on the cards, and the test AUC after it)
#   --batch B         instances per card per step (default 2048, runner.train_batch_size)
#   --max-steps S     refuse runs longer than S steps on one card (default 5000)
#   --out DIR         logs, metrics and results.tsv (default ./gpu_check.<UTC time>)
#   --skip-tests / --skip-bench   leave out step 3 / step 4
#   --test-timeout S  limit per test binary (default 600); --run-timeout S: per training run (default 900)
#   --keep-data       keep the generated data (default: deleted on exit; it lives under --out)
#   --no-link         do not create the tests' compiled-in source path (see below); those tests are skipped
#   --bin DIR         take the binaries from DIR instead of the bundle's bin/ (e.g. a cpu build, with
#                     --cards: then the "cards" are simulated and no GPU is needed)
# Some tests open files through absolute paths of the machine that built the bundle (its source
# folder's configs/, its build-cuda/bin/ tools); test_paths.txt lists them. When that source folder
# does not exist here, a symlink to the bundle is made in its place for the run and removed on exit.
# Exit status: 0 when every test passed and every benchmark run succeeded.
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
run_bench=1
test_timeout=600
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
    --skip-bench) run_bench=0; shift ;;
    --test-timeout) need_value "$1" $#; test_timeout="$2"; shift 2 ;;
    --run-timeout) need_value "$1" $#; run_timeout="$2"; shift 2 ;;
    --keep-data) keep_data=1; shift ;;
    --no-link) link=0; shift ;;
    --bin) need_value "$1" $#; bin="$2"; custom_bin=1; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "gpu_check: unknown argument '$1'" >&2; usage ;;
  esac
done
for pair in "--lines:$lines" "--epochs:$epochs" "--batch:$batch" "--max-steps:$max_steps" \
            "--test-timeout:$test_timeout" "--run-timeout:$run_timeout"; do
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
for t in gpubox_train gpubox_data; do [ -x "$bin/$t" ] || die "$bin/$t is missing"; done
[ -f "$root/configs/config_synthetic.yaml" ] || die "$root/configs/config_synthetic.yaml is missing (not a GPUBox bundle?)"
[ -n "$out" ] || out="$PWD/gpu_check.$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out" || die "--out '$out': cannot create the folder"
out="$(cd "$out" && pwd)"
data="$out/data"

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

echo "================ GPUBox GPU check  $(date -u +%Y-%m-%dT%H:%M:%SZ)"
if [ -f "$root/MANIFEST.txt" ]; then sed -n '1,5p' "$root/MANIFEST.txt"; fi
echo "host: $(hostname), $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //'), $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) memory"
echo "binaries: $bin"
echo "output: $out"

# ---- 1. GPUs -------------------------------------------------------------------------------------
echo
echo "================ 1. nvidia-smi"
ngpu=0
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi || die "nvidia-smi failed: is the NVIDIA driver loaded?"
  query="$(nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv,noheader 2>/dev/null ||
           nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader)"
  echo "index, name, compute capability, memory, driver"
  echo "$query"
  ngpu="$(grep -c . <<<"$query" || true)"
  ((ngpu > 0)) || die "nvidia-smi lists no GPU"
  if ((ngpu > 1)); then echo "topology:"; nvidia-smi topo -m 2>/dev/null || true; fi
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
elif [ -n "$cards_arg" ]; then
  note "no nvidia-smi: no GPU summary (running --cards $cards_arg on what --bin holds)"
else
  die "no nvidia-smi: this check needs an NVIDIA GPU machine with its driver (or --bin <cpu build> --cards LIST)"
fi

# ---- 2. shared libraries ------------------------------------------------------------------------
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
  die "unresolved shared libraries (above). libcuda.so.1 comes with the NVIDIA driver; libcublas.so.13 and
  libcublasLt.so.13 with the CUDA 13 toolkit (or pip nvidia-cublas); libnccl.so.2 with NCCL 2 (libnccl2 package
  or pip nvidia-nccl-cu13). Install them or put their folder in LD_LIBRARY_PATH. A 'version ... not found' line
  means this system's glibc/libstdc++ is older than the bundle needs (see MANIFEST.txt)."
fi
for f in "$bin"/gpubox_train; do
  ldd "$f" | awk '{ printf "  %-26s %s\n", $1, $3 }' | grep -E 'cud|cublas|nccl|'"$root"'/lib' || true
done
note "every binary's libraries resolve"

failures=0

# ---- 3. unit tests -------------------------------------------------------------------------------
declare -A skip_reason=()
if ((run_tests)); then
  echo
  echo "================ 3. unit tests (bin/*_test)"
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
  n_pass=0 n_fail=0 n_skip=0
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
    RUN_CWD="$work" TMPDIR="$work" run_limited "$test_timeout" "$out/tests/$name.log" "$t" --gtest_color=no || rc=$?
    secs="$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')"
    rm -rf "$work"
    summary="$(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]+ test' "$out/tests/$name.log" | tr '\n' ' ' || true)"
    if ((rc == 0)); then
      printf '%-28s %-8s %8s  %s\n' "$name" ok "$secs" "$summary"
      n_pass=$((n_pass + 1))
    else
      why="exit $rc"; ((rc == 124 || rc == 137)) && why="timed out after ${test_timeout}s"
      printf '%-28s %-8s %8s  %s %s\n' "$name" FAILED "$secs" "$why;" "$summary"
      # The first failure message and up to 5 failing test names (all of it is in the log).
      grep -m1 -A1 ': Failure$' "$out/tests/$name.log" | sed 's/^/      | /' || true
      awk '/listed below:/ { f = 1; next } f && /^\[  FAILED  \]/ { n++; if (n <= 5) print "      " $0 }
           END { if (n > 5) printf "      ... and %d more\n", n - 5 }' "$out/tests/$name.log"
      grep -q ': Failure$' "$out/tests/$name.log" || tail -n 5 "$out/tests/$name.log" | sed 's/^/      | /'
      n_fail=$((n_fail + 1))
    fi
  done
  echo "tests: $n_pass passed, $n_fail failed, $n_skip skipped (logs: $out/tests/)"
  ((n_fail == 0)) || failures=$((failures + n_fail))
fi

# ---- 4. per-card-count benchmark ---------------------------------------------------------------
if ((run_bench)); then
  echo
  echo "================ 4. benchmark per card count"
  if [ -n "$cards_arg" ]; then
    IFS=, read -r -a counts <<<"$cards_arg"
  else
    counts=()
    for ((c = 1; c <= ngpu; c *= 2)); do counts+=("$c"); done
    [ "${counts[-1]}" = "$ngpu" ] || counts+=("$ngpu")
  fi
  if ((ngpu > 0)); then
    for c in "${counts[@]}"; do ((c <= ngpu)) || die "--cards asks for $c cards, but nvidia-smi lists $ngpu GPUs"; done
  fi
  steps_one=$(( (lines + batch - 1) / batch * epochs ))
  ((steps_one <= max_steps)) || die "--lines $lines x --epochs $epochs at --batch $batch is $steps_one steps on one card, over --max-steps $max_steps"
  mkdir -p "$out/bench" "$data"
  test_lines=$((lines / 10 > 0 ? lines / 10 : 1))
  note "generating $lines training + $test_lines held-out lines (gpubox_data gen, seed 1) in $data"
  run_limited "$run_timeout" "$out/bench/gen.log" "$bin/gpubox_data" gen --out "$data/train" --lines "$lines" \
      --files 8 --seed 1 || die "gpubox_data gen failed: $(tail -n 3 "$out/bench/gen.log")"
  run_limited "$run_timeout" "$out/bench/gen_test.log" "$bin/gpubox_data" gen --out "$data/test" \
      --lines "$test_lines" --files 1 --seed 1 --first_line "$lines" ||
      die "gpubox_data gen (test) failed: $(tail -n 3 "$out/bench/gen_test.log")"
  cat "$out/bench/gen.log"
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
      failures=$((failures + 1)); continue
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
fi

echo
if ((failures)); then
  echo "gpu_check: FAILED ($failures failing test binaries or benchmark runs)"
  exit 1
fi
echo "gpu_check: all passed"
