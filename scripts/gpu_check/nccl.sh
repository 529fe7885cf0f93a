# shellcheck shell=bash
# scripts/gpu_check/nccl.sh: item 5, the 2-card run with NCCL_DEBUG=INFO and NCCL's transports.
# Sourced by scripts/gpu_check.sh (after its options are read), in its order; uses and sets its
# variables. Needs bash.

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
    grep -E '^pass: ' "$out/nccl/train.log" | sed 's/, ne:.*//; s/^/  /' || true
    if ((rc == 0)) && grep -q '^pass: 0' "$out/nccl/train.log"; then
      record PASS "2-card run" "nccl/train.log"
    else
      tail -n 8 "$out/nccl/train.log" | sed 's/^/  | /'
      record FAIL "2-card run" "$(why_failed "$rc" "$run_timeout") (nccl/train.log)"
    fi
    # Which transport NCCL took between the two GPUs: on one node every connection must be P2P
    # (NVLink or PCIe), never SHM (through host memory) or NET; NVLink when the topology has it.
    if ((ngpu < 2)); then
      record SKIP "NCCL transports" "simulated cards: no NCCL"
    else
      nvlink=0
      gc_topo_has_nvlink "$out/device/topo.txt" && nvlink=1
      trc=0
      gc_nccl_transports "$out/nccl/train.log" "$nvlink" > "$out/nccl/transports.txt" || trc=$?
      sed 's/^/  /' "$out/nccl/transports.txt"
      found="$(paste -sd';' "$out/nccl/transports.txt" | sed 's/;/, /g')"
      case "$trc" in
        0) record PASS "NCCL transports" "$found" ;;
        2) record FAIL "NCCL transports" "no NCCL connection line in nccl/train.log (NCCL_DEBUG=INFO)" ;;
        *) record FAIL "NCCL transports" "$found: want P2P only$( ((nvlink)) && echo ", over NVLink (graph type NVL)") on one node" ;;
      esac
    fi
  fi
else
  record SKIP "2-card run" "--skip-nccl"
fi
