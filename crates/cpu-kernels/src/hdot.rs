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
    rows_portable(order, rows, col)
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
}
