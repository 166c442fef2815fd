//! The BERT encoder as a compute graph, with mean pooling.
//!
//! Layout (ggml order, innermost first): hidden states are `[hidden, n_tokens * n_batch]`, so
//! every projection is one `mul_mat` over all tokens of all sentences. Attention reshapes to
//! heads, `[head_dim, n_tokens, n_heads, n_batch]`, and computes `kq = mul_mat(k, q)` per head
//! and sentence by broadcasting over dimensions 2 and 3. Padding is handled by the soft-max
//! mask (`-inf` on padded keys, shared by all heads) and by the pooling weights (`1/len` on
//! real tokens, 0 on padding), so a sentence's embedding does not depend on its batch.
//!
//! The graph's inputs are host data from [`GraphInputs::new`]; its output is the mean-pooled,
//! not yet normalised, `[hidden, n_batch]` matrix (normalisation is done on the host by
//! [`l2_normalize`]).

use graph::{Context, ElementType, Graph, TensorId};

use crate::config::BertConfig;
use crate::error::Result;
use crate::model::BertWeights;
use crate::tokenize::Batch;

/// Room for the nodes of one forward pass (about 40 per layer).
pub fn graph_capacity(cfg: &BertConfig) -> usize {
    64 + 64 * cfg.num_hidden_layers
}

/// One built forward pass: the graph, its input tensors and its output.
#[derive(Debug)]
pub struct BertGraph {
    /// The forward graph, in ggml build order.
    pub graph: Graph,
    /// Token ids, i32 `[n_tokens * n_batch]`.
    pub ids: TensorId,
    /// Token type ids, i32 `[n_tokens * n_batch]`.
    pub type_ids: TensorId,
    /// Positions `0..n_tokens`, i32 `[n_tokens]`.
    pub positions: TensorId,
    /// Attention mask, f32 `[n_tokens (keys), n_tokens (queries), 1, n_batch]`: 0 or `-inf`.
    pub mask: TensorId,
    /// Pooling weights, f32 `[n_tokens, 1, n_batch]`: `1/len` on real tokens, else 0.
    pub pool: TensorId,
    /// Pooled output, f32 `[hidden, n_batch]`.
    pub output: TensorId,
    /// Padded length.
    pub n_tokens: usize,
    /// Sentences.
    pub n_batch: usize,
}

/// Host data for the inputs of a [`BertGraph`], in the tensors' byte layouts.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphInputs {
    /// For [`BertGraph::ids`].
    pub ids: Vec<i32>,
    /// For [`BertGraph::type_ids`].
    pub type_ids: Vec<i32>,
    /// For [`BertGraph::positions`].
    pub positions: Vec<i32>,
    /// For [`BertGraph::mask`].
    pub mask: Vec<f32>,
    /// For [`BertGraph::pool`].
    pub pool: Vec<f32>,
}

impl GraphInputs {
    /// Derives every input from a tokenised batch.
    ///
    /// ```
    /// let b = minilm::Batch::from_ids(&[vec![101, 7, 102], vec![101, 102]], 0);
    /// let inp = minilm::GraphInputs::new(&b);
    /// assert_eq!(inp.positions, [0, 1, 2]);
    /// // sentence 1, query 0: keys 0 and 1 visible, key 2 is padding
    /// assert_eq!(&inp.mask[9..12], &[0.0, 0.0, f32::NEG_INFINITY]);
    /// assert_eq!(&inp.pool[3..6], &[0.5, 0.5, 0.0]);
    /// ```
    pub fn new(batch: &Batch) -> Self {
        let t = batch.n_tokens;
        let mut mask = Vec::with_capacity(t * t * batch.n_batch());
        let mut pool = Vec::with_capacity(t * batch.n_batch());
        for &len in &batch.lengths {
            for _q in 0..t {
                mask.extend((0..t).map(|k| if k < len { 0.0 } else { f32::NEG_INFINITY }));
            }
            let w = 1.0 / len.max(1) as f32;
            pool.extend((0..t).map(|k| if k < len { w } else { 0.0 }));
        }
        GraphInputs {
            ids: batch.ids.clone(),
            type_ids: batch.type_ids.clone(),
            positions: (0..t as i32).collect(),
            mask,
            pool,
        }
    }
}

fn input(ctx: &mut Context, ty: ElementType, ne: &[i64], name: &str) -> Result<TensorId> {
    let id = ctx.new_tensor(ty, ne)?;
    ctx.set_name(id, name)?;
    ctx.set_input(id)?;
    Ok(id)
}

fn named(ctx: &mut Context, id: TensorId, name: &str) -> Result<TensorId> {
    ctx.set_name(id, name)?;
    Ok(id)
}

/// `norm(x) * w + b` over the innermost dimension.
fn layer_norm(
    ctx: &mut Context,
    x: TensorId,
    w: TensorId,
    b: TensorId,
    eps: f32,
    name: &str,
) -> Result<TensorId> {
    let n = ctx.norm(x, eps)?;
    let n = ctx.mul(n, w)?;
    let n = ctx.add(n, b)?;
    named(ctx, n, name)
}

/// `w · x + b`.
fn linear(
    ctx: &mut Context,
    x: TensorId,
    w: TensorId,
    b: TensorId,
    name: &str,
) -> Result<TensorId> {
    let y = ctx.mul_mat(w, x)?;
    let y = ctx.add(y, b)?;
    named(ctx, y, name)
}

/// Builds the forward pass for `n_batch` sentences padded to `n_tokens` in `ctx` (after the
/// weights). The caller rewinds `ctx` when done with it.
pub fn build_graph(
    ctx: &mut Context,
    w: &BertWeights,
    cfg: &BertConfig,
    n_tokens: usize,
    n_batch: usize,
) -> Result<BertGraph> {
    let h = cfg.hidden_size as i64;
    let nh = cfg.num_attention_heads as i64;
    let d = cfg.head_dim() as i64;
    let t = n_tokens as i64;
    let b = n_batch as i64;
    let eps = cfg.layer_norm_eps as f32;

    let ids = input(ctx, ElementType::I32, &[t * b], "inp_ids")?;
    let type_ids = input(ctx, ElementType::I32, &[t * b], "inp_type_ids")?;
    let positions = input(ctx, ElementType::I32, &[t], "inp_pos")?;
    let mask = input(ctx, ElementType::F32, &[t, t, 1, b], "inp_mask")?;
    let pool = input(ctx, ElementType::F32, &[t, 1, b], "inp_pool")?;

    // Embeddings: word + token type + position, then layer norm.
    let x = ctx.get_rows(w.word_emb, ids)?;
    let ty = ctx.get_rows(w.type_emb, type_ids)?;
    let x = ctx.add(x, ty)?;
    let x = ctx.reshape_3d(x, h, t, b)?;
    let p = ctx.get_rows(w.pos_emb, positions)?;
    let x = ctx.add(x, p)?;
    let x = ctx.reshape_2d(x, h, t * b)?;
    let mut x = layer_norm(ctx, x, w.emb_ln_w, w.emb_ln_b, eps, "emb_out")?;

    let kq_scale = 1.0 / (d as f32).sqrt();
    for (il, l) in w.layers.iter().enumerate() {
        let q = linear(ctx, x, l.q_w, l.q_b, &format!("l{il}.q"))?;
        let k = linear(ctx, x, l.k_w, l.k_b, &format!("l{il}.k"))?;
        let v = linear(ctx, x, l.v_w, l.v_b, &format!("l{il}.v"))?;
        // [d, nh, t, b] -> [d, t, nh, b]
        let q = ctx.reshape_4d(q, d, nh, t, b)?;
        let q = ctx.permute(q, [0, 2, 1, 3])?;
        let k = ctx.reshape_4d(k, d, nh, t, b)?;
        let k = ctx.permute(k, [0, 2, 1, 3])?;
        // v transposed per head: [d, nh, t, b] -> [t, d, nh, b]
        let v = ctx.reshape_4d(v, d, nh, t, b)?;
        let v = ctx.permute(v, [1, 2, 0, 3])?;
        let v = ctx.cont(v)?;
        // scores [t_k, t_q, nh, b], soft-max over keys with the padding mask
        let kq = ctx.mul_mat(k, q)?;
        let kq = named(ctx, kq, &format!("l{il}.kq"))?;
        let kq = ctx.soft_max_ext(kq, Some(mask), kq_scale, 0.0)?;
        let kq = named(ctx, kq, &format!("l{il}.kq_soft_max"))?;
        // [d, t_q, nh, b] -> [d, nh, t_q, b] -> [h, t*b]
        let kqv = ctx.mul_mat(v, kq)?;
        let kqv = named(ctx, kqv, &format!("l{il}.kqv"))?;
        let kqv = ctx.permute(kqv, [0, 2, 1, 3])?;
        let merged = ctx.cont_shape(kqv, &[h, t * b])?;
        let merged = named(ctx, merged, &format!("l{il}.kqv_merged"))?;
        let attn = linear(ctx, merged, l.o_w, l.o_b, &format!("l{il}.attn_out"))?;
        let attn = ctx.add(attn, x)?;
        x = layer_norm(ctx, attn, l.ln1_w, l.ln1_b, eps, &format!("l{il}.attn_ln"))?;

        let up = linear(ctx, x, l.up_w, l.up_b, &format!("l{il}.ffn_up"))?;
        let up = ctx.gelu_erf(up)?;
        let up = named(ctx, up, &format!("l{il}.ffn_gelu"))?;
        let down = linear(ctx, up, l.down_w, l.down_b, &format!("l{il}.ffn_down"))?;
        let down = ctx.add(down, x)?;
        x = layer_norm(ctx, down, l.ln2_w, l.ln2_b, eps, &format!("l{il}.out"))?;
    }

    // Mean pooling: per sentence, [t, h]ᵀ · pool weights [t] -> [h].
    let x = ctx.reshape_3d(x, h, t, b)?;
    let xt = ctx.transpose(x)?;
    let xt = ctx.cont(xt)?;
    let xt = named(ctx, xt, "states_t")?;
    let pooled = ctx.mul_mat(xt, pool)?;
    let output = ctx.reshape_2d(pooled, h, b)?;
    let output = named(ctx, output, "embeddings")?;
    ctx.set_output(output)?;

    let mut graph = Graph::new(graph_capacity(cfg));
    graph.build_forward_expand(ctx, output)?;
    Ok(BertGraph {
        graph,
        ids,
        type_ids,
        positions,
        mask,
        pool,
        output,
        n_tokens,
        n_batch,
    })
}

/// Scales each `dim`-wide row of `v` to unit Euclidean length (rows of zeros stay zero), as
/// sentence-transformers' `Normalize` does.
///
/// ```
/// let mut v = vec![3.0, 4.0, 0.0, 0.0];
/// minilm::l2_normalize(&mut v, 2);
/// assert_eq!(v, [0.6, 0.8, 0.0, 0.0]);
/// ```
pub fn l2_normalize(v: &mut [f32], dim: usize) {
    for row in v.chunks_mut(dim.max(1)) {
        let n = row
            .iter()
            .map(|&x| f64::from(x) * f64::from(x))
            .sum::<f64>()
            .sqrt();
        let s = 1.0 / n.max(1e-12);
        for x in row {
            *x = (f64::from(*x) * s) as f32;
        }
    }
}

/// Cosine similarity of two vectors (f64 accumulation).
///
/// ```
/// assert!((minilm::cosine(&[1.0, 0.0], &[1.0, 1.0]) - 0.5f64.sqrt()).abs() < 1e-12);
/// ```
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    ab / (aa.sqrt() * bb.sqrt()).max(1e-300)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_mask_padding_keys_and_pool_real_tokens() {
        // lengths 1 and 3, padded to 3; values worked out by hand
        let b = Batch::from_ids(&[vec![5], vec![5, 6, 7]], 0);
        let inp = GraphInputs::new(&b);
        let inf = f32::NEG_INFINITY;
        #[rustfmt::skip]
        let mask = [
            0.0, inf, inf,   0.0, inf, inf,   0.0, inf, inf, // sentence 0, queries 0..3
            0.0, 0.0, 0.0,   0.0, 0.0, 0.0,   0.0, 0.0, 0.0, // sentence 1
        ];
        assert_eq!(inp.mask, mask);
        let third = 1.0 / 3.0;
        assert_eq!(inp.pool, [1.0, 0.0, 0.0, third, third, third]);
        assert_eq!(inp.ids, [5, 0, 0, 5, 6, 7]);
        assert_eq!(inp.positions, [0, 1, 2]);
    }

    #[test]
    fn l2_normalize_leaves_zero_rows_and_scales_others() {
        let mut v = vec![0.0, 0.0, 0.0, 1.0, 2.0, 2.0];
        l2_normalize(&mut v, 3);
        assert_eq!(&v[..3], &[0.0, 0.0, 0.0]);
        let n: f32 = v[3..].iter().map(|x| x * x).sum();
        assert!((n - 1.0).abs() < 1e-6);
        assert!((v[3] - 1.0 / 3.0).abs() < 1e-7 && (v[4] - 2.0 / 3.0).abs() < 1e-7);
    }
}
