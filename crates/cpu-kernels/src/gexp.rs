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

/// One SOFT_MAX row in place: `x = x · scale`, plus `slope · mask` (a fused multiply-add, or
/// a plain add when `slope` is 1) when there is a mask, then `exp(x − max) / Σ` with the
/// exponentials and their sum as [`soft_max_exp_sum`] computes them.
pub(crate) fn soft_max_row(x: &mut [f32], mask: Option<&[f32]>, scale: f32, slope: f32) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if avx512_available() {
        // SAFETY: the CPU has AVX-512 F and DQ (checked just above).
        return unsafe { x86::soft_max_row_avx512(x, mask, scale, slope) };
    }
    soft_max_row_portable(x, mask, scale, slope);
}

fn soft_max_row_portable(x: &mut [f32], mask: Option<&[f32]>, scale: f32, slope: f32) {
    x.iter_mut().for_each(|v| *v *= scale);
    if let Some(m) = mask {
        if slope == 1.0 {
            x.iter_mut().zip(m).for_each(|(v, &w)| *v += w);
        } else {
            // ggml's `wp[i] += slope*mp[i]` is compiled to a fused multiply-add.
            x.iter_mut()
                .zip(m)
                .for_each(|(v, &w)| *v = slope.mul_add(w, *v));
        }
    }
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let sum = soft_max_exp_sum(x, max);
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
fn avx512_available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512dq")
}

/// The AVX-512 row kernel: the same operations as the portable code, sixteen lanes at a time
/// (ggml's own AVX-512 `exp`, with `scalef`), in three passes over the row.
#[cfg(all(target_arch = "x86_64", not(miri)))]
mod x86 {
    use std::arch::x86_64::*;

    use super::*;

    /// # Safety
    /// The CPU must have AVX-512 F and DQ; `mask`, if any, is at least as long as `x`.
    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) unsafe fn soft_max_row_avx512(
        x: &mut [f32],
        mask: Option<&[f32]>,
        scale: f32,
        slope: f32,
    ) {
        let n = x.len();
        let full = n / LANES * LANES;
        assert!(mask.is_none_or(|m| m.len() >= n));
        let p = x.as_mut_ptr();
        let (vs, vslope) = (_mm512_set1_ps(scale), _mm512_set1_ps(slope));
        // Pass 1: scale, mask, running maximum (`max_ps(v, m)` keeps `m` when `v` is NaN,
        // as `f32::max` does).
        let mut vmax = _mm512_set1_ps(f32::NEG_INFINITY);
        for i in (0..full).step_by(LANES) {
            // SAFETY: i + 16 <= full <= n = x.len() <= mask.len().
            unsafe {
                let mut v = _mm512_mul_ps(_mm512_loadu_ps(p.add(i)), vs);
                if let Some(m) = mask {
                    let w = _mm512_loadu_ps(m.as_ptr().add(i));
                    v = if slope == 1.0 {
                        _mm512_add_ps(v, w)
                    } else {
                        _mm512_fmadd_ps(vslope, w, v)
                    };
                }
                _mm512_storeu_ps(p.add(i), v);
                vmax = _mm512_max_ps(v, vmax);
            }
        }
        let mut max = f32::NEG_INFINITY;
        let mut lanes = [0.0f32; LANES];
        // SAFETY: 16 floats into a 16-float array.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), vmax) };
        for v in lanes {
            max = max.max(v);
        }
        for (i, v) in x.iter_mut().enumerate().skip(full) {
            *v *= scale;
            if let Some(m) = mask {
                *v = if slope == 1.0 {
                    *v + m[i]
                } else {
                    slope.mul_add(m[i], *v)
                };
            }
            max = max.max(*v);
        }
        // Pass 2: exponentials and their sum, each vector's sum in reduce16's order.
        let vm = _mm512_set1_ps(max);
        let mut sum = 0.0f64;
        for i in (0..full).step_by(LANES) {
            // SAFETY: i + 16 <= full <= x.len().
            unsafe {
                let e = expf16(_mm512_sub_ps(_mm512_loadu_ps(p.add(i)), vm));
                _mm512_storeu_ps(p.add(i), e);
                sum += f64::from(reduce16_avx512(e));
            }
        }
        for v in x.iter_mut().skip(full) {
            *v = (*v - max).exp();
            sum += f64::from(*v);
        }
        // Pass 3: normalise.
        let inv = (1.0 / sum) as f32;
        let vi = _mm512_set1_ps(inv);
        for i in (0..full).step_by(LANES) {
            // SAFETY: i + 16 <= full <= x.len().
            unsafe { _mm512_storeu_ps(p.add(i), _mm512_mul_ps(_mm512_loadu_ps(p.add(i)), vi)) };
        }
        x.iter_mut().skip(full).for_each(|v| *v *= inv);
    }

    /// [`reduce16`]'s order: halves, quarters, then `(t0 + t2) + (t1 + t3)`.
    #[target_feature(enable = "avx512f,avx512dq")]
    fn reduce16_avx512(v: __m512) -> f32 {
        let t3 = _mm256_add_ps(_mm512_extractf32x8_ps::<1>(v), _mm512_castps512_ps256(v));
        let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
        let t = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
        _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps::<1>(t, t)))
    }

    /// [`ggml_expf`] on sixteen lanes (ggml's AVX-512 `ggml_v_expf`).
    #[target_feature(enable = "avx512f,avx512dq")]
    fn expf16(x: __m512) -> __m512 {
        let shift = _mm512_set1_ps(SHIFT);
        let z = _mm512_fmadd_ps(x, _mm512_set1_ps(LOG2E), shift);
        let n = _mm512_sub_ps(z, shift);
        let b = _mm512_fnmadd_ps(
            n,
            _mm512_set1_ps(LN2_LO),
            _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x),
        );
        let big = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
        let u = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_fmadd_ps(_mm512_set1_ps(P5), b, _mm512_set1_ps(P4)),
                u,
                _mm512_fmadd_ps(_mm512_set1_ps(P3), b, _mm512_set1_ps(P2)),
            ),
            u,
            _mm512_fmadd_ps(_mm512_set1_ps(P1), b, _mm512_set1_ps(1.0)),
        );
        let res = _mm512_scalef_ps(j, n);
        if big == 0 {
            return res;
        }
        let le0 = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps());
        let alt = _mm512_mask_blend_ps(le0, _mm512_set1_ps(f32::INFINITY), _mm512_setzero_ps());
        _mm512_mask_blend_ps(big, res, alt)
    }
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

    #[test]
    fn soft_max_rows_agree_with_the_portable_code() {
        // Whole vectors and a tail, with and without a mask and an ALiBi slope, -inf in
        // the mask, a row with an element far below the maximum (exp underflows to 0).
        // Miri perturbs libm's results, which the tail of a row takes; a perturbed tail
        // changes the row's sum and so every element: under Miri only whole vectors.
        let lengths: &[usize] = if cfg!(miri) { &[16, 48] } else { &[16, 48, 53] };
        for &n in lengths {
            let xs: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.9)
                .collect();
            let mut mask: Vec<f32> = (0..n).map(|i| (i % 5) as f32 * -0.25).collect();
            mask[3] = f32::NEG_INFINITY;
            for (m, slope) in [(None, 1.0), (Some(&mask[..]), 1.0), (Some(&mask[..]), 0.7)] {
                let mut a = xs.clone();
                a[7] = -200.0;
                let mut b = a.clone();
                soft_max_row_portable(&mut a, m, 0.125, slope);
                soft_max_row(&mut b, m, 0.125, slope);
                assert!(
                    a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "n{n} slope {slope}: {a:?} vs {b:?}"
                );
            }
        }
    }
}
