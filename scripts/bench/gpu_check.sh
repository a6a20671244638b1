#!/usr/bin/env bash
# scripts/bench/gpu_check.sh - one call on the GPU machine (../shared/device/README.md): the
# compiler's specs on the GPU's OpenCL device, the GEMM tuned, the LSTM step's launches and
# profile, and the workloads against PyTorch on CUDA, eager and nd.compile'd. Results go to
# $OUT (or /tmp/gpu_check); each step has its own time limit so that one slow step leaves
# the others their time. About 4-5 minutes on an H100 from a fresh kernel cache.
#
#   bash ../shared/device/bundle.sh                       # here, after scripts/setup.sh
#   device run (carry .device):  bash scripts/bench/gpu_check.sh [STEPS]
#
# STEPS: some of specs, tune, gemm, lstm, profile, bench, lstm_bench, cpu16, zoo16 (default: all
# but the last three). cpu16 and zoo16 are the 16-core CPU against PyTorch 2.11 on the same
# machine (issues 18 and 21): the harness's CPU workloads, and ResNet-50 / BERT / DistilBERT;
# about 3 and 4 minutes. needle's own kernels there do not depend on how OpenBLAS names the CPU.
R=${OUT:-/tmp/gpu_check}; mkdir -p "$R"
STEPS=" ${1:-specs tune gemm lstm profile bench} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
E="bash .device/env.sh .device/build/needle-lua"
t0=$(date +%s)
stamp() { echo "== $1 at $(( $(date +%s) - t0 )) s" | tee -a "$R/log.txt"; }
stamp start
{ nvidia-smi -L; nproc; python3 -c 'import torch; print(torch.__version__)'; } > "$R/env.txt" 2>&1
if want specs; then
stamp specs # fused kernels bit for bit against the unfused ones, compiled training against eager
timeout 200 $E spec/run.lua -o TAP spec/compile_passes_spec.lua spec/compile_spec.lua spec/opencl_tune_spec.lua spec/profile_spec.lua > "$R/specs.txt" 2>&1
grep -v "^ok" "$R/specs.txt" | tail -20; echo "ok: $(grep -c '^ok' "$R/specs.txt")"
fi
if want tune; then
stamp tune
timeout 60 $E scripts/tune_opencl.lua --device 0 --budget 15 > "$R/tune.txt" 2>&1; tail -1 "$R/tune.txt"
fi
if want gemm; then
stamp gemm # issue 22's GEMM targets: the tuned kernels against torch.matmul on CUDA (TF32 off), same run
timeout 90 $E scripts/bench/matmul_sweep.lua --devices opencl:0 --torch-device cuda --python python3 \
  --sizes 1024,4096,128x768x3072 --layouts nn,nt --reps 5 --out "$R/gemm" > "$R/gemm.txt" 2>&1; tail -12 "$R/gemm.txt"
fi
if want lstm; then
stamp lstm
timeout 90 $E scripts/bench/compile_opencl_lstm.lua opencl:0 > "$R/lstm_launches.txt" 2>&1; head -16 "$R/lstm_launches.txt"
fi
if want profile; then
stamp profile # host time per op, then device time per kernel (events on: slower)
timeout 90 $E -e '
local W = dofile("scripts/bench/workloads.lua")
nd.manual_seed(0)
local f = nd.compile(W.by_name.lstm_train.setup(nd, "opencl:0"))
for _ = 1, 5 do f() end; nd.synchronize("opencl:0")
local t0 = nd.clock(); for _ = 1, 10 do f() end; local t1 = nd.clock(); nd.synchronize("opencl:0")
print(("host time to enqueue one replay %.3f ms; with the GPU done %.3f ms"):format((t1 - t0) * 100, (nd.clock() - t0) * 100))
nd.profile(function() for _ = 1, 5 do f() end; nd.synchronize("opencl:0") end, {print = true})
nd.opencl.timing(true)
for _ = 1, 5 do f() end
local rows, sum = nd.opencl.kernel_times(), 0
for _, r in ipairs(rows) do sum = sum + r.ms end
print(("device time per replay %.3f ms in %d commands"):format(sum / 5, #rows))
for i, r in ipairs(rows) do
  print(("%8.3f ms/replay %6d calls/replay %8.2f us/call  %s"):format(r.ms / 5, r.calls // 5, 1000 * r.ms / r.calls, r.name))
end
' > "$R/profile.txt" 2>&1; head -20 "$R/profile.txt"; grep -A25 "device time per replay" "$R/profile.txt"
fi
if want lstm_bench; then
stamp lstm_bench
timeout 120 $E scripts/bench/run.lua --device opencl:0 --torch-device cuda --python python3 --threads 16 --rounds 1 \
  --only lstm_train_compiled --out "$R/lstm_bench" > "$R/lstm_bench.txt" 2>&1; tail -8 "$R/lstm_bench.txt"
fi
if want bench; then
stamp bench
timeout 200 $E scripts/bench/run.lua --device opencl:0 --torch-device cuda --python python3 --threads 16 --rounds 1 \
  --only lstm_train,lstm_train_compiled,transformer_infer_compiled,mlp_train_compiled,resnet9_train_compiled,mlp5_infer_compiled,resnet9_infer_compiled \
  --out "$R/bench" > "$R/bench.txt" 2>&1; tail -20 "$R/bench.txt"
fi
if want cpu16; then
stamp cpu16 # issue 18: the CPU harness at 16 threads against PyTorch 2.11 (MKL, oneDNN)
timeout 240 $E scripts/bench/run.lua --threads 16 --python python3 --rounds 1 \
  --only matmul_1024,matmul_bert,mlp_train,lstm_train,resnet9_train,transformer_infer,mlp5_infer,resnet9_infer \
  --out "$R/cpu16" > "$R/cpu16.txt" 2>&1; tail -14 "$R/cpu16.txt"
fi
if want zoo16; then
stamp zoo16 # issue 21: the real models on the 16-core CPU against PyTorch 2.11 (ResNet-50 needs torchvision there)
timeout 300 $E scripts/bench/zoo.lua --threads 16 --python python3 --rounds 1 \
  --models resnet50,distilbert,bert,bert_latency --out "$R/zoo16" > "$R/zoo16.txt" 2>&1; tail -16 "$R/zoo16.txt"
fi
stamp done
