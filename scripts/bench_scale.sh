#!/usr/bin/env bash
# scripts/bench_scale.sh — how cost grows with the number of keys in the job (issue 15).
#
# For each vocabulary size K in --sizes it generates pass folders with `gpubox_data gen
# --key_sampler closed_form` (26 slots of K/26 keys, heavy tail; the generator holds no table,
# so any K is cheap to draw), a held-out folder of the same planted model, and trains the
# default model (configs/config_gpubox.yaml) over the passes with the host tier's memory
# budget (runner.host_memory_mb) and its RocksDB disk tier. It writes DIR/report.md,
# DIR/results.json and DIR/scale.png: examples/s, begin_pass and end_pass seconds, peak RSS,
# bytes per key at each tier (as the trainer prints them at start), disk bytes, distinct keys
# and the test AUC, for each size. Every -o KEY=VALUE goes to gpubox_train, e.g.
# -o runner.prefetch_passes=0 to compare the pass pipeline off and on where that key exists.
# --time-limit S stops a size's training after S seconds (a machine too small or too busy for
# the largest size): the report then shows the passes that finished, marked partial, with the
# total projected from them.
# Not comparable with runs before the next pass's card work's pinned buffers were counted inside
# runner.host_memory_mb (the in-process table): at the default chunk, with no card budget, the
# table now plans its rows with about 15 MiB less per card of the same --host-memory-mb (the
# card tier's plan line at start says how much), so it keeps fewer rows in memory.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/bench_scale.sh [options] [-o KEY=VALUE ...]
  --sizes LIST       vocabulary sizes K (keys a job draws from), comma-separated; 1e6 form
                     accepted (default 1e6,1e7)
  --passes P         pass folders per size (default 4)
  --lines-per-key X  training lines = X * K / 26 (default 2: with the heavy tail about half
                     the vocabulary is drawn)
  --test-lines N     held-out lines (default 20000)
  --zipf A           exponent of the key power law (default 0.9)
  --host-memory-mb M runner.host_memory_mb for every size (default 256: the larger sizes
                     must use the disk tier)
  --card-memory-mb M runner.card_memory_mb (default 0: no card budget; at 10^8 keys set one, a
                     card row takes ~147 bytes)
  --time-limit S     stop each size's training after S seconds and report the passes done
                     (default 0: no limit)
  --config FILE      gpubox_train config (default configs/config_gpubox.yaml)
  --out DIR          report folder (default output/bench_scale/<UTC time>)
  --data-root DIR    data and RocksDB folder (default /tmp/gpubox_bench_scale); data of a size
                     is reused by later runs, the RocksDB folder is wiped per run
  --bin DIR          gpubox_train and gpubox_data from DIR (default: build/bin, built if missing)
  -o KEY=VALUE       extra gpubox_train override (repeatable)
  -h, --help         this text
Example (about 10 minutes on 2 cores):
  scripts/bench_scale.sh --sizes 1e6,1e7 --passes 4 --host-memory-mb 256
EOF
}

die() { echo "bench_scale.sh: $*" >&2; exit 2; }

repo="$(cd "$(dirname "$0")/.." && pwd)"
sizes_list="1e6,1e7"
passes=4
lines_per_key=2
test_lines=20000
zipf=0.9
host_mb=256
card_mb=0
time_limit=0
config="configs/config_gpubox.yaml"
out=""
data_root="/tmp/gpubox_bench_scale"
bin_dir=""
extra_o=()

# The command as run, for results.json (scripts/bench_table.py shows it beside the figures).
export BENCH_SCALE_COMMAND="scripts/bench_scale.sh $*"
need_val() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) need_val "$@"; sizes_list="$2"; shift 2 ;;
    --passes) need_val "$@"; passes="$2"; shift 2 ;;
    --lines-per-key) need_val "$@"; lines_per_key="$2"; shift 2 ;;
    --test-lines) need_val "$@"; test_lines="$2"; shift 2 ;;
    --zipf) need_val "$@"; zipf="$2"; shift 2 ;;
    --host-memory-mb) need_val "$@"; host_mb="$2"; shift 2 ;;
    --card-memory-mb) need_val "$@"; card_mb="$2"; shift 2 ;;
    --time-limit) need_val "$@"; time_limit="$2"; shift 2 ;;
    --config) need_val "$@"; config="$2"; shift 2 ;;
    --out) need_val "$@"; out="$2"; shift 2 ;;
    --data-root) need_val "$@"; data_root="$2"; shift 2 ;;
    --bin) need_val "$@"; bin_dir="$2"; shift 2 ;;
    -o) need_val "$@"; [[ "$2" == *=* ]] || die "-o '$2': expected KEY=VALUE"; extra_o+=(-o "$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done

# ---- validate ----
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
to_int() { python3 -c "import sys; v=float(sys.argv[1]); assert v == int(v) and v >= 1; print(int(v))" "$1" 2>/dev/null; }
IFS=, read -r -a size_args <<<"$sizes_list"
sizes=()
for s in "${size_args[@]}"; do
  k="$(to_int "$s")" || die "--sizes '$sizes_list': '$s' is not a positive whole number"
  [ "$k" -ge 26000 ] || die "--sizes: '$s' is below 26000 (1000 keys a slot)"
  sizes+=("$k")
done
for v in passes test_lines host_mb card_mb time_limit; do
  is_uint "${!v}" || die "--${v//_/-} '${!v}': expected a non-negative integer"
done
[ "$passes" -ge 1 ] || die "--passes: at least 1"
[[ "$lines_per_key" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--lines-per-key '$lines_per_key': expected a number"
[[ "$zipf" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--zipf '$zipf': expected a non-negative number"
case "$config" in /*) ;; *) config="$repo/$config" ;; esac
[ -f "$config" ] || die "--config '$config': no such file"
command -v python3 >/dev/null 2>&1 || die "python3 not found"
[ -x /usr/bin/time ] || die "/usr/bin/time not found (apt-get install time): it measures peak RSS"

if [ -z "$bin_dir" ]; then
  bin_dir="$repo/build/bin"
  [ -x "$bin_dir/gpubox_train" ] || "$repo/scripts/build.sh" cpu
fi
train_bin="$bin_dir/gpubox_train"
data_bin="$bin_dir/gpubox_data"
[ -x "$train_bin" ] && [ -x "$data_bin" ] || die "no gpubox_train/gpubox_data in '$bin_dir'"
[ -n "$out" ] || out="$repo/output/bench_scale/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out" "$data_root"
out="$(cd "$out" && pwd)"
seed=15
slots=26
dense=13

# ---- one size: data (reused when present), then one training run ----
for k in "${sizes[@]}"; do
  vocab=$((k / slots))
  lines="$(python3 -c "print(int($lines_per_key * $k / $slots))")"
  data="$data_root/k${k}_p${passes}_x${lines_per_key}_z${zipf}"
  if [ ! -f "$data/done" ]; then
    rm -rf "$data"
    mkdir -p "$data"
    echo "== size $k: generating $lines lines in $passes passes (vocab $vocab a slot)"
    per_pass=$(( (lines + passes - 1) / passes ))
    for ((p = 0; p < passes; p++)); do
      "$data_bin" gen --out "$data/pass-$p" --lines "$per_pass" --first_line $((p * per_pass)) \
        --files 2 --seed "$seed" --slots "$slots" --dense "$dense" --vocab "$vocab" --zipf "$zipf" \
        --key_sampler closed_form >"$data/gen-$p.log" 2>&1 || { cat "$data/gen-$p.log" >&2; die "gen failed"; }
    done
    "$data_bin" gen --out "$data/test" --lines "$test_lines" --first_line $((passes * per_pass)) \
      --files 1 --seed "$seed" --slots "$slots" --dense "$dense" --vocab "$vocab" --zipf "$zipf" \
      --key_sampler closed_form >"$data/gen-test.log" 2>&1 || { cat "$data/gen-test.log" >&2; die "gen failed"; }
    touch "$data/done"
  fi
  pass_dirs="$(python3 -c "import sys; print('[' + ', '.join('$data/pass-%d' % p for p in range($passes)) + ']')")"
  run="$out/k$k"
  rm -rf "$run"
  mkdir -p "$run"
  rocksdb="$data_root/rocksdb"
  rm -rf "$rocksdb"
  echo "== size $k: training $passes passes (host_memory_mb $host_mb)"
  limit=()
  [ "$time_limit" -eq 0 ] || limit=(timeout --signal=TERM "$time_limit")
  status=0
  cut -d' ' -f1-3 /proc/loadavg >"$run/load_start.txt"
  /usr/bin/time -f "%M %e" -o "$run/time.txt" ${limit[@]+"${limit[@]}"} "$train_bin" --config "$config" \
    -o "runner.pass_dirs=$pass_dirs" -o "runner.test_data_dir=$data/test" -o runner.epochs=1 \
    -o "runner.metrics_path=$run/metrics.jsonl" -o runner.model_save_path= \
    -o "runner.rocksdb_path=$rocksdb" -o "runner.host_memory_mb=$host_mb" \
    -o "runner.card_memory_mb=$card_mb" -o runner.print_interval=1000000 \
    ${extra_o[@]+"${extra_o[@]}"} >"$run/train.log" 2>&1 || status=$?
  if [ "$status" -eq 124 ] && [ "$time_limit" -gt 0 ]; then
    echo "== size $k: stopped at the --time-limit of $time_limit s; reporting the passes done"
    touch "$run/partial"
  elif [ "$status" -ne 0 ]; then
    tail -20 "$run/train.log" >&2; die "training size $k failed (see $run/train.log)"
  fi
  cut -d' ' -f1-3 /proc/loadavg >"$run/load_end.txt"
  du -sb "$rocksdb" | cut -f1 >"$run/disk_bytes.txt"
  rm -rf "$rocksdb"
  cp "$data/pass-0/oracle.json" "$run/oracle.json"
done

# ---- report ----
load="$(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" "$host_mb" "$card_mb" "$passes" "$lines_per_key" "$zipf" "$load" \
  "$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)" "${extra_o[*]:-}" \
  "${sizes[@]}" <<'PY'
import json, os, re, sys, time
out, host_mb, card_mb, passes, lpk, zipf, load, commit, extra = sys.argv[1:10]
sizes = [int(s) for s in sys.argv[10:]]
rows = []
for k in sizes:
    run = os.path.join(out, "k%d" % k)
    log = open(os.path.join(run, "train.log"), errors="replace").read()
    metrics = os.path.join(run, "metrics.jsonl")  # absent when stopped before any pass ended
    lines = ([json.loads(l) for l in open(metrics) if l.strip()]
             if os.path.exists(metrics) else [])
    passes_m = [p for p in lines if "pass" in p]  # the epoch's test line has no "pass"
    partial = os.path.exists(os.path.join(run, "partial"))
    if not passes_m:
        sys.exit("bench_scale.sh: size %d finished no pass (see %s/train.log)" % (k, run))
    rss_kb, wall = open(os.path.join(run, "time.txt")).read().split()[-2:]
    def grab(pattern, default=None):
        m = re.findall(pattern, log)
        return m[-1] if m else default
    host_line = grab(r"host tier: [^\n]*")
    card_line = grab(r"card tier[^\n]*")
    host_key = grab(r"per key in memory ([0-9.]+) bytes")
    disk_key = grab(r"on disk ([0-9]+) bytes")
    card_key = grab(r"([0-9.]+) bytes per key") or grab(r"per key up to ([0-9.]+) bytes")
    auc = grab(r"test auc: ([0-9.]+)")
    later = passes_m[1:] or passes_m
    examples = sum(p.get("examples", 0) for p in passes_m)
    train_s = sum(p.get("seconds", 0) for p in passes_m)
    rows.append({
        "vocab": k,
        "distinct_keys": int(sum(p.get("created", 0) for p in passes_m)),
        "examples": int(examples),
        "examples_per_s": examples / train_s if train_s else 0,
        "examples_per_s_after_pass0": sum(p.get("ips", 0) for p in later) / len(later),
        "begin_pass_s": [round(p.get("begin_pass_seconds", 0), 3) for p in passes_m],
        "end_pass_s": [round(p.get("end_pass_seconds", 0), 3) for p in passes_m],
        "keys_in_pass": [int(p.get("keys_in_pass", 0)) for p in passes_m],
        "pulled": [int(p.get("pulled", 0)) for p in passes_m],
        # Rows fetched ahead for the pass (runner.prefetch_passes), those begin_pass took from
        # them, rows evicted from the cards, and what the pass waited for its data.
        "staged": [int(p.get("staged", 0)) for p in passes_m],
        "prefetched": [int(p.get("prefetched", 0)) for p in passes_m],
        "evicted": [int(p.get("evicted", 0)) for p in passes_m],
        # Of those, what the cards did for the pass between the steps of the pass before it
        # (runner.next_pass_chunk_keys) and their time there (not part of begin_pass).
        "early_inserted": [int(p.get("early_inserted", 0)) for p in passes_m],
        "early_evicted": [int(p.get("early_evicted", 0)) for p in passes_m],
        "early_s": [round(p.get("early_seconds", 0), 3) for p in passes_m],
        "load_wait_s": [round(p.get("load_seconds", 0), 3) for p in passes_m],
        "train_s": [round(p.get("train_seconds", 0), 3) for p in passes_m],
        # The boundary training waits for: the pass's data, then begin_pass.
        "visible_begin_s": [round(p.get("load_seconds", 0) + p.get("begin_pass_seconds", 0), 3)
                            for p in passes_m],
        "load_average": [open(os.path.join(run, f)).read().strip()
                         for f in ("load_start.txt", "load_end.txt")
                         if os.path.exists(os.path.join(run, f))],
        "peak_rss_mb": int(rss_kb) / 1024.0,
        "wall_s": float(wall),
        "disk_bytes": int(open(os.path.join(run, "disk_bytes.txt")).read().split()[0]),
        "host_bytes_per_key": float(host_key) if host_key else None,
        "disk_bytes_per_key_encoded": int(disk_key) if disk_key else None,
        "card_bytes_per_key": float(card_key) if card_key else None,
        "host_tier": host_line, "card_tier": card_line,
        "test_auc": float(auc) if auc else None,
        "planted_auc": json.load(open(os.path.join(run, "oracle.json")))["auc"],
        "passes_done": len(passes_m),
        "partial": partial,
        # A stopped run: its wall time scaled by passes planned / passes done (pass times vary
        # as the disk tier fills, so a rough figure).
        "projected_wall_s": float(wall) * int(passes) / len(passes_m) if partial else float(wall),
    })
    r = rows[-1]
    budget_rows = grab(r"host tier: ([0-9]+) rows in memory at most")
    # Rows on disk at the end: the distinct keys beyond the rows the budget keeps in memory.
    r["rows_on_disk_approx"] = max(0, r["distinct_keys"] - int(budget_rows or r["distinct_keys"]))
    r["disk_bytes_per_key_measured"] = (round(r["disk_bytes"] / r["rows_on_disk_approx"], 1)
                                        if r["rows_on_disk_approx"] else None)
meta = {"host_memory_mb": int(host_mb), "card_memory_mb": int(card_mb), "passes": int(passes),
        "lines_per_key": float(lpk), "zipf": float(zipf), "load_average_at_end": load,
        "commit": commit, "extra_overrides": extra, "cores": os.cpu_count(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": os.environ.get("BENCH_SCALE_COMMAND", "")}
json.dump({"meta": meta, "runs": rows}, open(os.path.join(out, "results.json"), "w"), indent=1)
with open(os.path.join(out, "report.md"), "w") as f:
    f.write("# bench_scale (commit %s, %d cores, load average at end %s)\n\n" % (commit, os.cpu_count(), load))
    f.write("host_memory_mb %s, card_memory_mb %s, %s passes, lines = %s x K / 26, zipf %s, overrides: %s\n\n"
            % (host_mb, card_mb, passes, lpk, zipf, extra or "none"))
    for r in rows:
        if r["partial"]:
            f.write("**vocab %d: stopped at the time limit after %d of %s passes (%.0f s); total "
                    "projected %.0f s; the figures below are of the passes done.**\n\n"
                    % (r["vocab"], r["passes_done"], passes, r["wall_s"], r["projected_wall_s"]))
    f.write("| vocab K | distinct keys | examples | ex/s (all) | ex/s (passes 1..) | begin_pass s per pass | visible begin s (load wait + begin_pass) | end_pass s per pass | peak RSS MiB | disk MiB | disk B/row on disk | host B/key | card B/key | test AUC (planted) | load average start, end |\n")
    f.write("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        f.write("| %d | %d | %d | %.0f | %.0f | %s | %s | %s | %.0f | %.1f | %s | %s | %s | %s (%.4f) | %s |\n" % (
            r["vocab"], r["distinct_keys"], r["examples"], r["examples_per_s"],
            r["examples_per_s_after_pass0"], " / ".join("%.2f" % x for x in r["begin_pass_s"]),
            " / ".join("%.2f" % x for x in r["visible_begin_s"]),
            " / ".join("%.2f" % x for x in r["end_pass_s"]), r["peak_rss_mb"],
            r["disk_bytes"] / 2**20, r["disk_bytes_per_key_measured"], r["host_bytes_per_key"],
            r["card_bytes_per_key"], "%.4f" % r["test_auc"] if r["test_auc"] else "-", r["planted_auc"],
            "; ".join(r["load_average"])))
    f.write("\nTier lines as printed at start (largest size):\n\n    %s\n    %s\n" % (rows[-1]["host_tier"], rows[-1]["card_tier"]))
with open(os.path.join(out, "scale.dat"), "w") as f:
    for r in rows:
        f.write("%d %.1f %.3f %.3f %.1f\n" % (r["distinct_keys"], r["examples_per_s"],
                sum(r["begin_pass_s"]) / len(r["begin_pass_s"]),
                sum(r["end_pass_s"]) / len(r["end_pass_s"]), r["peak_rss_mb"]))
PY

cat >"$out/scale.gp" <<EOF
set terminal pngcairo size 1200,450
set output "$out/scale.png"
set multiplot layout 1,3
set logscale x
set xlabel "distinct keys in the job"
set grid
set title "examples/s"
plot "$out/scale.dat" using 1:2 with linespoints notitle
set title "seconds per pass boundary"
plot "$out/scale.dat" using 1:3 with linespoints title "begin_pass", "" using 1:4 with linespoints title "end_pass"
set title "peak RSS (MiB)"
plot "$out/scale.dat" using 1:5 with linespoints notitle
unset multiplot
EOF
if command -v gnuplot >/dev/null 2>&1; then
  gnuplot "$out/scale.gp" >"$out/gnuplot.log" 2>&1 || { cat "$out/gnuplot.log" >&2; die "gnuplot failed"; }
else
  echo "bench_scale.sh: gnuplot not found (apt-get install gnuplot-nox): scale.png not written" >&2
fi
echo "== done: $out/report.md, $out/results.json, $out/scale.png"
