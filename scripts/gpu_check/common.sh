# shellcheck shell=bash
# scripts/gpu_check/common.sh: what every item uses: the cleanup on exit, running a command under a
# limit (and the hang watchdog), the summary's lines, finding a tool, and the generated data
# sets (made once, when an item first needs them).
# Sourced by scripts/gpu_check.sh (after its options are read), in its order; uses and sets its
# variables. Needs bash.

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
