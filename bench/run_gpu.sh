#!/usr/bin/env bash
# One batch on the lent GPU machine: build the C core, run the gpu-marked tests and CuPy's own
# tests with ours installed (part "tests"), then the GPU bench, the render and widget benches, and
# record a real trace (part "bench").
# `bash bench/run_gpu.sh [tests|bench|all|expandable|short|whatif|torch]` (default all). Part "torch"
# (under 4 minutes) runs one cache for CuPy and PyTorch: tests/gpu/test_torch_share_gpu.py (each
# check in a child process), bench/bench_torch_share.py, then CuPy's own tests while PyTorch shares
# the cache. Part "expandable" runs
# only the expandable-segment pieces (about 2 minutes): the VMM self-check, parity with PyTorch's
# expandable_segments and CuPy arrays on them (tests/gpu/test_expandable_gpu.py), then
# bench/bench_expandable.py. Part "short" (under 8 minutes, for a small device budget) runs the
# expandable part, every other gpu-marked test, and the Dask plugin's overhead.
# Logs go to $OUT (or ./gpu-out). Run from the project root with the device wheels in .whl/
# (`../shared/tools/device-wheels distributed dask`, so the Dask GPU tests run too) and the built
# views in jupyter_gpumem/render/static/dist (both ignored by git: carry them to the machine).
set -uo pipefail
part=${1:-all}
[ $# -gt 0 ] && shift
out=${OUT:-gpu-out}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 --version;
  python3 -c 'import cupy, torch; print("cupy", cupy.__version__, "torch", torch.__version__)'; } \
  2>&1 | tee "$out/env.txt"
python3 -m jupyter_gpumem.engine._build_native 2>&1 | tee "$out/build.log"
if [ "$part" = expandable ] || [ "$part" = short ]; then
  python3 -c 'import cuda.bindings as b; print("cuda-bindings", getattr(b, "__version__", "?"))' \
    2>&1 | tee -a "$out/env.txt"
  # each step bounded, and a failure in one does not stop the next
  timeout 180 python3 -m pytest tests/gpu/test_expandable_gpu.py tests/devices/test_cuda_vmm.py \
    -v -s -p no:cacheprovider -rs "$@" > "$out/expandable-tests.log" 2>&1
  echo "expandable tests (exit $?)" | tee -a "$out/expandable-tests.log"
  grep -E "PASSED|FAILED|SKIPPED|ERROR|^VMM|^  |passed|failed" "$out/expandable-tests.log" \
    | tail -40
  timeout 240 python3 bench/bench_expandable.py --out "$out/bench_expandable.json" 2>&1 \
    | tee "$out/bench_expandable.log"
  echo "bench_expandable (exit ${PIPESTATUS[0]})"
  [ "$part" = expandable ] && exit 0
  timeout 240 python3 -m pytest tests -m gpu -v -s -p no:cacheprovider -rs \
    --ignore tests/gpu/test_expandable_gpu.py > "$out/gpu-tests.log" 2>&1
  echo "gpu tests (exit $?)"; grep -E "PASSED|FAILED|SKIPPED|ERROR|cluster:|chunks held|passed|failed" \
    "$out/gpu-tests.log" | tail -40
  timeout 120 python3 bench/bench_dask.py --gpu --only overhead --repeat 3 2>&1 \
    | tee "$out/bench_dask_gpu.log" | tail -6
  exit 0
fi
if [ "$part" = torch ]; then
  # the shim PyTorch calls is compiled once for all the children, outside $OUT
  JUPYTER_GPUMEM_CACHE_DIR=$(mktemp -d)
  export JUPYTER_GPUMEM_CACHE_DIR
  { python3 -c 'import torch; print("torch", torch.__version__, "cxx11 abi",
      torch._C._GLIBCXX_USE_CXX11_ABI)'; c++ --version | head -1; } 2>&1 | tee -a "$out/env.txt"
  timeout 170 python3 -m pytest tests/gpu/test_torch_share_gpu.py -v -s -p no:cacheprovider -rs \
    > "$out/torch-share-tests.log" 2>&1
  echo "torch share tests (exit $?)"
  grep -E "^(OK|FAIL) |^\[|PASSED|FAILED|SKIPPED|ERROR|passed|failed|budget|losses|^(same|DIFFERENT) " \
    "$out/torch-share-tests.log" | cut -c1-400 | tail -80
  timeout 120 python3 bench/bench_torch_share.py --json "$out/bench_torch_share.json" 2>&1 \
    | tee "$out/bench_torch_share.log"
  echo "bench_torch_share (exit ${PIPESTATUS[0]})"
  # CuPy's own tests with PyTorch sharing our cache for the session (bench/cupy_tests/conftest.py)
  JUPYTER_GPUMEM_SHARE_TORCH=1 CUPY_TEST_GPU_LIMIT=$(nvidia-smi -L | wc -l) timeout 75 \
    python3 -m pytest bench/cupy_tests -q -rfE -p no:cacheprovider > "$out/cupy-tests-torch.log" 2>&1
  echo "cupy tests, PyTorch sharing the cache (exit $?): $(grep -E '(passed|failed|error).* in [0-9.]+s' \
    "$out/cupy-tests-torch.log" | tail -1)"
  grep -A9 '^jupyter_gpumem:' "$out/cupy-tests-torch.log" | head -12
  exit 0
fi
if [ "$part" = whatif ]; then
  # PyTorch as a source and what-if replay (under 9 minutes): every gpu-marked test, the
  # PyTorch notebook checks, the fragmentation OOM whose suggestion is proven in a fresh
  # process, the replay's speed and the fixtures re-recorded and replayed
  timeout 240 python3 -m pytest tests -m gpu -v -s -p no:cacheprovider -rs \
    --ignore tests/gpu/test_dask_gpu.py > "$out/gpu-tests.log" 2>&1
  echo "gpu tests (exit $?)"; grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" \
    "$out/gpu-tests.log" | tail -40
  timeout 150 python3 bench/torch_notebook_check.py "$out/torch_check.ipynb" \
    > "$out/torch_check.log" 2>&1
  grep -E "^(FAIL|[0-9]+ passed)" "$out/torch_check.log"
  timeout 150 python3 bench/torch_whatif_check.py "$out/whatif" > "$out/torch_whatif.log" 2>&1
  echo "torch whatif (exit $?)"; cat "$out/torch_whatif.log" | cut -c1-400
  timeout 60 python3 bench/bench_replay.py 2>&1 | tee "$out/bench_replay.log" | tail -6
  timeout 120 python3 bench/record_fixtures.py "$out/fixtures" 2>&1 \
    | tee "$out/record_fixtures.log" | grep -E "^(FAIL|PASS|[0-9]+ failed)" | cut -c1-300
  exit 0
fi
if [ "$part" = tests ] || [ "$part" = all ]; then
python3 -m pytest tests -m gpu -v -p no:cacheprovider -rs "$@" 2>&1 | tee "$out/gpu-tests.log" \
  | tail -45
# CuPy's own tests of mem.size users and of allocators, with ours installed for the session
# (bench/cupy_tests: two of CuPy's test files, vendored; the summary lists the tests that used ours)
# CuPy's convention: CUPY_TEST_GPU_LIMIT skips the tests that need more GPUs than there are
CUPY_TEST_GPU_LIMIT=$(nvidia-smi -L | wc -l) timeout 300 python3 -m pytest bench/cupy_tests -q -rfE > "$out/cupy-tests.log" 2>&1
echo "cupy tests (exit $?): $(grep -E '(passed|failed|error).* in [0-9.]+s' "$out/cupy-tests.log" \
  | tail -1)" | tee -a "$out/cupy-tests.log"
grep -A8 '^jupyter_gpumem:' "$out/cupy-tests.log" | head -12
fi
[ "$part" = tests ] && exit 0
python3 bench/bench_gpu.py --json "$out/bench_gpu.json" 2>&1 | tee "$out/bench_gpu.log"
# Hooks.alloc (installed now) against the PythonFunctionAllocator route it replaced
python3 bench/bench_cupy_alloc.py --json "$out/bench_cupy_alloc.json" 2>&1 \
  | tee "$out/bench_cupy_alloc.log"
JUPYTER_GPUMEM_CORE=python python3 bench/bench_gpu.py --quick 2>&1 \
  | tee "$out/bench_gpu_python_core.log" | tail -8
# the renderers and the widget on the same machine (CPU-bound; the GPU box is quieter)
timeout 300 python3 bench/bench_render.py 2>&1 | tee "$out/bench_render.log" | tail -8
timeout 300 python3 bench/bench_widget.py 2>&1 | tee "$out/bench_widget.log" | tail -12
# a real trace for the README: record, save, render
timeout 300 python3 examples/h200_trace.py "$out/trace" 2>&1 | tee "$out/h200_trace.log" | tail -3
# the what-if replay's speed (C loop and the whole call), and the replay fixtures recorded on
# this GPU for tests/data/fixtures (a CuPy trace through ours, a PyTorch pickle and its stats)
timeout 300 python3 bench/bench_replay.py 2>&1 | tee "$out/bench_replay.log" | tail -6
timeout 300 python3 bench/record_fixtures.py "$out/fixtures" 2>&1 | tee "$out/record_fixtures.log" \
  | tail -6
# PyTorch as a source: a training notebook run by nbclient, checked against torch.cuda.memory
timeout 300 python3 bench/torch_notebook_check.py "$out/torch_check.ipynb" > "$out/torch_check.log" 2>&1
grep -E "^(FAIL|[0-9]+ passed)" "$out/torch_check.log"
# Dask: two workers sharing this GPU (the test prints which cluster ran), then the plugin's cost
timeout 300 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/gpu/test_dask_gpu.py \
  > "$out/dask-gpu-tests.log" 2>&1; grep -E "cluster:|passed|failed|Error" "$out/dask-gpu-tests.log" | tail -8
timeout 240 python3 bench/bench_dask.py --gpu --only overhead 2>&1 | tee "$out/bench_dask_gpu.log" | tail -6
timeout 240 python3 bench/bench_dask.py --gather-processes --only gather 2>&1 \
  | tee "$out/bench_dask_gather.log" | tail -4
