#!/usr/bin/env bash
# scripts/bench/gpu_check.sh - one call on the GPU machine (../shared/device/README.md): the
# compiler's specs on the GPU's OpenCL device, the GEMM tuned, the LSTM step's launches and
# profile, and the workloads against PyTorch on CUDA, eager and nd.compile'd. Results go to
# $OUT (or /tmp/gpu_check); each step has its own time limit so that one slow step leaves
# the others their time. About 4-5 minutes on an H100 from a fresh kernel cache.
#
#   bash ../shared/device/bundle.sh                       # here, after scripts/setup.sh
#   device run (carry .device):  bash scripts/bench/gpu_check.sh
R=${OUT:-/tmp/gpu_check}; mkdir -p "$R"
E="bash .device/env.sh .device/build/needle-lua"
t0=$(date +%s)
stamp() { echo "== $1 at $(( $(date +%s) - t0 )) s" | tee -a "$R/log.txt"; }
stamp start
{ nvidia-smi -L; nproc; python3 -c 'import torch; print(torch.__version__)'; } > "$R/env.txt" 2>&1
stamp specs # fused kernels bit for bit against the unfused ones, compiled training against eager
timeout 170 $E spec/run.lua -o TAP spec/compile_passes_spec.lua spec/compile_spec.lua > "$R/specs.txt" 2>&1
grep -v "^ok" "$R/specs.txt" | tail -20; echo "ok: $(grep -c '^ok' "$R/specs.txt")"
stamp tune
timeout 60 $E scripts/tune_opencl.lua --device 0 --budget 15 > "$R/tune.txt" 2>&1; tail -1 "$R/tune.txt"
stamp lstm
timeout 90 $E scripts/bench/compile_opencl_lstm.lua opencl:0 > "$R/lstm_launches.txt" 2>&1; head -16 "$R/lstm_launches.txt"
timeout 60 $E -e '
local W = dofile("scripts/bench/workloads.lua")
nd.manual_seed(0)
local f = nd.compile(W.by_name.lstm_train.setup(nd, "opencl:0"))
for _ = 1, 5 do f() end; nd.synchronize("opencl:0")
local t0 = nd.clock(); for _ = 1, 10 do f() end; local t1 = nd.clock(); nd.synchronize("opencl:0")
print(("host time to enqueue one replay %.3f ms; with the GPU done %.3f ms"):format((t1 - t0) * 100, (nd.clock() - t0) * 100))
nd.profile(function() for _ = 1, 5 do f() end; nd.synchronize("opencl:0") end, {print = true})
' > "$R/profile.txt" 2>&1; head -20 "$R/profile.txt"
stamp bench
timeout 200 $E scripts/bench/run.lua --device opencl:0 --torch-device cuda --python python3 --threads 16 --rounds 1 \
  --only lstm_train,lstm_train_compiled,transformer_infer_compiled,mlp_train_compiled,resnet9_train_compiled,mlp5_infer_compiled,resnet9_infer_compiled \
  --out "$R/bench" > "$R/bench.txt" 2>&1; tail -20 "$R/bench.txt"
stamp done
