//! Choosing the next token from the logits.
//!
//! Greedy decoding is llama.cpp's `llama_sampler_greedy`: ids are scanned in ascending order
//! and a strictly larger logit replaces the best, so the lowest id wins an exact tie — the
//! rule the agreement tests with llama.cpp depend on. Sampling with a temperature keeps the
//! `top_k` largest logits, divides by the temperature, keeps the smallest set whose
//! probability reaches `top_p`, and draws with a seeded generator (splitmix64), so a seed
//! gives the same tokens on every run and machine.

/// How to pick tokens.
///
/// ```
/// use llm::{Sampler, Sampling};
/// let mut greedy = Sampler::new(Sampling::Greedy);
/// assert_eq!(greedy.sample(&[0.5, 2.0, 2.0, -1.0]), 1); // the lowest id wins the tie
/// let mut s = Sampler::new(Sampling::Random { temp: 0.8, top_k: 40, top_p: 0.95, seed: 7 });
/// let t = s.sample(&[0.5, 2.0, 2.0, -1.0]);
/// assert!(t < 4);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampling {
    /// The largest logit, lowest id on ties.
    Greedy,
    /// Top-k, temperature, top-p, then a seeded draw.
    Random {
        /// Temperature (> 0; ≤ 0 means greedy).
        temp: f32,
        /// Keep this many best logits (0: all).
        top_k: usize,
        /// Keep the smallest set of tokens whose probability reaches this (1: all).
        top_p: f32,
        /// Seed of the generator.
        seed: u64,
    },
}

/// A token picker with its own scratch memory and random state.
#[derive(Clone, Debug)]
pub struct Sampler {
    how: Sampling,
    state: u64,
    cand: Vec<(f32, u32)>,
}

impl Sampler {
    /// A sampler for `how`.
    pub fn new(how: Sampling) -> Self {
        let state = match how {
            Sampling::Random { seed, .. } => seed,
            Sampling::Greedy => 0,
        };
        Sampler {
            how,
            state,
            cand: Vec::new(),
        }
    }

    /// The next token given one position's logits (`logits` non-empty). NaN logits never
    /// win.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        match self.how {
            Sampling::Random {
                temp, top_k, top_p, ..
            } if temp > 0.0 => self.sample_random(logits, temp, top_k, top_p),
            _ => greedy(logits),
        }
    }

    fn next_f32(&mut self) -> f32 {
        // splitmix64
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32
    }

    fn sample_random(&mut self, logits: &[f32], temp: f32, top_k: usize, top_p: f32) -> u32 {
        self.cand.clear();
        self.cand.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.is_nan())
                .map(|(i, &l)| (l, i as u32)),
        );
        if self.cand.is_empty() {
            return 0;
        }
        // Largest logit first, lowest id first on ties.
        let order = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        let k = if top_k == 0 {
            self.cand.len()
        } else {
            top_k.min(self.cand.len())
        };
        if k < self.cand.len() {
            self.cand.select_nth_unstable_by(k - 1, order);
            self.cand.truncate(k);
        }
        self.cand.sort_unstable_by(order);
        let max = self.cand[0].0 / temp;
        let mut sum = 0.0f64;
        for c in &mut self.cand {
            c.0 = (c.0 / temp - max).exp();
            sum += f64::from(c.0);
        }
        // Top-p: the smallest prefix whose mass reaches top_p.
        let mut keep = self.cand.len();
        if top_p < 1.0 {
            let mut acc = 0.0f64;
            for (i, c) in self.cand.iter().enumerate() {
                acc += f64::from(c.0) / sum;
                if acc >= f64::from(top_p) {
                    keep = i + 1;
                    break;
                }
            }
        }
        let mass: f64 = self.cand[..keep].iter().map(|c| f64::from(c.0)).sum();
        let mut r = f64::from(self.next_f32()) * mass;
        for c in &self.cand[..keep] {
            r -= f64::from(c.0);
            if r < 0.0 {
                return c.1;
            }
        }
        self.cand[keep - 1].1
    }
}

/// The id of the largest logit, the lowest id on exact ties; NaN never wins.
pub fn greedy(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_lowest_id_on_ties_and_skips_nan() {
        assert_eq!(greedy(&[1.0, 3.0, 3.0]), 1);
        assert_eq!(greedy(&[f32::NAN, 0.5, 0.2]), 1);
        assert_eq!(greedy(&[-1.0]), 0);
    }

    #[test]
    fn seeded_sampling_repeats_and_respects_top_k() {
        let logits: Vec<f32> = (0..100).map(|i| (i % 17) as f32 * 0.3).collect();
        let how = Sampling::Random {
            temp: 1.0,
            top_k: 3,
            top_p: 1.0,
            seed: 42,
        };
        let (mut a, mut b) = (Sampler::new(how), Sampler::new(how));
        let ta: Vec<u32> = (0..50).map(|_| a.sample(&logits)).collect();
        let tb: Vec<u32> = (0..50).map(|_| b.sample(&logits)).collect();
        assert_eq!(ta, tb);
        // The three best are ids 16, 33 and 50 (logit 4.8, lowest ids first).
        assert!(ta.iter().all(|t| [16, 33, 50].contains(t)), "{ta:?}");
        assert!(ta.iter().any(|&t| t != ta[0]), "a draw, not a constant");
    }

    #[test]
    fn tiny_top_p_is_greedy() {
        let how = Sampling::Random {
            temp: 0.7,
            top_k: 0,
            top_p: 1e-6,
            seed: 1,
        };
        let mut s = Sampler::new(how);
        for _ in 0..20 {
            assert_eq!(s.sample(&[0.1, 0.9, 0.3]), 1);
        }
    }
}
