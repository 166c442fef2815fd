//! Products with f16 weights in ggml's summation orders (the attention's `K·Q` and `V·P`
//! over an f16 KV cache).
//!
//! ggml converts `src1` to f16 first (its `vec_dot_type` for f16 weights; the executor
//! rounds the column), so every product of two f16 values is exact in f32 and only the
//! order of the additions is left. Its AVX-512 build (the build llama.cpp's reference
//! outputs were made with) uses two orders:
//!
//! * **one column** (`ggml_vec_dot_f16`): four accumulators of 16 lanes over steps of 64
//!   elements (FMA), reduced as `(a0 + a2) + (a1 + a3)` lane by lane and then across the
//!   lanes in `_mm512_reduce_add_ps`'s order; elements past the last step of 64 are added
//!   one by one in f64.
//! * **two or more columns** (llamafile's `tinyBLAS`, taken when the length is a multiple
//!   of 16 and the row count of 4): one accumulator of 16 lanes over steps of 16, reduced the
//!   same way. Other shapes fall back to the one-column order.
//!
//! The functions here are portable code (`f32::mul_add` fuses at every level), compiled for
//! AVX2/FMA at run time where available so they vectorise; every level gives the same bits.
//!
//! Indexing: [`dot_rows`] asserts the row and column lengths once; the loops below index
//! `chunks_exact` pieces and the fixed-size accumulators with constant bounds.

use crate::gexp::reduce16;

/// Which of ggml's orders a product takes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    /// `ggml_vec_dot_f16` (one column).
    VecDot,
    /// llamafile's tinyBLAS (several columns).
    Tiny,
}

impl Order {
    /// The order ggml uses for a product of `m` weight rows of length `k` with `n` columns.
    pub(crate) fn for_shape(k: usize, m: usize, n: usize) -> Order {
        if n >= 2 && k.is_multiple_of(16) && m.is_multiple_of(4) {
            Order::Tiny
        } else {
            Order::VecDot
        }
    }
}

#[inline(always)]
fn vec_dot(row: &[f32], col: &[f32]) -> f32 {
    let k = col.len();
    let np = k / 64 * 64;
    let mut acc = [[0.0f32; 16]; 4];
    for (r, c) in row[..np].chunks_exact(64).zip(col[..np].chunks_exact(64)) {
        for (j, a) in acc.iter_mut().enumerate() {
            for l in 0..16 {
                a[l] = r[16 * j + l].mul_add(c[16 * j + l], a[l]);
            }
        }
    }
    let mut x = [0.0f32; 16];
    for l in 0..16 {
        x[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let mut sum = f64::from(reduce16(&x));
    for (&a, &b) in row[np..k].iter().zip(&col[np..]) {
        sum += f64::from(a * b);
    }
    sum as f32
}

#[inline(always)]
fn tiny(row: &[f32], col: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    for (r, c) in row.chunks_exact(16).zip(col.chunks_exact(16)) {
        for l in 0..16 {
            acc[l] = r[l].mul_add(c[l], acc[l]);
        }
    }
    reduce16(&acc)
}

#[inline(always)]
fn rows_portable<const R: usize>(order: Order, rows: [&[f32]; R], col: &[f32]) -> [f32; R] {
    let k = col.len();
    // Plain loops rather than `rows.map(..)`: a closure is a function of its own that need
    // not be inlined, and outside `rows_fma`'s target features `mul_add` becomes a call to
    // the library's `fmaf` per element (same bits, some fifty times slower).
    let mut out = [0.0f32; R];
    for i in 0..R {
        let r = &rows[i][..k];
        out[i] = match order {
            Order::VecDot => vec_dot(r, col),
            Order::Tiny => tiny(r, col),
        };
    }
    out
}

/// `out[r] = rows[r] · col` in `order` (each row at least `col.len()` long; for
/// [`Order::Tiny`] the length a multiple of 16).
pub(crate) fn dot_rows<const R: usize>(order: Order, rows: [&[f32]; R], col: &[f32]) -> [f32; R] {
    assert!(
        rows.iter().all(|r| r.len() >= col.len())
            && (order == Order::VecDot || col.len().is_multiple_of(16)),
        "hdot::dot_rows: short row or bad length (a kernel bug)"
    );
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        return unsafe { rows_fma(order, rows, col) };
    }
    rows_portable(order, rows, col)
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx2,fma")]
fn rows_fma<const R: usize>(order: Order, rows: [&[f32]; R], col: &[f32]) -> [f32; R] {
    if order == Order::Tiny {
        return rows_portable(order, rows, col);
    }
    // The one-column order with explicit 256-bit vectors (left to itself the compiler used
    // 128-bit ones and spilled the accumulators): the same lane-wise fused operations.
    use std::arch::x86_64::*;
    let k = col.len();
    let np = k / 64 * 64;
    let mut out = [0.0f32; R];
    for (o, row) in out.iter_mut().zip(rows) {
        let row = &row[..k];
        let mut acc = [_mm256_setzero_ps(); 8];
        for (r, c) in row[..np].chunks_exact(64).zip(col[..np].chunks_exact(64)) {
            for (h, a) in acc.iter_mut().enumerate() {
                // SAFETY: `r` and `c` hold 64 floats and `8 · h + 8 <= 64`.
                let (x, y) = unsafe {
                    (
                        _mm256_loadu_ps(r.as_ptr().add(8 * h)),
                        _mm256_loadu_ps(c.as_ptr().add(8 * h)),
                    )
                };
                *a = _mm256_fmadd_ps(x, y, *a);
            }
        }
        // Accumulator j of the portable code is acc[2j] (lanes 0..8) and acc[2j + 1].
        let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
        let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
        let mut x = [0.0f32; 16];
        // SAFETY: `x` holds sixteen floats.
        unsafe {
            _mm256_storeu_ps(x.as_mut_ptr(), lo);
            _mm256_storeu_ps(x.as_mut_ptr().add(8), hi);
        }
        let mut sum = f64::from(reduce16(&x));
        for (&a, &b) in row[np..].iter().zip(&col[np..]) {
            sum += f64::from(a * b);
        }
        *o = sum as f32;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_are_as_described_and_levels_agree() {
        // Values whose sums round differently in different orders.
        let k = 80;
        let row: Vec<f32> = (0..k).map(|i| 1.0 + (i as f32) * 1e-3).collect();
        let col: Vec<f32> = (0..k)
            .map(|i| if i % 7 == 0 { 1e4 } else { 1e-3 * i as f32 })
            .collect();
        // One column: lane sums over the one full step of 64, then the tail in f64.
        let mut lanes = [[0.0f32; 16]; 4];
        for i in 0..64 {
            lanes[i / 16][i % 16] = row[i] * col[i];
        }
        let x: [f32; 16] =
            std::array::from_fn(|l| (lanes[0][l] + lanes[2][l]) + (lanes[1][l] + lanes[3][l]));
        let mut want = f64::from(reduce16(&x));
        for i in 64..k {
            want += f64::from(row[i] * col[i]);
        }
        let [got] = dot_rows(Order::VecDot, [&row[..]], &col);
        assert_eq!(got, want as f32);
        assert_eq!(rows_portable(Order::VecDot, [&row[..]], &col), [got]);
        // Several columns: one 16-lane accumulator over steps of 16.
        let mut acc = [0.0f32; 16];
        for i in 0..k {
            acc[i % 16] = row[i].mul_add(col[i], acc[i % 16]);
        }
        let [got] = dot_rows(Order::Tiny, [&row[..]], &col);
        assert_eq!(got, reduce16(&acc));
        assert_eq!(rows_portable(Order::Tiny, [&row[..]], &col), [got]);
        assert_eq!(Order::for_shape(64, 256, 1), Order::VecDot);
        assert_eq!(Order::for_shape(64, 256, 2), Order::Tiny);
        assert_eq!(Order::for_shape(40, 256, 2), Order::VecDot);
        assert_eq!(Order::for_shape(64, 6, 2), Order::VecDot);
    }

    #[test]
    fn vector_kernel_matches_portable_on_the_attention_shapes() {
        // Values spread over magnitudes (f16-representable) so the order of additions shows.
        let val = |i: usize| {
            let x = (i.wrapping_mul(2654435761) % 2001) as f32 - 1000.0;
            half::f16::from_f32(x * if i.is_multiple_of(5) { 3.0 } else { 1e-3 }).to_f32()
        };
        for k in [64, 100, 256, 512] {
            let rows: Vec<Vec<f32>> = (0..8)
                .map(|r| (0..k).map(|i| val(i * 8 + r)).collect())
                .collect();
            let col: Vec<f32> = (0..k).map(|i| val(i + 7777)).collect();
            let rws: [&[f32]; 8] = std::array::from_fn(|r| &rows[r][..]);
            for order in [Order::VecDot, Order::Tiny] {
                if order == Order::Tiny && !k.is_multiple_of(16) {
                    continue;
                }
                let got = dot_rows(order, rws, &col);
                let want = rows_portable(order, rws, &col);
                assert_eq!(
                    got.map(f32::to_bits),
                    want.map(f32::to_bits),
                    "k {k}, {order:?}"
                );
            }
        }
    }
}
