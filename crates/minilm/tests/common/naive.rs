//! A naive evaluator of our graphs, written for the tests: plain loops, f64 accumulation,
//! ggml's semantics read off the op definitions (views address their root's bytes through
//! `view_offs` and the strides `nb`). It checks the graph builder independently of the
//! backends.

use graph::{Context, ElementType, Graph, Op, TensorId, UnaryOp};

/// Bytes of every root tensor, by arena index.
pub struct Naive<'c> {
    ctx: &'c Context,
    mem: Vec<Option<Vec<u8>>>,
}

fn root_of(ctx: &Context, id: TensorId) -> (TensorId, usize) {
    let t = &ctx[id];
    match t.view_src() {
        // view_src is always the root in ggml (views of views point at the root).
        Some(r) => (r, t.view_offs()),
        None => (id, 0),
    }
}

impl<'c> Naive<'c> {
    pub fn new(ctx: &'c Context) -> Self {
        Naive {
            ctx,
            mem: vec![None; ctx.len()],
        }
    }

    /// Sets a root tensor's bytes.
    pub fn set(&mut self, id: TensorId, bytes: Vec<u8>) {
        assert_eq!(bytes.len(), self.ctx[id].nbytes());
        self.mem[id.index()] = Some(bytes);
    }

    fn mem_mut(&mut self, root: TensorId) -> &mut Vec<u8> {
        let n = self.ctx[root].nbytes();
        self.mem[root.index()].get_or_insert_with(|| vec![0; n])
    }

    fn offset(&self, id: TensorId, i: [i64; 4]) -> usize {
        let t = &self.ctx[id];
        let nb = t.nb();
        let (_, off) = root_of(self.ctx, id);
        off + (0..4).map(|d| i[d] as usize * nb[d]).sum::<usize>()
    }

    /// Element `i` of `id` as f64 (f32 or i32 tensors).
    pub fn get(&self, id: TensorId, i: [i64; 4]) -> f64 {
        let (root, _) = root_of(self.ctx, id);
        let m = self.mem[root.index()]
            .as_ref()
            .expect("read before written");
        let o = self.offset(id, i);
        let b: [u8; 4] = m[o..o + 4].try_into().unwrap();
        match self.ctx[id].ty() {
            ElementType::F32 => f64::from(f32::from_le_bytes(b)),
            ElementType::I32 => f64::from(i32::from_le_bytes(b)),
            t => panic!("naive evaluator: type {t}"),
        }
    }

    fn put(&mut self, id: TensorId, i: [i64; 4], v: f64) {
        let (root, _) = root_of(self.ctx, id);
        let o = self.offset(id, i);
        let m = self.mem_mut(root);
        m[o..o + 4].copy_from_slice(&(v as f32).to_le_bytes());
    }

    /// Computes every node of `g` in order.
    pub fn compute(&mut self, g: &Graph) {
        for &n in g.nodes() {
            self.node(n);
        }
    }

    fn node(&mut self, n: TensorId) {
        let ctx = self.ctx;
        let t = &ctx[n];
        let ne = t.ne();
        let src = |k: usize| t.src(k).unwrap();
        let each = |f: &mut dyn FnMut([i64; 4])| {
            for i3 in 0..ne[3] {
                for i2 in 0..ne[2] {
                    for i1 in 0..ne[1] {
                        for i0 in 0..ne[0] {
                            f([i0, i1, i2, i3]);
                        }
                    }
                }
            }
        };
        match t.op() {
            Op::None | Op::View | Op::Reshape | Op::Permute | Op::Transpose => {}
            Op::Add | Op::Mul => {
                let (a, b) = (src(0), src(1));
                let nb_ = ctx[b].ne();
                let add = t.op() == Op::Add;
                let mut out = Vec::new();
                each(&mut |i| {
                    let bi = [i[0] % nb_[0], i[1] % nb_[1], i[2] % nb_[2], i[3] % nb_[3]];
                    let (x, y) = (self.get(a, i), self.get(b, bi));
                    out.push((i, if add { x + y } else { x * y }));
                });
                for (i, v) in out {
                    self.put(n, i, v);
                }
            }
            Op::GetRows => {
                let (a, rows) = (src(0), src(1));
                let mut out = Vec::new();
                each(&mut |i| {
                    let r = self.get(rows, [i[1], i[2], i[3], 0]) as i64;
                    out.push((i, self.get(a, [i[0], r, i[2], i[3]])));
                });
                for (i, v) in out {
                    self.put(n, i, v);
                }
            }
            Op::Norm => {
                let a = src(0);
                let eps = f64::from(t.op_params().f32(0));
                for i3 in 0..ne[3] {
                    for i2 in 0..ne[2] {
                        for i1 in 0..ne[1] {
                            let row: Vec<f64> =
                                (0..ne[0]).map(|i0| self.get(a, [i0, i1, i2, i3])).collect();
                            let mean = row.iter().sum::<f64>() / row.len() as f64;
                            let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>()
                                / row.len() as f64;
                            let s = 1.0 / (var + eps).sqrt();
                            for (i0, x) in row.iter().enumerate() {
                                self.put(n, [i0 as i64, i1, i2, i3], (x - mean) * s);
                            }
                        }
                    }
                }
            }
            Op::MulMat => {
                let (a, b) = (src(0), src(1));
                let (na, nb_) = (ctx[a].ne(), ctx[b].ne());
                let (r2, r3) = (nb_[2] / na[2], nb_[3] / na[3]);
                let mut out = Vec::new();
                each(&mut |i| {
                    let s: f64 = (0..na[0])
                        .map(|l| {
                            self.get(a, [l, i[0], i[2] / r2, i[3] / r3])
                                * self.get(b, [l, i[1], i[2], i[3]])
                        })
                        .sum();
                    out.push((i, s));
                });
                for (i, v) in out {
                    self.put(n, i, v);
                }
            }
            Op::SoftMax => {
                let a = src(0);
                let mask = t.src(1);
                let scale = f64::from(t.op_params().f32(0));
                for i3 in 0..ne[3] {
                    for i2 in 0..ne[2] {
                        for i1 in 0..ne[1] {
                            let row: Vec<f64> = (0..ne[0])
                                .map(|i0| {
                                    let m = mask.map_or(0.0, |m| {
                                        let mn = ctx[m].ne();
                                        self.get(m, [i0, i1, i2 % mn[2], i3 % mn[3]])
                                    });
                                    self.get(a, [i0, i1, i2, i3]) * scale + m
                                })
                                .collect();
                            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                            let e: Vec<f64> = row.iter().map(|x| (x - max).exp()).collect();
                            let sum: f64 = e.iter().sum();
                            for (i0, x) in e.iter().enumerate() {
                                self.put(n, [i0 as i64, i1, i2, i3], x / sum);
                            }
                        }
                    }
                }
            }
            Op::Unary(UnaryOp::GeluErf) => {
                let a = src(0);
                let mut out = Vec::new();
                each(&mut |i| {
                    let x = self.get(a, i);
                    out.push((i, 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))));
                });
                for (i, v) in out {
                    self.put(n, i, v);
                }
            }
            Op::Cont | Op::Dup => {
                // Elements in row-major order of the source, written in row-major order of
                // the result (the shapes may differ, the counts may not).
                let a = src(0);
                let na = ctx[a].ne();
                let mut vals = Vec::new();
                for i3 in 0..na[3] {
                    for i2 in 0..na[2] {
                        for i1 in 0..na[1] {
                            for i0 in 0..na[0] {
                                vals.push(self.get(a, [i0, i1, i2, i3]));
                            }
                        }
                    }
                }
                let mut idx = Vec::new();
                each(&mut |i| idx.push(i));
                for (i, v) in idx.into_iter().zip(vals) {
                    self.put(n, i, v);
                }
            }
            op => panic!("naive evaluator: op {op:?} not implemented"),
        }
    }

    /// The contiguous f32 values of `id`.
    pub fn read(&self, id: TensorId) -> Vec<f32> {
        let ne = self.ctx[id].ne();
        let mut v = Vec::new();
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    for i0 in 0..ne[0] {
                        v.push(self.get(id, [i0, i1, i2, i3]) as f32);
                    }
                }
            }
        }
        v
    }
}
