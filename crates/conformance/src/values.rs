//! Reading tensors as numbers, generating inputs, and the error measure.

use backend_core::{BackendError, tensor_get, tensor_set};
use graph::{Context, ElementType, TensorId};

/// A small deterministic generator (xorshift64*): the same seed gives the same inputs on
/// every machine, so a failure reproduces.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `[lo, hi)`.
    pub(crate) fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
}

/// Every element of `t` (any strides) as f64, in logical order (dimension 0 fastest).
/// `None` for types without a per-element value here (block types).
pub(crate) fn read_values(ctx: &Context, t: TensorId) -> Result<Option<Vec<f64>>, BackendError> {
    let tensor = ctx.get(t)?;
    let ty = tensor.ty();
    if !matches!(
        ty,
        ElementType::F32 | ElementType::F16 | ElementType::BF16 | ElementType::I32
    ) {
        return Ok(None);
    }
    let mut raw = vec![0u8; tensor.nbytes()];
    tensor_get(ctx, t, 0, &mut raw)?;
    let (ne, nb) = (tensor.ne(), tensor.nb());
    let mut out = Vec::with_capacity(tensor.nelements().max(0) as usize);
    for i3 in 0..ne[3] as usize {
        for i2 in 0..ne[2] as usize {
            for i1 in 0..ne[1] as usize {
                for i0 in 0..ne[0] as usize {
                    let o = i0 * nb[0] + i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
                    out.push(decode(ty, &raw[o..]));
                }
            }
        }
    }
    Ok(Some(out))
}

fn decode(ty: ElementType, b: &[u8]) -> f64 {
    match ty {
        ElementType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        ElementType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
        ElementType::BF16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        ElementType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        _ => f64::NAN,
    }
}

/// Write `values` (logical order) into contiguous tensor `t` converted to its type.
pub(crate) fn write_values(ctx: &Context, t: TensorId, values: &[f32]) -> Result<(), BackendError> {
    let ty = ctx.get(t)?.ty();
    let bytes: Vec<u8> = match ty {
        ElementType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ElementType::F16 => values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        ElementType::BF16 => values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        ElementType::I32 => values
            .iter()
            .flat_map(|v| (*v as i32).to_le_bytes())
            .collect(),
        other => {
            return Err(BackendError::failed(
                "conformance",
                format!("no input generator for {other:?}"),
            ));
        }
    };
    tensor_set(ctx, t, 0, &bytes)
}

/// How `b` differs from the reference `a`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Mismatch {
    /// Element `i` is NaN on one side only, or infinite with different values.
    NonFinite { i: usize, a: f64, b: f64 },
    /// The lengths differ.
    Length(usize, usize),
}

/// Normalised mean squared error of `b` against `a` over the finite elements:
/// Σ(a−b)² / Σa² (plain Σ(a−b)² when a is all zeros). NaN and infinities must match exactly.
pub(crate) fn nmse(a: &[f64], b: &[f64]) -> Result<f64, Mismatch> {
    if a.len() != b.len() {
        return Err(Mismatch::Length(a.len(), b.len()));
    }
    let (mut err, mut norm) = (0.0f64, 0.0f64);
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        if x.is_nan() || y.is_nan() {
            if x.is_nan() && y.is_nan() {
                continue;
            }
            return Err(Mismatch::NonFinite { i, a: x, b: y });
        }
        if x.is_infinite() || y.is_infinite() {
            if x == y {
                continue;
            }
            return Err(Mismatch::NonFinite { i, a: x, b: y });
        }
        err += (x - y) * (x - y);
        norm += x * x;
    }
    Ok(if norm > 0.0 { err / norm } else { err })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nmse_by_hand() {
        // a = [1, 2], b = [1, 3]: Σ(a−b)² = 1, Σa² = 5.
        assert_eq!(nmse(&[1.0, 2.0], &[1.0, 3.0]), Ok(0.2));
        assert_eq!(nmse(&[0.0, 0.0], &[0.0, 0.5]), Ok(0.25));
        assert_eq!(nmse(&[f64::NAN, 1.0], &[f64::NAN, 1.0]), Ok(0.0));
        assert!(matches!(
            nmse(&[f64::NAN], &[1.0]),
            Err(Mismatch::NonFinite { i: 0, .. })
        ));
        assert!(matches!(
            nmse(&[1.0], &[f64::INFINITY]),
            Err(Mismatch::NonFinite { .. })
        ));
        assert_eq!(nmse(&[f64::INFINITY], &[f64::INFINITY]), Ok(0.0));
        assert!(matches!(nmse(&[1.0], &[]), Err(Mismatch::Length(1, 0))));
    }

    #[test]
    fn rng_is_deterministic_and_in_range() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..1000 {
            let x = a.uniform(-1.0, 1.0);
            assert_eq!(x, b.uniform(-1.0, 1.0));
            assert!((-1.0..1.0).contains(&x));
        }
    }
}
