#!/usr/bin/env bash
# scripts/bench_gpubox.sh — training throughput per card count, in one command (issue 8).
#
# Builds if needed, generates (or reuses) train + held-out test data with `gpubox_data gen`,
# runs `gpubox_train` R times for each card count, and writes DIR/report.md, DIR/results.json
# and DIR/throughput.png (examples/s and scaling efficiency against card count).
# --components also runs the `gpubox_bench` micro-benchmarks, each next to its limit.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/bench_gpubox.sh [options]
  --cards LIST      card counts to run, comma-separated (default 1,2); the scaling
                    efficiency ips(C)/(C*ips(1)) needs 1 in the list
  --trainers LIST   also run jobs of T trainer processes x C cards each (C from --cards;
                    Gloo over loopback, cpu build), e.g. 1,2: examples/s of the job, bytes sent
                    between processes per step, and `gpubox_bench comm --trainers T` (Gloo
                    all-reduce busbw next to one loopback TCP stream, same run); written to
                    OUT/trainers.md and appended to report.md (default: none)
  --config FILE     gpubox_train config (default configs/config_synthetic.yaml)
  --lines N         generated training lines (default 200000)
  --test-lines N    generated held-out lines of the same planted model (default lines/5)
  --repeats R       runs per card count (default 3); runs of different card counts interleave
  --epochs E        passes per run (default 2, whatever the config says); pass 0 is the
                    warm-up (cold pulls), examples/s is measured over passes 1..E-1 when E >= 2
  --out DIR         report folder (default output/bench/<UTC time>)
  --components      also run gpubox_bench hashtable, sparse, dense, server, comm, table, dataset
  --seed S          data generator seed (default 1)
  --vocab V         keys per slot of the generator (default 100000)
  --zipf A          Zipf exponent of the generator's keys (default 2.0, as config_synthetic.yaml)
  --factor-dim F    the planted model's interaction rank (default 1, as config_synthetic.yaml)
  --files K         training files (default 4)
  --data-root DIR   data cache (default /dev/shm/gpubox_bench, or /tmp/gpubox_bench without
                    /dev/shm); one sub-folder per data parameter set, reused by later runs
  --clean-data      delete this run's data folder on exit (default: keep it for reuse)
  --backend B       cpu | cuda (default: cuda when nvidia-smi sees a GPU, else cpu);
                    builds with scripts/build.sh B into build/ or build-cuda/
  --bin DIR         use gpubox_train/gpubox_data/gpubox_bench from DIR; no build
  --threads-per-card T  cpu build: gpubox_train --threads_per_card T (default: the trainer's
                    own default, cores / cards)
  --precision P     fp32 | bf16: -o hyper_parameters.dense_precision=P for gpubox_train
                    (default: the config's); bf16 without AVX512-BF16/AMX (or a GPU) runs fp32
                    and gpubox_train says so at start
  --set KEY=VALUE   extra `-o KEY=VALUE` for gpubox_train (repeatable)
  -h, --help        this text
Example (a few minutes on 2 cores):
  scripts/bench_gpubox.sh --cards 1,2 --lines 200000 --repeats 3 --components
EOF
}

die() { echo "bench_gpubox.sh: $*" >&2; exit 2; }
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

repo="$(cd "$(dirname "$0")/.." && pwd)"
cards_list="1,2"
trainers_list=""
config="configs/config_synthetic.yaml"
lines=200000
test_lines=""
repeats=3
epochs=2
out=""
components=0
seed=1
vocab=100000
zipf=2.0
factor_dim=1
files=4
data_root=""
clean_data=0
backend=""
bin_dir=""
extra_o=()
threads_per_card=""
precision=""

need_val() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --cards) need_val "$@"; cards_list="$2"; shift 2 ;;
    --trainers) need_val "$@"; trainers_list="$2"; shift 2 ;;
    --config) need_val "$@"; config="$2"; shift 2 ;;
    --lines) need_val "$@"; lines="$2"; shift 2 ;;
    --test-lines) need_val "$@"; test_lines="$2"; shift 2 ;;
    --repeats) need_val "$@"; repeats="$2"; shift 2 ;;
    --epochs) need_val "$@"; epochs="$2"; shift 2 ;;
    --out) need_val "$@"; out="$2"; shift 2 ;;
    --components) components=1; shift ;;
    --seed) need_val "$@"; seed="$2"; shift 2 ;;
    --vocab) need_val "$@"; vocab="$2"; shift 2 ;;
    --zipf) need_val "$@"; zipf="$2"; shift 2 ;;
    --factor-dim) need_val "$@"; factor_dim="$2"; shift 2 ;;
    --files) need_val "$@"; files="$2"; shift 2 ;;
    --data-root) need_val "$@"; data_root="$2"; shift 2 ;;
    --clean-data) clean_data=1; shift ;;
    --backend) need_val "$@"; backend="$2"; shift 2 ;;
    --bin) need_val "$@"; bin_dir="$2"; shift 2 ;;
    --threads-per-card) need_val "$@"; threads_per_card="$2"; shift 2 ;;
    --precision) need_val "$@"; precision="$2"; shift 2 ;;
    --set) need_val "$@"; [[ "$2" == *=* ]] || die "--set '$2': expected KEY=VALUE"; extra_o+=(-o "$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done

# ---- validate arguments ----
[[ "$cards_list" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--cards '$cards_list': expected a comma-separated list of card counts, e.g. 1,2,4"
IFS=, read -r -a cards <<<"$cards_list"
for c in "${cards[@]}"; do
  [ "$c" -ge 1 ] && [ "$c" -le 64 ] || die "--cards '$cards_list': card count '$c' is not in 1..64"
done
if [ -n "$trainers_list" ]; then
  [[ "$trainers_list" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "--trainers '$trainers_list': expected a comma-separated list of trainer counts, e.g. 1,2"
  IFS=, read -r -a trainer_counts <<<"$trainers_list"
fi
for v in lines repeats seed vocab files; do
  is_uint "${!v}" || die "--$v '${!v}': expected a non-negative integer"
done
[ "$lines" -ge 1000 ] || die "--lines '$lines': at least 1000"
[ "$repeats" -ge 1 ] || die "--repeats '$repeats': at least 1"
[ "$files" -ge 1 ] || die "--files '$files': at least 1"
[ "$vocab" -ge 1 ] || die "--vocab '$vocab': at least 1"
[[ "$zipf" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--zipf '$zipf': expected a non-negative number"
is_uint "$factor_dim" && [ "$factor_dim" -ge 1 ] || die "--factor-dim '$factor_dim': expected a positive integer"
if [ -z "$test_lines" ]; then test_lines=$((lines / 5)); [ "$test_lines" -ge 1000 ] || test_lines=1000; fi
is_uint "$test_lines" && [ "$test_lines" -ge 1 ] || die "--test-lines '$test_lines': expected a positive integer"
if [ -n "$threads_per_card" ]; then is_uint "$threads_per_card" && [ "$threads_per_card" -ge 1 ] || die "--threads-per-card '$threads_per_card': expected a positive integer"; fi
case "$precision" in
  "") ;;
  fp32|bf16) extra_o+=(-o "hyper_parameters.dense_precision=$precision") ;;
  *) die "--precision '$precision': expected fp32 or bf16" ;;
esac
is_uint "$epochs" && [ "$epochs" -ge 1 ] || die "--epochs '$epochs': expected a positive integer"
case "$config" in /*) ;; *) config="$repo/$config" ;; esac
[ -f "$config" ] || die "--config '$config': no such file"
slots="$(sed -n 's/^[[:space:]]*sparse_inputs_slots:[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$config" | head -1)"
slots=$(( ${slots:-27} - 1 ))   # PaddleRec counts the label as a slot
dense="$(sed -n 's/^[[:space:]]*dense_input_dim:[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$config" | head -1)"
dense="${dense:-13}"
batch="$(sed -n 's/^[[:space:]]*train_batch_size:[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$config" | head -1)"
batch="${batch:-512}"

if [ -z "$backend" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then backend=cuda; else backend=cpu; fi
fi
case "$backend" in cpu|cuda) ;; *) die "--backend '$backend': expected cpu or cuda" ;; esac
command -v python3 >/dev/null 2>&1 || die "python3 not found (needed to parse the JSON lines)"

# ---- binaries ----
if [ -n "$bin_dir" ]; then
  [ -d "$bin_dir" ] || die "--bin '$bin_dir': no such folder"
  bin_dir="$(cd "$bin_dir" && pwd)"
  build_dir="$(dirname "$bin_dir")"
else
  if [ "$backend" = cuda ]; then build_dir="$repo/${GPUBOX_BUILD_DIR:-build-cuda}"; else build_dir="$repo/${GPUBOX_BUILD_DIR:-build}"; fi
  echo "== building ($backend backend, $build_dir; incremental: a no-op when up to date)"
  "$repo/scripts/build.sh" "$backend"
  bin_dir="$build_dir/bin"
fi
train_bin="$bin_dir/gpubox_train"
data_bin="$bin_dir/gpubox_data"
bench_bin="$bin_dir/gpubox_bench"
for b in "$train_bin" "$data_bin"; do [ -x "$b" ] || die "missing binary $b (build it, or pass --bin DIR)"; done
if [ "$components" = 1 ] && [ ! -x "$bench_bin" ]; then die "--components needs $bench_bin (build it, or pass --bin DIR)"; fi
if [ -n "$trainers_list" ] && [ ! -x "$bench_bin" ]; then die "--trainers needs $bench_bin (build it, or pass --bin DIR)"; fi
if [ -f "$build_dir/CMakeCache.txt" ]; then
  built_backend="$(sed -n 's/^GPUBOX_BACKEND:STRING=//p' "$build_dir/CMakeCache.txt")"
  if [ -n "$built_backend" ] && [ "$built_backend" != "$backend" ]; then
    echo "note: $bin_dir is a $built_backend build; reporting backend $built_backend" >&2
    backend="$built_backend"
  fi
fi

# ---- output folder ----
[ -n "$out" ] || out="$repo/output/bench/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out" || die "--out '$out': cannot create"
out="$(cd "$out" && pwd)"
rm -rf "$out/runs" "$out/components"
mkdir -p "$out/runs"
[ "$components" = 0 ] || mkdir -p "$out/components"

# ---- child processes: always waited for, killed on interrupt ----
child=""
data_tmp=""
data_dir=""
cleanup() {
  local rc=$?
  if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then kill "$child" 2>/dev/null || true; wait "$child" 2>/dev/null || true; fi
  [ -z "$data_tmp" ] || rm -rf "$data_tmp"
  if [ "$clean_data" = 1 ] && [ -n "$data_dir" ]; then rm -rf "$data_dir"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "bench_gpubox.sh: interrupted" >&2; exit 130' INT TERM
# run_child LOG CMD...: runs CMD in the background (so a signal can stop it), stdout+stderr to LOG
run_child() {
  local log="$1"; shift
  "$@" >"$log" 2>&1 &
  child=$!
  local rc=0
  wait "$child" || rc=$?
  child=""
  return "$rc"
}

# ---- data: generated once per parameter set, then reused ----
if [ -z "$data_root" ]; then
  if [ -d /dev/shm ] && [ -w /dev/shm ]; then data_root=/dev/shm/gpubox_bench; else data_root=/tmp/gpubox_bench; fi
fi
mkdir -p "$data_root" || die "--data-root '$data_root': cannot create"
data_key="lines${lines}_test${test_lines}_files${files}_seed${seed}_vocab${vocab}_zipf${zipf}_factor${factor_dim}_slots${slots}_dense${dense}"
data_dir="$data_root/$data_key"
if [ -f "$data_dir/train/oracle.json" ] && [ -f "$data_dir/test/oracle.json" ]; then
  echo "== reusing data $data_dir"
  data_reused=1
else
  echo "== generating data $data_dir ($lines train + $test_lines test lines)"
  data_reused=0
  rm -rf "$data_dir"
  data_tmp="$data_dir.tmp.$$"
  mkdir -p "$data_tmp"
  gen=(--seed "$seed" --vocab "$vocab" --zipf "$zipf" --factor-dim "$factor_dim" --slots "$slots" --dense "$dense")
  run_child "$data_tmp/gen_train.log" "$data_bin" gen --out "$data_tmp/train" --lines "$lines" --files "$files" "${gen[@]}" \
    || { cat "$data_tmp/gen_train.log" >&2; die "gpubox_data gen (train) failed"; }
  run_child "$data_tmp/gen_test.log" "$data_bin" gen --out "$data_tmp/test" --lines "$test_lines" --files 1 \
    --first_line "$lines" "${gen[@]}" \
    || { cat "$data_tmp/gen_test.log" >&2; die "gpubox_data gen (test) failed"; }
  tail -1 "$data_tmp/gen_train.log"
  mv "$data_tmp" "$data_dir"
  data_tmp=""
fi

# ---- training runs ----
manifest="$out/runs/manifest.tsv"
printf 'cards\trepeat\trc\twall_s\tloadavg_before\tloadavg_after\tmetrics\tlog\n' >"$manifest"
total=$(( ${#cards[@]} * repeats ))
n=0
for ((r = 1; r <= repeats; r++)); do
  for c in "${cards[@]}"; do
    n=$((n + 1))
    sel="$(seq -s, 0 $((c - 1)))"
    metrics="$out/runs/cards${c}_run${r}.jsonl"
    log="$out/runs/cards${c}_run${r}.log"
    rm -f "$metrics"
    load_before="$(cut -d' ' -f1 /proc/loadavg)"
    echo "== run $n/$total: $c card(s), repeat $r (load $load_before)"
    t0="$(date +%s.%N)"
    rc=0
    FLAGS_selected_gpus="$sel" run_child "$log" "$train_bin" --config "$config" \
      -o "runner.train_data_dir=$data_dir/train" -o "runner.test_data_dir=$data_dir/test" \
      -o "runner.metrics_path=$metrics" -o "runner.model_save_path=" -o "runner.epochs=$epochs" \
      ${threads_per_card:+--threads_per_card "$threads_per_card"} ${extra_o[@]+"${extra_o[@]}"} || rc=$?
    t1="$(date +%s.%N)"
    load_after="$(cut -d' ' -f1 /proc/loadavg)"
    wall="$(python3 -c "print(f'{$t1 - $t0:.3f}')")"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$c" "$r" "$rc" "$wall" "$load_before" "$load_after" "$metrics" "$log" >>"$manifest"
    if [ "$rc" != 0 ]; then
      tail -20 "$log" >&2
      die "gpubox_train with $c card(s), repeat $r exited with $rc (log: $log)"
    fi
    grep '^pass: ' "$log" | sed 's/, logloss.*ips_per_card/ ... ips_per_card/; s/, keys_in_pass.*//' || true
  done
done

# ---- several trainer processes (--trainers) ----
trainers_md=""
if [ -n "$trainers_list" ]; then
  [ "$backend" = cpu ] || die "--trainers: the multi-process rows run the cpu build's Gloo group"
  trainers_md="$out/trainers.md"
  mkdir -p "$out/trainers"
  for t in "${trainer_counts[@]}"; do
    for c in "${cards[@]}"; do
      for ((r = 1; r <= repeats; r++)); do
        job="t${t}_c${c}_run${r}"
        rdv="$out/trainers/$job.rendezvous"
        rm -rf "$rdv" "$out/trainers/$job".*
        load_before="$(cut -d' ' -f1 /proc/loadavg)"
        echo "== job $job: $t trainer(s) x $c card(s) (load $load_before)"
        pids=()
        for ((id = 0; id < t; id++)); do
          PADDLE_TRAINERS_NUM="$t" PADDLE_TRAINER_ID="$id" GPUBOX_RENDEZVOUS="file://$rdv" \
            FLAGS_selected_gpus="$(seq -s, 0 $((c - 1)))" "$train_bin" --config "$config" \
            -o "runner.train_data_dir=$data_dir/train" -o "runner.test_data_dir=" \
            -o "runner.metrics_path=$out/trainers/$job.jsonl" -o "runner.model_save_path=" \
            -o "runner.epochs=$epochs" \
            ${threads_per_card:+--threads_per_card "$threads_per_card"} ${extra_o[@]+"${extra_o[@]}"} \
            >"$out/trainers/$job.worker$id.log" 2>&1 &
          pids+=($!)
        done
        rc=0
        for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
        rm -rf "$rdv"
        [ "$rc" = 0 ] || { tail -5 "$out/trainers/$job".worker*.log >&2; die "job $job exited with $rc"; }
        echo "$t $c $r $load_before $(cut -d' ' -f1 /proc/loadavg)" >>"$out/trainers/jobs.txt"
      done
      if [ "$t" -gt 1 ]; then
        "$bench_bin" comm --ranks $((t * c)) --trainers "$t" --mb 16 --iters 5 --json \
          >"$out/trainers/comm_t${t}_c${c}.json" 2>"$out/trainers/comm_t${t}_c${c}.err" \
          || die "gpubox_bench comm --trainers $t failed (see $out/trainers/comm_t${t}_c${c}.err)"
      fi
    done
  done
  python3 - "$out/trainers" "$epochs" >"$trainers_md" <<'PY'
import glob, json, os, statistics, sys
folder, epochs = sys.argv[1], int(sys.argv[2])
jobs = [line.split() for line in open(os.path.join(folder, "jobs.txt"))]
print("## Several trainer processes (Gloo over loopback)\n")
print("examples/s of the job: median over repeats of trainer 0's passes 1.. (pass 0 with fewer "
      "than 2 passes); bytes between processes per step: every trainer's "
      "`interprocess_bytes_per_step` summed; busbw: `gpubox_bench comm --trainers T`, 16 MB "
      "per rank, against one loopback TCP stream in the same run.\n")
print("| trainers x cards | examples/s | bytes between processes per step | Gloo all-reduce busbw GB/s | all-to-all-v busbw GB/s | loopback TCP GB/s | load before/after |")
print("|---|---|---|---|---|---|---|")
keys = sorted({(int(t), int(c)) for t, c, *_ in jobs})
for t, c in keys:
    ips, bytes_, loads = [], [], []
    for jt, jc, r, lb, la in jobs:
        if (int(jt), int(jc)) != (t, c):
            continue
        loads.append(f"{lb}/{la}")
        base = os.path.join(folder, f"t{t}_c{c}_run{r}")
        passes = [json.loads(l) for l in open(base + ".jsonl") if '"pass"' in l]
        steady = [p for p in passes if p["pass"] >= 1] or passes
        ips.append(statistics.median(p["ips"] for p in steady))
        total = 0.0
        for f in [base + ".jsonl"] + sorted(glob.glob(base + ".trainer*.jsonl")):
            lines = [json.loads(l) for l in open(f) if '"pass"' in l]
            total += statistics.median(l.get("interprocess_bytes_per_step", 0.0) for l in lines)
        bytes_.append(total)
    comm = os.path.join(folder, f"comm_t{t}_c{c}.json")
    if os.path.exists(comm):
        figure = json.loads(open(comm).read().strip().splitlines()[-1])
        bus = f'{figure["all_reduce_sum"]["busbw_gbps"]:.2f}'
        a2a = f'{figure["all_to_all_v"]["busbw_gbps"]:.2f}'
        tcp = f'{figure["loopback_tcp_gbps"]:.2f}'
    else:
        bus = a2a = tcp = "-"
    print(f"| {t} x {c} | {statistics.median(ips):.0f} | {statistics.median(bytes_):.0f} | {bus} | {a2a} | {tcp} | {', '.join(loads)} |")
PY
  echo "== wrote $trainers_md"
fi

# ---- component micro-benchmarks ----
if [ "$components" = 1 ]; then
  export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
  comp() {  # comp NAME ARGS...: gpubox_bench ARGS, stdout to components/NAME.out
    local name="$1"; shift
    echo "== gpubox_bench $*"
    printf '%s\n' "$*" >"$out/components/$name.cmd"
    run_child "$out/components/$name.out" "$bench_bin" "$@" \
      || { tail -5 "$out/components/$name.out" >&2; die "gpubox_bench $1 failed (output: $out/components/$name.out)"; }
  }
  comp hashtable hashtable --keys 1000000 --repeats 3 --json
  for c in "${cards[@]}"; do
    comp "dense_c$c" dense --batch "$batch" --cards "$c" --seconds 2 --repeats 3 --json
    comp "sparse_c$c" sparse --cards "$c" --batch "$batch" --steps 100 --json
    if [ "$c" -ge 2 ]; then comp "comm_c$c" comm --ranks "$c" --mb 16 --json; fi
  done
  comp server server --clients 1 --seconds 2 --batch 4096 --keys 1000000 --json
  mkdir -p "$out/components/rocksdb"
  comp table table --rows 500000 --repeats 1 --disk_rows 50000 --disk_dir "$out/components/rocksdb" --json
  rm -rf "$out/components/rocksdb"
  comp dataset dataset --dir "$data_dir/train" --threads 1,2 --repeat 1 --batch "$batch"
fi

# ---- machine facts, then the report ----
facts="$out/machine.env"
{
  echo "cpu_model=$(LC_ALL=C lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)"
  echo "cores=$(nproc)"
  echo "mem_total_kb=$(sed -n 's/^MemTotal:[[:space:]]*\([0-9]*\).*/\1/p' /proc/meminfo)"
  echo "kernel=$(uname -sr)"
  echo "backend=$backend"
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | paste -sd ';' -)"
  else
    echo "gpu="
  fi
  echo "commit=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "dirty=$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null | wc -l)"
  echo "config_sha256=$(sha256sum "$config" | cut -c1-16)"
  echo "config_dirty=$(git -C "$repo" status --porcelain -- "$config" 2>/dev/null | wc -l)"
  echo "bin_dir=$bin_dir"
  echo "train_bin_mtime=$(date -u -r "$train_bin" +%Y-%m-%dT%H:%M:%SZ)"
  echo "compiler=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build_dir/CMakeCache.txt" 2>/dev/null | head -1)"
  echo "omp_num_threads=${OMP_NUM_THREADS:-}"
  echo "threads_per_card=${threads_per_card:-}"
  echo "date_utc=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$facts"

cmdline="scripts/bench_gpubox.sh --cards $cards_list${trainers_list:+ --trainers $trainers_list} --config ${config#"$repo"/} --lines $lines --repeats $repeats --epochs $epochs"
[ -z "$threads_per_card" ] || cmdline+=" --threads-per-card $threads_per_card"
[ -z "$precision" ] || cmdline+=" --precision $precision"
[ "$components" = 0 ] || cmdline+=" --components"
python3 "$repo/scripts/bench_report.py" --out "$out" --config "$config" --data "$data_dir" \
  --data-reused "$data_reused" --epochs "$epochs" --batch "$batch" --command "$cmdline" \
  ${extra_o[@]+--extra "${extra_o[*]}"}

if [ -n "$trainers_md" ]; then { echo; cat "$trainers_md"; } >>"$out/report.md"; fi

# ---- the plot ----
if ! command -v gnuplot >/dev/null 2>&1; then
  echo "== gnuplot missing: installing gnuplot-nox (Debian)"
  if [ "$(id -u)" = 0 ]; then
    { apt-get install -y gnuplot-nox || { apt-get update && apt-get install -y gnuplot-nox; }; } >"$out/apt.log" 2>&1 || true
  elif command -v sudo >/dev/null 2>&1; then
    { sudo apt-get install -y gnuplot-nox || { sudo apt-get update && sudo apt-get install -y gnuplot-nox; }; } >"$out/apt.log" 2>&1 || true
  fi
fi
command -v gnuplot >/dev/null 2>&1 \
  || { echo "bench_gpubox.sh: gnuplot could not be installed (see $out/apt.log); report.md and results.json are written, throughput.png is not" >&2; exit 1; }
gnuplot "$out/throughput.gp" >"$out/gnuplot.log" 2>&1 \
  || { cat "$out/gnuplot.log" >&2; echo "bench_gpubox.sh: gnuplot failed on $out/throughput.gp" >&2; exit 1; }

echo "== done: $out/report.md, $out/results.json, $out/throughput.png"
