//! ggml's vector `exp` (`ggml_v_expf`) and the two kernels built on it, SILU and the
//! exponentials and sum of SOFT_MAX, reproduced lane for lane.
//!
//! Why: ggml's CPU backend does not call libm's `expf` in these ops but a polynomial, 16
//! lanes at a time in its AVX-512 build (8 in its AVX2 build, with a slightly different final
//! rounding), and libm only for the elements past the last full vector. A llama decode that
//! is compared token for token with llama.cpp runs SILU in every block and the softmax in
//! every attention, so these follow ggml's AVX-512 build — the build llama.cpp's reference
//! outputs were made with (`-march=native` on an AVX-512 machine):
//!
//! * `exp(x)`: `n = round(x · log2 e)` by the 1.5·2²³ shift, `b = x − n·ln2` in two FMAs,
//!   a degree-5 polynomial `j ≈ e^b` evaluated with FMAs, then `j · 2ⁿ` (`scalef`: exact,
//!   rounded once); `|n| > 192` gives 0 or +∞.
//! * SILU: `x / (1 + exp(0 − x))` per full 16-lane vector, `x / (1 + expf(−x))` (libm) for
//!   the rest of the row.
//! * SOFT_MAX: `exp(x − max)` per full vector, each vector's sum reduced in `_mm512_reduce_
//!   add_ps`'s order and added to an f64 sum; libm and f64 additions for the rest.
//!
//! Every operation is an IEEE operation with one rounding (`f32::mul_add` is fused at every
//! level), so the portable code gives the same bits as the vectorised builds of it.

/// Lanes of ggml's vectors in its AVX-512 build.
const LANES: usize = 16;

const SHIFT: f32 = 12_582_912.0; // 0x1.8p23
const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b); // 0x1.715476p+0
const LN2_HI: f32 = f32::from_bits(0x3f31_7200); // 0x1.62e4p-1
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e); // 0x1.7f7d1cp-20
const P5: f32 = f32::from_bits(0x3c07_2010); // 0x1.0e4020p-7
const P4: f32 = f32::from_bits(0x3d2b_9f17); // 0x1.573e2ep-5
const P3: f32 = f32::from_bits(0x3e2a_af33); // 0x1.555e66p-3
const P2: f32 = f32::from_bits(0x3eff_fedb); // 0x1.fffdb6p-2
const P1: f32 = f32::from_bits(0x3f7f_fff6); // 0x1.ffffecp-1

/// `2^e` for `e` in −126..=127.
#[inline(always)]
fn pow2(e: i32) -> f32 {
    f32::from_bits((e.wrapping_add(127) as u32) << 23)
}

/// One lane of ggml's AVX-512 `ggml_v_expf`.
#[inline(always)]
pub(crate) fn ggml_expf(x: f32) -> f32 {
    let z = x.mul_add(LOG2E, SHIFT);
    let n = z - SHIFT;
    let b = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let u = b * b;
    let j = P5
        .mul_add(b, P4)
        .mul_add(u, P3.mul_add(b, P2))
        .mul_add(u, P1.mul_add(b, 1.0));
    // scalef(j, n) for |n| <= 192: two power-of-two factors, the first exact, the second
    // rounding once (to a subnormal or infinity where the result is out of range).
    // `n` is integral; clamped to ±192 it sits exactly in the low bits of `n + SHIFT`, read
    // as an integer (this vectorises; `as i32`, which saturates and maps NaN to 0, did not).
    // For NaN `ni` is arbitrary, but `j` is NaN and so is the result, as before.
    let ni =
        ((n.clamp(-192.0, 192.0) + SHIFT).to_bits() as i32).wrapping_sub(SHIFT.to_bits() as i32);
    let h = ni / 2;
    let res = (j * pow2(h)) * pow2(ni - h);
    if n.abs() > 192.0 {
        if n <= 0.0 { 0.0 } else { f32::INFINITY }
    } else {
        res
    }
}

/// `_mm512_reduce_add_ps`'s order (GCC's: halves, then quarters, then pairs).
#[inline(always)]
pub(crate) fn reduce16(v: &[f32; LANES]) -> f32 {
    let t3: [f32; 8] = std::array::from_fn(|i| v[8 + i] + v[i]);
    let t6: [f32; 4] = std::array::from_fn(|i| t3[4 + i] + t3[i]);
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

#[inline(always)]
fn silu_portable(v: &mut [f32]) {
    let full = v.len() / LANES * LANES;
    let (body, tail) = v.split_at_mut(full);
    for x in body {
        *x = *x / (1.0 + ggml_expf(0.0 - *x));
    }
    for x in tail {
        *x = *x / (1.0 + (-*x).exp());
    }
}

#[inline(always)]
fn soft_max_portable(v: &mut [f32], max: f32) -> f64 {
    let full = v.len() / LANES * LANES;
    let (body, tail) = v.split_at_mut(full);
    let mut sum = 0.0f64;
    for c in body.chunks_exact_mut(LANES) {
        let mut e = [0.0f32; LANES];
        for (e, x) in e.iter_mut().zip(c.iter_mut()) {
            *x = ggml_expf(*x - max);
            *e = *x;
        }
        sum += f64::from(reduce16(&e));
    }
    for x in tail {
        *x = (*x - max).exp();
        sum += f64::from(*x);
    }
    sum
}

/// SILU over one row (or a part of a row starting at a multiple of 16 elements), as ggml.
pub(crate) fn silu_slice(v: &mut [f32]) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if fma_available() {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        return unsafe { silu_fma(v) };
    }
    silu_portable(v);
}

/// SOFT_MAX's exponentials of one row, in place (`v[i] = exp(v[i] − max)`), and their sum
/// as ggml adds it.
pub(crate) fn soft_max_exp_sum(v: &mut [f32], max: f32) -> f64 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if fma_available() {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        return unsafe { soft_max_fma(v, max) };
    }
    soft_max_portable(v, max)
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
fn fma_available() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx2,fma")]
fn silu_fma(v: &mut [f32]) {
    silu_portable(v);
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx2,fma")]
fn soft_max_fma(v: &mut [f32], max: f32) -> f64 {
    soft_max_portable(v, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expf_is_close_to_libm_and_handles_the_ends() {
        let mut x = -80.0f32;
        while x < 88.0 {
            let (g, l) = (ggml_expf(x), x.exp());
            // Miri adds a few ulps of noise to libm's results on purpose.
            let tol = if cfg!(miri) { 1e-5 } else { 4e-7 };
            assert!(((g - l) / l).abs() < tol, "{x}: {g} vs {l}");
            x += 0.37;
        }
        assert_eq!(ggml_expf(0.0), 1.0);
        assert_eq!(ggml_expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(ggml_expf(-300.0), 0.0);
        assert_eq!(ggml_expf(300.0), f32::INFINITY);
        assert!(ggml_expf(f32::NAN).is_nan());
        // Subnormal results (126 < |n| <= 192) are rounded once, not flushed.
        let s = ggml_expf(-95.0);
        assert!(s > 0.0 && s < f32::MIN_POSITIVE);
        if !cfg!(miri) {
            assert!(((s - (-95.0f32).exp()) / (-95.0f32).exp()).abs() < 1e-3);
        }
    }

    /// The exponent read from the bits of `n + SHIFT` gives the bits the saturating cast
    /// gave, over the whole range, the ends and NaN.
    #[test]
    fn exponent_from_bits_matches_the_cast() {
        fn by_cast(x: f32) -> f32 {
            let z = x.mul_add(LOG2E, SHIFT);
            let n = z - SHIFT;
            let b = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
            let u = b * b;
            let j = P5
                .mul_add(b, P4)
                .mul_add(u, P3.mul_add(b, P2))
                .mul_add(u, P1.mul_add(b, 1.0));
            let ni = n.clamp(-192.0, 192.0) as i32;
            let h = ni / 2;
            let res = (j * pow2(h)) * pow2(ni - h);
            if n.abs() > 192.0 {
                if n <= 0.0 { 0.0 } else { f32::INFINITY }
            } else {
                res
            }
        }
        let step = if cfg!(miri) { 7.3 } else { 0.0137 };
        let mut x = -200.0f32;
        let mut xs = vec![
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
        ];
        while x < 200.0 {
            xs.push(x);
            x += step;
        }
        for x in xs {
            let (got, want) = (ggml_expf(x), by_cast(x));
            // NaN results: Rust leaves their sign and payload open (Miri varies them).
            if want.is_nan() {
                assert!(got.is_nan(), "{x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{x}");
            }
        }
    }

    #[test]
    fn portable_and_vectorised_builds_agree() {
        // Whole vectors only: the rest of a row goes through libm, whose results Miri
        // perturbs from call to call.
        let xs: Vec<f32> = (0..48).map(|i| (i as f32 - 18.0) * 0.731).collect();
        let mut a = xs.clone();
        let mut b = xs.clone();
        silu_portable(&mut a);
        silu_slice(&mut b);
        assert_eq!(a, b);
        let mut a = xs.clone();
        let mut b = xs.clone();
        assert_eq!(
            soft_max_portable(&mut a, 13.0),
            soft_max_exp_sum(&mut b, 13.0)
        );
        assert_eq!(a, b);
    }
}
