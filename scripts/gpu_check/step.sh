# shellcheck shell=bash
# scripts/gpu_check/step.sh: item 7, the per-step device counts (gpubox_bench step --json).
# Sourced by scripts/gpu_check.sh (after its options are read), in its order; uses and sets its
# variables. Needs bash.

# ---- 7. per-step device counts ------------------------------------------------------------------
if ((run_step)) && ((${#counts[@]} > 0)); then
  echo
  echo "================ 7. per-step device counts (gpubox_bench step --json, default model, batch 512)"
  mkdir -p "$out/step"
  : > "$out/step/step.jsonl"
  for c in "${counts[@]}"; do
    rc=0
    run_limited "$run_timeout" "$out/step/step.$c.log" "$bin/gpubox_bench" step --cards "$c" --json || rc=$?
    line="$(grep '"bench": "step"' "$out/step/step.$c.log" || true)"
    if ((rc != 0)) || [ -z "$line" ]; then
      tail -n 5 "$out/step/step.$c.log" | sed 's/^/  | /'
      record FAIL "step counts, $c card(s)" "$(why_failed "$rc" "$run_timeout") (step/step.$c.log)"
      continue
    fi
    echo "$line" >> "$out/step/step.jsonl"
    num() { grep -o "\"$1\": [-0-9.e+]*" <<<"$line" | awk '{ print $2 }'; }
    printf '  %d card(s): host_syncs %s, pipeline_waits %s, allocations %s, pageable_copies %s, pinned_copies %s, launches %s, collectives %s outside graphs, graph launches %s of %s nodes per step; %s examples/s\n' \
        "$c" "$(num host_syncs_per_step)" "$(num pipeline_waits_per_step)" "$(num allocations_per_step)" "$(num pageable_copies_per_step)" \
        "$(num pinned_copies_per_step)" "$(num launches_per_step)" "$(num collectives_per_step)" \
        "$(num graph_launches_per_step)" "$(num graph_nodes_per_step)" "$(num examples_per_sec)"
    printf '  %d card(s): step time p50 %s ms, p99 %s ms, max %s ms; card memory high-water mark %s MiB\n' \
        "$c" "$(num step_ms_p50)" "$(num step_ms_p99)" "$(num step_ms_max)" "$(num card_memory_peak_mb)"
    # The first pass's steps, its first ones included, are sized before it (no allocation, no
    # pinned regrowth: a cudaFreeHost in a step can deadlock against a peer's NCCL kernel).
    verdict="$(awk -v s="$(num host_syncs_per_step)" -v w="$(num max_pipeline_waits_in_a_step)" \
                   -v es="$(num eval_host_syncs_per_step)" \
                   -v ew="$(num eval_max_pipeline_waits_in_a_step)" \
                   -v a="$(num allocations_per_step)" \
                   -v p="$(num pageable_copies_per_step)" -v k="$(num collectives_per_step)" \
                   -v g="$(num graph_launches_per_step)" \
                   -v eg="$(num eval_graph_launches_per_step)" -v el="$(num eval_launches_per_step)" \
                   -v ek="$(num eval_collectives_per_step)" -v c="$c" \
                   -v ec="$(num eval_graph_captures)" -v ex="$(num eval_examples)" \
                   -v ep="$(num eval_predictions)" -v eb="$(num eval_predictions_bad)" \
                   -v fa="$(num first_pass_step_allocations)" -v fp="$(num first_pass_step_pinned_allocations)" 'BEGIN {
      bad = ""
      if (fa > 0) bad = bad " first pass step allocations " fa " > 0;"
      if (fp > 0) bad = bad " first pass step pinned allocations " fp " > 0;"
      # No round trip in a steady step (issue 31, item 2). The host may wait for the oldest
      # step of the full status ring (4 back) when the card is slower than the host: a
      # pipeline wait, at most one in any step (heterps/device/late_readback.hpp).
      if (s == "" || s != 0) bad = bad " host_syncs " s " != 0;"
      if (w == "" || w > 1) bad = bad " pipeline_waits in a step " w " > 1;"
      if (es == "" || es != 0) bad = bad " evaluation host_syncs " es " != 0;"
      if (ew == "" || ew > 1) bad = bad " evaluation pipeline_waits in a step " ew " > 1;"
      if (a > 0) bad = bad " allocations " a " > 0;"
      if (p > 0) bad = bad " pageable_copies " p " > 0;"
      # A step is 1 graph launch ("train step": sparse pull, dense step, status copy, sparse
      # push, dense update), every collective inside it.
      if (g != 1) bad = bad " graph launches " g " != 1;"
      if (k != 0) bad = bad " collectives outside graphs " k " != 0;"
      # An evaluation step too ("eval step": sparse lookup, forward, metrics, the slot copies).
      if (eg != 1) bad = bad " evaluation graph launches " eg " != 1;"
      if (el != 0) bad = bad " evaluation launches outside graphs " el " != 0;"
      if (ek != 0) bad = bad " evaluation collectives outside graphs " ek " != 0;"
      # It keeps its predictions (copied into the pinned block of the ring slot, inside the
      # graph): every one back, each a probability; one graph per upload buffer on each card
      # (every batch is full), whichever slot the predictions of a step go to.
      if (ep == "" || ep != ex) bad = bad " evaluation predictions " ep " for " ex " examples;"
      if (eb != 0) bad = bad " evaluation predictions outside [0, 1] " eb ";"
      if (ec == "" || ec > 2 * c) bad = bad " evaluation graphs captured " ec " > " 2 * c " (2 a card);"
      print bad }')"
    if [ -z "$verdict" ]; then
      record PASS "step counts, $c card(s)" "syncs 0, pipeline waits $(num pipeline_waits_per_step) (at most $(num max_pipeline_waits_in_a_step) in a step), allocations 0, pageable 0, 1 graph launch of $(num graph_nodes_per_step) nodes (every collective inside), $(num launches_per_step) launches outside, evaluation 1 graph launch of $(num eval_graph_nodes_per_step) nodes ($(num eval_graph_captures) captured, $(num eval_predictions) predictions kept), $(num examples_per_sec) ex/s, step p50/p99 $(num step_ms_p50)/$(num step_ms_p99) ms, card memory $(num card_memory_peak_mb) MiB"
    else
      record FAIL "step counts, $c card(s)" "$verdict (step/step.jsonl)"
    fi
  done
else
  record SKIP "step counts" "$( ((run_step)) && echo "no card count" || echo "--skip-step")"
fi
