//! Test support: a small synthetic llama model (random F32 weights) served as a
//! [`llm::ModelFile`], and a naive reference forward pass written from the spec's
//! description of the graph (not from the crate's code).

#![allow(dead_code, clippy::print_stderr)]

pub mod golden;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use backend_core::HostMemory;
use graph::ElementType;
use llm::{Hparams, Metadata, ModelFile, TensorEntry};

/// Metadata values of the synthetic model.
#[derive(Clone, Debug)]
pub enum Meta {
    Str(String),
    Uint(u64),
    Float(f32),
}

struct Bytes(Arc<Vec<u8>>);

impl AsRef<[u8]> for Bytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// A model file held in memory.
#[derive(Clone)]
pub struct Synthetic {
    pub hp: Hparams,
    pub meta: HashMap<String, Meta>,
    pub tensors: BTreeMap<String, TensorEntry>,
    pub data: Arc<Vec<u8>>,
    /// F32 values of every tensor, by name (for the reference).
    pub values: BTreeMap<String, Vec<f32>>,
}

impl Metadata for Synthetic {
    fn string(&self, key: &str) -> Option<&str> {
        match self.meta.get(key)? {
            Meta::Str(s) => Some(s),
            _ => None,
        }
    }
    fn uint(&self, key: &str) -> Option<u64> {
        match self.meta.get(key)? {
            Meta::Uint(v) => Some(*v),
            _ => None,
        }
    }
    fn float(&self, key: &str) -> Option<f32> {
        match self.meta.get(key)? {
            Meta::Float(v) => Some(*v),
            _ => None,
        }
    }
    fn array_len(&self, _key: &str) -> Option<usize> {
        None
    }
}

impl ModelFile for Synthetic {
    fn tensor(&self, name: &str) -> Option<TensorEntry> {
        self.tensors.get(name).cloned()
    }
    fn data(&self) -> &[u8] {
        &self.data
    }
    fn host_memory(&self) -> HostMemory {
        HostMemory::read_only(Bytes(Arc::clone(&self.data)))
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}

impl Synthetic {
    /// 2 blocks, width 64, 4 query heads of 16 over 2 KV heads, 50 tokens, tied output.
    /// (Heads of 16 and caches of a multiple of 4 cells take the CPU kernels' several-column
    /// order for the f16 attention products, as SmolLM2's prompts do.)
    pub fn tiny(seed: u64) -> Self {
        let hp = Hparams {
            n_layer: 2,
            n_embd: 64,
            n_head: 4,
            n_head_kv: 2,
            n_ff: 96,
            n_vocab: 50,
            n_ctx_train: 128,
            n_rot: 16,
            rope_freq_base: 10_000.0,
            rope_freq_scale: 1.0,
            rms_eps: 1e-5,
        };
        let meta = HashMap::from([
            ("general.architecture".to_owned(), Meta::Str("llama".into())),
            ("llama.block_count".to_owned(), Meta::Uint(2)),
            ("llama.context_length".to_owned(), Meta::Uint(128)),
            ("llama.embedding_length".to_owned(), Meta::Uint(64)),
            ("llama.feed_forward_length".to_owned(), Meta::Uint(96)),
            ("llama.attention.head_count".to_owned(), Meta::Uint(4)),
            ("llama.attention.head_count_kv".to_owned(), Meta::Uint(2)),
            ("llama.rope.freq_base".to_owned(), Meta::Float(10_000.0)),
            (
                "llama.attention.layer_norm_rms_epsilon".to_owned(),
                Meta::Float(1e-5),
            ),
            ("llama.rope.dimension_count".to_owned(), Meta::Uint(16)),
            ("llama.vocab_size".to_owned(), Meta::Uint(50)),
        ]);
        let (e, kv, ff, nv) = (64i64, 32i64, 96i64, 50i64);
        let mut shapes: Vec<(String, Vec<i64>, f32)> =
            vec![("token_embd.weight".into(), vec![e, nv], 2.0)];
        for l in 0..2 {
            let p = |n: &str| format!("blk.{l}.{n}.weight");
            shapes.push((p("attn_norm"), vec![e], -1.0));
            shapes.push((p("attn_q"), vec![e, e], 0.6));
            shapes.push((p("attn_k"), vec![e, kv], 0.6));
            shapes.push((p("attn_v"), vec![e, kv], 0.6));
            shapes.push((p("attn_output"), vec![e, e], 0.3));
            shapes.push((p("ffn_norm"), vec![e], -1.0));
            shapes.push((p("ffn_gate"), vec![e, ff], 0.5));
            shapes.push((p("ffn_up"), vec![e, ff], 0.5));
            shapes.push((p("ffn_down"), vec![ff, e], 0.3));
        }
        shapes.push(("output_norm.weight".into(), vec![e], -1.0));
        let mut rng = Rng(seed);
        let mut data = Vec::new();
        let mut tensors = BTreeMap::new();
        let mut values = BTreeMap::new();
        for (name, ne, scale) in shapes {
            let n: i64 = ne.iter().product();
            // Norm scales (scale < 0) around 1, matrices around 0.
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    if scale < 0.0 {
                        1.0 + 0.4 * rng.next()
                    } else {
                        scale * rng.next()
                    }
                })
                .collect();
            let mut ne4 = [1i64; 4];
            ne4[..ne.len()].copy_from_slice(&ne);
            let offset = data.len();
            data.extend(v.iter().flat_map(|x| x.to_le_bytes()));
            tensors.insert(
                name.clone(),
                TensorEntry {
                    ty: ElementType::F32,
                    ne: ne4,
                    offset,
                    size: n as usize * 4,
                },
            );
            values.insert(name, v);
            while data.len() % 32 != 0 {
                data.push(0);
            }
        }
        Synthetic {
            hp,
            meta,
            tensors,
            data: Arc::new(data),
            values,
        }
    }

    fn w(&self, name: &str) -> &[f32] {
        &self.values[name]
    }

    /// Logits after the last of `tokens`, computed naively from the spec: full causal
    /// attention over every earlier position, K and V rounded to F16.
    pub fn reference_logits(&self, tokens: &[u32]) -> Vec<f32> {
        let hp = &self.hp;
        let (e, hd, nh, nkv) = (hp.n_embd, hp.head_dim(), hp.n_head, hp.n_head_kv);
        let ekv = hd * nkv;
        // out[r] = dot(row r of W (length in), x)
        let matvec = |w: &[f32], x: &[f32], out_n: usize| -> Vec<f32> {
            let n_in = x.len();
            (0..out_n)
                .map(|r| (0..n_in).map(|i| w[r * n_in + i] * x[i]).sum())
                .collect()
        };
        let rms = |x: &[f32], w: &[f32]| -> Vec<f32> {
            let mean = x.iter().map(|v| f64::from(v * v)).sum::<f64>() / x.len() as f64;
            let s = 1.0 / ((mean as f32) + hp.rms_eps).sqrt();
            x.iter().zip(w).map(|(v, g)| v * s * g).collect()
        };
        let rope = |v: &mut [f32], pos: usize, heads: usize| {
            for h in 0..heads {
                for i in 0..hp.n_rot / 2 {
                    let theta =
                        pos as f32 * hp.rope_freq_base.powf(-2.0 * i as f32 / hp.n_rot as f32);
                    let (s, c) = theta.sin_cos();
                    let (a, b) = (v[h * hd + 2 * i], v[h * hd + 2 * i + 1]);
                    v[h * hd + 2 * i] = a * c - b * s;
                    v[h * hd + 2 * i + 1] = a * s + b * c;
                }
            }
        };
        let f16 = |x: f32| half::f16::from_f32(x).to_f32();
        let emb = self.w("token_embd.weight");
        let mut xs: Vec<Vec<f32>> = tokens
            .iter()
            .map(|&t| emb[t as usize * e..(t as usize + 1) * e].to_vec())
            .collect();
        for l in 0..hp.n_layer {
            let p = |n: &str| format!("blk.{l}.{n}.weight");
            let mut ks = Vec::new();
            let mut vs = Vec::new();
            let mut qs = Vec::new();
            for (pos, x) in xs.iter().enumerate() {
                let h = rms(x, self.w(&p("attn_norm")));
                let mut q = matvec(self.w(&p("attn_q")), &h, e);
                let mut k = matvec(self.w(&p("attn_k")), &h, ekv);
                let v = matvec(self.w(&p("attn_v")), &h, ekv);
                rope(&mut q, pos, nh);
                rope(&mut k, pos, nkv);
                ks.push(k.into_iter().map(f16).collect::<Vec<_>>());
                vs.push(v.into_iter().map(f16).collect::<Vec<_>>());
                qs.push(q);
            }
            let mut out = Vec::new();
            for (pos, x) in xs.iter().enumerate() {
                let mut attn = vec![0f32; e];
                for h in 0..nh {
                    let g = h / (nh / nkv);
                    let q = &qs[pos][h * hd..(h + 1) * hd];
                    let scores: Vec<f32> = (0..=pos)
                        .map(|j| {
                            let k = &ks[j][g * hd..(g + 1) * hd];
                            q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * hp.attn_scale()
                        })
                        .collect();
                    let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let ex: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
                    let sum: f32 = ex.iter().sum();
                    for (j, p) in ex.iter().enumerate() {
                        for d in 0..hd {
                            attn[h * hd + d] += p / sum * vs[j][g * hd + d];
                        }
                    }
                }
                let o = matvec(self.w(&p("attn_output")), &attn, e);
                let a: Vec<f32> = o.iter().zip(x).map(|(o, x)| o + x).collect();
                let f = rms(&a, self.w(&p("ffn_norm")));
                let g = matvec(self.w(&p("ffn_gate")), &f, hp.n_ff);
                let u = matvec(self.w(&p("ffn_up")), &f, hp.n_ff);
                let s: Vec<f32> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                let d = matvec(self.w(&p("ffn_down")), &s, e);
                out.push(d.iter().zip(&a).map(|(d, a)| d + a).collect());
            }
            xs = out;
        }
        let hn = rms(xs.last().unwrap(), self.w("output_norm.weight"));
        matvec(emb, &hn, hp.n_vocab)
    }
}

impl Synthetic {
    /// The same model with every matrix but the token embeddings stored as `ty` (q4_0, q4_1
    /// or q8_0, quantized here from the F32 values by the formats' definitions; `values` keep
    /// the F32 originals, so the naive reference no longer applies).
    pub fn quantized(&self, ty: ElementType) -> Self {
        let mut data = Vec::new();
        let mut tensors = BTreeMap::new();
        for (name, t) in &self.tensors {
            let v = &self.values[name];
            let matrix = t.ne[1] > 1 && name != "token_embd.weight";
            let (ty, bytes) = if matrix {
                (ty, quantize(ty, v))
            } else {
                (t.ty, v.iter().flat_map(|x| x.to_le_bytes()).collect())
            };
            let offset = data.len();
            let size = bytes.len();
            data.extend(bytes);
            while data.len() % 32 != 0 {
                data.push(0);
            }
            tensors.insert(
                name.clone(),
                TensorEntry {
                    ty,
                    ne: t.ne,
                    offset,
                    size,
                },
            );
        }
        Synthetic {
            tensors,
            data: Arc::new(data),
            ..self.clone()
        }
    }
}

/// `v` in blocks of 32 as `ty`: q4_0 (f16 scale `d = max / -8` of the value largest in
/// magnitude, nibbles `x / d + 8`), q4_1 (f16 `d = (max - min) / 15` and min, nibbles
/// `(x - min) / d`), q8_0 (f16 `d = amax / 127`, bytes `x / d`).
fn quantize(ty: ElementType, v: &[f32]) -> Vec<u8> {
    let h = |x: f32| half::f16::from_f32(x).to_le_bytes();
    let mut out = Vec::new();
    for b in v.chunks(32) {
        match ty {
            ElementType::Q4_0 => {
                let m = b
                    .iter()
                    .copied()
                    .fold(0f32, |m, x| if x.abs() > m.abs() { x } else { m });
                let d = m / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(h(d));
                let q = |x: f32| ((x * id + 8.5) as i32).clamp(0, 15) as u8;
                out.extend((0..16).map(|j| q(b[j]) | q(b[j + 16]) << 4));
            }
            ElementType::Q4_1 => {
                let lo = b.iter().copied().fold(f32::INFINITY, f32::min);
                let hi = b.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (hi - lo) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(h(d));
                out.extend(h(lo));
                let q = |x: f32| (((x - lo) * id + 0.5) as i32).clamp(0, 15) as u8;
                out.extend((0..16).map(|j| q(b[j]) | q(b[j + 16]) << 4));
            }
            ElementType::Q8_0 => {
                let amax = b.iter().fold(0f32, |m, x| m.max(x.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(h(d));
                out.extend(b.iter().map(|&x| (x * id).round() as i8 as u8));
            }
            other => panic!("quantize: {other:?} is not a block type this helper writes"),
        }
    }
    out
}

/// The largest absolute difference.
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
