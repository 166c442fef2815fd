//! MUL_MAT's dot path: the weights' rows against the packed columns, one unit of rows at a
//! time (decode steps and small batches of quantized or f16 weights, f32 weights against
//! few columns). [`DotOp::new`] chooses the kernel family of an op's units once
//! ([`DotPath`]); each family's unit loop is a method of [`DotOp`], which holds what the op
//! fixes (shapes, packed columns, prefetch distances). Split from `mul_mat` so that each
//! loop reads on its own.

use super::*;

/// Rows of a unit of one-column f16 products read in place: eight calls of the kernel's
/// [`hdot::F16_ROWS`] rows, call `t` taking rows `t, t + 8, .., t + 40` of the unit, so that
/// the six rows a call reads side by side are six contiguous stretches of eight rows each,
/// read from front to back through the unit's calls. Each row's prefetch then runs on into
/// the row its stretch needs next, and the six streams restart cold once a unit instead of
/// once a call, as with groups of six consecutive rows (three such groups a unit made the
/// 64 MiB f16 mat-vec of `benches/matvec.rs` 0.82 of the read, median of rounds; these
/// units 0.95, on two threads of a loaded machine; the `f16_strided` loop of
/// `benches/stream_shape.rs` shows the same on one thread).
const F16_UNIT_ROWS: usize = 8 * hdot::F16_ROWS;

/// Rows of a unit of several-column f16 products read in place (`hdot::dot_pairs_f16`):
/// a decode step's `K·Q` has a few hundred rows of 64 elements per head, and each unit costs
/// a claim, a scratch lookup and a store per column.
const F16_PAIRS_UNIT_ROWS: usize = 64;

/// The kernel calls over the `nn` columns of a q4_0 row group (`n` per head): four columns
/// per call share the rows' unpacking, in fours from each head's first column (as without
/// GQA), then one at a time. `call(j, four)` covers column `j` and, if `four`, the three
/// after it.
fn q4_column_calls(nn: usize, n: usize, mut call: impl FnMut(usize, bool)) {
    for h in (0..nn).step_by(n) {
        let mut j = h;
        while j + Q4_COLS <= h + n {
            call(j, true);
            j += Q4_COLS;
        }
        for j in j..h + n {
            call(j, false);
        }
    }
}

/// Rows of a unit of plain q4_0 products by the `q4tiles` kernel: four calls of sixteen
/// consecutive rows, each asking for the next call's rows as it goes (one sequential stream
/// from memory). From DRAM (8192 × 16384 weights, two threads, `benches/matvec.rs`, six
/// alternated runs on a loaded machine) the product took 1.17–1.39 times the read's time
/// (median 1.27) this way against 1.21–1.45 (median 1.37) with the earlier order: call `t`
/// taking rows `t, t + 4, .., t + 60`, so that each of its sixteen streams ran on through
/// four consecutive rows, each row prefetched ahead of itself. (That order had beaten
/// sixteen consecutive rows prefetched row by row, 1.20–1.29 against 1.41–1.54.) On Intel
/// cores one-column products take that earlier order again, with each row prefetched on
/// into the next (`q4tiles::interleaves`, measured on a Sapphire Rapids host), and so do
/// one-column plain q4_1 products there (`DotOp::q4_1_interleaved`), where the rows' stride
/// spreads a call's rows over the L1 sets (`q4tiles::interleaved_rows_spread`).
const Q4_UNIT_ROWS: usize = q4tiles::INTERLEAVED_ROWS;

/// Calls in a block of [`q4tiles::INTERLEAVED_ROWS`] interleaved rows: call `t` takes rows
/// `t, t + INTERLEAVED_CALLS, ..` of the block.
const INTERLEAVED_CALLS: usize = q4tiles::INTERLEAVED_ROWS / q4tiles::ROWS;
// The q4_1 sixteen-row calls fill the same blocks as the q4_0 ones.
const _: () = assert!(qdot::ROWS16 == q4tiles::ROWS);

/// The whole blocks of [`q4tiles::INTERLEAVED_ROWS`] rows among the first `rows`, as
/// [`INTERLEAVED_CALLS`] interleaved sixteen-row calls a block (`q4tiles::interleaves`):
/// `call(first, on)` computes rows `first, first + INTERLEAVED_CALLS, ..`, each row's
/// prefetch running on `on` rows further (into the next call's row; the block's last call's
/// into the next block's first call's), and each result goes to its row of `out`. Returns
/// the rows done.
fn interleaved_blocks(
    rows: usize,
    out: &mut [f32],
    mut call: impl FnMut(usize, usize) -> [f32; q4tiles::ROWS],
) -> usize {
    let blocks = rows / q4tiles::INTERLEAVED_ROWS * q4tiles::INTERLEAVED_ROWS;
    for b0 in (0..blocks).step_by(q4tiles::INTERLEAVED_ROWS) {
        for t in 0..INTERLEAVED_CALLS {
            let on = if t + 1 < INTERLEAVED_CALLS {
                1
            } else {
                q4tiles::INTERLEAVED_ROWS - (INTERLEAVED_CALLS - 1)
            };
            for (i, v) in call(b0 + t, on).into_iter().enumerate() {
                out[b0 + t + INTERLEAVED_CALLS * i] = v;
            }
        }
    }
    blocks
}

/// The kernel family that computes the units of one op on the dot path, chosen once per op
/// ([`DotOp::new`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum DotPath {
    /// Plain q4_0, q4_1 or q8_0 rows against several columns: each unit (one group of
    /// sixteen rows) is repacked into scratch and the repacked kernels run on it
    /// ([`repack_on_the_fly`]); a short last unit takes [`DotPath::Rows`].
    Transient,
    /// f32 rows against at least [`F32_TILE_MIN_N`] columns: register tiles.
    TilesF32,
    /// f16 rows against several columns in the one-column order (a decode step's attention
    /// with grouped-query heads), read in place (`hdot::dot_pairs_f16`).
    PairsF16,
    /// f16 rows against one column, read in place and converted in registers
    /// (`hdot::dot_rows_f16`).
    DirectF16,
    /// Groups of rows against the columns: plain q4_0 sixteen rows a call where the CPU has
    /// `q4tiles`, q4_1 and q8_0 by `qdot`, the rest of q4_0 by `quant`'s eight-row kernel,
    /// f16 converted into scratch (`hdot`), f32 by `quant::dot_f32_rows`.
    Rows,
}

/// What `mul_mat` hands the dot path: the weights (not in a repacked layout), the result,
/// the packed columns and the CPU's kernels.
pub(super) struct Operands<'a> {
    pub a: &'a TView,
    pub dst: &'a TView,
    /// Quantized columns (`cols.bytes`, empty for f32 and f16 weights) and the column counts.
    pub cols: PackedCols<'a>,
    /// f32 columns, `k` floats each (empty for quantized weights).
    pub fcols: &'a [f32],
    /// How many result matrices share one matrix of `a`, along dimensions 2 and 3.
    pub r2: usize,
    pub r3: usize,
    pub isa: quant::Isa,
}

/// One op on the dot path: its operands and what they fix for all its units (the kernel
/// family, the unit size, prefetch distances). A unit is `unit_rows` rows of one matrix of
/// the weights against the `nn` columns of the `bh` result matrices that share it.
pub(super) struct DotOp<'a> {
    operands: Operands<'a>,
    path: DotPath,
    unit_rows: usize,
    /// Bytes of one row of the weights.
    row_len: usize,
    /// The f16 summation order (`hdot`) for this shape.
    half_order: hdot::Order,
    /// q4_1 and q8_0: the `qdot` kind (ggml's integer order).
    ggml_order: Option<qdot::WeightKind>,
    /// Plain q4_0 rows by `q4tiles` (units of [`Q4_UNIT_ROWS`]).
    wide_q4: bool,
    /// Of those, rows that follow each other, against one column, in interleaved blocks of
    /// calls ([`DotOp::q4tiles_interleaved`]) where the column is expanded.
    interleaved_q4_0: bool,
    /// Plain q4_1 rows that follow each other, against one column, in interleaved blocks of
    /// calls (units of [`Q4_UNIT_ROWS`]; [`DotOp::q4_1_interleaved`]).
    interleaved_q4_1: bool,
    /// How far on the `qdot` kernels prefetch (their next call's rows; 0 where rows do not
    /// follow each other).
    qdot_prefetch: usize,
}

/// One unit of a [`DotOp`]: its rows, and where they are.
struct Unit<'a> {
    /// The first of the `bh` result matrices (and column groups) of the unit.
    batch0: usize,
    /// The matrix `(a2, a3)` of the weights.
    a2: usize,
    a3: usize,
    rows: std::ops::Range<usize>,
    /// The unit's rows where they are dense, bounds-checked once: row `rows.start + i` is
    /// `row_len` bytes at `i · nb[1]` (empty otherwise).
    span: &'a [u8],
}

impl<'a> DotOp<'a> {
    /// Chooses the kernel family for the operands.
    pub(super) fn new(operands: Operands<'a>) -> DotOp<'a> {
        let (a, isa) = (operands.a, operands.isa);
        let (k, m, n, nn) = (a.ne[0], a.ne[1], operands.cols.n, operands.cols.nn);
        let half_order = hdot::Order::for_shape(k, m, n);
        let in_place_f16 = a.ty == ElementType::F16
            && half_order == hdot::Order::VecDot
            && a.rows_contiguous()
            && hdot::has_direct_f16();
        // `Isa::Avx512` includes VNNI and is never chosen under Miri.
        let transient =
            repack_on_the_fly(a.ty, nn) && a.rows_contiguous() && isa == quant::Isa::Avx512;
        let path = if transient {
            DotPath::Transient
        } else if a.ty == ElementType::F32 && n >= F32_TILE_MIN_N {
            DotPath::TilesF32
        } else if in_place_f16 && nn >= 2 {
            DotPath::PairsF16
        } else if in_place_f16 {
            DotPath::DirectF16
        } else {
            DotPath::Rows
        };
        let wide_q4 = a.ty == ElementType::Q4_0 && a.rows_contiguous() && q4tiles::available();
        // Rows that follow each other in memory: the `qdot` kernels prefetch the next group.
        let qdot_prefetch = if a.nb[1] == a.ty.row_size(k) {
            ROWS * a.nb[1]
        } else {
            0
        };
        // One column over rows that follow each other, four rows' stride spreading an
        // interleaved call's rows over the L1 sets: plain q4_0 and q4_1 may go in
        // interleaved blocks of calls, on the CPUs where that is faster.
        let interleavable = matches!(a.ty, ElementType::Q4_0 | ElementType::Q4_1)
            && nn == 1
            && qdot_prefetch != 0
            && q4tiles::interleaved_rows_spread(a.nb[1]);
        let interleaved_q4_0 = wide_q4 && interleavable && q4tiles::interleaves();
        let interleaved_q4_1 = a.ty == ElementType::Q4_1
            && interleavable
            && isa == quant::Isa::Avx512
            && qdot::interleaves_q4_1();
        let unit_rows = match path {
            DotPath::DirectF16 => F16_UNIT_ROWS,
            DotPath::PairsF16 => F16_PAIRS_UNIT_ROWS,
            DotPath::Rows if wide_q4 || interleaved_q4_1 => Q4_UNIT_ROWS,
            _ => MM_ROWS,
        };
        DotOp {
            operands,
            path,
            unit_rows,
            row_len: a.ty.row_size(k),
            half_order,
            ggml_order: qdot_kind(a.ty),
            wide_q4,
            interleaved_q4_0,
            interleaved_q4_1,
            qdot_prefetch,
        }
    }

    /// Row blocks of a weight matrix (units of `unit_rows` rows).
    fn mblocks(&self) -> usize {
        self.operands.a.ne[1].div_ceil(self.unit_rows)
    }

    /// The op's units: each weight matrix's row blocks against the result matrices that
    /// share it.
    pub(super) fn units(&self) -> usize {
        let dst = self.operands.dst;
        dst.ne[2] * dst.ne[3] / self.operands.cols.bh * self.mblocks()
    }

    /// A unit's multiply-adds, as the split's cost hint (saturating: only compared).
    pub(super) fn unit_cost(&self) -> usize {
        let (k, nn) = (self.operands.a.ne[0], self.operands.cols.nn);
        self.unit_rows.saturating_mul(k).saturating_mul(nn)
    }

    /// Units `units` (of [`DotOp::units`]), on the calling thread.
    pub(super) fn run(&self, units: Range<usize>, ts: &mut ThreadScratch) {
        // Row blocks computed as one unit: those of a claim, up to RUN_FLOATS results, where
        // the family's loop takes any row count (the others keep their own order).
        let run_blocks = match self.path {
            DotPath::Rows => (RUN_FLOATS / (self.unit_rows * self.operands.cols.nn)).max(1),
            _ => 1,
        };
        for (bi, mbs) in runs(units, self.mblocks(), run_blocks) {
            self.unit(bi, mbs, ts);
        }
    }

    /// Row blocks `mbs` of the `bh` result matrices from `bi · bh` on.
    fn unit(&self, bi: usize, mbs: Range<usize>, ts: &mut ThreadScratch) {
        let (a, dst, bh, nn) = (
            self.operands.a,
            self.operands.dst,
            self.operands.cols.bh,
            self.operands.cols.nn,
        );
        let batch0 = bi * bh;
        let (i2_0, i3) = (batch0 % dst.ne[2], batch0 / dst.ne[2]);
        let (a2, a3) = (i2_0 / self.operands.r2, i3 / self.operands.r3);
        let rows = mbs.start * self.unit_rows..(mbs.end * self.unit_rows).min(a.ne[1]);
        let nr = rows.len();
        let span = if a.rows_contiguous() {
            a.rows_bytes(rows.start, nr, a2, a3)
        } else {
            &[]
        };
        let u = Unit {
            batch0,
            a2,
            a3,
            rows,
            span,
        };
        let ThreadScratch {
            a: fa, c, bytes, ..
        } = ts;
        let out = grow(c, nr * nn);
        match self.path {
            DotPath::Transient if nr == repack::GROUP_ROWS => self.transient(&u, bytes, out),
            DotPath::TilesF32 => self.tiles_f32(&u, fa, out),
            DotPath::PairsF16 => self.pairs_f16(&u, out),
            DotPath::DirectF16 => self.direct_f16(&u, out),
            _ => self.row_groups(&u, fa, out),
        }
        for jj in 0..nn {
            let (h, j) = (jj / self.operands.cols.n, jj % self.operands.cols.n);
            dst.store_f32(u.rows.start, j, i2_0 + h, i3, &out[jj * nr..(jj + 1) * nr]);
        }
    }

    /// Packed quantized column `j` of the unit (of `nn`).
    #[inline]
    fn qcol(&self, u: &Unit<'_>, j: usize) -> &'a [u8] {
        self.operands.cols.col(u.batch0, j)
    }

    /// f32 column `j` of the unit (of `nn`).
    #[inline]
    fn fcol(&self, u: &Unit<'_>, j: usize) -> &'a [f32] {
        let (c, k) = (u.batch0 * self.operands.cols.n + j, self.operands.a.ne[0]);
        &self.operands.fcols[c * k..(c + 1) * k]
    }

    /// Row `rows.start + i` of the unit, in place (dense rows only).
    #[inline]
    fn row<'u>(&self, u: &Unit<'u>, i: usize) -> &'u [u8] {
        let o = i * self.operands.a.nb[1];
        &u.span[o..o + self.row_len]
    }

    /// [`DotPath::Transient`]: the unit's sixteen rows repacked into `group`.
    fn transient(&self, u: &Unit<'_>, group: &mut Vec<u8>, out: &mut [f32]) {
        let Operands { a, cols, isa, .. } = &self.operands;
        let rws: [&[u8]; repack::GROUP_ROWS] = std::array::from_fn(|i| self.row(u, i));
        let group = grow(group, repack::GROUP_ROWS * self.row_len);
        repack::pack_group(a.ty, a.ne[0], &rws, group);
        let col = |j| self.qcol(u, j);
        repacked_group(*isa, a.ty, group, cols.nn, (u.rows.len(), 0), out, col);
    }

    /// [`DotPath::TilesF32`]: one call per head (the tiles' slicing depends on the column
    /// count).
    fn tiles_f32(&self, u: &Unit<'_>, scratch: &mut Vec<f32>, out: &mut [f32]) {
        let Operands {
            a,
            cols,
            fcols,
            isa,
            ..
        } = &self.operands;
        let (nr, n, k) = (u.rows.len(), cols.n, a.ne[0]);
        let rws: [&[f32]; MM_ROWS] =
            f32_rows(a, |i| u.rows.start + i.min(nr - 1), u.a2, u.a3, scratch);
        for h in 0..cols.bh {
            let batch = u.batch0 + h;
            let head = &fcols[batch * n * k..(batch + 1) * n * k];
            mul_mat_tiles_f32(*isa, &rws[..nr], head, k, &mut out[h * n * nr..]);
        }
    }

    /// [`DotPath::PairsF16`]: rows `per` at a time against columns `cw` at a time, at most
    /// `F16_PAIRS` products a call.
    fn pairs_f16(&self, u: &Unit<'_>, out: &mut [f32]) {
        let (nr, nn) = (u.rows.len(), self.operands.cols.nn);
        let cw = nn.min(hdot::F16_PAIRS);
        let per = (hdot::F16_PAIRS / cw).min(nr);
        let mut d = [0.0f32; hdot::F16_PAIRS];
        for r0 in (0..nr).step_by(per) {
            let rn = per.min(nr - r0);
            let mut rws: [&[u8]; hdot::F16_PAIRS] = [&[]; hdot::F16_PAIRS];
            for (i, r) in rws.iter_mut().enumerate().take(rn) {
                *r = self.row(u, r0 + i);
            }
            for j0 in (0..nn).step_by(cw) {
                let cn = cw.min(nn - j0);
                let mut cls: [&[f32]; hdot::F16_PAIRS] = [&[]; hdot::F16_PAIRS];
                for (j, cl) in cls.iter_mut().enumerate().take(cn) {
                    *cl = self.fcol(u, j0 + j);
                }
                hdot::dot_pairs_f16(&rws[..rn], &cls[..cn], &mut d[..rn * cn]);
                // Element by element: a copy of a few floats of run-time length is a call
                // to `memmove`.
                for c in 0..cn {
                    for r in 0..rn {
                        out[(j0 + c) * nr + r0 + r] = d[c * rn + r];
                    }
                }
            }
        }
    }

    /// [`DotPath::DirectF16`]: call `t` reads rows `t + b·j` (see [`F16_UNIT_ROWS`]; a short
    /// last unit has shorter stretches, and a call past the unit's end repeats its last row
    /// and drops that result: a row's result does not depend on the other rows of its call).
    fn direct_f16(&self, u: &Unit<'_>, out: &mut [f32]) {
        let nr = u.rows.len();
        let b = nr.div_ceil(hdot::F16_ROWS);
        let at = |t: usize, j: usize| (t + b * j).min(nr - 1);
        let col = self.fcol(u, 0);
        for t in 0..b {
            let rs = std::array::from_fn(|j| self.row(u, at(t, j)));
            let d = hdot::dot_rows_f16(rs, col);
            for (j, &v) in d.iter().enumerate() {
                if t + b * j < nr {
                    out[t + b * j] = v;
                }
            }
        }
    }

    /// [`DotPath::Rows`]: plain q4_0 rows sixteen at a time where the CPU allows
    /// (`q4tiles`, the same bits as the eight-row kernel), then groups of rows that share
    /// each column load (a short last group repeats its last row and drops the extra
    /// results; a row's result does not depend on the other rows of its group).
    fn row_groups(&self, u: &Unit<'_>, scratch: &mut Vec<f32>, out: &mut [f32]) {
        let (nr, isa, nn) = (u.rows.len(), self.operands.isa, self.operands.cols.nn);
        let wide = if self.wide_q4 {
            nr / q4tiles::ROWS * q4tiles::ROWS
        } else {
            0
        };
        self.q4tiles_rows(u, wide, out);
        // One column (a decode step) of q4_1 or q8_0: sixteen rows per call.
        let sixteen = self.ggml_order.is_some() && nn == 1;
        let wide = if self.interleaved_q4_1 {
            self.q4_1_interleaved(u, out)
        } else {
            wide
        };
        let group = match self.operands.a.ty {
            _ if sixteen => qdot::ROWS16,
            ElementType::Q4_0 | ElementType::Q4_1 | ElementType::Q8_0 => ROWS,
            _ => F32_ROWS,
        };
        for g0 in (wide..nr).step_by(group) {
            let g = (nr - g0).min(group);
            let mut put = |j: usize, d: &[f32]| {
                out[j * nr + g0..j * nr + g0 + g].copy_from_slice(&d[..g]);
            };
            // Row `g0 + i` of the unit, the group's last for `i` past its end.
            let at = |i: usize| g0 + i.min(g - 1);
            match (self.ggml_order, self.operands.a.ty) {
                (Some(kind), _) if sixteen => {
                    // The sixteen-row kernels' next call is sixteen rows on.
                    let prefetch = qdot::ROWS16 / ROWS * self.qdot_prefetch;
                    let rws = std::array::from_fn(|i| self.row(u, at(i)));
                    put(
                        0,
                        &qdot::dot_rows16(isa, kind, rws, self.qcol(u, 0), prefetch),
                    );
                }
                (Some(kind), _) => {
                    let rws = std::array::from_fn(|i| self.row(u, at(i)));
                    let col = |j| self.qcol(u, j);
                    let prefetch = self.qdot_prefetch;
                    qdot_group(isa, kind, rws, nn, col, prefetch, &mut put);
                }
                (None, ElementType::Q4_0) => {
                    let rws: [&[u8]; ROWS] = std::array::from_fn(|i| self.row(u, at(i)));
                    self.q4_0_rows8(u, rws, &mut put);
                }
                (None, ElementType::F16) => {
                    let rws = self.f32_group(u, at, scratch);
                    self.f16_converted(u, rws, &mut put);
                }
                _ => {
                    let rws = self.f32_group(u, at, scratch);
                    for j in 0..nn {
                        put(j, &quant::dot_f32_rows(isa, rws, self.fcol(u, j)));
                    }
                }
            }
        }
    }

    /// Rows `at(0)`, …, `at(F32_ROWS − 1)` of the unit as f32 ([`f32_rows`]: in place, or
    /// converted into `scratch`).
    fn f32_group<'s>(
        &'s self,
        u: &Unit<'_>,
        at: impl Fn(usize) -> usize,
        scratch: &'s mut Vec<f32>,
    ) -> [&'s [f32]; F32_ROWS] {
        let a = self.operands.a;
        f32_rows(a, |i| u.rows.start + at(i), u.a2, u.a3, scratch)
    }

    /// The unit's first `wide` plain q4_0 rows by `q4tiles`, each call prefetching the
    /// next call's rows where rows follow each other (see [`Q4_UNIT_ROWS`]), or for one
    /// column on the CPUs where that is faster in interleaved blocks ([`Self::q4tiles_interleaved`])
    /// when the rows' stride spreads those blocks' calls over the L1 sets (`interleaved_q4_0`,
    /// from `q4tiles::interleaved_rows_spread`; otherwise each row runs on into the next
    /// call's, `q4tiles::Prefetch::consecutive`).
    fn q4tiles_rows(&self, u: &Unit<'_>, wide: usize, out: &mut [f32]) {
        let (nr, nb1) = (u.rows.len(), self.operands.a.nb[1]);
        let next = self.qdot_prefetch / ROWS * q4tiles::ROWS;
        let interleaved = match self.operands.cols.expanded(u.batch0, 0) {
            Some(col) if self.interleaved_q4_0 => self.q4tiles_interleaved(u, wide, col, out),
            _ => 0,
        };
        for r0 in (interleaved..wide).step_by(q4tiles::ROWS) {
            let rws = &u.span[r0 * nb1..];
            q4_column_calls(self.operands.cols.nn, self.operands.cols.n, |j, four| {
                let mut put = |c: usize, d: &[f32; q4tiles::ROWS]| {
                    let at = (j + c) * nr + r0;
                    out[at..at + q4tiles::ROWS].copy_from_slice(d);
                };
                // The first call over these rows brings the next ones in.
                let next = if j == 0 { next } else { 0 };
                if four {
                    let cols = std::array::from_fn(|c| self.qcol(u, j + c));
                    let d = q4tiles::dot_rows16::<Q4_COLS>(rws, nb1, cols, next);
                    d.iter().enumerate().for_each(|(c, d)| put(c, d));
                } else {
                    let [d] = match self.operands.cols.expanded(u.batch0, j) {
                        Some(e) => {
                            let nb = self.operands.a.ne[0] / quant::QK;
                            let prefetch = q4tiles::Prefetch::consecutive(next);
                            q4tiles::dot_rows16_expanded(rws, nb1, [e], nb, prefetch)
                        }
                        None => q4tiles::dot_rows16(rws, nb1, [self.qcol(u, j)], next),
                    };
                    put(0, &d);
                }
            });
        }
    }

    /// The unit's whole blocks of [`q4tiles::INTERLEAVED_ROWS`] consecutive rows (of its
    /// first `wide`) against its one expanded column `col`, four interleaved calls a block:
    /// call `t` takes rows `t, t + 4, .., t + 60` of the block, and each of its rows is
    /// prefetched on into the next row (call `t + 1`'s), the last call's into the next
    /// block's first call's ([`q4tiles::interleaves`]). Returns the rows done.
    fn q4tiles_interleaved(&self, u: &Unit<'_>, wide: usize, col: &[u8], out: &mut [f32]) -> usize {
        let (nb1, nb) = (self.operands.a.nb[1], self.operands.a.ne[0] / quant::QK);
        interleaved_blocks(wide, out, |first, on| {
            let prefetch = q4tiles::Prefetch::EachRow(on * nb1);
            let rws = &u.span[first * nb1..];
            let [d] =
                q4tiles::dot_rows16_expanded(rws, INTERLEAVED_CALLS * nb1, [col], nb, prefetch);
            d
        })
    }

    /// The unit's whole blocks of [`q4tiles::INTERLEAVED_ROWS`] plain q4_1 rows against its
    /// one column, four interleaved calls a block as [`Self::q4tiles_interleaved`] does: call
    /// `t` takes rows `t, t + 4, .., t + 60` of the block, each row's prefetch running on
    /// into the next row (call `t + 1`'s), the last call's into the next block's first
    /// call's (`qdot::interleaves_q4_1`). Returns the rows done.
    fn q4_1_interleaved(&self, u: &Unit<'_>, out: &mut [f32]) -> usize {
        let (isa, nb1) = (self.operands.isa, self.operands.a.nb[1]);
        let col = self.qcol(u, 0);
        interleaved_blocks(u.rows.len(), out, |first, on| {
            let rws = std::array::from_fn(|i| self.row(u, first + INTERLEAVED_CALLS * i));
            qdot::dot_rows16(isa, qdot::WeightKind::Q4_1, rws, col, on * nb1)
        })
    }

    /// Eight plain q4_0 rows by `quant`'s kernel, four columns a call where they come in
    /// fours ([`q4_column_calls`]).
    fn q4_0_rows8(&self, u: &Unit<'_>, rws: [&[u8]; ROWS], put: &mut impl FnMut(usize, &[f32])) {
        q4_column_calls(self.operands.cols.nn, self.operands.cols.n, |j, four| {
            if four {
                let cols = std::array::from_fn(|c| self.qcol(u, j + c));
                let d = quant::dot_q4_0_q8_0_rows::<Q4_COLS>(self.operands.isa, rws, cols);
                for (c, d) in d.iter().enumerate() {
                    put(j + c, d);
                }
            } else {
                let [d] = quant::dot_q4_0_q8_0_rows(self.operands.isa, rws, [self.qcol(u, j)]);
                put(j, &d);
            }
        });
    }

    /// f16 rows converted into scratch (`rws`) against the columns in the shape's `hdot`
    /// order: tiles of four rows and four columns for tiny shapes (a short last tile repeats
    /// its last column), else one column at a time.
    fn f16_converted(
        &self,
        u: &Unit<'_>,
        rws: [&[f32]; F32_ROWS],
        put: &mut impl FnMut(usize, &[f32]),
    ) {
        let nn = self.operands.cols.nn;
        let col = |j: usize| self.fcol(u, j.min(nn - 1));
        if self.half_order != hdot::Order::Tiny {
            for j in 0..nn {
                put(j, &hdot::dot_rows(self.half_order, rws, col(j)));
            }
            return;
        }
        for j0 in (0..nn).step_by(hdot::TILE_COLS) {
            let cls = std::array::from_fn(|c| col(j0 + c));
            let mut d = [[0.0f32; F32_ROWS]; hdot::TILE_COLS];
            for h in (0..F32_ROWS).step_by(hdot::TILE_ROWS) {
                let rs = std::array::from_fn(|r| rws[h + r]);
                let t = hdot::dot_tile(self.operands.isa, rs, cls);
                for (dc, tc) in d.iter_mut().zip(&t) {
                    dc[h..h + hdot::TILE_ROWS].copy_from_slice(tc);
                }
            }
            for (c, dc) in d.iter().enumerate().take(nn - j0) {
                put(j0 + c, dc);
            }
        }
    }
}

/// Rows `row(0)`, …, `row(N − 1)` of the matrix `(i2, i3)` of `a` as f32 slices: the
/// tensor's own rows when they are f32 and aligned, else converted (or copied) into
/// `scratch`, one row after the other.
fn f32_rows<'a, const N: usize>(
    a: &'a TView,
    row: impl Fn(usize) -> usize,
    i2: usize,
    i3: usize,
    scratch: &'a mut Vec<f32>,
) -> [&'a [f32]; N] {
    let direct: [Option<&[f32]>; N] = std::array::from_fn(|j| a.f32_row(row(j), i2, i3));
    if direct.iter().all(Option::is_some) {
        return direct.map(Option::unwrap_or_default);
    }
    let k = a.ne[0];
    let x = grow(scratch, N * k);
    for (j, xr) in x.chunks_exact_mut(k).enumerate() {
        a.load_f32(0, row(j), i2, i3, xr);
    }
    let x = &*x;
    std::array::from_fn(|j| &x[j * k..(j + 1) * k])
}

/// `out[j · nr + i] = rows[i] · cols[j]` for the `nr = rows.len()` weight rows (each at
/// least `k` long) and `n = cols.len() / k` columns of a batched f32 product, in
/// [`quant::dot_f32_tile`] tiles.
///
/// The length is cut into slices (of [`TILE_COL_FLOATS`] / `n` floats, 256 to 1024) so
/// that one tile's rows and columns stay in L1 and a unit's rows and all its columns in L2
/// while every tile of the unit uses them; each slice's results are added to `out` in slice
/// order. A short last tile repeats its last row or column and drops those results, so a
/// result depends only on its row, its column and `k`.
fn mul_mat_tiles_f32(isa: quant::Isa, rows: &[&[f32]], cols: &[f32], k: usize, out: &mut [f32]) {
    use quant::{TILE_COLS, TILE_ROWS};
    // Indexing: the caller passes `k > 0`, at least `F32_TILE_MIN_N` columns and one row, and
    // `out` of at least `nr * n` floats; `(i0 + t).min(nr - 1)` and `cj(t)` clamp to them.
    let (nr, n) = (rows.len(), cols.len() / k);
    out[..nr * n].fill(0.0);
    let kc = (TILE_COL_FLOATS / n).clamp(256, 1024) / 8 * 8;
    for kb in (0..k).step_by(kc) {
        let ke = (kb + kc).min(k);
        for i0 in (0..nr).step_by(TILE_ROWS) {
            let rws: [&[f32]; TILE_ROWS] =
                std::array::from_fn(|t| &rows[(i0 + t).min(nr - 1)][kb..ke]);
            for j0 in (0..n).step_by(TILE_COLS) {
                let cj = |t: usize| (j0 + t).min(n - 1);
                let cls: [&[f32]; TILE_COLS] =
                    std::array::from_fn(|t| &cols[cj(t) * k + kb..cj(t) * k + ke]);
                let d = quant::dot_f32_tile(isa, rws, cls);
                for (t, d) in d.iter().enumerate().take(n - j0) {
                    let o = &mut out[(j0 + t) * nr + i0..];
                    for (o, v) in o.iter_mut().zip(d).take(nr - i0) {
                        *o += v;
                    }
                }
            }
        }
    }
}

/// The `qdot` weight kind of a type whose products follow ggml's integer order.
fn qdot_kind(ty: ElementType) -> Option<qdot::WeightKind> {
    match ty {
        ElementType::Q4_1 => Some(qdot::WeightKind::Q4_1),
        ElementType::Q8_0 => Some(qdot::WeightKind::Q8_0),
        _ => None,
    }
}

/// Rows per call of the many-column `qdot` kernel (with [`QDOT_COLS`] columns: sixteen
/// eight-lane accumulators, AVX2's register count).
const QDOT_ROWS: usize = 4;
/// Columns per call of the many-column `qdot` kernel.
const QDOT_COLS: usize = 4;

/// Whether plain weights of `ty` against `nn` columns are repacked on the fly, a group of
/// sixteen rows at a time into scratch (`repack::pack_group`, about 1.3–1.7 µs a group of
/// 4096-element rows), for the repacked kernels (on AVX-512 VNNI CPUs): where those beat
/// the plain kernels with the copy included. One thread, 4096 × 256 weights in L2
/// (`THIN_N=… cargo bench -p cpu-kernels --bench thin_cpu`, two alternated runs, µs per
/// product, plain kernels against repacked on the fly):
///
/// * q4_0 from 16 columns: ×2 23–24 against 36–49, ×4 37–38 against 43–55, ×8 75–79
///   against 65–84, ×16 151–154 against 110–134 (the `q4tiles` kernel takes four columns
///   at a time, so up to eight it keeps up);
/// * q4_1 from 4: ×2 36 against 41–54, ×4 95–114 against 54–73, ×8 96–105 against 80–81,
///   ×16 193–223 against 137–139;
/// * q8_0 for 4 to 7 columns and from 64: ×2 40–54 against 42, ×4 101 against 62, ×8 91–92
///   against 101–104 and ×16 178–181 against 182–185 (from eight columns the plain rows go
///   through eight-by-eight tiles), ×32 355–388 against 323–328, ×64 704–740 against
///   640–643, ×128 1432–1436 against 1256–1299; two threads, 4096 × 4096
///   (`benches/kernels.rs`), ×32 was 2.64–2.98 ms against 2.88–3.05.
fn repack_on_the_fly(ty: ElementType, nn: usize) -> bool {
    match ty {
        ElementType::Q4_0 => nn >= 16,
        ElementType::Q4_1 => nn >= 4,
        ElementType::Q8_0 => nn >= 64 || (4..8).contains(&nn),
        _ => false,
    }
}

/// One group of [`ROWS`] weight rows against the `n` columns `col(0..n)`, handing each
/// column's results to `put`: one column at a time with all rows when `n` is small (decode),
/// else [`QDOT_ROWS`] × [`QDOT_COLS`] tiles so a weight block is unpacked once for several
/// columns. Each result is one row dotted with one column, whatever the tiling.
fn qdot_group<'c>(
    isa: quant::Isa,
    kind: qdot::WeightKind,
    rows: [&[u8]; ROWS],
    n: usize,
    col: impl Fn(usize) -> &'c [u8],
    prefetch: usize,
    put: &mut impl FnMut(usize, &[f32]),
) {
    let mut j = 0;
    // Eight rows by eight columns per call where the kernel has such tiles (`q4_1` and
    // `q8_0` with AVX-512 VNNI): one pass over a weight block for eight columns.
    if ROWS == qdot::TILE && isa == quant::Isa::Avx512 {
        while j + qdot::TILE <= n {
            let cols: [&[u8]; qdot::TILE] = std::array::from_fn(|c| col(j + c));
            let rows: [&[u8]; qdot::TILE] = std::array::from_fn(|r| rows[r]);
            let d = qdot::dot_tile(isa, kind, rows, cols, prefetch);
            for (c, dc) in d.iter().enumerate() {
                put(j + c, dc);
            }
            j += qdot::TILE;
        }
    }
    while j + QDOT_COLS <= n {
        let cols: [&[u8]; QDOT_COLS] = std::array::from_fn(|c| col(j + c));
        let mut d = [[0.0f32; ROWS]; QDOT_COLS];
        for h in 0..ROWS / QDOT_ROWS {
            let rs: [&[u8]; QDOT_ROWS] = std::array::from_fn(|r| rows[h * QDOT_ROWS + r]);
            let part = qdot::dot_rows(isa, kind, rs, cols, prefetch);
            for (dc, pc) in d.iter_mut().zip(&part) {
                dc[h * QDOT_ROWS..(h + 1) * QDOT_ROWS].copy_from_slice(pc);
            }
        }
        for (c, dc) in d.iter().enumerate() {
            put(j + c, dc);
        }
        j += QDOT_COLS;
    }
    for j in j..n {
        let [d] = qdot::dot_rows(isa, kind, rows, [col(j)], prefetch);
        put(j, &d);
    }
}
