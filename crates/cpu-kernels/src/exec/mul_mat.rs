//! Matrix products (MUL_MAT): the dispatch by weight type and column count, and its paths —
//! the dot path over rows of quantized or f16 weights (decode), register tiles for f32
//! weights with few columns, our AVX-512 `sgemm`, the repacked q4_0 layout and the `gemm`
//! crate. Split from the executor because it is most of its code; the rules of work units
//! and threads are the executor's (`super`).

use super::*;
use crate::{q4tiles, repack};

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
/// sixteen consecutive rows prefetched row by row, 1.20–1.29 against 1.41–1.54.)
const Q4_UNIT_ROWS: usize = 4 * q4tiles::ROWS;

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
        // `dst.ne == [m, n, b.ne2, b.ne3]`, so `i2 / r2 < a.ne2` and `i3 / r3 < a.ne3`. The
        // packed columns are `ncols` slices of `k` floats (or `col_bytes` bytes), sliced by
        // column indices `< ncols`; the products fit `usize` as they count elements (or
        // packed bytes, at most the f32 size) of `b`, whose byte size the graph checked.
        let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
        let n_batch = dst.ne[2] * dst.ne[3];
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
        // Dot-product path: pack src1 columns once (f32, or q8_0 for quantized weights).
        let quantized = a.ty.is_quantized();
        let ncols = n * n_batch;
        // q4_0 rows read the column in `quant`'s own layout (f32 scales, precomputed
        // corrections), q8_0 rows as q8_0 blocks.
        let q4 = a.ty == ElementType::Q4_0;
        // q4_1 and q8_0 rows read the column as `qdot` packs it (ggml's x86 rule).
        let ggml_order = qdot_kind(a.ty);
        let col_bytes = if q4 {
            quant::q8_col_bytes(k)
        } else {
            qdot::col_bytes(k)
        };
        if quantized {
            // Disjoint fields of the scratch: the column buffer and the packed columns (no
            // copy of the column buffer, so a decode step does not allocate).
            let scratch = &mut *self.scratch;
            let tmp = grow(&mut scratch.thread[0].get_mut().a, k);
            let packed = grow(&mut scratch.shared_u8, ncols * col_bytes);
            for c in 0..ncols {
                let (j, i2, i3) = unravel(c, [k, n, dst.ne[2], dst.ne[3]]);
                b.load_f32(0, j, i2, i3, tmp);
                let out = &mut packed[c * col_bytes..(c + 1) * col_bytes];
                if q4 {
                    quant::quantize_q8_col(tmp, out);
                } else {
                    qdot::quantize_col(tmp, out);
                }
            }
        } else {
            let packed = grow(&mut self.scratch.shared_f32, ncols * k);
            for c in 0..ncols {
                let (j, i2, i3) = unravel(c, [k, n, dst.ne[2], dst.ne[3]]);
                let col = &mut packed[c * k..(c + 1) * k];
                b.load_f32(0, j, i2, i3, col);
                round_to_weight_type(a.ty, col);
            }
        }
        let packed_f32 = &self.scratch.shared_f32[..if quantized { 0 } else { ncols * k }];
        let packed_q = &self.scratch.shared_u8[..if quantized { ncols * col_bytes } else { 0 }];
        let row_len = a.ty.row_size(k);
        let isa = quant::Isa::best();
        let tiled = a.ty == ElementType::F32 && n >= F32_TILE_MIN_N;
        let half_order = hdot::Order::for_shape(k, m, n);
        // Rows that follow each other in memory: the `qdot` kernels prefetch the next group.
        let qdot_prefetch = if a.nb[1] == a.ty.row_size(k) {
            ROWS * a.nb[1]
        } else {
            0
        };
        // The sixteen-row kernels' next call is sixteen rows on.
        let qdot16_prefetch = qdot::ROWS16 / ROWS * qdot_prefetch;
        // The `bh` query heads that share one matrix of `a` (GQA: `r2` of them) go in one
        // unit, so that its rows are read (and for f16, converted) once for all of them: the
        // heads' columns are the consecutive packed columns `batch0 · n ..`, `nn` in all.
        let bh = if a.ne[2] * r2 == dst.ne[2] { r2 } else { 1 };
        let nn = bh * n;
        // One-column f16 products read their rows in place, converting in registers
        // (`hdot::dot_rows_f16`), where the CPU has that kernel; with several columns the
        // rows are converted once into scratch and shared by the columns.
        let direct_f16 = a.ty == ElementType::F16
            && half_order == hdot::Order::VecDot
            && nn == 1
            && a.rows_contiguous()
            && hdot::has_direct_f16();
        // Several columns of f16 weights in the one-column order (a decode step's attention
        // with grouped-query heads: `bh` columns per matrix of the KV cache) read their rows
        // in place too, each row converted once for all its columns
        // (`hdot::dot_pairs_f16`).
        let pairs_f16 = a.ty == ElementType::F16
            && half_order == hdot::Order::VecDot
            && nn >= 2
            && a.rows_contiguous()
            && hdot::has_direct_f16();
        // Plain q4_0, q4_1 and q8_0 weights against several columns: each group of sixteen
        // rows is repacked into scratch and the repacked kernels run on it
        // ([`repack_on_the_fly`]; `Isa::Avx512` includes VNNI and is never chosen under Miri).
        let transient = !packed
            && repack_on_the_fly(a.ty, nn)
            && a.rows_contiguous()
            && isa == quant::Isa::Avx512;
        // Plain q4_0 rows where the CPU has the `q4tiles` kernel: units of [`Q4_UNIT_ROWS`].
        let wide_q4 = a.ty == ElementType::Q4_0 && a.rows_contiguous() && q4tiles::available();
        let unit_rows = if direct_f16 {
            F16_UNIT_ROWS
        } else if pairs_f16 {
            F16_PAIRS_UNIT_ROWS
        } else if transient {
            MM_ROWS
        } else if wide_q4 {
            Q4_UNIT_ROWS
        } else {
            MM_ROWS
        };
        let mblocks = m.div_ceil(unit_rows);
        let this = &*self;
        if packed {
            let cols = PackedCols {
                bytes: packed_q,
                col_bytes,
                n,
                nn,
                bh,
            };
            return this.mul_mat_repacked(dst, a, &cols, r2, r3, isa);
        }
        this.par_for_contiguous(n_batch / bh * mblocks, unit_rows * k * nn, |units, ts| {
            for u in units {
                let (batch0, mb) = (u / mblocks * bh, u % mblocks);
                let (i2_0, i3) = (batch0 % dst.ne[2], batch0 / dst.ne[2]);
                let (a2, a3) = (i2_0 / r2, i3 / r3);
                let rows = mb * unit_rows..((mb + 1) * unit_rows).min(m);
                let nr = rows.len();
                let out = grow(&mut ts.c, nr * nn);
                // Packed column `j` of the unit (of `nn`), for quantized weights.
                let qcol = |j: usize| {
                    let c = batch0 * n + j;
                    &packed_q[c * col_bytes..(c + 1) * col_bytes]
                };
                // The unit's rows where they are dense, bounds-checked once: row
                // `rows.start + i` is `row_len` bytes at `i · nb[1]` of `span`.
                let span = if a.rows_contiguous() {
                    a.rows_bytes(rows.start, nr, a2, a3)
                } else {
                    &[]
                };
                let unit_row = |i: usize| {
                    let o = i * a.nb[1];
                    &span[o..o + row_len]
                };
                if transient && nr == repack::GROUP_ROWS {
                    let rws: [&[u8]; repack::GROUP_ROWS] = std::array::from_fn(unit_row);
                    let group = grow(&mut ts.bytes, repack::GROUP_ROWS * row_len);
                    repack::pack_group(a.ty, k, &rws, group);
                    repacked_group(isa, a.ty, group, nn, nr, out, qcol);
                } else if tiled {
                    let rws: [&[f32]; MM_ROWS] =
                        f32_rows(a, |i| rows.start + i.min(nr - 1), a2, a3, &mut ts.a);
                    // One call per head: the tiles' slicing depends on the column count.
                    for h in 0..bh {
                        let batch = batch0 + h;
                        let cols = &packed_f32[batch * n * k..(batch + 1) * n * k];
                        mul_mat_tiles_f32(isa, &rws[..nr], cols, k, &mut out[h * n * nr..]);
                    }
                } else if pairs_f16 {
                    // Rows `per` at a time against columns `cw` at a time: at most
                    // `F16_PAIRS` products a call.
                    let cw = nn.min(hdot::F16_PAIRS);
                    let per = (hdot::F16_PAIRS / cw).min(nr);
                    let mut d = [0.0f32; hdot::F16_PAIRS];
                    for r0 in (0..nr).step_by(per) {
                        let rn = per.min(nr - r0);
                        let mut rws: [&[u8]; hdot::F16_PAIRS] = [&[]; hdot::F16_PAIRS];
                        for (i, r) in rws.iter_mut().enumerate().take(rn) {
                            *r = unit_row(r0 + i);
                        }
                        for j0 in (0..nn).step_by(cw) {
                            let cn = cw.min(nn - j0);
                            let mut cls: [&[f32]; hdot::F16_PAIRS] = [&[]; hdot::F16_PAIRS];
                            for (j, cl) in cls.iter_mut().enumerate().take(cn) {
                                let c = batch0 * n + j0 + j;
                                *cl = &packed_f32[c * k..(c + 1) * k];
                            }
                            hdot::dot_pairs_f16(&rws[..rn], &cls[..cn], &mut d[..rn * cn]);
                            // Element by element: a copy of a few floats of run-time
                            // length is a call to `memmove`.
                            for c in 0..cn {
                                for r in 0..rn {
                                    out[(j0 + c) * nr + r0 + r] = d[c * rn + r];
                                }
                            }
                        }
                    }
                } else if direct_f16 {
                    // Call `t` reads rows `t + b·j` (see F16_UNIT_ROWS; a short last unit
                    // has shorter stretches, and a call past the unit's end repeats its last
                    // row and drops that result: a row's result does not depend on the other
                    // rows of its call).
                    let b = nr.div_ceil(hdot::F16_ROWS);
                    let at = |t: usize, j: usize| (t + b * j).min(nr - 1);
                    let c = batch0 * n;
                    let col = &packed_f32[c * k..(c + 1) * k];
                    for t in 0..b {
                        let rs = std::array::from_fn(|j| unit_row(at(t, j)));
                        let d = hdot::dot_rows_f16(rs, col);
                        for (j, &v) in d.iter().enumerate() {
                            if t + b * j < nr {
                                out[t + b * j] = v;
                            }
                        }
                    }
                } else {
                    // Groups of weight rows share each column load (a short last group repeats
                    // its last row and drops the extra results; a row's result does not depend
                    // on the other rows of its group).
                    // One column (a decode step) of q4_1 or q8_0: sixteen rows per call.
                    let sixteen = ggml_order.is_some() && nn == 1;
                    let group = match a.ty {
                        _ if sixteen => qdot::ROWS16,
                        ElementType::Q4_0 | ElementType::Q4_1 | ElementType::Q8_0 => ROWS,
                        _ => F32_ROWS,
                    };
                    let qrow = |i: usize| unit_row(i - rows.start);
                    // Plain q4_0 rows sixteen at a time where the CPU allows (`q4tiles`; the
                    // same bits as the eight-row kernel): the unit's first `wide` rows, each
                    // call prefetching the next call's rows where rows follow each other (see
                    // [`Q4_UNIT_ROWS`]); the rest go below.
                    let wide = if wide_q4 {
                        nr / q4tiles::ROWS * q4tiles::ROWS
                    } else {
                        0
                    };
                    let next = qdot_prefetch / ROWS * q4tiles::ROWS;
                    for r0 in (0..wide).step_by(q4tiles::ROWS) {
                        let rws = &span[r0 * a.nb[1]..];
                        q4_column_calls(nn, n, |j, four| {
                            let mut put = |c: usize, d: &[f32; q4tiles::ROWS]| {
                                let at = (j + c) * nr + r0;
                                out[at..at + q4tiles::ROWS].copy_from_slice(d);
                            };
                            // The first call over these rows brings the next ones in.
                            let next = if j == 0 { next } else { 0 };
                            if four {
                                let cols = std::array::from_fn(|c| qcol(j + c));
                                let d = q4tiles::dot_rows16::<Q4_COLS>(rws, a.nb[1], cols, next);
                                d.iter().enumerate().for_each(|(c, d)| put(c, d));
                            } else {
                                let [d] = q4tiles::dot_rows16(rws, a.nb[1], [qcol(j)], next);
                                put(0, &d);
                            }
                        });
                    }
                    for g0 in (wide..nr).step_by(group) {
                        let g = (nr - g0).min(group);
                        let row_of = |j: usize| rows.start + g0 + j.min(g - 1);
                        let mut put = |j: usize, d: &[f32]| {
                            out[j * nr + g0..j * nr + g0 + g].copy_from_slice(&d[..g]);
                        };
                        if let (Some(kind), true) = (ggml_order, sixteen) {
                            let rws: [&[u8]; qdot::ROWS16] =
                                std::array::from_fn(|j| qrow(row_of(j)));
                            put(
                                0,
                                &qdot::dot_rows16(isa, kind, rws, qcol(0), qdot16_prefetch),
                            );
                            continue;
                        }
                        if let Some(kind) = ggml_order {
                            let rws: [&[u8]; ROWS] = std::array::from_fn(|j| qrow(row_of(j)));
                            qdot_group(isa, kind, rws, nn, qcol, qdot_prefetch, &mut put);
                            continue;
                        }
                        match a.ty {
                            ElementType::Q4_0 => {
                                let rws: [&[u8]; ROWS] = std::array::from_fn(|j| qrow(row_of(j)));
                                q4_column_calls(nn, n, |j, four| {
                                    if four {
                                        let cols = std::array::from_fn(|c| qcol(j + c));
                                        let d =
                                            quant::dot_q4_0_q8_0_rows::<Q4_COLS>(isa, rws, cols);
                                        for (c, d) in d.iter().enumerate() {
                                            put(j + c, d);
                                        }
                                    } else {
                                        let [d] = quant::dot_q4_0_q8_0_rows(isa, rws, [qcol(j)]);
                                        put(j, &d);
                                    }
                                });
                            }
                            ElementType::F16 => {
                                let rws: [&[f32]; F32_ROWS] =
                                    f32_rows(a, row_of, a2, a3, &mut ts.a);
                                let col = |j: usize| {
                                    let c = batch0 * n + j.min(nn - 1);
                                    &packed_f32[c * k..(c + 1) * k]
                                };
                                if half_order == hdot::Order::Tiny {
                                    // Tiles of four rows and four columns (a short last
                                    // tile repeats its last column).
                                    for j0 in (0..nn).step_by(hdot::TILE_COLS) {
                                        let cls = std::array::from_fn(|c| col(j0 + c));
                                        let mut d = [[0.0f32; F32_ROWS]; hdot::TILE_COLS];
                                        for h in (0..F32_ROWS).step_by(hdot::TILE_ROWS) {
                                            let rs = std::array::from_fn(|r| rws[h + r]);
                                            let t = hdot::dot_tile(isa, rs, cls);
                                            for (dc, tc) in d.iter_mut().zip(&t) {
                                                dc[h..h + hdot::TILE_ROWS].copy_from_slice(tc);
                                            }
                                        }
                                        for (c, dc) in d.iter().enumerate().take(nn - j0) {
                                            put(j0 + c, dc);
                                        }
                                    }
                                    continue;
                                }
                                for j in 0..nn {
                                    put(j, &hdot::dot_rows(half_order, rws, col(j)));
                                }
                            }
                            _ => {
                                let rws: [&[f32]; F32_ROWS] =
                                    f32_rows(a, row_of, a2, a3, &mut ts.a);
                                for j in 0..nn {
                                    let c = batch0 * n + j;
                                    let col = &packed_f32[c * k..(c + 1) * k];
                                    put(j, &quant::dot_f32_rows(isa, rws, col));
                                }
                            }
                        }
                    }
                }
                for jj in 0..nn {
                    let (h, j) = (jj / n, jj % n);
                    dst.store_f32(rows.start, j, i2_0 + h, i3, &out[jj * nr..(jj + 1) * nr]);
                }
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
        let grid = sgemm::Grid::new(m, n, n_batch, nth);
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

    /// The dot path over q4_0, q4_1 or q8_0 weights in the repacked layout (`repack`): a unit is one group
    /// of `GROUP_ROWS` rows (= `MM_ROWS`) against all columns. (Units of a group against a
    /// chunk of columns that stays in L2, chunks outermost, measured no faster at 512
    /// columns.)
    fn mul_mat_repacked(
        &self,
        dst: &TView,
        a: &TView,
        cols: &PackedCols<'_>,
        r2: usize,
        r3: usize,
        isa: quant::Isa,
    ) -> Result<(), BackendError> {
        let (m, k) = (a.ne[1], a.ne[0]);
        let mblocks = m.div_ceil(MM_ROWS);
        let n_mats = dst.ne[2] * dst.ne[3] / cols.bh;
        self.par_for_contiguous(n_mats * mblocks, MM_ROWS * k * cols.nn, |units, ts| {
            for u in units {
                let (mat, mb) = (u / mblocks, u % mblocks);
                let batch0 = mat * cols.bh;
                let (i2_0, i3) = (batch0 % dst.ne[2], batch0 / dst.ne[2]);
                let rows = mb * MM_ROWS..((mb + 1) * MM_ROWS).min(m);
                let nr = rows.len();
                let out = grow(&mut ts.c, nr * cols.nn);
                // One group of the repacked layout (the row count is a multiple of it).
                let group = a.rows_bytes(rows.start, nr, i2_0 / r2, i3 / r3);
                let col = |j: usize| {
                    let c = batch0 * cols.n + j;
                    &cols.bytes[c * cols.col_bytes..(c + 1) * cols.col_bytes]
                };
                repacked_group(isa, a.ty, group, cols.nn, nr, out, col);
                for (o, jj) in out.chunks_exact(nr).zip(0..cols.nn) {
                    let (h, j) = (jj / cols.n, jj % cols.n);
                    dst.store_f32(rows.start, j, i2_0 + h, i3, o);
                }
            }
            Ok(())
        })
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

/// Packed src1 columns of a matrix product (`quant::quantize_q8_col` layout, `col_bytes`
/// each): `n` per matrix of `dst`, and the `bh` matrices that share one weight matrix
/// (`nn = bh · n` columns) handled together.
struct PackedCols<'a> {
    bytes: &'a [u8],
    col_bytes: usize,
    n: usize,
    nn: usize,
    bh: usize,
}

/// Columns per call of the repacked q4_1 kernel (eight accumulators and one of minimums per
/// column: two columns fill most of AVX-512's 32 registers).
const Q4_1_REPACK_COLS: usize = 2;

/// Columns per call of the repacked q8_0 kernel (eight accumulators per column).
const Q8_0_REPACK_COLS: usize = 2;

/// `out[j · nr + i]` = row `i` of the repacked (`repack`) q4_0, q4_1 or q8_0 group `group`
/// (`nr` = 16 rows) dotted with packed column `col(j)`, for the `nn` columns: the repacked
/// kernels, each over the columns in the counts it takes at once.
fn repacked_group<'c>(
    isa: quant::Isa,
    ty: ElementType,
    group: &[u8],
    nn: usize,
    nr: usize,
    out: &mut [f32],
    col: impl Fn(usize) -> &'c [u8],
) {
    // The layout's kernel at `$nc` columns and at one.
    macro_rules! run {
        ($dot:path, $nc:expr) => {
            mul_mat_group::<$nc>(
                nn,
                nr,
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
/// time through `dot` and the rest one by one through `dot1`, into `out[j · nr ..]` per
/// column `j`. (`dot` and `dot1` are the layout's kernel at `NC` columns and at one.)
fn mul_mat_group<'c, const NC: usize>(
    n: usize,
    nr: usize,
    out: &mut [f32],
    col: impl Fn(usize) -> &'c [u8],
    dot: impl Fn([&'c [u8]; NC]) -> [[f32; crate::repack::GROUP_ROWS]; NC],
    dot1: impl Fn([&'c [u8]; 1]) -> [[f32; crate::repack::GROUP_ROWS]; 1],
) {
    let mut put = |j: usize, d: &[f32]| {
        out[j * nr..(j + 1) * nr].copy_from_slice(&d[..nr]);
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
