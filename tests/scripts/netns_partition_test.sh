#!/usr/bin/env bash
# Two trainers on two "machines": network namespaces joined by a veth pair (10.231.0.1 and
# 10.231.0.2), a gpubox_server bound to 10.231.0.1 with a token, trainer 0 (2 simulated cards)
# beside it and trainer 1 (2 cards) in the other namespace, meeting through a file rendezvous:
#  1. the job trains to the same test AUC as the same 2 x 2 job on loopback (run first, here);
#  2. the link is taken down mid-pass: both trainers end within seconds (runner.peer_timeout_s,
#     not runner.collective_timeout_s = 300), each naming the other side's address;
#  3. with the link up again, the job run again resumes from its last complete save.
# With --mpirun, the job of step 1 is started the way a cluster does: mpirun with an rsh agent
# that enters each "host"'s namespace (scripts/run_gpubox.sh maps OMPI_COMM_WORLD_RANK/SIZE).
#
#   netns_partition_test.sh SOURCE_DIR BUILD_DIR [--mpirun]
# Exit 77 (skipped, with the reason) where namespaces cannot be made (not root, no `ip netns`)
# or, with --mpirun, where mpirun is absent. Only this test's own namespaces and veth pair are
# touched; their names carry the PID, so parallel runs do not collide.
set -uo pipefail
src="${1:?source dir}"
bin="${2:?build dir}/bin"
mode="${3:-}"
skip() {
  echo "SKIPPED: $*"
  exit 77
}
fail() {
  echo "FAILED: $*" >&2
  exit 1
}

[ "$(id -u)" = 0 ] || skip "network namespaces need root (uid $(id -u))"
command -v ip >/dev/null 2>&1 || skip "no 'ip' command (iproute2)"
if [ "$mode" = --mpirun ]; then
  command -v mpirun >/dev/null 2>&1 || skip "mpirun is not installed (apt-get install openmpi-bin)"
fi
for b in gpubox_train gpubox_server gpubox_data; do
  [ -x "$bin/$b" ] || fail "$bin/$b is not built"
done

tag="gbx$$"
ns_a="${tag}a" ns_b="${tag}b"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/gpubox_netns.XXXXXX")"
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null; done
  for p in "${pids[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null; done
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null  # deleting a namespace deletes its end of the veth pair
  if [ -n "${GPUBOX_TEST_KEEP:-}" ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$ns_a" 2>"$tmp/netns.err" || skip "cannot create a network namespace: $(cat "$tmp/netns.err")"
ip netns add "$ns_b" || fail "ip netns add $ns_b"
ip link add "${tag}a" type veth peer name "${tag}b" || fail "cannot create a veth pair"
ip link set "${tag}a" netns "$ns_a" && ip link set "${tag}b" netns "$ns_b" || fail "veth into namespaces"
ip -n "$ns_a" addr add 10.231.0.1/24 dev "${tag}a" && ip -n "$ns_b" addr add 10.231.0.2/24 dev "${tag}b" ||
  fail "addresses"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
link() { ip -n "$ns_a" link set "${tag}a" "$1"; }  # up | down: the one cable between the machines
link up && ip -n "$ns_b" link set "${tag}b" up || fail "link up"
# A veth pair's carrier follows its ends' state a moment later: wait for it (at most 5 s).
for _ in $(seq 50); do
  ip -n "$ns_a" link show "${tag}a" | grep -q LOWER_UP && ip -n "$ns_b" link show "${tag}b" | grep -q LOWER_UP && break
  sleep 0.1
done

# ---- data, config, token ----------------------------------------------------------------
"$bin/gpubox_data" gen --out "$tmp/train" --lines 1600 --files 16 --seed 3 --slots 6 --dense 3 \
  --vocab 2000 --threads 1 >/dev/null || fail "gpubox_data gen"
"$bin/gpubox_data" gen --out "$tmp/test" --lines 400 --files 2 --seed 3 --slots 6 --dense 3 \
  --vocab 2000 --first_line 20000 --threads 1 >/dev/null || fail "gpubox_data gen (test)"
cat >"$tmp/config.yaml" <<EOF
runner:
  train_data_dir: $tmp/train
  test_data_dir: $tmp/test
  train_batch_size: 50
  infer_batch_size: 256
  epochs: 2
  thread_num: 1
  shuffle: false
  seed: 5
  peer_timeout_s: 2
hyper_parameters:
  sparse_inputs_slots: 7
  dense_input_dim: 3
  sparse_feature_dim: 5
  fc_sizes: [16, 8]
  optimizer:
    learning_rate: 0.05
  sparse_optimizer:
    learning_rate: 0.3
    mf_learning_rate: 0.3
EOF
(umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$tmp/token")

# in NS CMD...: CMD in namespace NS ("" = this one), in the background; its pid in $! (ip netns
# exec execs the command: the pid is the command's).
in_ns() {
  local ns="$1"
  shift
  # exec: started with `&`, $! is then the program itself (ip netns exec execs it too), so that
  # cleanup's kill reaches it rather than the subshell around it (servers outlived the test).
  if [ -n "$ns" ]; then exec ip netns exec "$ns" "$@"; else exec "$@"; fi
}

# start_server NS IP NAME: a fresh server bound to IP; its endpoint in $endpoint.
start_server() {
  mkdir -p "$tmp/$3.data"
  in_ns "$1" "$bin/gpubox_server" --port 0 --bind "$2" --auth_token_file "$tmp/token" \
    --data_dir "$tmp/$3.data" --config "$tmp/config.yaml" >"$tmp/$3.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    endpoint="$(sed -n 's/.*listening on \([0-9.]*:[0-9]*\).*/\1/p' "$tmp/$3.log" | head -1)"
    [ -n "$endpoint" ] && return 0
    sleep 0.1
  done
  fail "server $3 did not start: $(cat "$tmp/$3.log")"
}

# start_trainer NS POD_IP ID NAME [-o k=v ...]: trainer ID of 2 (cards 0,1) of job NAME.
start_trainer() {
  local ns="$1" ip="$2" id="$3" name="$4"
  shift 4
  in_ns "$ns" env FLAGS_selected_gpus=0,1 PADDLE_TRAINERS_NUM=2 PADDLE_TRAINER_ID="$id" \
    POD_IP="$ip" GPUBOX_RENDEZVOUS="file://$tmp/rendezvous.$name" \
    PADDLE_PSERVERS_IP_PORT_LIST="$endpoint" GPUBOX_AUTH_TOKEN_FILE="$tmp/token" \
    "$bin/gpubox_train" --config "$tmp/config.yaml" --threads_per_card 1 \
    -o "runner.metrics_path=$tmp/$name.jsonl" "$@" >"$tmp/$name.$id.log" 2>&1 &
  pids+=($!)
}

# wait_for PID SECONDS: the exit status of PID, or 124 after SECONDS (then it is killed).
wait_for() {
  local pid="$1" limit="$2" waited=0
  while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt $((limit * 10)) ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    return 124
  fi
  wait "$pid"
}

# run_job NAME NS0 IP0 NS1 IP1 [-o ...]: both trainers to the end; fails unless both exit 0.
run_job() {
  local name="$1" ns0="$2" ip0="$3" ns1="$4" ip1="$5"
  shift 5
  start_trainer "$ns0" "$ip0" 0 "$name" "$@"
  local t0=$!
  start_trainer "$ns1" "$ip1" 1 "$name" "$@"
  local t1=$!
  local rc0=0 rc1=0
  wait_for "$t0" 60 || rc0=$?
  wait_for "$t1" 10 || rc1=$?
  [ "$rc0$rc1" = 00 ] || fail "$name: trainer 0 exited $rc0, trainer 1 $rc1 (124: killed)
trainer 0: $(tail -4 "$tmp/$name.0.log")
trainer 1: $(tail -4 "$tmp/$name.1.log")"
}

test_auc() { sed -n 's/.*epoch: 1, test auc: \([0-9.]*\).*/\1/p' "$1" | tail -1; }

# ---- 1. the same job on loopback and across the two namespaces --------------------------
start_server "" 127.0.0.1 loopback_server
run_job loopback "" 127.0.0.1 "" 127.0.0.1
auc_loopback="$(test_auc "$tmp/loopback.0.log")"
[ -n "$auc_loopback" ] || fail "no test AUC in the loopback run: $(tail -5 "$tmp/loopback.0.log")"

start_server "$ns_a" 10.231.0.1 server
server_endpoint="$endpoint"
if [ "$mode" = --mpirun ]; then
  # The cluster's way: mpirun starts one process per "host" through its rsh agent, which enters
  # that host's namespace; run_gpubox.sh takes the trainer id and count from OMPI_COMM_WORLD_*.
  cat >"$tmp/rsh_agent" <<EOF
#!/bin/sh
# mpirun's rsh agent: "rsh_agent HOST COMMAND...": HOST is a namespace of this test.
host="\$1"; shift
case "\$host" in
  hosta) exec ip netns exec $ns_a sh -c "\$*" 2>>"$tmp/rsh_agent.log" ;;
  hostb) exec ip netns exec $ns_b sh -c "\$*" 2>>"$tmp/rsh_agent.log" ;;
esac
echo "rsh_agent: unknown host \$host" >&2; exit 1
EOF
  chmod +x "$tmp/rsh_agent"
  cat >"$tmp/rank.sh" <<EOF
#!/bin/sh
# One rank: this host's address is POD_IP (the address of its namespace's veth end).
POD_IP="\$(ip -4 -o addr show | sed -n 's/.* \(10\.231\.0\.[0-9]*\)\/.*/\1/p' | head -1)"
export POD_IP
exec sh "$src/scripts/run_gpubox.sh" --config "$tmp/config.yaml" --threads_per_card 1 \
  -o "runner.metrics_path=$tmp/mpirun.jsonl" >"$tmp/mpirun.\$OMPI_COMM_WORLD_RANK.log" 2>&1
EOF
  # The whole mpirun lives in namespace A (its daemons must reach it: both namespaces see A).
  # A fresh CI machine's first mpirun once started no rank: a daemon did not come up ("ORTE does
  # not know how to route a message ... hosta"), which is the launch, not GPUBox. Such a launch is
  # tried once more; the agent's own errors (rsh_agent.log) are shown either way.
  mpirun_once() {
    ip netns exec "$ns_a" env GPUBOX_BUILD_DIR="${bin%/bin}" FLAGS_selected_gpus=0,1 \
      GPUBOX_RENDEZVOUS="file://$tmp/rendezvous.mpirun$1" PADDLE_PSERVERS_IP_PORT_LIST="$endpoint" \
      GPUBOX_AUTH_TOKEN_FILE="$tmp/token" OMPI_MCA_plm_rsh_agent="$tmp/rsh_agent" \
      mpirun --allow-run-as-root --oversubscribe -n 2 --host hosta:1,hostb:1 \
      --mca plm_rsh_agent "$tmp/rsh_agent" \
      --mca btl self,tcp --mca oob_tcp_if_include 10.231.0.0/24 \
      -x GPUBOX_BUILD_DIR -x FLAGS_selected_gpus -x GPUBOX_RENDEZVOUS -x PADDLE_PSERVERS_IP_PORT_LIST \
      -x GPUBOX_AUTH_TOKEN_FILE sh "$tmp/rank.sh" >"$tmp/mpirun.log" 2>&1 &
    pids+=($!)
    wait_for $! 90
  }
  rendezvous=""
  mpirun_once ""
  rc=$?
  if [ "$rc" != 0 ] && [ "$rc" != 124 ] && ! ls "$tmp"/mpirun.[01].log >/dev/null 2>&1; then
    # Only a launch that started no rank is tried again, and what it printed is shown.
    echo "mpirun started no rank (exit $rc), trying once more; it printed:"
    tail -20 "$tmp/mpirun.log"
    cat "$tmp/rsh_agent.log" 2>/dev/null
    rendezvous=".retry"
    mpirun_once "$rendezvous"
    rc=$?
  fi
  [ "$rc" = 0 ] || fail "mpirun exited $rc: $(tail -20 "$tmp/mpirun.log"; cat "$tmp/rsh_agent.log" 2>/dev/null
    tail -5 "$tmp"/mpirun.[01].log)"
  auc_netns="$(test_auc "$tmp/mpirun.0.log")"
  grep -q '^10\.231\.0\.2 ' "$tmp/rendezvous.mpirun$rendezvous/heartbeat@1" ||
    fail "trainer 1 did not run at 10.231.0.2: $(cat "$tmp/rendezvous.mpirun$rendezvous/heartbeat@1")"
  echo "mpirun: test AUC loopback $auc_loopback, mpirun across namespaces $auc_netns"
  [ "$auc_netns" = "$auc_loopback" ] || fail "test AUC differs: loopback $auc_loopback, mpirun $auc_netns"
  exit 0
fi
run_job netns "$ns_a" 10.231.0.1 "$ns_b" 10.231.0.2
auc_netns="$(test_auc "$tmp/netns.0.log")"
echo "test AUC: loopback $auc_loopback, two namespaces $auc_netns"
[ "$auc_netns" = "$auc_loopback" ] || fail "test AUC differs: loopback $auc_loopback, namespaces $auc_netns"

# ---- 2. the link goes down mid-pass ----------------------------------------------------
saves="$tmp/server.data/saves"  # beneath the server's --data_dir
long=(-o "runner.model_save_path=$saves" -o runner.epochs=100 -o runner.save_mode=checkpoint)
start_trainer "$ns_a" 10.231.0.1 0 partition "${long[@]}"
t0=$!
start_trainer "$ns_b" 10.231.0.2 1 partition "${long[@]}"
t1=$!
# Two complete saves, then cut the cable while the next pass trains.
for _ in $(seq 300); do
  [ -f "$saves/1/MODEL_MANIFEST" ] && break
  kill -0 "$t0" 2>/dev/null || fail "partition job ended early: $(tail -5 "$tmp/partition.0.log")"
  sleep 0.1
done
[ -f "$saves/1/MODEL_MANIFEST" ] || fail "no save 1 within 30 s: $(tail -5 "$tmp/partition.0.log")"
link down
cut="$(date +%s.%N)"
wait_for "$t0" 30
rc0=$?
end0="$(date +%s.%N)"
wait_for "$t1" 30
rc1=$?
end1="$(date +%s.%N)"
d0="$(awk "BEGIN { printf \"%.1f\", $end0 - $cut }")"
d1="$(awk "BEGIN { printf \"%.1f\", $end1 - $cut }")"
echo "partition: trainer 0 ended ${d0} s after the cut (exit $rc0), trainer 1 ${d1} s (exit $rc1)"
echo "  trainer 0: $(grep -m1 '^gpubox_train: ' "$tmp/partition.0.log")"
echo "  trainer 1: $(grep -m1 '^gpubox_train: ' "$tmp/partition.1.log")"
[ "$rc0" != 124 ] || fail "trainer 0 still ran 30 s after the cut: $(tail -5 "$tmp/partition.0.log")"
[ "$rc1" != 124 ] || fail "trainer 1 still ran 30 s after the cut: $(tail -5 "$tmp/partition.1.log")"
[ "$rc0" != 0 ] && [ "$rc1" != 0 ] || fail "a trainer exited 0 after the cut"
grep -q "gpubox_train: .*10\.231\.0\.2" "$tmp/partition.0.log" ||
  fail "trainer 0 does not name 10.231.0.2: $(tail -5 "$tmp/partition.0.log")"
grep -q "gpubox_train: .*10\.231\.0\.1" "$tmp/partition.1.log" ||
  fail "trainer 1 does not name 10.231.0.1: $(tail -5 "$tmp/partition.1.log")"

# ---- 3. link up, run again: resumes from the last complete save --------------------------
link up
# The neighbour entries that failed while the link was down would refuse the first connections
# ("No route to host") until they expire: forget them, and wait until B reaches A's server.
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" neigh flush all 2>/dev/null; done
for _ in $(seq 50); do
  ip netns exec "$ns_b" bash -c "exec 3<>/dev/tcp/${server_endpoint%:*}/${server_endpoint#*:}" \
    2>/dev/null && break
  sleep 0.1
done
last=""
for d in "$saves"/*/; do
  p="$(basename "$d")"
  if [ -f "$d/MODEL_MANIFEST" ] && { [ -z "$last" ] || [ "$p" -gt "$last" ]; }; then last="$p"; fi
done
[ -n "$last" ] || fail "no complete save"
run_job rerun "$ns_a" 10.231.0.1 "$ns_b" 10.231.0.2 -o "runner.model_save_path=$saves" \
  -o "runner.epochs=$((last + 2))" -o runner.save_mode=checkpoint
grep -q "runner.resume: resuming from pass $last" "$tmp/rerun.0.log" ||
  fail "the rerun did not resume from save $last: $(grep -m3 resum "$tmp/rerun.0.log")"
grep -q "pass: $((last + 1))," "$tmp/rerun.0.log" || fail "the rerun did not train pass $((last + 1))"
echo "rerun: resumed from pass $last (the last complete save) and trained pass $((last + 1))"
echo "PASSED"
