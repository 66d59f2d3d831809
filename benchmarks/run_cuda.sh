#!/usr/bin/env bash
# The CUDA checks and benchmarks in one command, on a machine with an NVIDIA GPU, from the source
# tree (the Triton kernels compile at first use; the C++ extension is built at one level first, for
# the layers launched from C++).
#
#     bash benchmarks/run_cuda.sh [OUT_DIR]
#
# OUT_DIR (default benchmarks/out/cuda) receives log.txt, selfcheck.txt and each benchmark's JSON.
# First the kernels' tests and `fastbert selfcheck --device cuda` (side by side: correctness only),
# then the benchmarks one after another on an otherwise idle GPU.
set -u
out=${1:-benchmarks/out/cuda}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
# the build maps kernels/ to fastbert.kernels; from the source tree a link does the same
if [ ! -e fastbert/kernels ]; then
    ln -s ../kernels fastbert/kernels
    trap 'rm -f fastbert/kernels' EXIT
fi
exec > >(tee -a "$out/log.txt") 2>&1

step() {  # step SECONDS NAME COMMAND...: run with a time limit, say how it ended
    local limit=$1 name=$2
    shift 2
    echo "=== $name ($(date +%T))"
    timeout "$limit" "$@"
    echo "=== $name: exit $? ($(date +%T))"
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
$py -c "import sys, torch, triton, transformers; print('python', sys.version.split()[0], '| torch', torch.__version__,
'| triton', triton.__version__, '| transformers', transformers.__version__, '|', torch.cuda.get_device_name())"

# the C++ extension, one level (the CPU's speed does not matter here): the layers launched from C++
# (fastbert.ops.cuda_stack) need it; without it they run their Python route
step 240 "build (scalar level)" env FASTBERT_LEVELS=scalar $py setup.py build_ext --inplace > "$out/build.txt" 2>&1
tail -3 "$out/build.txt"

step 180 selfcheck $py -m fastbert selfcheck --device cuda > "$out/selfcheck.txt" 2>&1 &
checks=$!
workers=$($py -c "import xdist" 2>/dev/null && echo "-n 8")  # pytest-xdist, where installed, compiles in parallel
step 240 "kernel tests" $py -m pytest -q -p no:cacheprovider tests/ops/test_attention.py tests/ops/test_bias_gelu.py \
    tests/ops/test_add_layer_norm.py tests/ops/test_add_layer_norm_sum.py tests/ops/test_geglu.py \
    tests/ops/test_attention_rotary.py tests/ops/test_attention_local.py tests/ops/test_attention_relative.py \
    tests/ops/test_disentangled_attention.py -k "triton" $workers
wait $checks
tail -25 "$out/selfcheck.txt"

step 120 "graph, inference-route and training-node tests" $py -m pytest -q -p no:cacheprovider \
    tests/ops/test_encoder_graphs.py tests/kernels/test_inference_options.py tests/ops/test_encoder.py \
    tests/ops/test_joined_attention.py tests/ops/test_layer_training.py tests/model/test_dropout_seeds.py \
    tests/ops/test_cuda_stack.py -k "triton or gpu or graphs or options or waits"
step 150 "check_modern_cuda" $py benchmarks/check_modern_cuda.py --json "$out/modern.json"
step 150 "bench_encoder_cuda" $py benchmarks/bench_encoder_cuda.py --json "$out/encoder.json"
step 60 "bench_encoder_cuda one20" $py benchmarks/bench_encoder_cuda.py --workloads one20 --scale 1 \
    --dtypes float16,bfloat16 --json "$out/encoder_one20.json"
step 90 "bench_launch" $py benchmarks/bench_launch.py --device cuda --calls 200 --rounds 5 --json "$out/launch.json"
step 100 "bench_attention fp16" $py benchmarks/bench_attention.py --dtype float16 --json "$out/attention_fp16.json"
step 90 "bench_ops" $py benchmarks/bench_ops.py --dtypes float32,bfloat16 --json "$out/ops.json"
step 80 "bench_pretrain" $py benchmarks/bench_pretrain.py --device cuda --rounds 5 --budget 30 --json "$out/pretrain.json"
# last, the compilers' minutes: torch.compile(mode="reduce-overhead") of a model, training and inference, against
# eager; then BERT-base at 8.5k real tokens against transformers under torch.compile(mode="max-autotune")
step 150 "reduce-overhead test" $py -m pytest -q -p no:cacheprovider \
    "tests/model/test_hf.py::test_torch_compile_reduce_overhead_on_gpu"
step 300 "bench_encoder_cuda compiled" $py benchmarks/bench_encoder_cuda.py --compiled --workloads var128 \
    --dtypes bfloat16 --json "$out/encoder_compiled.json"
