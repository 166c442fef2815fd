#!/usr/bin/env python3
"""The ratios of a benches/kernel-targets.sh run: `benches/kernel-targets-ratios.py run.txt`.

Per round (1/2/3), ours ÷ ggml for the 4096 × 4096 quantized products: criterion's point
estimate of ours (`BENCH_MIN=1`: each sample's fastest call) against ggml's fastest call
(its driver's second column), for
  * plain q4_0 and our CPU_REPACK q4_0 against ggml's CPU_REPACK q4_0 (ggml's fastest q4_0
    layout that runs every shape; where ggml's AMX type ran a shape, against it too),
  * q4_1 and q8_0, plain and ours in CPU_REPACK, against ggml's default path (ggml has no
    x86 layout for them in CPU_REPACK) and, where it ran, its AMX type;
then the GEMM rounds (ours and MKL ÷ the round's nominal peak and FMA loop), the mat-vec
rows (as printed), MiniLM and SmolLM2 (as printed).
"""
import re
import sys

UNIT = {"ns": 1e-3, "µs": 1.0, "us": 1.0, "ms": 1e3, "s": 1e6}


def parse(path):
    ggml, ours = {}, {}
    rnd, side, name = 0, None, None
    gemm, mkl, other = [], [], []
    part = None
    for line in open(path, encoding="utf-8"):
        m = re.match(r"== round (\d+): (ggml|ours)", line)
        if m:
            rnd, side, part = int(m.group(1)), m.group(2), "kernels"
            continue
        m = re.match(r"== (gemm|matvec|minilm|smollm2|end)", line)
        if m:
            part = m.group(1)
            continue
        if part == "kernels" and side == "ggml":
            f = line.split()
            if len(f) >= 3 and f[1].isdigit():
                ggml[(f[0], rnd)] = int(f[1]) / 1e3  # µs
            continue
        if part == "kernels" and side == "ours":
            m = re.match(r"mul_mat/(\S+)", line)
            if m:
                name = m.group(1)
            m = re.search(r"time:\s+\[\S+ \S+ (\S+) (\S+)", line)
            if m and name:
                ours[(name, rnd)] = float(m.group(1)) * UNIT[m.group(2)]
                name = None
            continue
        if part == "gemm":
            f = line.split()
            if f and f[0] == "fma_peak":
                gemm.append({"nominal": float(f[3]), "fma": float(f[4]), "cases": {}})
            elif f and (f[0].startswith("minilm") or f[0].startswith("f32_")) and len(f) > 3 and f[1].isdigit() and f[2] != "of" and gemm:
                gemm[-1]["cases"][f[0]] = (float(f[2]), float(f[3]))
            elif f and f[0] == "mkl" and gemm:
                gemm[-1].setdefault("mkl", {})[f[1]] = float(f[3])
            continue
        if part in ("matvec", "minilm", "smollm2"):
            other.append(line.rstrip())
    return ggml, ours, gemm, other


def main():
    ggml, ours, gemm, other = parse(sys.argv[1])
    rounds = sorted({r for _, r in ggml})

    def row(label, our, ref):
        vals = []
        for r in rounds:
            o, g = ours.get((our, r)), ggml.get((ref, r))
            vals.append(f"{o / g:.2f}" if o and g else "-")
        print(f"{label:<58} {'/'.join(vals)}")

    print("ours ÷ ggml, rounds " + "/".join(map(str, rounds)))
    for n in ("x1", "x32", "x512"):
        row(f"q4_0 plain ÷ ggml CPU_REPACK {n}", f"q4_0_4096x4096_{n}", f"q4_0_4096x4096_{n}_repack")
        row(f"q4_0 CPU_REPACK ÷ ggml CPU_REPACK {n}", f"q4_0_4096x4096_{n}_repack", f"q4_0_4096x4096_{n}_repack")
        row(f"q4_0 plain ÷ ggml AMX {n}", f"q4_0_4096x4096_{n}", f"q4_0_4096x4096_{n}_amx")
        row(f"q4_0 CPU_REPACK ÷ ggml AMX {n}", f"q4_0_4096x4096_{n}_repack", f"q4_0_4096x4096_{n}_amx")
    for t in ("q4_1", "q8_0"):
        for n in ("x1", "x32", "x512"):
            row(f"{t} plain ÷ ggml default {n}", f"{t}_4096x4096_{n}", f"{t}_4096x4096_{n}")
            row(f"{t} CPU_REPACK ÷ ggml default {n}", f"{t}_4096x4096_{n}_repack", f"{t}_4096x4096_{n}")
            row(f"{t} CPU_REPACK ÷ ggml AMX {n}", f"{t}_4096x4096_{n}_repack", f"{t}_4096x4096_{n}_amx")
    print("\nGEMM per round: ours and MKL in GFLOP/s ÷ nominal peak (÷ FMA loop)")
    for i, g in enumerate(gemm):
        print(f"round {i + 1}: nominal {g['nominal']:.1f}, FMA loop {g['fma']:.1f}")
        for c, (fma_near, o) in g["cases"].items():
            mk = g.get("mkl", {}).get(c)
            mks = f"; MKL {mk:.1f}: {mk / g['nominal']:.2f} ({mk / g['fma']:.2f}), ours ÷ MKL {o / mk:.2f}" if mk else ""
            print(f"  {c:<32} ours {o:.1f}: {o / g['nominal']:.2f} ({o / fma_near:.2f}){mks}")
    print()
    print("\n".join(other))


if __name__ == "__main__":
    main()
