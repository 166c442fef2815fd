//! Block formats `q8_0` and `q4_0`: dequantize, quantize, and block dot products.
//!
//! Layouts (ggml's): a `q8_0` block is an f16 scale `d` then 32 signed bytes, value `q · d`;
//! a `q4_0` block is an f16 scale `d` then 16 bytes whose low nibbles are elements 0..16 and
//! high nibbles elements 16..32, value `(q − 8) · d`. Safe code over byte slices; the
//! quantizers follow ggml's reference rounding so files written by either agree.

use half::f16;

/// Elements per block.
pub(crate) const QK: usize = 32;
/// Bytes of a q8_0 block.
pub(crate) const Q8_0_BYTES: usize = 34;
/// Bytes of a q4_0 block.
pub(crate) const Q4_0_BYTES: usize = 18;

#[inline]
fn scale(b: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// Dequantize q8_0 blocks into `out` (`out.len()` a multiple of 32).
pub(crate) fn dequantize_q8_0(src: &[u8], out: &mut [f32]) {
    for (blk, o) in src.chunks_exact(Q8_0_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = scale(blk);
        for (v, &q) in o.iter_mut().zip(&blk[2..]) {
            *v = f32::from(q as i8) * d;
        }
    }
}

/// Dequantize q4_0 blocks into `out`.
pub(crate) fn dequantize_q4_0(src: &[u8], out: &mut [f32]) {
    for (blk, o) in src.chunks_exact(Q4_0_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = scale(blk);
        let (lo, hi) = o.split_at_mut(QK / 2);
        for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(&blk[2..]) {
            *l = f32::from((q & 0x0f) as i8 - 8) * d;
            *h = f32::from((q >> 4) as i8 - 8) * d;
        }
    }
}

/// Quantize `x` (a multiple of 32 long) to q8_0 like ggml's reference: `d = max|x| / 127`,
/// `q = round(x / d)` with ties away from zero.
pub(crate) fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    for (xb, blk) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        blk[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        for (q, &v) in blk[2..].iter_mut().zip(xb) {
            *q = (v * id).round() as i8 as u8;
        }
    }
}

/// Quantize `x` to q4_0 like ggml's reference: `d = m / −8` where `m` is the element of
/// largest magnitude (sign kept), `q = min(15, trunc(x / d + 8.5))`.
pub(crate) fn quantize_q4_0(x: &[f32], out: &mut [u8]) {
    for (xb, blk) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q4_0_BYTES)) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        blk[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        for j in 0..QK / 2 {
            let q0 = ((xb[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((xb[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
            blk[2 + j] = q0 | (q1 << 4);
        }
    }
}

/// Σ over blocks of `d_a · d_b · Σ q_a · q_b` for a q4_0 row and a q8_0 row.
pub(crate) fn dot_q4_0_q8_0(a: &[u8], b: &[u8]) -> f32 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if x86::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked just above), the only requirement
        // of the target-feature function.
        return unsafe { x86::dot_q4_0_q8_0(a, b) };
    }
    dot_q4_0_q8_0_body(a, b)
}

#[inline(always)]
fn dot_q4_0_q8_0_body(a: &[u8], b: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in a.chunks_exact(Q4_0_BYTES).zip(b.chunks_exact(Q8_0_BYTES)) {
        let mut qx = [0i8; QK];
        for j in 0..QK / 2 {
            qx[j] = (x[2 + j] & 0x0f) as i8 - 8;
            qx[j + QK / 2] = (x[2 + j] >> 4) as i8 - 8;
        }
        let mut s = 0i32;
        for (&p, &q) in qx.iter().zip(&y[2..2 + QK]) {
            s += i32::from(i16::from(p) * i16::from(q as i8));
        }
        sum += s as f32 * (scale(x) * scale(y));
    }
    sum
}

/// Σ over blocks of `d_a · d_b · Σ q_a · q_b` for two q8_0 rows.
pub(crate) fn dot_q8_0_q8_0(a: &[u8], b: &[u8]) -> f32 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if x86::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked just above).
        return unsafe { x86::dot_q8_0_q8_0(a, b) };
    }
    dot_q8_0_q8_0_body(a, b)
}

#[inline(always)]
fn dot_q8_0_q8_0_body(a: &[u8], b: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in a.chunks_exact(Q8_0_BYTES).zip(b.chunks_exact(Q8_0_BYTES)) {
        let mut s = 0i32;
        for (&p, &q) in x[2..].iter().zip(&y[2..]) {
            s += i32::from(i16::from(p as i8) * i16::from(q as i8));
        }
        sum += s as f32 * (scale(x) * scale(y));
    }
    sum
}

/// f32 dot product (products summed in 32 independent lanes, then reduced).
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        return unsafe { x86::dot_f32(a, b) };
    }
    dot_f32_body::<false>(a, b)
}

#[inline(always)]
fn dot_f32_body<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 32;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; L];
    let ca = a.chunks_exact(L);
    let cb = b.chunks_exact(L);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..L {
            acc[k] = if FMA {
                x[k].mul_add(y[k], acc[k])
            } else {
                acc[k] + x[k] * y[k]
            };
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    let mut s = 0.0f32;
    for v in acc {
        s += v;
    }
    s + tail
}

/// The same bodies compiled for AVX2 (+FMA), chosen at run time: the crate is built for the
/// baseline x86-64 target, where the compiler may only use SSE2.
///
/// The quantized dots are written with intrinsics (ggml's scheme: widen the nibbles to
/// bytes, multiply signed bytes pairwise with `maddubs` after moving the sign to the other
/// operand, add pairs to i32 lanes, scale by the two f16 block scales in f32).
#[cfg(all(target_arch = "x86_64", not(miri)))]
mod x86 {
    use std::arch::x86_64::*;

    pub(super) fn has_avx2_fma_f16c() -> bool {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        super::dot_f32_body::<true>(a, b)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn h2f(lo: u8, hi: u8) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
            u16::from_le_bytes([lo, hi]),
        ))))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        _mm_cvtss_f32(s)
    }

    /// Σ qx·qy over 32 signed bytes as 8 f32 lanes.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn mul_sum_i8(qx: __m256i, qy: __m256i) -> __m256 {
        let ax = _mm256_sign_epi8(qx, qx);
        let sy = _mm256_sign_epi8(qy, qx);
        let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
        _mm256_cvtepi32_ps(dot)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn dot_q4_0_q8_0(a: &[u8], b: &[u8]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let m4 = _mm_set1_epi8(0x0f);
        let eight = _mm256_set1_epi8(8);
        for (x, y) in a
            .chunks_exact(super::Q4_0_BYTES)
            .zip(b.chunks_exact(super::Q8_0_BYTES))
        {
            let d = h2f(x[0], x[1]) * h2f(y[0], y[1]);
            // SAFETY: `x` is an 18-byte block, so the 16 bytes from offset 2 are inside it;
            // `y` is a 34-byte block, so the 32 bytes from offset 2 are inside it. The loads
            // are unaligned loads.
            let (qx, qy) = unsafe {
                (
                    _mm_loadu_si128(x.as_ptr().add(2).cast()),
                    _mm256_loadu_si256(y.as_ptr().add(2).cast()),
                )
            };
            let lo = _mm_and_si128(qx, m4);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(qx), m4);
            let qx = _mm256_sub_epi8(_mm256_set_m128i(hi, lo), eight);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), mul_sum_i8(qx, qy), acc);
        }
        hsum(acc)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn dot_q8_0_q8_0(a: &[u8], b: &[u8]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for (x, y) in a
            .chunks_exact(super::Q8_0_BYTES)
            .zip(b.chunks_exact(super::Q8_0_BYTES))
        {
            let d = h2f(x[0], x[1]) * h2f(y[0], y[1]);
            // SAFETY: both are 34-byte blocks: the 32 bytes from offset 2 are inside them.
            let (qx, qy) = unsafe {
                (
                    _mm256_loadu_si256(x.as_ptr().add(2).cast()),
                    _mm256_loadu_si256(y.as_ptr().add(2).cast()),
                )
            };
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), mul_sum_i8(qx, qy), acc);
        }
        hsum(acc)
    }
}
