//! Vectorisable elementary functions for the unary kernels.
//!
//! Why not `libm::erff` per element: it branches on the argument's range, so nothing around
//! it vectorises, and GELU_ERF took about a sixth of an embedding model's time. Here GELU_ERF
//! is branch-free straight-line f64 code that the compiler vectorises (with AVX2 or AVX-512
//! when the CPU has them, chosen at run time), accurate to about 1e-10 before the final
//! rounding to f32, so results are the correctly rounded value or one ulp off.
//!
//! The method: for `z ≥ 0`, `erfc(z) = t · exp(−z² + P(t))` with `t = 1 / (1 + z/2)`, where
//! `P` is a degree-12 polynomial in `t` fitted (least squares on Chebyshev nodes, our own
//! fit) to `ln(erfcx(z) / t)` over `0 ≤ z ≤ 10`: relative error below 2e-10 there. Then
//! `gelu(x) = x · Φ(x)`, `Φ(x) = erfc(|z|)/2` for `x < 0` and `1 − erfc(|z|)/2` otherwise,
//! with `z = x/√2`; beyond `|z| = 10`, `Φ` is 0 or 1 in f32 terms. `exp` is evaluated by
//! reduction to `2ⁿ · e^r`, `|r| ≤ ln2/2`, and a degree-9 Taylor polynomial. Both
//! polynomials are evaluated in Estrin's scheme (powers of the argument, pairs of terms):
//! with Horner's one long chain per element the vectorised loop was bound by latency.

/// Coefficients of `P(t)`, lowest degree first.
const ERFC_P: [f64; 13] = [
    -1.2655049706794568,
    0.9997486142989933,
    0.37894246883873606,
    0.04685888414897303,
    0.1356729765670583,
    -1.0742119751248738,
    2.6686347591497173,
    -5.764043615536945,
    8.55326235830104,
    -7.89499285943131,
    4.4061761268181066,
    -1.3770017350381605,
    0.18645896786504057,
];

/// `e^a` for `a` in about `[−700, 700]` (here `[−110, 1]`), relative error ~1e-11.
#[inline(always)]
fn exp_f64(a: f64) -> f64 {
    const LOG2E: f64 = std::f64::consts::LOG2_E;
    const LN2_HI: f64 = 0.693_147_180_369_123_8;
    const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
    // 1.5 · 2^52: adding it rounds to an integer held in the low mantissa bits.
    const SHIFT: f64 = 6_755_399_441_055_744.0;
    let y = a * LOG2E + SHIFT;
    let n = y - SHIFT;
    let r = (a - n * LN2_HI) - n * LN2_LO;
    // Taylor polynomial of degree 9 (|r| <= ln2/2: truncation below 1e-11 relative), in
    // Estrin's scheme: a short dependency chain, so the vectorised loop is not bound by the
    // latency of one long Horner chain.
    let r2 = r * r;
    let r4 = r2 * r2;
    let r8 = r4 * r4;
    let q0 = 1.0 + r;
    let q1 = 1.0 / 2.0 + r * (1.0 / 6.0);
    let q2 = 1.0 / 24.0 + r * (1.0 / 120.0);
    let q3 = 1.0 / 720.0 + r * (1.0 / 5_040.0);
    let q4 = 1.0 / 40_320.0 + r * (1.0 / 362_880.0);
    let p = (q0 + q1 * r2) + (q2 + q3 * r2) * r4 + q4 * r8;
    // n as a two's-complement integer: the low bits of y's representation minus SHIFT's.
    let k = y.to_bits().wrapping_sub(SHIFT.to_bits());
    let scale = f64::from_bits(k.wrapping_add(1023) << 52);
    p * scale
}

/// GELU with the exact erf (`0.5 · x · (1 + erf(x/√2))`) of one value.
#[inline(always)]
pub(crate) fn gelu_erf(x: f32) -> f32 {
    let x = f64::from(x);
    let z_raw = (x * std::f64::consts::FRAC_1_SQRT_2).abs();
    let z = z_raw.min(10.0);
    let t = 1.0 / (1.0 + 0.5 * z);
    // P(t) in Estrin's scheme (see `exp_f64`).
    let c = &ERFC_P;
    let t2 = t * t;
    let t4 = t2 * t2;
    let t8 = t4 * t4;
    let r0 = (c[0] + c[1] * t) + (c[2] + c[3] * t) * t2;
    let r1 = (c[4] + c[5] * t) + (c[6] + c[7] * t) * t2;
    let r2 = (c[8] + c[9] * t) + (c[10] + c[11] * t) * t2;
    let p = (r0 + r1 * t4) + (r2 + c[12] * t4) * t8;
    let e = t * exp_f64(p - z * z); // erfc(z)
    let half = 0.5 * e;
    let mut phi = if x >= 0.0 { 1.0 - half } else { half };
    if z_raw > 10.0 {
        phi = if x >= 0.0 { 1.0 } else { 0.0 };
    }
    (x * phi) as f32
}

/// [`gelu_erf`] over a slice, compiled for the best instruction set available.
pub(crate) fn gelu_erf_slice(v: &mut [f32]) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512 F (checked just above), the function's only
            // requirement.
            return unsafe { gelu_erf_avx512(v) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { gelu_erf_avx2(v) };
        }
    }
    gelu_erf_portable(v);
}

#[inline(always)]
fn gelu_erf_portable(v: &mut [f32]) {
    for x in v {
        *x = gelu_erf(*x);
    }
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx512f")]
fn gelu_erf_avx512(v: &mut [f32]) {
    gelu_erf_portable(v);
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx2")]
fn gelu_erf_avx2(v: &mut [f32]) {
    gelu_erf_portable(v);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(x: f32) -> f64 {
        let x = f64::from(x);
        0.5 * x * libm::erfc(-x / std::f64::consts::SQRT_2)
    }

    #[test]
    fn gelu_erf_is_within_two_ulp_relative_everywhere() {
        let n = if cfg!(miri) { 200 } else { 400_000 };
        let mut xs: Vec<f32> = (0..=n)
            .map(|i| -16.0 + 32.0 * i as f32 / n as f32)
            .collect();
        xs.extend([
            0.0, -0.0, 1e-30, -1e-30, 1e-3, -1e-3, 13.9, -13.9, 14.2, -14.2,
        ]);
        let mut got = xs.clone();
        gelu_erf_slice(&mut got);
        for (&x, &g) in xs.iter().zip(&got) {
            let want = reference(x);
            let err = (f64::from(g) - want).abs();
            // 1.2e-7 relative: the f32 rounding (6e-8) plus the approximation (2e-10), with
            // an absolute floor at the smallest normal f32 for results that underflow.
            assert!(
                err <= 1.2e-7 * want.abs() + f64::from(f32::MIN_POSITIVE),
                "gelu_erf({x}) = {g}, want {want}"
            );
        }
        // Vectorised and portable code give the same bits (no fused operations).
        let mut portable = xs.clone();
        gelu_erf_portable(&mut portable);
        assert!(
            portable
                .iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
    }

    #[test]
    fn gelu_erf_special_values() {
        let mut v = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 100.0, -100.0];
        gelu_erf_slice(&mut v);
        assert_eq!(v[0], f32::INFINITY);
        assert!(v[1] == 0.0 || v[1].is_nan());
        assert!(v[2].is_nan());
        assert_eq!(v[3], 100.0);
        assert_eq!(v[4], 0.0);
    }
}
