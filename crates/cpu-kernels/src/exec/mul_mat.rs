//! Matrix products (MUL_MAT): the dispatch by weight type and column count, the packing of
//! the columns, and the paths — the dot path over rows of quantized or f16 weights and f32
//! weights against few columns (module `dot`), our AVX-512 `sgemm`, the `CPU_REPACK`
//! layouts and the `gemm` crate. Split from the executor because it is most of its code;
//! the rules of work units and threads are the executor's (`super`).

use super::*;
use crate::{q4tiles, repack};

mod dot;

/// Results (rows × columns) of a run of row blocks computed as one (the repacked path's
/// groups, the dot path's `Rows` units): the blocks of the units a thread claims at once go
/// through the kernel back to back and are stored together, one bounds-checked span and
/// one store per column for the run instead of per block of rows.
const RUN_FLOATS: usize = 4096;

/// The runs of `units` (numbered matrix by matrix, `mblocks` row blocks a matrix) of at most
/// `most` blocks each, none across two matrices: `(matrix, row blocks)`.
fn runs(
    units: Range<usize>,
    mblocks: usize,
    most: usize,
) -> impl Iterator<Item = (usize, Range<usize>)> {
    let mut u = units.start;
    std::iter::from_fn(move || {
        (u < units.end).then(|| {
            let (mat, mb) = (u / mblocks, u % mblocks);
            let blocks = (units.end - u).min(mblocks - mb).min(most);
            u += blocks;
            (mat, mb..mb + blocks)
        })
    })
}

impl Exec<'_> {
    /// `packed`: `a` is q4_0, q4_1 or q8_0 in the interleaved layout of `repack` (groups of
    /// 16 rows).
    pub(super) fn mul_mat(
        &mut self,
        dst: &TView,
        a: &TView,
        b: &TView,
        packed: bool,
    ) -> Result<(), BackendError> {
        if a.overlaps(dst) || b.overlaps(dst) {
            return Err(BackendError::failed(
                "CPU",
                "mul_mat: result overlaps a source",
            ));
        }
        let k = a.ne[0];
        let m = a.ne[1];
        let n = b.ne[1];
        if k == 0 {
            // every dot product is over no terms (the paths below split rows by `k`)
            let zeros = vec![0.0f32; dst.ne[0]];
            for i3 in 0..dst.ne[3] {
                for i2 in 0..dst.ne[2] {
                    for i1 in 0..dst.ne[1] {
                        dst.store_f32(0, i1, i2, i3, &zeros);
                    }
                }
            }
            return Ok(());
        }
        // Indexing: `supports_op` checked `a.ne2, a.ne3 > 0` dividing `b`'s and
        // `dst.ne == [m, n, b.ne2, b.ne3]`, so `i2 / r2 < a.ne2` and `i3 / r3 < a.ne3`.
        let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
        // q4_0 weights always take the dot path: its kernel unpacks each block once for four
        // columns, and measured faster than dequantizing into the f32 gemm at every batch
        // up to 512 columns (2.5-3x at 32, 2x at 512).
        let gemm_min_n = if a.ty == ElementType::F32 {
            F32_GEMM_MIN_N
        } else {
            GEMM_MIN_N
        };
        // q4_1 and q8_0 likewise: their products follow ggml's integer dots bit for bit
        // (`qdot`), at every column count as ggml's do (it quantizes the columns to q8_0 /
        // q8_1 for batches too).
        // f16 weights likewise: their products follow ggml's summation orders (`hdot`).
        let use_gemm = !cfg!(miri)
            && !matches!(
                a.ty,
                ElementType::Q4_0 | ElementType::Q4_1 | ElementType::Q8_0 | ElementType::F16
            )
            && n >= gemm_min_n
            && m >= 16
            && k >= 16;
        if use_gemm {
            if a.ty == ElementType::F32
                && let Some(kernel) = sgemm::Kernel::best()
                && dst.f32_matrix(0, 0).is_some()
                && a.f32_matrix(0, 0).is_some()
                && b.f32_matrix(0, 0).is_some()
            {
                return self.mul_mat_sgemm(kernel, dst, a, b, r2, r3);
            }
            return self.mul_mat_gemm(dst, a, b, r2, r3);
        }
        self.dot_products(&[Weighted { dst, a, packed }], b)
    }

    /// Products of the weights `items[i].a` with the same columns `b`, on the dot path (or
    /// the repacked one), run as one job: the columns are packed once and every product's
    /// units share the threads' ranges, so the products cost one hand-over to the workers
    /// instead of one each (a decode step's Q, K and V; gate and up). The weights are all of
    /// one type, `k > 0`, no result overlaps a source, and the caller chose the dot path
    /// (the type and column count do not take the gemm).
    pub(super) fn dot_products(
        &mut self,
        items: &[Weighted<'_>],
        b: &TView,
    ) -> Result<(), BackendError> {
        let Some(first) = items.first() else {
            return Ok(());
        };
        let (ty, k, n) = (first.a.ty, first.a.ne[0], b.ne[1]);
        let (ne2, ne3) = (first.dst.ne[2], first.dst.ne[3]);
        // Dot-product path: pack src1 columns once (f32, or q8_0 for quantized weights).
        let quantized = ty.is_quantized();
        let ncols = n * ne2 * ne3;
        // q4_0 rows read the column in `quant`'s own layout (f32 scales, precomputed
        // corrections), q4_1 and q8_0 rows as `qdot` packs it (ggml's x86 rule).
        let q4 = ty == ElementType::Q4_0;
        let col_bytes = if q4 {
            quant::q8_col_bytes(k)
        } else {
            qdot::col_bytes(k)
        };
        // One column a matrix against plain q4_0 rows that `q4tiles` reads: each column also
        // expanded for it (`q4tiles::expand_col`), after the packed ones, from a 64-byte
        // boundary. Sizes: a packed column is 1.25 bytes and an expanded one 3 bytes per
        // element of `b`, whose 4-byte elements the graph's byte size checked, so the sums
        // below fit `usize`.
        let expand = q4
            && n == 1
            && q4tiles::available()
            && items.iter().any(|w| !w.packed && w.a.rows_contiguous());
        let expanded_bytes = if expand {
            q4tiles::expanded_col_bytes(k / quant::QK)
        } else {
            0
        };
        let mut expanded_at = 0;
        if quantized {
            // Disjoint fields of the scratch: the column buffer and the packed columns (no
            // copy of the column buffer, so a decode step does not allocate).
            let scratch = &mut *self.scratch;
            let tmp = grow(&mut scratch.thread[0].get_mut().a, k);
            let all = ncols * col_bytes
                + if expand {
                    ncols * expanded_bytes + 64
                } else {
                    0
                };
            let packed = grow(&mut scratch.shared_u8, all);
            let (packed, rest) = packed.split_at_mut(ncols * col_bytes);
            let pad = rest.as_ptr().align_offset(64).min(rest.len());
            expanded_at = ncols * col_bytes + pad;
            let expanded = &mut rest[pad..];
            for c in 0..ncols {
                let (j, i2, i3) = unravel(c, [k, n, ne2, ne3]);
                b.load_f32(0, j, i2, i3, tmp);
                let out = &mut packed[c * col_bytes..(c + 1) * col_bytes];
                if q4 {
                    quant::quantize_q8_col(tmp, out);
                } else {
                    qdot::quantize_col(tmp, out);
                }
                if expand {
                    let e = &mut expanded[c * expanded_bytes..(c + 1) * expanded_bytes];
                    q4tiles::expand_col(out, e);
                }
            }
        } else {
            let packed = grow(&mut self.scratch.shared_f32, ncols * k);
            for c in 0..ncols {
                let (j, i2, i3) = unravel(c, [k, n, ne2, ne3]);
                let col = &mut packed[c * k..(c + 1) * k];
                b.load_f32(0, j, i2, i3, col);
                round_to_weight_type(ty, col);
            }
        }
        let packed_f32 = &self.scratch.shared_f32[..if quantized { 0 } else { ncols * k }];
        let packed_q = &self.scratch.shared_u8[..if quantized { ncols * col_bytes } else { 0 }];
        let expanded = &self.scratch.shared_u8[expanded_at..expanded_at + ncols * expanded_bytes];
        let isa = quant::Isa::best();
        let products: Products<'_> = items
            .iter()
            .map(|&Weighted { dst, a, packed }| {
                // Indexing: `supports_op` checked `a.ne2, a.ne3 > 0` dividing `b`'s and
                // `dst.ne == [m, n, b.ne2, b.ne3]`, so `i2 / r2 < a.ne2` and `i3 / r3 <
                // a.ne3`. The packed columns are `ncols` slices of `k` floats (or
                // `col_bytes` bytes), sliced by column indices `< ncols`; the products fit
                // `usize` as they count elements (or packed bytes, at most the f32 size) of
                // `b`, whose byte size the graph checked.
                let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
                // The `bh` query heads that share one matrix of `a` (GQA: `r2` of them) go
                // in one unit, so that its rows are read (and for f16, converted) once for
                // all of them: the heads' columns are the consecutive packed columns
                // `batch0 · n ..`, `nn` in all.
                let bh = if a.ne[2] * r2 == dst.ne[2] { r2 } else { 1 };
                let cols = PackedCols {
                    bytes: packed_q,
                    col_bytes,
                    expanded,
                    expanded_bytes,
                    n,
                    nn: bh * n,
                    bh,
                };
                if packed {
                    return Product::Repacked(RepackedOp {
                        dst,
                        a,
                        cols,
                        r2,
                        r3,
                        isa,
                    });
                }
                Product::Dot(dot::DotOp::new(dot::Operands {
                    a,
                    dst,
                    cols,
                    fcols: packed_f32,
                    r2,
                    r3,
                    isa,
                }))
            })
            .collect();
        self.run_products(&products)
    }

    /// Every unit of `products` on the threads, the products' units one after another in
    /// one job (each thread's share a contiguous stretch of the weights, as for one product).
    /// Products whose units cost differently run one job each.
    fn run_products(&self, products: &[Product<'_>]) -> Result<(), BackendError> {
        let Some(cost) = products.first().map(Product::unit_cost) else {
            return Ok(());
        };
        if products.iter().any(|p| p.unit_cost() != cost) {
            return products
                .iter()
                .try_for_each(|p| self.run_products(std::slice::from_ref(p)));
        }
        // Where each product's units end in the job's numbering.
        let mut ends = smallvec::SmallVec::<[usize; MAX_SHARED_COLUMNS]>::new();
        let mut total = 0usize;
        for p in products {
            total = total.checked_add(p.units()).ok_or_else(|| {
                BackendError::failed("CPU", "mul_mat: more work units than fit usize")
            })?;
            ends.push(total);
        }
        self.par_for_contiguous(total, cost, |units, ts| {
            let mut u = units.start;
            while u < units.end {
                // Indexing: `u < total`, the last end.
                let i = ends.partition_point(|&e| e <= u);
                let start = if i == 0 { 0 } else { ends[i - 1] };
                let stop = units.end.min(ends[i]);
                products[i].run(u - start..stop - start, ts);
                u = stop;
            }
            Ok(())
        })
    }

    /// f32 weights on an AVX-512 CPU: our blocked product (`sgemm`). First every matrix
    /// of the weights is packed once (panels in parallel), then units of rows × columns of
    /// each result matrix run. Every result is one FMA chain over `k`, so the split does not
    /// change a bit.
    fn mul_mat_sgemm(
        &mut self,
        kernel: sgemm::Kernel,
        dst: &TView,
        a: &TView,
        b: &TView,
        r2: usize,
        r3: usize,
    ) -> Result<(), BackendError> {
        let (k, m, n) = (a.ne[0], a.ne[1], b.ne[1]);
        let n_batch = dst.ne[2] * dst.ne[3];
        let nth = self.n_threads.min(self.pool.n_threads()).max(1);
        let grid = sgemm::Grid::new(m, k, n, n_batch, nth);
        let per = grid.units_per_matrix();
        let (na, alen) = (a.ne[2] * a.ne[3], sgemm::packed_a_len(m, k));
        let misaligned = || BackendError::failed("CPU", "mul_mat: misaligned f32 matrix");
        let mut buf = std::mem::take(&mut self.scratch.shared_f32);
        let packed = sgemm::aligned(&mut buf, na * alen);
        let mut panels = Vec::new();
        let mut rest = &mut *packed;
        for mat in 0..na {
            for (lines, ks) in sgemm::a_panels(m, k) {
                let (p, r) = rest.split_at_mut(sgemm::MR * ks.len());
                panels.push((mat, lines, ks, Mutex::new(p)));
                rest = r;
            }
        }
        let packing = self.par_for(panels.len(), sgemm::MR * k.min(512), |units, _| {
            for (mat, lines, ks, out) in &panels[units] {
                let am = a
                    .f32_matrix(mat % a.ne[2], mat / a.ne[2])
                    .ok_or_else(misaligned)?;
                sgemm::pack_a_panel(kernel, &am, lines.clone(), ks.clone(), &mut out.lock());
            }
            Ok(())
        });
        drop(panels);
        let packed = &*packed;
        let res = packing.and_then(|()| {
            self.par_for(n_batch * per, grid.unit_cost(k), |units, ts| {
                for u in units {
                    let (batch, (rows, cols)) = (u / per, grid.unit(u % per));
                    let (i2, i3) = (batch % dst.ne[2], batch / dst.ne[2]);
                    let mat = i2 / r2 + i3 / r3 * a.ne[2];
                    let dm = dst.f32_matrix(i2, i3).ok_or_else(misaligned)?;
                    let bm = b.f32_matrix(i2, i3).ok_or_else(misaligned)?;
                    let ap = &packed[mat * alen..(mat + 1) * alen];
                    // SAFETY: this unit alone computes these rows × columns of matrix
                    // (i2, i3) of the destination, which does not overlap src1 (checked by
                    // `mul_mat`).
                    unsafe { sgemm::gemm_unit(kernel, &dm, ap, m, &bm, rows, cols, &mut ts.b) };
                }
                Ok(())
            })
        });
        self.scratch.shared_f32 = buf;
        res
    }

    fn mul_mat_gemm(
        &mut self,
        dst: &TView,
        a: &TView,
        b: &TView,
        r2: usize,
        r3: usize,
    ) -> Result<(), BackendError> {
        let k = a.ne[0];
        let m = a.ne[1];
        let n = b.ne[1];
        let n_batch = dst.ne[2] * dst.ne[3];
        let direct_a = a.f32_matrix(0, 0).is_some() && a.rows_contiguous();
        let nth = self.n_threads.min(self.pool.n_threads()).max(1);
        // Rows of `a` per unit: enough units to keep every thread busy, and for converted
        // weights no more than a panel of GEMM_PANEL_FLOATS.
        let per_batch = if n_batch >= nth {
            1
        } else {
            nth.div_ceil(n_batch)
        };
        let mut mc = m.div_ceil(per_batch).next_multiple_of(16);
        if !direct_a {
            mc = mc.min((GEMM_PANEL_FLOATS / k).max(16));
        }
        let mblocks = m.div_ceil(mc);
        // src1 as a gemm operand: directly, or packed dense per batch.
        let direct_b =
            b.f32_matrix(0, 0).is_some() && !matches!(a.ty, ElementType::F16 | ElementType::BF16);
        if !direct_b {
            let packed = grow(&mut self.scratch.shared_f32, n_batch * n * k);
            for c in 0..n_batch * n {
                let (j, i2, i3) = unravel(c, [k, n, dst.ne[2], dst.ne[3]]);
                let col = &mut packed[c * k..(c + 1) * k];
                b.load_f32(0, j, i2, i3, col);
                round_to_weight_type(a.ty, col);
            }
        }
        let packed = &self.scratch.shared_f32[..if direct_b { 0 } else { n_batch * n * k }];
        let this = &*self;
        this.par_for(n_batch * mblocks, mc * n * k, |units, ts| {
            for u in units {
                let (batch, mb) = (u / mblocks, u % mblocks);
                let (i2, i3) = (batch % dst.ne[2], batch / dst.ne[2]);
                let (a2, a3) = (i2 / r2, i3 / r3);
                let rows = mb * mc..((mb + 1) * mc).min(m);
                let dm = dst
                    .f32_matrix(i2, i3)
                    .ok_or_else(|| BackendError::failed("CPU", "mul_mat: misaligned result"))?;
                let bm = match b.f32_matrix(i2, i3).filter(|_| direct_b) {
                    Some(x) => x,
                    None => MatF32::from_slice(&packed[batch * n * k..(batch + 1) * n * k], k, n),
                };
                if direct_a {
                    let am = a.f32_matrix(a2, a3).ok_or_else(|| {
                        BackendError::failed("CPU", "mul_mat: misaligned weights")
                    })?;
                    gemm_f32(dm, am, 0, bm, rows);
                } else {
                    let panel = grow(&mut ts.a, rows.len() * k);
                    for (ri, i) in rows.clone().enumerate() {
                        let x = &mut panel[ri * k..(ri + 1) * k];
                        if a.ty.is_quantized() {
                            dequantize_row(a, i, a2, a3, x);
                        } else {
                            a.load_f32(0, i, a2, a3, x);
                        }
                    }
                    let am = MatF32::from_slice(panel, k, rows.len());
                    gemm_f32(dm, am, rows.start, bm, rows);
                }
            }
            Ok(())
        })
    }
}

impl Exec<'_> {
    /// The products `ids` (a [`shared_column_run`]) as one job; one node at a time where a
    /// result overlaps a source or another result (which [`Exec::node`] then reports).
    pub fn shared_column_products(
        &mut self,
        ctx: &Context,
        ids: &[TensorId],
    ) -> Result<(), BackendError> {
        let resolver = self.resolver;
        let resolve = |id: Option<TensorId>, of: TensorId| match id {
            Some(s) => TView::resolve(ctx, s, resolver),
            None => Err(unsupported(ctx, of)),
        };
        let Some(&first) = ids.first() else {
            return Ok(());
        };
        let b = resolve(ctx.get(first)?.src(1), first)?;
        let mut views = smallvec::SmallVec::<[(TView, TView, bool); MAX_SHARED_COLUMNS]>::new();
        for &id in ids {
            let a = ctx.get(id)?.src(0);
            let packed = a.map(|s| repack::layout(ctx, s)) == Some(repack::Layout::Repacked);
            views.push((TView::resolve(ctx, id, resolver)?, resolve(a, id)?, packed));
        }
        let apart = views.iter().enumerate().all(|(i, (dst, _, _))| {
            !dst.overlaps(&b)
                && views
                    .iter()
                    .enumerate()
                    .all(|(j, (other, a, _))| !dst.overlaps(a) && (i == j || !dst.overlaps(other)))
        });
        if !apart {
            return ids.iter().try_for_each(|&id| self.node(ctx, id));
        }
        let items: smallvec::SmallVec<[Weighted<'_>; MAX_SHARED_COLUMNS]> = views
            .iter()
            .map(|(dst, a, packed)| Weighted {
                dst,
                a,
                packed: *packed,
            })
            .collect();
        self.dot_products(&items, &b)
    }
}

/// The MUL_MAT nodes from `nodes[0]` on that multiply quantized weights (one type, one
/// layout, single matrices) with the same `src1`, with only views between them: run as one
/// job ([`Exec::shared_column_products`]), they pack their columns once and hand the
/// workers one job. Returns the entries of `nodes` they cover and their ids (up to
/// [`MAX_SHARED_COLUMNS`]); fewer than two ids are no run.
pub(crate) fn shared_column_run(
    ctx: &Context,
    nodes: &[TensorId],
) -> (usize, smallvec::SmallVec<[TensorId; MAX_SHARED_COLUMNS]>) {
    let mut ids = smallvec::SmallVec::new();
    let mut covered = 0;
    // (src1, weight type, layout) of the run's first product.
    let mut key = None;
    for &id in nodes {
        let Ok(t) = ctx.get(id) else { break };
        if t.op() == Op::None || t.op().is_view_op() {
            if key.is_none() {
                break;
            }
            covered += 1;
            continue;
        }
        let this = (t.op() == Op::MulMat)
            .then(|| t.src(0).zip(t.src(1)))
            .flatten()
            .and_then(|(a, b)| Some((ctx.get(a).ok()?, a, ctx.get(b).ok()?, b)))
            .filter(|(a, _, b, _)| {
                matches!(
                    a.ty(),
                    ElementType::Q4_0 | ElementType::Q4_1 | ElementType::Q8_0
                ) && a.ne()[0] > 0
                    && a.ne()[2..] == [1, 1]
                    && b.ne()[2..] == [1, 1]
            })
            .map(|(a, a_id, _, b_id)| (b_id, a.ty(), repack::layout(ctx, a_id)));
        match (this, key) {
            (Some(k), None) => key = Some(k),
            (Some(k), Some(first)) if k == first && ids.len() < MAX_SHARED_COLUMNS => {}
            _ => break,
        }
        ids.push(id);
        covered += 1;
    }
    // Only ops the CPU computes, checked once there is a run (a lone product goes to
    // `Exec::node`, which checks it): the run ends before the first other one.
    if ids.len() >= 2
        && let Some(bad) = ids.iter().position(|&id| !crate::supports_op(ctx, id))
    {
        ids.truncate(bad);
    }
    // Views after the last product are not the run's.
    let last = nodes[..covered]
        .iter()
        .rposition(|id| ids.last() == Some(id))
        .map_or(0, |p| p + 1);
    (last, ids)
}

/// Products of one [`Exec::dot_products`] job that share the columns: a decode step's Q,
/// K and V are three.
pub(crate) const MAX_SHARED_COLUMNS: usize = 4;

/// One product's weights and result (a MUL_MAT node's `src0` and itself); `packed`: the
/// weights are q4_0, q4_1 or q8_0 in the interleaved layout of `repack` (groups of 16 rows).
#[derive(Clone, Copy)]
pub(super) struct Weighted<'a> {
    pub dst: &'a TView,
    pub a: &'a TView,
    pub packed: bool,
}

type Products<'a> = smallvec::SmallVec<[Product<'a>; MAX_SHARED_COLUMNS]>;

/// One product's work on the dot path, as units of row blocks numbered from zero.
enum Product<'a> {
    Repacked(RepackedOp<'a>),
    Dot(dot::DotOp<'a>),
}

impl Product<'_> {
    fn units(&self) -> usize {
        match self {
            Product::Repacked(op) => op.units(),
            Product::Dot(op) => op.units(),
        }
    }

    /// A unit's multiply-adds (the split's cost hint).
    fn unit_cost(&self) -> usize {
        match self {
            Product::Repacked(op) => op.unit_cost(),
            Product::Dot(op) => op.unit_cost(),
        }
    }

    fn run(&self, units: Range<usize>, ts: &mut ThreadScratch) {
        match self {
            Product::Repacked(op) => op.run(units, ts),
            Product::Dot(op) => op.run(units, ts),
        }
    }
}

/// A product over q4_0, q4_1 or q8_0 weights in the repacked layout (`repack`): a unit is
/// one group of `GROUP_ROWS` rows (= `MM_ROWS`) of one weight matrix against all its
/// columns. (Units of a group against a chunk of columns that stays in L2, chunks
/// outermost, measured no faster at 512 columns.)
struct RepackedOp<'a> {
    dst: &'a TView,
    a: &'a TView,
    cols: PackedCols<'a>,
    r2: usize,
    r3: usize,
    isa: quant::Isa,
}

impl RepackedOp<'_> {
    fn mblocks(&self) -> usize {
        self.a.ne[1].div_ceil(MM_ROWS)
    }

    fn units(&self) -> usize {
        self.dst.ne[2] * self.dst.ne[3] / self.cols.bh * self.mblocks()
    }

    fn unit_cost(&self) -> usize {
        MM_ROWS
            .saturating_mul(self.a.ne[0])
            .saturating_mul(self.cols.nn)
    }

    /// Units `units`: the groups of a claim go through the kernel back to back, as many
    /// between two stores of the results as `RUN_FLOATS` holds.
    fn run(&self, units: Range<usize>, ts: &mut ThreadScratch) {
        let (dst, a, cols) = (self.dst, self.a, &self.cols);
        let (m, nn) = (a.ne[1], cols.nn);
        let run_groups = (RUN_FLOATS / (MM_ROWS * nn)).max(1);
        for (mat, mbs) in runs(units, self.mblocks(), run_groups) {
            let groups = mbs.len();
            let batch0 = mat * cols.bh;
            let (i2_0, i3) = (batch0 % dst.ne[2], batch0 / dst.ne[2]);
            let rows = mbs.start * MM_ROWS..(mbs.end * MM_ROWS).min(m);
            let nr = rows.len();
            let out = grow(&mut ts.c, nr * nn);
            // Whole groups of the repacked layout (the row count is a multiple of it).
            let span = a.rows_bytes(rows.start, nr, i2_0 / self.r2, i3 / self.r3);
            let col = |j: usize| cols.col(batch0, j);
            for (g, group) in span.chunks(span.len() / groups).enumerate() {
                repacked_group(self.isa, a.ty, group, nn, (nr, g * MM_ROWS), out, col);
            }
            for (o, jj) in out.chunks_exact(nr).zip(0..nn) {
                let (h, j) = (jj / cols.n, jj % cols.n);
                dst.store_f32(rows.start, j, i2_0 + h, i3, o);
            }
        }
    }
}

/// Packed src1 columns of a matrix product (`quant::quantize_q8_col` layout, `col_bytes`
/// each): `n` per matrix of `dst`, and the `bh` matrices that share one weight matrix
/// (`nn = bh · n` columns) handled together.
struct PackedCols<'a> {
    bytes: &'a [u8],
    col_bytes: usize,
    /// The same columns expanded by `q4tiles::expand_col`, `expanded_bytes` each (empty
    /// unless the weights are plain q4_0 and there is one column a matrix).
    expanded: &'a [u8],
    expanded_bytes: usize,
    n: usize,
    nn: usize,
    bh: usize,
}

impl<'a> PackedCols<'a> {
    /// Column `j` (of `nn`) of the `bh` result matrices from `batch0` on.
    #[inline]
    fn col(&self, batch0: usize, j: usize) -> &'a [u8] {
        let c = batch0 * self.n + j;
        &self.bytes[c * self.col_bytes..(c + 1) * self.col_bytes]
    }

    /// Column `j` of the `bh` result matrices from `batch0` on as `q4tiles::expand_col`
    /// wrote it, if the columns were expanded.
    #[inline]
    fn expanded(&self, batch0: usize, j: usize) -> Option<&'a [u8]> {
        let c = batch0 * self.n + j;
        let e = self.expanded_bytes;
        self.expanded.get(c * e..(c + 1) * e).filter(|_| e > 0)
    }
}

/// Columns per call of the repacked q4_1 kernel (eight accumulators and one of minimums per
/// column: two columns fill most of AVX-512's 32 registers).
const Q4_1_REPACK_COLS: usize = 2;

/// Columns per call of the repacked q8_0 kernel (eight accumulators per column).
const Q8_0_REPACK_COLS: usize = 2;

/// `out[j · nr + at + i]` = row `i` of the repacked (`repack`) q4_0, q4_1 or q8_0 group
/// `group` (16 rows) dotted with packed column `col(j)`, for the `nn` columns: the repacked
/// kernels, each over the columns in the counts it takes at once. (`nr`: the rows of the
/// results' run, of which this group's are `at..at + 16`.)
fn repacked_group<'c>(
    isa: quant::Isa,
    ty: ElementType,
    group: &[u8],
    nn: usize,
    (nr, at): (usize, usize),
    out: &mut [f32],
    col: impl Fn(usize) -> &'c [u8],
) {
    // The layout's kernel at `$nc` columns and at one.
    macro_rules! run {
        ($dot:path, $nc:expr) => {
            mul_mat_group::<$nc>(
                nn,
                (nr, at),
                out,
                col,
                |c| $dot(isa, group, c),
                |c| $dot(isa, group, c),
            )
        };
    }
    match ty {
        ElementType::Q4_1 => run!(crate::repack::q4_1::dot_group, Q4_1_REPACK_COLS),
        ElementType::Q8_0 => run!(crate::repack::q8_0::dot_group, Q8_0_REPACK_COLS),
        _ => run!(crate::repack::dot_group, Q4_COLS),
    }
}

/// One group of `GROUP_ROWS` repacked rows against the `n` columns `col(0..n)`, `NC` at a
/// time through `dot` and the rest one by one through `dot1`, into `out[j · nr + at ..]`
/// per column `j`. (`dot` and `dot1` are the layout's kernel at `NC` columns and at one.)
fn mul_mat_group<'c, const NC: usize>(
    n: usize,
    (nr, at): (usize, usize),
    out: &mut [f32],
    col: impl Fn(usize) -> &'c [u8],
    dot: impl Fn([&'c [u8]; NC]) -> [[f32; crate::repack::GROUP_ROWS]; NC],
    dot1: impl Fn([&'c [u8]; 1]) -> [[f32; crate::repack::GROUP_ROWS]; 1],
) {
    let rows = crate::repack::GROUP_ROWS;
    let mut put = |j: usize, d: &[f32]| {
        out[j * nr + at..j * nr + at + rows].copy_from_slice(d);
    };
    let mut j = 0;
    while j + NC <= n {
        for (c, d) in dot(std::array::from_fn(|c| col(j + c))).iter().enumerate() {
            put(j + c, d);
        }
        j += NC;
    }
    for j in j..n {
        let [d] = dot1([col(j)]);
        put(j, &d);
    }
}

pub(super) fn dequantize_row(a: &TView, i1: usize, i2: usize, i3: usize, out: &mut [f32]) {
    let bytes = a.row_bytes(i1, i2, i3);
    match a.ty {
        ElementType::Q8_0 => quant::dequantize_q8_0(bytes, out),
        ElementType::Q4_1 => qdot::dequantize_q4_1(bytes, out),
        _ => quant::dequantize_q4_0(bytes, out),
    }
}

/// Round a column of `src1` to f16 or bf16 when the weights are of that type: ggml converts
/// `src1` to the weights' `vec_dot_type` (f16 for f16, bf16 for bf16) before its dot
/// products, so a product with f16 weights (the attention's `K·Q` and `V·P` over an f16 KV
/// cache) sees the column rounded to nearest even. Products of those values are exact in
/// f32, so only the summation order is left to differ from ggml.
fn round_to_weight_type(ty: ElementType, col: &mut [f32]) {
    match ty {
        ElementType::F16 => hdot::round_to_f16(col),
        ElementType::BF16 => col
            .iter_mut()
            .for_each(|v| *v = half::bf16::from_f32(*v).to_f32()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use graph::Graph;

    fn nodes(ctx: &mut Context, outs: &[TensorId]) -> Vec<TensorId> {
        let mut g = Graph::new(64);
        for &o in outs {
            g.build_forward_expand(ctx, o).unwrap();
        }
        g.as_view().nodes.to_vec()
    }

    /// A layer's Q, K, V and what follows them: which nodes make one job.
    #[test]
    fn products_of_one_input_with_views_between_make_a_run() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor_2d(ElementType::F32, 64, 1).unwrap();
        let w = |ctx: &mut Context, ty, m| ctx.new_tensor_2d(ty, 64, m).unwrap();
        let (wq, wk, wv) = (
            w(&mut ctx, ElementType::Q8_0, 64),
            w(&mut ctx, ElementType::Q8_0, 32),
            w(&mut ctx, ElementType::Q8_0, 32),
        );
        let q = ctx.mul_mat(wq, x).unwrap();
        let q3 = ctx.reshape_3d(q, 16, 4, 1).unwrap();
        let k = ctx.mul_mat(wk, x).unwrap();
        let v = ctx.mul_mat(wv, x).unwrap();
        let v3 = ctx.reshape_3d(v, 16, 2, 1).unwrap();
        let list = nodes(&mut ctx, &[q, q3, k, v, v3]);
        let (covered, ids) = shared_column_run(&ctx, &list);
        assert_eq!(ids.as_slice(), &[q, k, v]);
        // q, its view, k and v: not the view after v.
        assert_eq!(covered, 4);
        // The run starts only at a product, and one product alone is no run.
        assert_eq!(list[1], q3);
        assert!(shared_column_run(&ctx, &list[1..]).1.is_empty());
        assert_eq!(shared_column_run(&ctx, &list[2..]).1.as_slice(), &[k, v]);
        assert_eq!(shared_column_run(&ctx, &list[3..]).1.as_slice(), &[v]);
        // At most MAX_SHARED_COLUMNS products a run.
        let six: Vec<TensorId> = (0..6).map(|_| ctx.mul_mat(wk, x).unwrap()).collect();
        let list = nodes(&mut ctx, &six);
        assert_eq!(shared_column_run(&ctx, &list).1.len(), MAX_SHARED_COLUMNS);
    }

    #[test]
    fn other_inputs_types_and_shapes_end_a_run() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor_2d(ElementType::F32, 64, 1).unwrap();
        let x2 = ctx.new_tensor_2d(ElementType::F32, 64, 1).unwrap();
        let q8 = ctx.new_tensor_2d(ElementType::Q8_0, 64, 32).unwrap();
        let q4 = ctx.new_tensor_2d(ElementType::Q4_0, 64, 32).unwrap();
        let f32w = ctx.new_tensor_2d(ElementType::F32, 64, 32).unwrap();
        let q8_3d = ctx.new_tensor_3d(ElementType::Q8_0, 64, 32, 2).unwrap();
        let x_3d = ctx.new_tensor_3d(ElementType::F32, 64, 1, 2).unwrap();
        let a = ctx.mul_mat(q8, x).unwrap();
        for other in [
            ctx.mul_mat(q8, x2).unwrap(),
            ctx.mul_mat(q4, x).unwrap(),
            ctx.mul_mat(f32w, x).unwrap(),
        ] {
            let list = nodes(&mut ctx, &[a, other]);
            let (covered, ids) = shared_column_run(&ctx, &list);
            assert_eq!((covered, ids.as_slice()), (1, &[a][..]));
        }
        // f32 weights and stacks of matrices make no run, even with one input.
        let f = [ctx.mul_mat(f32w, x).unwrap(), ctx.mul_mat(f32w, x).unwrap()];
        let list = nodes(&mut ctx, &f);
        assert!(shared_column_run(&ctx, &list).1.len() < 2);
        let s = [
            ctx.mul_mat(q8_3d, x_3d).unwrap(),
            ctx.mul_mat(q8_3d, x_3d).unwrap(),
        ];
        let list = nodes(&mut ctx, &s);
        assert!(shared_column_run(&ctx, &list).1.len() < 2);
        // Products the CPU does not compute (an f16 input) make no run either: each goes
        // to `Exec::node`, which reports it.
        let x16 = ctx.new_tensor_2d(ElementType::F16, 64, 1).unwrap();
        let h = [ctx.mul_mat(q8, x16).unwrap(), ctx.mul_mat(q8, x16).unwrap()];
        let list = nodes(&mut ctx, &h);
        assert!(!crate::supports_op(&ctx, h[0]));
        assert!(shared_column_run(&ctx, &list).1.is_empty());
    }
}
