#!/usr/bin/env bash
# Intel MKL's f32 GEMM (cblas_sgemm) on the shapes of benches/gemm.rs, for a reference
# measured on the same machine in the same minutes: MKL is the fastest f32 GEMM we know of
# on Intel CPUs, so its fraction of the FMA peak says how far a product can get there.
# Nothing built or installed here is committed.
#
# Usage: crates/cpu-kernels/benches/mkl-sgemm-bench.sh [ROUNDS] [THREADS]   (defaults 3, 2)
#   One line per case and round: `mkl CASE ROUND GFLOP/s` (the fastest of 8 calls, 3 for
#   4096³; GEMM_SKIP_LARGE=1 leaves 4096³ out). The layout is ours: weights of m rows of k
#   adjacent floats, n columns of k adjacent floats, the m × n result column by column, i.e.
#   C (n × m, row-major) = B (n × k) · Aᵀ. Compare the GFLOP/s with the `nominal` and `FMA
#   loop` figures of the gemm bench run just before or after.
#   Threads: MKL's GNU OpenMP layer on gcc's libgomp (MKL_THREADING_LAYER=GNU; the Intel
#   OpenMP runtime is another package).
# Cost: a virtual environment in ${MKL_BENCH_VENV:-$HOME/.cache/mkl-sgemm-venv} with
# numpy==2.4.6 and mkl==2026.2.1 from PyPI (about 240 MB to download, 780 MB installed).
set -euo pipefail
ROUNDS=${1:-3}
THREADS=${2:-2}
VENV=${MKL_BENCH_VENV:-$HOME/.cache/mkl-sgemm-venv}
if [[ ! -x $VENV/bin/python ]] || ! "$VENV/bin/python" -c 'import numpy' 2>/dev/null; then
    python3 -m venv "$VENV" >&2
    "$VENV/bin/pip" install -q --no-deps numpy==2.4.6 mkl==2026.2.1 >&2
fi
LIB=$(ls "$VENV"/lib/libmkl_rt.so.* | head -1)
GOMP=$(gcc -print-file-name=libgomp.so.1)
export MKL_THREADING_LAYER=GNU OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
LD_PRELOAD=$GOMP "$VENV/bin/python" - "$LIB" "$ROUNDS" "$THREADS" <<'PY'
import ctypes, os, sys, time
import numpy as np

lib, rounds, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mkl = ctypes.CDLL(lib)
mkl.MKL_Set_Num_Threads(ctypes.c_int(threads))
sgemm = mkl.cblas_sgemm
sgemm.argtypes = [ctypes.c_int] * 6 + [
    ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
    ctypes.c_float, ctypes.c_void_p, ctypes.c_int,
]
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
cases = [
    ("minilm_qkvo_384x384_x4096", 384, 384, 4096, 8),
    ("minilm_ffn_up_384x1536_x4096", 384, 1536, 4096, 8),
    ("minilm_ffn_down_1536x384_x4096", 1536, 384, 4096, 8),
]
if not os.environ.get("GEMM_SKIP_LARGE"):
    cases.append(("f32_4096x4096x4096", 4096, 4096, 4096, 3))
for rnd in range(rounds):
    for name, k, m, n, reps in cases:
        a = (np.arange(k * m) % 13).astype(np.float32).reshape(m, k) / 8
        b = (np.arange(k * n) % 11).astype(np.float32).reshape(n, k) / 8
        c = np.zeros((n, m), np.float32)
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            sgemm(ROW_MAJOR, NO_TRANS, TRANS, n, m, k, 1.0, b.ctypes.data, k,
                  a.ctypes.data, k, 0.0, c.ctypes.data, m)
            best = min(best, time.perf_counter() - t)
        want = b[:3] @ a[:5].T
        assert np.allclose(c[:3, :5], want, rtol=1e-4), "MKL gave a wrong product"
        print(f"mkl {name} {rnd} {2 * k * m * n / best / 1e9:.1f}", flush=True)
PY
