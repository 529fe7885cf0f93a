#!/usr/bin/env bash
# scripts/paddlerec_sweep.sh: PaddleRec's model zoo (models/rank/**/*.yaml), unchanged, through
# GPUBox: which configs load, which train the network their folder names, which are refused and
# why (issue 32's measure).
#
#   scripts/paddlerec_sweep.sh PADDLEREC_DIR [--all] [--families "dnn fm ..."] [--timeout S]
#                              [--out FILE.tsv] [--work DIR]
#
# For each config: `gpubox_train -m CONFIG --print_model_root` (the config read, its keys
# checked, its network chosen: nothing trained), then one epoch on the folder's shipped sample,
# bounded by --timeout seconds (default 600: the slowest, fat_deepffm/config.yaml's async epoch,
# 80 steps each carrying its 71 MB dense table, took 292 s on a 2-core machine at load 15, the
# others under 30 s): gpubox_train in the gpubox mode, scripts/launch.sh
# with 1 server and 1 worker in the async/sync/geo modes. The config file is never edited; the
# only overrides are `-o runner.epochs=1`, the data folders when the config's do not exist (the
# first folder holding a file under <model>/data/: the sample PaddleRec ships), and
# `-o runner.pipe_command=""` when Paddle is not importable (its Python readers need it; GPUBox
# then reads the files itself). Each run happens in its own folder under --work (saves, logs);
# with Paddle, that folder links the model folder's *.py and PaddleRec's models/, so the config's
# pipe_command finds its reader whether PaddleRec runs it from the model folder (`python
# benchmark_reader.py`) or from its root (`python models/rank/dnn/queuedataset_reader.py`).
#
# Outcomes, one row per config (markdown on stdout, tab-separated in --out):
#   trains  - it trained one epoch, the network its folder names (dnn, slot_dnn -> dnn,
#             logistic_regression -> wide, others by their name)
#   loads   - the config was accepted but training failed, timed out, or trained another network
#   refused - the config was refused (the reason: the first line of the error, unknown keys
#             listed by name)
# --out starts with `# key: value` lines (the PaddleRec and GPUBox commits, date, whether Paddle
# was importable, the timeout) and ends with `# seconds: S`, the run time:
# scripts/sweep_table.py renders README.md's table from it.
# Then the count per outcome. Default families: issue 32's table; --all: every models/rank folder.
# Binaries: $GPUBOX_BUILD_DIR/bin (default build/bin).
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi
set -uo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
build_dir="${GPUBOX_BUILD_DIR:-$repo/build}"
case "$build_dir" in /*) ;; *) build_dir="$PWD/$build_dir" ;; esac  # the runs cd elsewhere
export GPUBOX_BUILD_DIR="$build_dir"  # launch.sh, which the PS-mode runs call, reads it there too
bin="$build_dir/bin"
die() {
  echo "paddlerec_sweep: $*" >&2
  exit 2
}

families="dnn wide_deep deepfm slot_dnn logistic_regression dcn_v2 dcn fm ffm deepfefm xdeepfm"
families+=" flen fat_deepffm dlrm autoint"
paddlerec="" timeout_s=600 out="" work=""
while [ $# -gt 0 ]; do
  case "$1" in
    --all) families="" ; shift ;;
    --families) families="${2:?}"; shift 2 ;;
    --timeout) timeout_s="${2:?}"; shift 2 ;;
    --out) out="${2:?}"; shift 2 ;;
    --work) work="${2:?}"; shift 2 ;;
    -h | --help) sed -n '2,/^if /p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (--help)" ;;
    *) [ -z "$paddlerec" ] || die "one PADDLEREC_DIR, got '$paddlerec' and '$1'"
       paddlerec="$1"; shift ;;
  esac
done
[ -n "$paddlerec" ] || die "usage: scripts/paddlerec_sweep.sh PADDLEREC_DIR [--help]"
rank="$(cd "$paddlerec" 2>/dev/null && pwd)/models/rank"
[ -d "$rank" ] || die "no models/rank under '$paddlerec'"
[ -x "$bin/gpubox_train" ] || die "no gpubox_train in $bin (scripts/build.sh, or GPUBOX_BUILD_DIR)"
[[ "$timeout_s" =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a positive number of seconds"
if [ -z "$families" ]; then
  families="$(cd "$rank" && ls -d */ | tr -d / | tr '\n' ' ')"
fi
work="${work:-$(mktemp -d "${TMPDIR:-/tmp}/paddlerec_sweep.XXXXXX")}"
mkdir -p "$work" || die "cannot create --work '$work'"
work="$(cd "$work" && pwd)"
paddle_importable=""
if python3 -c 'import paddle' >/dev/null 2>&1; then paddle_importable=1; fi
export FLAGS_selected_gpus="${FLAGS_selected_gpus:-0}"

# The GPUBox network a PaddleRec folder names (trainer/config/network_choice.cpp).
expected_network() {
  case "$1" in
    slot_dnn) echo dnn ;;
    logistic_regression) echo wide ;;
    *) echo "$1" ;;
  esac
}

# The scalar value of `key:` in a YAML file (first occurrence; quotes, brackets, comments off).
yaml_value() {  # FILE KEY
  sed -n "s/^[[:space:]]*$2:[[:space:]]*//p" "$1" | head -1 | sed 's/[[:space:]]#.*$//' |
    tr -d "\"'[]" | sed 's/[[:space:]]*$//'
}

# One line from a run's output: gpubox_train's first error (else launch.sh's) without its
# program and status prefix; for unknown keys, their names.
reason_of() {  # LOGFILE
  awk '
    /^launch: / { if (launch == "") launch = $0; next }
    /^gpubox_train: / { if (first == "") first = $0; next }
    first != "" && /unknown key/ { sub(/.*unknown key /, ""); keys = keys (keys ? ", " : "") $1; next }
    first != "" && /^  / { sub(/^  [^ ]*: /, ""); rest = rest (rest ? "; " : "") $0 }
    END {
      if (first == "") first = launch
      sub(/^(gpubox_train|launch): /, "", first)
      sub(/^(InvalidArgument|NotFound|Internal|IOError|FailedPrecondition): /, "", first)
      sub(/^[^ ]*\.yaml(:[0-9]+)?: /, "", first)
      if (keys != "") { first = "unknown keys: " keys; if (rest != "") first = first "; " rest }
      gsub(/\t/, " ", first)
      print substr(first, 1, 300)
    }' "$1"
}

row() {  # CONFIG OUTCOME NETWORK DETAIL
  printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "${4//|/\\|}"
  [ -z "$out" ] || printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$out"
}

# The -o overrides of one config (see the header), into the array `overrides`.
config_overrides() {  # CONFIG FOLDER
  local config="$1" folder="$2" key value sample
  overrides=(-o runner.epochs=1)
  sample="$(find "$folder/data" -type f 2>/dev/null | LC_ALL=C sort | head -1)"
  sample="${sample:+$(dirname "$sample")}"
  for key in train_data_dir test_data_dir; do
    value="$(yaml_value "$config" "$key")"
    [ -n "$value" ] || continue
    case "$value" in /*) ;; *) value="$(dirname "$config")/$value" ;; esac
    if [ ! -e "$value" ] && [ -n "$sample" ]; then overrides+=(-o "runner.$key=$sample"); fi
  done
  if [ -n "$(yaml_value "$config" pipe_command)" ] && [ -z "$paddle_importable" ]; then
    overrides+=(-o runner.pipe_command=)
  fi
}

# The folder of one config's runs under --work.
run_dir() {  # CONFIG
  local rel="${1#"$rank"/}" dir
  dir="$work/${rel//\//__}"
  echo "${dir%.yaml}"
}

# A config starting from a save that another config of its folder writes (dnn's
# config_to_static.yaml starts from config.yaml's output_model_dnn/0, as PaddleRec's own order of
# runs has it) starts from that config's save in this sweep, copied into its run folder; prints
# that config's file name, nothing when there is none.
seed_init_save() {  # CONFIG RUN
  local init sibling save
  init="$(yaml_value "$1" model_init_path)"
  [ -n "$init" ] || init="$(yaml_value "$1" init_model_path)"
  case "$init" in "" | /*) return ;; esac
  for sibling in "$(dirname "$1")"/*.yaml; do
    if [ "$sibling" = "$1" ] || [ "$(yaml_value "$sibling" model_save_path)" != "${init%%/*}" ]; then
      continue
    fi
    save="$(run_dir "$sibling")/$init"
    [ -d "$save" ] || continue
    mkdir -p "$2/$(dirname "$init")" && cp -r "$save" "$2/$init" && basename "$sibling"
    return
  done
}

# The links that let a pipe_command run from the run folder (see the header).
link_readers() {  # CONFIG RUN
  if [ -z "$paddle_importable" ] || [ -z "$(yaml_value "$1" pipe_command)" ]; then return; fi
  ln -s "$(dirname "$rank")" "$2/models"
  ln -s "$(dirname "$1")"/*.py "$2/" 2>/dev/null || true
}

sweep_one() {  # CONFIG
  local config="$1" rel family run mode network expected rc seeded start
  rel="${config#"$rank"/}"
  family="${rel%%/*}"
  run="$(run_dir "$config")"
  rm -rf "$run" && mkdir -p "$run"
  seeded="$(seed_init_save "$config" "$run")"
  link_readers "$config" "$run"
  config_overrides "$config" "$rank/$family"
  expected="$(expected_network "$family")"
  if ! (cd "$run" && timeout 60 nice -n 10 "$bin/gpubox_train" -m "$config" "${overrides[@]}" \
          --print_model_root) >"$run/load.log" 2>&1; then
    row "$rel" refused - "$(reason_of "$run/load.log")"
    return
  fi
  network="$(sed -n 's/.*network: \([a-z_0-9]*\) (from.*/\1/p' "$run/load.log" | head -1)"
  mode="$(yaml_value "$config" sync_mode)"
  start=$SECONDS
  case "$mode" in
    async | sync | geo)
      (cd "$run" && timeout "$timeout_s" nice -n 10 "$repo/scripts/launch.sh" --server_num 1 \
         --worker_num 1 --config "$config" "${overrides[@]}") >"$run/train.log" 2>&1
      rc=$?
      cat "$run/log/workerlog.0" >>"$run/train.log" 2>/dev/null ;;
    *)
      (cd "$run" && timeout "$timeout_s" nice -n 10 "$bin/gpubox_train" -m "$config" \
         "${overrides[@]}") >"$run/train.log" 2>&1
      rc=$? ;;
  esac
  if [ "$rc" = 124 ]; then
    row "$rel" loads "$network" "training timed out after ${timeout_s}s (--timeout)"
  elif [ "$rc" != 0 ] || ! grep -q 'epoch: 0 done' "$run/train.log"; then
    row "$rel" loads "$network" "training failed (exit $rc): $(reason_of "$run/train.log")"
  elif [ "$network" != "$expected" ]; then
    row "$rel" loads "$network" "trained $network, but the folder names $expected"
  else
    [ -z "$seeded" ] || seeded=", from $seeded's save"
    row "$rel" trains "$network" "${mode:-gpubox} mode, $(grep -o 'epoch: 0 done, auc: [0-9.na-]*' \
      "$run/train.log" | head -1 | sed 's/epoch: 0 done, //'), $((SECONDS - start)) s$seeded"
  fi
}

# The commit of a checkout, "+changes" when its tracked files under PATHSPEC differ from it.
commit_of() {  # DIR PATHSPEC...
  local dir="$1" c
  shift
  c="$(git -C "$dir" rev-parse --short=8 HEAD 2>/dev/null)" || { echo "not a git checkout"; return; }
  [ -z "$(git -C "$dir" status --porcelain --untracked-files=no -- "$@" 2>/dev/null)" ] ||
    c+="+changes"
  echo "$c"
}
paddlerec_commit="$(commit_of "$paddlerec" models/rank)"
# GPUBox's: its code and scripts (the documents and tests do not change a run).
gpubox_commit="$(commit_of "$repo" . ':(exclude)*.md' ':(exclude)docs' ':(exclude)tests')"
if [ -n "$out" ]; then  # the header scripts/sweep_table.py reads
  paddle="${paddle_importable:+importable}"
  printf '# %s: %s\n' paddlerec "$paddlerec_commit" gpubox "$gpubox_commit" \
    date "$(date -u +%F)" paddle "${paddle:-not importable}" timeout "${timeout_s}s" >"$out"
fi
echo "PaddleRec: $rank ($paddlerec_commit)"
echo "runs: $work; Paddle importable: ${paddle_importable:-no}; timeout ${timeout_s}s per config"
echo
echo "| config | outcome | network | detail |"
echo "|---|---|---|---|"
configs=()
for family in $families; do
  [ -d "$rank/$family" ] || die "no folder models/rank/$family"
  while IFS= read -r f; do configs+=("$f"); done < <(find "$rank/$family" -name '*.yaml' | LC_ALL=C sort)
done
trains=0 loads=0 refused=0
for config in "${configs[@]}"; do
  line="$(sweep_one "$config")"
  echo "$line"
  case "$line" in
    *"| trains |"*) trains=$((trains + 1)) ;;
    *"| loads |"*) loads=$((loads + 1)) ;;
    *) refused=$((refused + 1)) ;;
  esac
done
echo
echo "${#configs[@]} configs: $trains train the network their folder names, $loads load only," \
  "$refused refused"
[ -z "$out" ] || printf '# seconds: %s\n' "$SECONDS" >>"$out"
