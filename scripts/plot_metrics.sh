#!/bin/sh
# scripts/plot_metrics.sh METRICS.jsonl [--out DIR]
#
# Draws what gpubox_train appended to runner.metrics_path (default log/metrics.jsonl) as
# DIR/metrics.png (default DIR: the metrics file's folder), three panels over the passes in file
# order: train AUC with each epoch's test AUC (runner.test_data_dir), train and test logloss, and
# examples/s (all cards, and per card as PaddleRec counts it). The numbers drawn are written
# beside it (metrics_passes.dat, metrics_tests.dat). Needs gnuplot (scripts/setup.sh installs
# gnuplot-nox). POSIX sh.
set -eu

usage() { echo "usage: scripts/plot_metrics.sh METRICS.jsonl [--out DIR]" >&2; exit 2; }
metrics=""
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || usage; out="$2"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "plot_metrics: unknown option $1" >&2; usage ;;
    *) [ -z "$metrics" ] || usage; metrics="$1"; shift ;;
  esac
done
[ -n "$metrics" ] || usage
[ -f "$metrics" ] || { echo "plot_metrics: no metrics file '$metrics'" >&2; exit 1; }
[ -n "$out" ] || out="$(dirname "$metrics")"
if ! command -v gnuplot >/dev/null 2>&1; then
  echo "plot_metrics: gnuplot is not installed (scripts/setup.sh installs gnuplot-nox)" >&2
  exit 2
fi
mkdir -p "$out"
passes="$out/metrics_passes.dat"
tests="$out/metrics_tests.dat"

# One row per pass line: index (file order, from 0 as passes count), pass, auc, logloss, ips,
# ips_per_card; one row per test line: the index of the epoch's last pass, epoch, test_auc,
# test_logloss. null -> NaN
# (gnuplot leaves the point out).
awk -v passes="$passes" -v tests="$tests" '
  function field(name,   start) {
    if (!match($0, "\"" name "\": *(-?[0-9][-+0-9.eE]*|null)")) return "NaN"
    start = substr($0, RSTART, RLENGTH)
    sub(/^"[^"]*": */, "", start)
    return start == "null" ? "NaN" : start
  }
  BEGIN { print "# index pass auc logloss ips ips_per_card" > passes
          print "# index epoch test_auc test_logloss" > tests }
  /"pass":/ { print n + 0, field("pass"), field("auc"), field("logloss"), field("ips"),
              field("ips_per_card") > passes; n++ }
  /"test_auc":/ { print n - 1, field("epoch"), field("test_auc"), field("test_logloss") > tests }
  END { if (n == 0) exit 3 }
' "$metrics" || { echo "plot_metrics: '$metrics' holds no pass line (\"pass\": ...)" >&2; exit 1; }
pass_count="$(grep -vc '^#' "$passes" || true)"
have_tests=0
[ "$(grep -vc '^#' "$tests" || true)" -gt 0 ] && have_tests=1

png="$out/metrics.png"
script="$out/metrics.gp"
{
  echo "set terminal png size 900,1000"
  echo "set output '$png'"
  echo "set multiplot layout 3,1 title 'GPUBox: $(basename "$metrics")'"
  echo "set grid; set key bottom right; set xlabel 'pass (in file order)'"
  [ "$pass_count" -gt 20 ] || echo "set xtics 1"
  echo "set ylabel 'AUC'"
  if [ "$have_tests" = 1 ]; then
    echo "plot '$passes' using 1:3 with linespoints title 'train', '$tests' using 1:3 with linespoints title 'test (per epoch)'"
  else
    echo "plot '$passes' using 1:3 with linespoints title 'train'"
  fi
  echo "set key top right; set ylabel 'logloss'"
  if [ "$have_tests" = 1 ]; then
    echo "plot '$passes' using 1:4 with linespoints title 'train', '$tests' using 1:4 with linespoints title 'test (per epoch)'"
  else
    echo "plot '$passes' using 1:4 with linespoints title 'train'"
  fi
  echo "set key bottom right; set ylabel 'examples/s'; set yrange [0:*]"
  echo "plot '$passes' using 1:5 with linespoints title 'all cards', '$passes' using 1:6 with linespoints title 'per card'"
  echo "unset multiplot"
} >"$script"
gnuplot "$script" >"$out/gnuplot.log" 2>&1 || {
  cat "$out/gnuplot.log" >&2
  echo "plot_metrics: gnuplot failed on $script" >&2
  exit 1
}
echo "plot_metrics: wrote $png ($pass_count passes, $(grep -vc '^#' "$tests" || true) test evaluations)"
