# shellcheck shell=bash
# scripts/gpu_check/nsys.sh: item 6, an nsys profile of one pass and its time per NVTX range.
# Sourced by scripts/gpu_check.sh (after its options are read), in its order; uses and sets its
# variables. Needs bash.

# ---- 6. nsys profile of one pass ----------------------------------------------------------------
# --cuda-graph-trace=node: a graph-replayed step's kernels are traced one by one (nsys's default
# shows a graph launch as one range), so the kernel summary lists the steady steps' kernels by
# name. GPUBox's NVTX ranges are the card thread's: they wrap the host's enqueue of each phase,
# not its card time; a replayed step runs every phase's card work in its graph launch (inside
# `step`), and a phase's range lasts while its work is recorded when the graph is captured.
if ((run_nsys)); then
  echo
  echo "================ 6. nsys profile of one pass (1 card, Zipf data)"
  nsys="$(first_tool nsys)"
  if ((dry_run)); then
    would_run "nsys profile" "${nsys:-nsys}" profile --trace=cuda,nvtx,osrt --cuda-graph-trace=node --sample=none -o "$out/nsys/one_pass" \
        "$bin/gpubox_train" --config "$root/configs/config_synthetic.yaml" -o runner.epochs=1
  elif ((ngpu == 0)); then
    record SKIP "nsys profile" "no GPU"
  elif [ -z "$nsys" ]; then
    record SKIP "nsys profile" "nsys is not installed (Nsight Systems)"
  else
    make_data
    mkdir -p "$out/nsys"
    rc=0
    FLAGS_selected_gpus=0 run_limited "$run_timeout" "$out/nsys/profile.log" "$nsys" profile \
        --trace=cuda,nvtx,osrt --cuda-graph-trace=node --sample=none --force-overwrite=true -o "$out/nsys/one_pass" \
        "$bin/gpubox_train" --config "$root/configs/config_synthetic.yaml" \
        -o runner.train_data_dir="$data/train" -o runner.test_data_dir= -o runner.model_save_path= \
        -o runner.save_mode=none -o runner.epochs=1 -o runner.train_batch_size="$batch" \
        -o runner.metrics_path= || rc=$?
    if ((rc == 0)); then
      run_limited "$run_timeout" "$out/nsys/stats.txt" "$nsys" stats \
          --report cuda_gpu_kern_sum,cuda_api_sum,cuda_gpu_mem_time_sum --format column \
          "$out/nsys/one_pass.nsys-rep" || true
      # Time per GPUBox NVTX range (device::ProfileRange: the step's phases, the pass boundary);
      # the report is nvtx_sum in current nsys, nvtxsum in older ones.
      run_limited "$run_timeout" "$out/nsys/nvtx.txt" "$nsys" stats --report nvtx_sum --format column \
          "$out/nsys/one_pass.nsys-rep" ||
        run_limited "$run_timeout" "$out/nsys/nvtx.txt" "$nsys" stats --report nvtxsum --format column \
            "$out/nsys/one_pass.nsys-rep" || true
      phases="$(grep -oE 'begin_pass|end_pass|next pass card work|dense forward/backward|dense all-reduce|dense update|upload|pull|push|step' \
                "$out/nsys/nvtx.txt" 2>/dev/null | sort -u | paste -sd, || true)"
      sed -n '1,30p' "$out/nsys/nvtx.txt" 2>/dev/null | sed 's/^/  /' || true
      if [ -n "$phases" ]; then
        record PASS "nsys profile" "nsys/one_pass.nsys-rep; NVTX ranges: $phases (nsys/nvtx.txt)"
      else
        record FAIL "nsys profile" "no GPUBox NVTX range in the profile (nsys/nvtx.txt)"
      fi
    else
      tail -n 5 "$out/nsys/profile.log" | sed 's/^/  | /'
      record FAIL "nsys profile" "exit $rc (nsys/profile.log)"
    fi
  fi
else
  record SKIP "nsys profile" "--skip-nsys"
fi
