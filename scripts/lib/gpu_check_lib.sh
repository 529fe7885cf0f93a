# shellcheck shell=bash
# scripts/lib/gpu_check_lib.sh: the parts of scripts/gpu_check.sh that read what a run left
# behind or watch a run, sourced by it (and by tests/scripts/gpu_check_test.sh, which runs them
# on this machine without a GPU). Needs bash.
#
#   gc_run_watched LIMIT HANG LOG CMD...  CMD in the background (in folder $RUN_CWD when set),
#                                 output to LOG; its status, or 124 when it ran past LIMIT
#                                 seconds, 125 when LOG stayed silent for HANG seconds (0: no
#                                 silence check). Before such a run is stopped, LOG.hang.txt gets
#                                 every thread's stack of CMD and its descendants
#                                 (gc_dump_stacks). With GC_LIMIT_ENDS_RUN=1 the limit is the
#                                 run's planned end (a soak): CMD still running then is stopped
#                                 without a dump and the status is 0. gc_child is CMD's pid
#   gc_stop_child                 TERM (then KILL after 10 s) to the running CMD and descendants
#   gc_dump_stacks PID OUT        stacks of every thread of PID and its descendants (gdb, else
#                                 eu-stack, plus each thread's kernel state, wchan and, when
#                                 readable, /proc/PID/task/TID/stack), the kernel's NVIDIA Xid
#                                 lines (dmesg) and nvidia-smi, into OUT
#   gc_nccl_transports LOG [NVLINK]  the connections NCCL_DEBUG=INFO output in LOG names (one
#                                 line each: "P2P/CUMEM x8", "SHM/direct/direct x2") and the
#                                 graph types it chose ("graph: NVL/PIX"). Returns 0 when every
#                                 connection is P2P (NVLink or PCIe peer-to-peer: one node),
#                                 1 when one goes through SHM or NET, or when NVLINK is 1 (the
#                                 GPUs have NVLink) and no graph is of type NVL; 2 when LOG names
#                                 no connection
#   gc_topo_has_nvlink TOPO       0 when `nvidia-smi topo -m` output TOPO shows an NV<n> link
#   gc_last_pass_number FILE KEY  KEY's number in the last per-pass JSON object of FILE ("" if none)
#   gc_step_allocations METRICS   "" when every pass of the metrics file METRICS sized its steps
#                                 before it began (pass_step_allocations, _frees and
#                                 _pinned_allocations all 0), else what did (or that no pass did)
#   gc_compare_predictions A B TOL  0 when the `label prediction` lines of files A and B
#                                 (gpubox_train --predictions_out) match line for line: the same
#                                 text when TOL is 0 (prints where they differ), else the same
#                                 labels and predictions within TOL (prints the largest
#                                 difference, and what fails: line counts, the first differing
#                                 label, the line of a difference over TOL); else 1
#   gc_gpu_memory_start OUT / gc_gpu_memory_stop OUT
#                                 sample nvidia-smi's memory.used of every GPU every 500 ms into
#                                 OUT while a run goes on / stop it and print "gpu0 12345 MiB, ..."
#                                 (each GPU's high-water mark; nothing without nvidia-smi)

gc_child=""
gc_memory_sampler=""

# gc_alive PID: PID runs (a zombie, exited but not yet waited for, does not).
gc_alive() {
  local state
  [ -r "/proc/$1/stat" ] || return 1
  state="$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)"
  [ -n "$state" ] && [ "$state" != Z ]
}

# gc_descendants PID: PID and every process below it, parents first.
gc_descendants() {
  local pid kids kid
  echo "$1"
  kids="$(ps -o pid= --ppid "$1" 2>/dev/null || true)"
  for kid in $kids; do
    for pid in $(gc_descendants "$kid"); do echo "$pid"; done
  done
}

gc_dump_stacks() {
  local root="$1" out="$2" pid tid gdb eustack
  gdb="$(command -v gdb 2>/dev/null || true)"
  eustack="$(command -v eu-stack 2>/dev/null || true)"
  {
    echo "== stacks of pid $root and its descendants at $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    for pid in $(gc_descendants "$root"); do
      gc_alive "$pid" || continue
      echo
      echo "==== pid $pid: $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-300)"
      if [ -n "$gdb" ]; then
        timeout 120 "$gdb" -batch -nx -p "$pid" -ex 'set pagination off' -ex 'thread apply all bt' 2>&1 ||
          echo "(gdb could not attach: ptrace permissions? run as root or set kernel.yama.ptrace_scope=0)"
      elif [ -n "$eustack" ]; then
        timeout 120 "$eustack" -p "$pid" 2>&1 || echo "(eu-stack could not attach)"
      else
        echo "(neither gdb nor eu-stack is installed: kernel-side view only)"
      fi
      echo "---- threads (kernel view): tid name state wchan"
      for tid in /proc/"$pid"/task/*; do
        [ -d "$tid" ] || continue
        printf '%s %s %s %s\n' "${tid##*/}" "$(cat "$tid/comm" 2>/dev/null)" \
          "$(sed -n 's/^State:[[:space:]]*//p' "$tid/status" 2>/dev/null)" "$(cat "$tid/wchan" 2>/dev/null)"
        if [ -r "$tid/stack" ]; then sed 's/^/    /' "$tid/stack" 2>/dev/null || true; fi
      done
    done
    echo
    echo "== kernel log: NVIDIA Xid lines (dmesg)"
    if dmesg >/dev/null 2>&1; then
      dmesg 2>/dev/null | grep -i 'xid' || echo "(no Xid line)"
    else
      echo "(dmesg is not readable here: run as root, or see journalctl -k)"
    fi
    if command -v nvidia-smi >/dev/null 2>&1; then
      echo
      echo "== nvidia-smi"
      timeout 60 nvidia-smi 2>&1 || true
    fi
  } > "$out" 2>&1
}

gc_stop_child() {
  [ -n "$gc_child" ] || return 0
  local pids pid waited=0
  pids="$(gc_descendants "$gc_child")"
  for pid in $pids; do kill -TERM "$pid" 2>/dev/null || true; done
  while ((waited < 100)); do
    local any=0
    for pid in $pids; do gc_alive "$pid" && any=1; done
    ((any)) || break
    sleep 0.1
    waited=$((waited + 1))
  done
  for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done
  wait "$gc_child" 2>/dev/null || true
  gc_child=""
}

gc_run_watched() {
  local limit="$1" hang="$2" log="$3" rc=0 start size last_size=-1 last_change why="" nap=0.05
  shift 3
  (cd "${RUN_CWD:-.}" && exec "$@") >"$log" 2>&1 </dev/null &
  gc_child=$!
  start=$SECONDS
  last_change=$SECONDS
  while gc_alive "$gc_child"; do
    if ((SECONDS - start >= limit)); then why=limit; break; fi
    size="$(stat -c %s "$log" 2>/dev/null || echo 0)"
    if [ "$size" != "$last_size" ]; then
      last_size="$size"
      last_change=$SECONDS
    elif ((hang > 0 && SECONDS - last_change >= hang)); then
      why=hang
      break
    fi
    sleep "$nap"
    nap=$([ "$nap" = 0.05 ] && echo 0.2 || echo 1)
  done
  if [ "$why" = limit ] && [ "${GC_LIMIT_ENDS_RUN:-0}" = 1 ]; then
    echo "gpu_check: stopped after ${limit}s as planned" >> "$log"
    gc_stop_child
    return 0
  fi
  if [ -n "$why" ]; then
    gc_dump_stacks "$gc_child" "$log.hang.txt"
    if [ "$why" = limit ]; then
      echo "gpu_check: stopped after ${limit}s (the limit); stacks of every thread: $log.hang.txt" >> "$log"
    else
      echo "gpu_check: no output for ${hang}s (hung?); stacks of every thread: $log.hang.txt" >> "$log"
    fi
    gc_stop_child
    [ "$why" = limit ] && return 124
    return 125
  fi
  wait "$gc_child" || rc=$?
  gc_child=""
  return "$rc"
}

gc_nccl_transports() {
  local log="$1" nvlink="${2:-0}" conns graphs
  # "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read", "... via SHM/direct/direct", "via NET/IB/0".
  conns="$(grep -oE 'Channel [0-9]+(/[0-9]+)? ?: [0-9]+\[[0-9a-f]+\] -> [0-9]+\[[0-9a-f]+\] (\[[a-z]+\] )?via [A-Za-z0-9_/]+' "$log" 2>/dev/null |
           sed 's/.* via //' | sort | uniq -c | awk '{ printf "%s x%d\n", $2, $1 }')"
  # "Pattern 4, crossNic 0, nChannels 2, bw 40.000000/40.000000, type NVL/PIX, sameChannels 1".
  graphs="$(grep -oE 'type [A-Z]+/[A-Z]+' "$log" 2>/dev/null | awk '{ print $2 }' | sort -u | paste -sd' ')"
  [ -z "$conns" ] || echo "$conns"
  echo "graph: ${graphs:-none named}"
  [ -n "$conns" ] || return 2
  if grep -qE '^(SHM|NET)' <<<"$conns"; then return 1; fi
  if ((nvlink)) && ! grep -qE '(^| )NVL/' <<<"$graphs"; then return 1; fi
  return 0
}

gc_topo_has_nvlink() {
  grep -E '^GPU[0-9]' "$1" 2>/dev/null | grep -qE '(^|[[:space:]])NV[0-9]+([[:space:]]|$)'
}

gc_last_pass_number() {
  grep '"pass":' "$1" 2>/dev/null | tail -n 1 | grep -o "\"$2\": [-0-9.e+]*" | awk '{ print $2 }' || true
}

gc_step_allocations() {
  grep '"pass":' "$1" 2>/dev/null | awk '{
    n++
    for (k = 1; k <= 3; k++) {
      key = k == 1 ? "pass_step_allocations" : k == 2 ? "pass_step_frees" : "pass_step_pinned_allocations"
      if (!match($0, "\"" key "\": [0-9.e+]+")) { bad = bad " pass " (n - 1) " has no " key ";"; continue }
      v = substr($0, RSTART + length(key) + 4, RLENGTH - length(key) - 4) + 0
      if (v > 0) bad = bad " pass " (n - 1) " " key " " v ";"
    } }
    END { if (n == 0) print " no pass line;"; else print bad }'
}

gc_compare_predictions() {
  if [ "$3" = 0 ]; then
    cmp -s "$1" "$2" && return 0
    echo "differ from line $(cmp "$1" "$2" 2>/dev/null | sed -n 's/.* line \([0-9]*\).*/\1/p')"
    return 1
  fi
  awk -v tol="$3" 'NR == FNR { label[FNR] = $1; pred[FNR] = $2; n = FNR; next }
    { m = FNR
      if (!(FNR in label) || $1 != label[FNR]) { if (!bad_label) bad_label = FNR; next }
      d = $2 - pred[FNR]; if (d < 0) d = -d
      if (d > worst) { worst = d; at = FNR } }
    END {
      if (n != m) printf "%d lines against %d; ", n, m
      if (bad_label) printf "labels differ from line %d; ", bad_label
      printf "max |difference| %g", worst
      if (worst > tol) printf " > %g at line %d", tol, at
      print ""
      exit (n != m || bad_label || worst > tol) }' "$1" "$2"
}

gc_gpu_memory_start() {
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 > "$1" 2>/dev/null &
  gc_memory_sampler=$!
}

gc_gpu_memory_stop() {
  [ -n "$gc_memory_sampler" ] || return 0
  kill -TERM "$gc_memory_sampler" 2>/dev/null || true
  wait "$gc_memory_sampler" 2>/dev/null || true
  gc_memory_sampler=""
  awk -F', *' '$2 ~ /^[0-9]+$/ { if ($2 > peak[$1]) peak[$1] = $2 }
    END { n = 0; for (g in peak) { printf "%sgpu%s %d MiB", (n++ ? ", " : ""), g, peak[g] } if (n) print "" }' "$1"
}
