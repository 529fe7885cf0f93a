#!/usr/bin/env bash
# scripts/launch.sh: PaddleRec's fleetrun for the parameter-server modes (runner.sync_mode async,
# sync or geo): starts gpubox_server shards and gpubox_train trainers, logs as fleetrun does, and
# stops every process it started when one fails or when it is stopped.
#
# One machine:
#   scripts/launch.sh --server_num S --worker_num W [--config C] [-o key=value ...]
#     S servers on free loopback ports (a fresh token only this job knows), W trainers
#     (PADDLE_TRAINER_ID 0..W-1) against them.
# Several machines (run the same command on each; each starts the endpoints of its own address):
#   scripts/launch.sh --servers ip:port,... --workers ip:port,... [--config C] [-o key=value ...]
#     Endpoints whose ip is POD_IP (default 127.0.0.1) are started here: server i as shard i of
#     the list, worker i as PADDLE_TRAINER_ID i. TRAINING_ROLE=PSERVER or TRAINER starts only that
#     role (with PADDLE_TRAINER_ID: only that worker), as PaddleRec's per-process variables do.
#     Off loopback, GPUBOX_AUTH_TOKEN_FILE must name a token file every machine shares.
#     FLAGS_selected_gpus (optional): this machine's cards, split over its trainers (a block
#     each, or one each in turn when there are fewer cards than trainers); unset, none is given.
#     With TRAINING_ROLE=TRAINER and PADDLE_TRAINER_ID (one trainer a process), that trainer gets
#     the whole list: give each process its own FLAGS_selected_gpus, as Paddle's launch does.
# Collective mode (runner.use_fleet without sync_mode; PaddleRec's `fleetrun --gpus=0,1`):
#   scripts/launch.sh --gpus 0,1 [--worker_num W] [--config C] [-o key=value ...]
#     no servers; W trainers (default 1) on this machine share the cards (a multiple of W, split
#     in order; one trainer drives several cards), meeting through a fresh rendezvous folder.
#     FLAGS_selected_gpus stands for --gpus when neither it nor servers are given. The default
#     config is configs/config_collective.yaml.
# fleetrun's training script argument (tools/static_ps_trainer.py, tools/trainer.py) is accepted
# and ignored, with a note. Other arguments go to every gpubox_train; --config and -o go to the
# servers too (the same row layout). Logs: log/serverlog.N, log/workerlog.N. The exit status is
# 0 when every worker here
# finished; else the first failure's, named on stderr (a worker's status, or 1 for a server that
# died while workers ran), after every process started here was stopped.
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi
set -euo pipefail
# `wait -n -p` (which process ended) came with bash 5.1.
if ((BASH_VERSINFO[0] < 5 || (BASH_VERSINFO[0] == 5 && BASH_VERSINFO[1] < 1))); then
  echo "launch.sh: needs bash 5.1 or newer (this is $BASH_VERSION)" >&2
  exit 2
fi

repo="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/lib/procs.sh
source "$repo/scripts/lib/procs.sh"  # (procs_wait_for_port, procs_stop_pids, procs_hold_log, procs_release_logs)
source "$repo/scripts/lib/config_args.sh"  # (config_flag)
bin="${GPUBOX_BUILD_DIR:-$repo/build}/bin"
usage() {
  sed -n '2,/^if /p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}
die() {
  echo "launch: $*" >&2
  exit 2
}

# need_val "$@": dies unless the flag in $1 has a value after it (not another flag).
need_val() {
  [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"
  case "$2" in --*) die "$1 needs a value, not the flag $2 (see --help)" ;; esac
}

server_num="" worker_num="" server_list="" worker_list="" config="" gpus=""
config_args=()  # --config C and -o k=v: for the servers and the trainers
train_args=()   # everything else: for the trainers only
while [ $# -gt 0 ]; do
  case "$1" in
    --server_num) need_val "$@"; server_num="$2"; shift 2 ;;
    --server_num=*) need_val "${1%%=*}" "${1#*=}"; server_num="${1#*=}"; shift ;;
    --worker_num) need_val "$@"; worker_num="$2"; shift 2 ;;
    --worker_num=*) need_val "${1%%=*}" "${1#*=}"; worker_num="${1#*=}"; shift ;;
    --servers) need_val "$@"; server_list="$2"; shift 2 ;;
    --servers=*) need_val "${1%%=*}" "${1#*=}"; server_list="${1#*=}"; shift ;;
    --workers) need_val "$@"; worker_list="$2"; shift 2 ;;
    --workers=*) need_val "${1%%=*}" "${1#*=}"; worker_list="${1#*=}"; shift ;;
    --gpus) need_val "$@"; gpus="$2"; shift 2 ;;
    --gpus=*) need_val "${1%%=*}" "${1#*=}"; gpus="${1#*=}"; shift ;;
    # The config and overrides in any spelling gpubox_train takes (config_args.sh): the servers
    # get them too.
    --config | -config | -m | --config_yaml | -config_yaml | --config=* | -config=* | \
    --config_yaml=* | -config_yaml=* | -o | --o | -o=* | --o=* | -o[!u]*=* | -ou[!t]*=*)
      config_flag "$1" "${2-}"
      [ "$config_flag_used" -eq 1 ] || [ $# -ge 2 ] || die "$1 needs a value"
      if [ "$config_flag_kind" = config ]; then
        config="$config_flag_value"; config_args+=(--config "$config")
      else
        config_args+=(-o "$config_flag_value")
      fi
      shift "$config_flag_used" ;;
    -h | --help) usage 0 ;;
    # This script's own flags spelt with hyphens ran on with the flag handed to the trainers.
    --server-num* | --worker-num*)
      die "${1%%=*}: did you mean $(echo "${1%%=*}" | tr - _ | sed 's/^__/--/')? (this script's flags are spelt with underscores)" ;;
    # fleetrun's training script (tools/static_ps_trainer.py, tools/trainer.py ...): gpubox_train
    # is the trainer, so a PaddleRec command line works as it is.
    *.py) echo "launch: $1: GPUBox needs no training script (gpubox_train trains); ignored" >&2
          shift ;;
    *) train_args+=("$1"); shift ;;
  esac
done
# Collective: --gpus, or FLAGS_selected_gpus with no servers named.
if [ -z "$gpus" ] && [ -z "$server_num$server_list$worker_list" ]; then gpus="${FLAGS_selected_gpus:-}"; fi
collective=""
if [ -n "$gpus" ]; then
  collective=1
  [ -z "$server_num$server_list$worker_list" ] || die "--gpus (Collective mode) starts no servers: drop --server_num/--servers/--workers"
fi
if [ -z "$config" ]; then
  config="$repo/configs/config_$([ -n "$collective" ] && echo collective || echo ps).yaml"
  config_args=(--config "$config" "${config_args[@]}")
fi
{ [ -x "$bin/gpubox_train" ] && [ -x "$bin/gpubox_server" ]; } ||
  die "no gpubox_train/gpubox_server in $bin (scripts/build.sh cpu, or set GPUBOX_BUILD_DIR)"
is_count() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }

pod_ip="${POD_IP:-127.0.0.1}"
role="${TRAINING_ROLE:-}"
[ -z "$role" ] || [ "$role" = PSERVER ] || [ "$role" = TRAINER ] ||
  die "TRAINING_ROLE='$role': expected PSERVER or TRAINER (or unset: both)"
is_loopback() { case "$1" in 127.* | localhost) return 0 ;; esac; return 1; }

if [ -n "$collective" ]; then
  [[ "$gpus" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--gpus '$gpus': expected card ids such as 0,1"
  worker_num="${worker_num:-1}"
  is_count "$worker_num" || die "--worker_num must be a positive count"
  IFS=',' read -r -a cards <<<"$gpus"
  # A card named twice goes to two trainers, or twice to one (two of its cards one GPU).
  for ((i = 0; i < ${#cards[@]}; i++)); do
    for ((j = 0; j < i; j++)); do
      [ "$((10#${cards[i]}))" != "$((10#${cards[j]}))" ] ||
        die "--gpus $gpus names card ${cards[i]} twice: each card goes to one trainer once"
    done
  done
  [ $(( ${#cards[@]} % worker_num )) = 0 ] ||
    die "--gpus $gpus: ${#cards[@]} cards do not split evenly over $worker_num trainers"
  servers=() workers=()
  for ((i = 0; i < worker_num; i++)); do workers+=("127.0.0.1:0"); done
elif [ -n "$server_list$worker_list" ]; then
  [ -n "$server_list" ] && [ -n "$worker_list" ] || die "--servers and --workers go together"
  [ -z "$server_num$worker_num" ] || die "--server_num/--worker_num or --servers/--workers, not both"
  IFS=',' read -r -a servers <<<"$server_list"
  IFS=',' read -r -a workers <<<"$worker_list"
  for e in "${servers[@]}" "${workers[@]}"; do
    [[ "$e" =~ ^[^:]+:[0-9]+$ ]] || die "endpoint '$e' is not ip:port"
  done
  # (Port 0: each its own port, the kernel's choice.)
  # awk, not grep -v: with every entry on port 0 grep selects nothing and fails the pipeline
  # (set -o pipefail), which ended the script silently.
  duplicate="$(printf '%s\n' "${servers[@]}" "${workers[@]}" | awk '!/:0$/' | sort | uniq -d | head -n 1)"
  [ -z "$duplicate" ] || die "endpoint $duplicate is listed twice in --servers/--workers: each server and trainer needs its own port"
else
  is_count "${server_num:-}" || die "--server_num must be a positive count (or use --servers; --help)"
  is_count "${worker_num:-}" || die "--worker_num must be a positive count (or use --workers; --help)"
  servers=() workers=()
  # Port 0: each server's port is the kernel's choice at bind time (read back from its log
  # below), so launches side by side never race for one.
  for ((i = 0; i < server_num; i++)); do servers+=("127.0.0.1:0"); done
  for ((i = 0; i < worker_num; i++)); do workers+=("127.0.0.1:0"); done
fi

# Processes started here: pid, what it is, its log.
pids=() names=() logs=() kinds=()
token_dir=""
stop_all() {
  procs_stop_pids "${pids[@]:-}"
  pids=()
  procs_release_logs
  if [ -n "$token_dir" ]; then rm -rf "$token_dir"; fi
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

token_file="${GPUBOX_AUTH_TOKEN_FILE:-}"
if [ -n "$collective" ]; then
  # No servers: the trainers hold the table; several meet through a folder of their own.
  token_dir="$(mktemp -d "${TMPDIR:-/tmp}/gpubox_collective.XXXXXX")"
  export GPUBOX_RENDEZVOUS="${GPUBOX_RENDEZVOUS:-file://$token_dir/rendezvous}"
elif [ -z "$token_file" ]; then
  for e in "${servers[@]}"; do
    is_loopback "${e%:*}" || die "server $e is off loopback: set GPUBOX_AUTH_TOKEN_FILE to a token file (mode 600) every machine shares"
  done
  token_dir="$(mktemp -d "${TMPDIR:-/tmp}/gpubox_token.XXXXXX")"
  token_file="$token_dir/token"
  (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$token_file")
fi
[ -n "$collective" ] || export GPUBOX_AUTH_TOKEN_FILE="$token_file"

mkdir -p log
here() { [ "$1" = "$pod_ip" ] || { is_loopback "$1" && is_loopback "$pod_ip"; }; }

# The folder that holds every save the trainers write or read (gpubox_train --print_model_root):
# the servers' --data_dir, since their SAVE and LOAD paths must stay inside it.
server_args=()
if [ "$role" != TRAINER ]; then
  model_root="$("$bin/gpubox_train" "${config_args[@]}" "${train_args[@]}" --print_model_root 2>/dev/null || true)"
  if [ -n "$model_root" ]; then mkdir -p "$model_root" && server_args+=(--data_dir "$model_root"); fi
fi

# A TRAINING_ROLE=PSERVER server exits when every trainer of its job ended it (PaddleRec's
# servers stop after the workers' stop_worker); started beside its trainers, this script stops it.
[ "$role" != PSERVER ] || server_args+=(--exit_when_job_ends)
servers_here=0
if [ "$role" != TRAINER ]; then
  for i in "${!servers[@]}"; do
    ip="${servers[$i]%:*}" port="${servers[$i]##*:}"
    here "$ip" || continue
    logf="log/serverlog.$i"
    procs_hold_log launch "$logf"
    # Emptied before the start (the server truncates it only once it runs): the 'listening on'
    # line an earlier job's server left there would otherwise be read as this one's port.
    : >"$logf"
    "$bin/gpubox_server" --port "$port" --bind "$ip" --shard_id "$i" --shard_num "${#servers[@]}" \
      --auth_token_file "$token_file" "${config_args[@]}" "${server_args[@]}" >"$logf" 2>&1 &
    pids+=($!) names+=("gpubox_server $i ($ip:$port)") logs+=("$logf") kinds+=(server)
    servers_here=$((servers_here + 1))
    # A server that is alive keeps its chance: under load (a loaded CI machine, a build beside
    # it) its start has taken over 10 s; one that exits is reported at once.
    waited=0
    listened="$(procs_wait_for_port "${pids[-1]}" "$logf")" || waited=$?
    if [ "$waited" = 1 ]; then
      tail -n 20 "$logf" >&2
      die "gpubox_server $i failed to start; see $logf"
    fi
    if [ "$waited" != 0 ]; then
      tail -n 20 "$logf" >&2
      die "gpubox_server $i did not write its 'gpubox_server listening on' line to $logf within $procs_port_wait_s s (its last lines above)"
    fi
    if [ "$port" = 0 ]; then
      port="$listened"
      servers[$i]="$ip:$port"
    fi
    echo "launch: gpubox_server $i on $ip:$port (pid ${pids[-1]}, log: $logf)"
  done
fi
server_csv="$(IFS=,; echo "${servers[*]}")"

# The workers to start here.
if [ "$role" = TRAINER ] && [ -n "${PADDLE_TRAINER_ID:-}" ]; then
  [[ "$PADDLE_TRAINER_ID" =~ ^[0-9]+$ ]] && [ "$PADDLE_TRAINER_ID" -lt "${#workers[@]}" ] ||
    die "PADDLE_TRAINER_ID='$PADDLE_TRAINER_ID' is not a trainer of this job: --workers lists ${#workers[@]}, ids 0 to $(( ${#workers[@]} - 1 ))"
fi
mine=()
if [ "$role" != PSERVER ]; then
  for i in "${!workers[@]}"; do
    here "${workers[$i]%:*}" || continue
    if [ "$role" = TRAINER ] && [ -n "${PADDLE_TRAINER_ID:-}" ] && [ "$PADDLE_TRAINER_ID" != "$i" ]; then continue; fi
    mine+=("$i")
  done
fi
# The cards of each worker. Collective: its block of --gpus. PS modes: FLAGS_selected_gpus are
# this machine's cards for its trainers, which each need cards of their own (a trainer drives
# its cards' dense nets): a block each when they split evenly, else one each in turn when there
# are fewer cards than trainers (they share). Unset: no card list is given (a cpu build's PS
# trainer uses none; a cuda one takes gpubox_train's default, card 0).
ps_cards=()
if [ -z "$collective" ] && [ -n "${FLAGS_selected_gpus:-}" ] && [ "${#mine[@]}" -gt 0 ]; then
  [[ "$FLAGS_selected_gpus" =~ ^[0-9]+(,[0-9]+)*$ ]] ||
    die "FLAGS_selected_gpus='$FLAGS_selected_gpus': expected card ids such as 0,1"
  IFS=',' read -r -a ps_cards <<<"$FLAGS_selected_gpus"
  [ "${#ps_cards[@]}" -lt "${#mine[@]}" ] || [ $(( ${#ps_cards[@]} % ${#mine[@]} )) = 0 ] ||
    die "FLAGS_selected_gpus=$FLAGS_selected_gpus: ${#ps_cards[@]} cards do not split evenly over the ${#mine[@]} trainers of this machine"
fi
workers_here=0
for i in "${mine[@]}"; do
  logf="log/workerlog.$i"
  selected=""
  if [ -n "$collective" ]; then  # this trainer's block of the cards
    per=$(( ${#cards[@]} / ${#workers[@]} ))
    selected="$(IFS=,; echo "${cards[*]:$((i * per)):$per}")"
  elif [ "${#ps_cards[@]}" -ge "${#mine[@]}" ]; then
    per=$(( ${#ps_cards[@]} / ${#mine[@]} ))
    selected="$(IFS=,; echo "${ps_cards[*]:$((workers_here * per)):$per}")"
  elif [ "${#ps_cards[@]}" -gt 0 ]; then
    selected="${ps_cards[$((workers_here % ${#ps_cards[@]}))]}"
  fi
  (
    if [ -n "$selected" ]; then export FLAGS_selected_gpus="$selected"; else unset FLAGS_selected_gpus; fi
    PADDLE_PSERVERS_IP_PORT_LIST="$server_csv" PADDLE_TRAINERS_NUM="${#workers[@]}" \
      PADDLE_TRAINER_ID="$i" TRAINING_ROLE=TRAINER \
      exec "$bin/gpubox_train" "${config_args[@]}" "${train_args[@]}"
  ) >"$logf" 2>&1 &
  pids+=($!) names+=("worker $i") logs+=("$logf") kinds+=(worker)
  workers_here=$((workers_here + 1))
  echo "launch: worker $i of ${#workers[@]}${selected:+ on cards $selected} (log: $logf)"
done
[ "${#pids[@]}" -gt 0 ] || die "nothing to start on POD_IP=$pod_ip (no endpoint of --servers/--workers is on it)"

# Until every worker here finished: the first failure (a worker's non-zero status, or a server
# that exits while workers run) stops everything. `wait -n` takes them in the order they ended (a
# poll in index order named worker 0, which failed because worker 1 had been killed).
declare -A index_of=()
for k in "${!pids[@]}"; do index_of[${pids[$k]}]=$k; done
left=$workers_here
while true; do
  live=()
  for k in "${!pids[@]}"; do [ -z "${pids[$k]}" ] || live+=("${pids[$k]}"); done
  [ "${#live[@]}" -gt 0 ] || exit 0
  status=0
  pid=""
  wait -n -p pid "${live[@]}" || status=$?
  if [ -z "$pid" ]; then  # none of those it waited for was its child: never so, unless bash errs
    echo "launch: wait -n named no process (status $status) while ${#live[@]} ran; stopping the job" >&2
    exit 1
  fi
  k="${index_of[$pid]}"
  pids[k]=""
  if [ "${kinds[$k]}" = worker ] && [ "$status" = 0 ]; then
    left=$((left - 1))
    echo "launch: ${names[$k]} finished"
  elif [ "${kinds[$k]}" = server ] && [ "$status" = 0 ] && [ "$role" = PSERVER ]; then
    servers_here=$((servers_here - 1))
    echo "launch: ${names[$k]} exited with its job"
  else
    echo "launch: ${names[$k]} exited with status $status; stopping the job. Last lines of ${logs[$k]}:" >&2
    tail -n 15 "${logs[$k]}" >&2
    # A process's end is often what made another fail: name those gone since.
    sleep 0.2
    for j in "${!pids[@]}"; do
      other="${pids[$j]}"
      if [ -n "$other" ] && ! kill -0 "$other" 2>/dev/null; then
        other_status=0
        wait "$other" 2>/dev/null || other_status=$?
        pids[j]=""
        echo "launch: ${names[$j]} exited too, with status $other_status (${logs[$j]})" >&2
      fi
    done
    [ "${kinds[$k]}" = server ] && [ "$status" = 0 ] && status=1
    exit "$status"
  fi
  if [ "$workers_here" -gt 0 ] && [ "$left" = 0 ]; then
    echo "launch: every worker finished"
    exit 0
  fi
  if [ "$role" = PSERVER ] && [ "$servers_here" = 0 ]; then
    echo "launch: every server here exited with its job"
    exit 0
  fi
done
