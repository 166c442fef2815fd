//! The `CPU_REPACK` buffer type: q4_0 (q4_1, q8_0) matrices written into it read back as written (whole,
//! in parts, after a fill, through copies), products over them have the bits of the same
//! products over a plain CPU buffer at every thread count, and no other op reads them.

use backend_core::*;
use backend_cpu::*;
use graph::{Context, ElementType, Graph, TensorId};

/// Deterministic q4_0 bytes with finite f16 scales (every 18-byte block starts with one).
fn q4_bytes(seed: u64, n: usize) -> Vec<u8> {
    q4_bytes_of(ElementType::Q4_0, seed, n)
}

/// Deterministic q4_0, q4_1 or q8_0 bytes with finite f16 scales (and minimums).
fn q4_bytes_of(ty: ElementType, seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v: Vec<u8> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 32) as u8
        })
        .collect();
    let block = ty.type_size();
    for blk in v.chunks_exact_mut(block) {
        blk[1] = 0x20 | (blk[1] & 0x8f); // exponent 8..15: 2^-7 .. 2^0 magnitudes
        if ty == ElementType::Q4_1 {
            blk[3] = 0x20 | (blk[3] & 0x8f);
        }
    }
    v
}

fn f32_bytes(seed: u64, n: usize) -> Vec<u8> {
    q4_bytes(seed, n)
        .iter()
        .flat_map(|&b| (f32::from(b as i8) / 50.0).to_le_bytes())
        .collect()
}

fn read(ctx: &Context, t: TensorId) -> Vec<u8> {
    let mut v = vec![0u8; ctx[t].nbytes()];
    tensor_get(ctx, t, 0, &mut v).unwrap();
    v
}

/// Write `patch` at byte `off` of `w`, apply it to `want` (the plain bytes `w` should now
/// hold), and check that the whole tensor and the patched range read back as `want`.
fn write_and_read_back(ctx: &Context, w: TensorId, want: &mut [u8], off: usize, patch: &[u8]) {
    let len = patch.len();
    tensor_set(ctx, w, off, patch).unwrap();
    want[off..off + len].copy_from_slice(patch);
    assert_eq!(read(ctx, w), want, "write at {off}+{len}");
    let mut part = vec![0u8; len];
    tensor_get(ctx, w, off, &mut part).unwrap();
    assert_eq!(part, want[off..off + len]);
}

#[test]
fn the_repack_buffer_type_is_an_extra_buffer_type_of_the_cpu_device() {
    let buft = cpu_repack_buffer_type();
    assert_eq!(buft.name(), "CPU_REPACK");
    assert!(!buft.is_host());
    assert_eq!(buft.alignment(), ALIGNMENT);
    assert_eq!(buft.device(), Some(cpu_device()));
    assert!(cpu_device().supports_buft(&buft));
    let ext = cpu_registry().extension(EXT_EXTRA_BUFFER_TYPES).unwrap();
    let f = ext.downcast_ref::<ExtraBufferTypes>().unwrap();
    assert_eq!(f(), vec![buft.clone()]);
    assert_eq!(cpu_device().extra_buffer_types(), vec![buft]);
}

/// As ggml's CPU device: an op with a source in the repack buffer type runs only if that
/// source is stored repacked (as a product's weights); tensors the buffer keeps as they are
/// are refused, so weight loaders that probe with `supports_op` leave them in plain memory.
#[test]
fn tensors_a_repack_buffer_stores_as_they_are_are_refused() {
    let mut ctx = Context::new();
    let odd = ctx.new_tensor_2d(ElementType::Q4_0, 64, 8).unwrap(); // 8 rows: not repacked
    let f = ctx.new_tensor_2d(ElementType::F32, 64, 16).unwrap();
    let buf = cpu_repack_buffer_type().alloc_buffer(8192).unwrap();
    tensor_alloc(&mut ctx, &buf, odd, 0).unwrap();
    tensor_alloc(&mut ctx, &buf, f, 4096).unwrap();
    let x = ctx.new_tensor_2d(ElementType::F32, 64, 1).unwrap();
    let mm_odd = ctx.mul_mat(odd, x).unwrap();
    let mm_f = ctx.mul_mat(f, x).unwrap();
    let dev = cpu_device();
    assert!(!dev.supports_op(&ctx, mm_odd));
    assert!(!dev.supports_op(&ctx, mm_f));
    // An empty buffer of the type answers as a full one would (weight loaders probe so).
    let mut c2 = Context::new();
    let w = c2.new_tensor_2d(ElementType::Q4_0, 64, 16).unwrap();
    let x = c2.new_tensor_2d(ElementType::F32, 64, 1).unwrap();
    let mm = c2.mul_mat(w, x).unwrap();
    let empty = cpu_repack_buffer_type().alloc_buffer(0).unwrap();
    c2.get_mut(w)
        .unwrap()
        .set_storage(Some(empty.storage_at(0)));
    assert!(dev.supports_op(&c2, mm));
    let ids = c2.new_tensor_1d(ElementType::I32, 1).unwrap();
    let rows = c2.get_rows(w, ids).unwrap();
    assert!(!dev.supports_op(&c2, rows));
}

#[test]
fn set_and_get_round_trip_whole_in_parts_and_after_fills() {
    let (k, m) = if cfg!(miri) { (64, 48) } else { (256, 48) };
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(ElementType::Q4_0, k, m).unwrap();
    let odd = ctx.new_tensor_2d(ElementType::Q4_0, k, 8).unwrap(); // not repacked
    let f = ctx.new_tensor_1d(ElementType::F32, 16).unwrap();
    let nw = ctx[w].nbytes();
    let buf = cpu_repack_buffer_type().alloc_buffer(nw + 4096).unwrap();
    tensor_alloc(&mut ctx, &buf, w, 0).unwrap();
    tensor_alloc(&mut ctx, &buf, odd, nw.next_multiple_of(64)).unwrap();
    tensor_alloc(&mut ctx, &buf, f, nw.next_multiple_of(64) + 2048).unwrap();
    let bytes = q4_bytes(1, nw);
    tensor_set(&ctx, w, 0, &bytes).unwrap();
    assert_eq!(read(&ctx, w), bytes);
    // The stored bytes are not the plain ones (the layout is in use) ...
    let plain = cpu_buffer_type().alloc_buffer(nw).unwrap();
    let mut c2 = Context::new();
    let raw = c2.new_tensor_1d(ElementType::I8, nw as i64).unwrap();
    tensor_alloc(&mut c2, &buf, raw, 0).unwrap();
    assert_ne!(read(&c2, raw), bytes);
    // ... and a copy out into a plain buffer gives the plain bytes.
    let w2 = ctx.new_tensor_2d(ElementType::Q4_0, k, m).unwrap();
    tensor_alloc(&mut ctx, &plain, w2, 0).unwrap();
    tensor_copy(&ctx, w, w2).unwrap();
    assert_eq!(read(&ctx, w2), bytes);
    // and back in: a copy in repacks.
    tensor_set(&ctx, w, 0, &vec![0u8; nw]).unwrap();
    tensor_copy(&ctx, w2, w).unwrap();
    assert_eq!(read(&ctx, w), bytes);
    // Partial writes and reads at odd offsets, straddling blocks, rows and groups.
    let mut want = bytes.clone();
    let group = 16 * (k as usize / 32) * 18;
    for (i, (off, len)) in [
        (0, 1),
        (1, 18),
        (17, 37),
        (5, group),
        (group - 3, group + 7),
    ]
    .into_iter()
    .enumerate()
    {
        let patch = q4_bytes(10 + i as u64, len);
        write_and_read_back(&ctx, w, &mut want, off, &patch);
    }
    tensor_memset(&ctx, w, 0xab, 19, 100).unwrap();
    want[19..119].fill(0xab);
    assert_eq!(read(&ctx, w), want);
    // Out of range: a typed error, nothing written.
    let r = tensor_set(&ctx, w, nw - 2, &[0; 4]);
    assert_eq!(
        r,
        Err(BackendError::out_of_bounds("tensor_set", nw - 2, 4, nw))
    );
    assert_eq!(read(&ctx, w), want);
    // Other tensors pass through unchanged.
    let ob = q4_bytes(3, ctx[odd].nbytes());
    tensor_set(&ctx, odd, 0, &ob).unwrap();
    assert_eq!(read(&ctx, odd), ob);
    tensor_set(&ctx, f, 0, &[7; 64]).unwrap();
    assert_eq!(read(&ctx, f), vec![7; 64]);
    // A fill is the same in both layouts.
    buf.clear(0x3c).unwrap();
    assert_eq!(read(&ctx, w), vec![0x3c; nw]);
}

/// `y = w · x` with `w` in `weights` (plain or repacked) and every thread count: the bits of
/// each compute, for the shapes (k, m, n, batch).
fn products(
    buft: &BufferType,
    ty: ElementType,
    k: i64,
    m: i64,
    n: i64,
    batch: i64,
) -> Vec<Vec<u8>> {
    let mut ctx = Context::new();
    let w = ctx.new_tensor_3d(ty, k, m, batch).unwrap();
    let x = ctx
        .new_tensor_3d(ElementType::F32, k, n, 2 * batch)
        .unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    let wbuf = buft.alloc_buffer(ctx[w].nbytes()).unwrap();
    tensor_alloc(&mut ctx, &wbuf, w, 0).unwrap();
    let nx = ctx[x].nbytes();
    let buf = cpu_buffer_type()
        .alloc_buffer(nx.next_multiple_of(64) + ctx[y].nbytes())
        .unwrap();
    tensor_alloc(&mut ctx, &buf, x, 0).unwrap();
    tensor_alloc(&mut ctx, &buf, y, nx.next_multiple_of(64)).unwrap();
    tensor_set(&ctx, w, 0, &q4_bytes_of(ty, 5, ctx[w].nbytes())).unwrap();
    tensor_set(&ctx, x, 0, &f32_bytes(6, nx / 4)).unwrap();
    let mut g = Graph::new(4);
    g.build_forward_expand(&mut ctx, y).unwrap();
    let backend = backend_cpu::init().unwrap();
    let cpu = CpuBackend::from_backend(&backend).unwrap();
    [1, 2, 3]
        .into_iter()
        .map(|t| {
            cpu.set_n_threads(t);
            backend.graph_compute(&ctx, g.as_view()).unwrap();
            read(&ctx, y)
        })
        .collect()
}

#[test]
fn products_over_repacked_weights_equal_the_plain_ones_bit_for_bit() {
    let shapes: &[(i64, i64, i64, i64)] = if cfg!(miri) {
        &[(64, 16, 1, 1)]
    } else {
        &[
            (64, 16, 1, 1),
            (96, 32, 5, 1),
            (256, 48, 9, 2),
            (4096, 64, 1, 1),
            (256, 32, 35, 1),
            // Plain q4_0 units of 64 rows (four calls of sixteen rows a stride apart), and
            // short units of three and one such calls.
            (64, 112, 1, 1),
            (96, 80, 6, 1),
            // A decode step's shapes (SmolLM2-135M's K and V, gate and up): small units, which
            // each thread claims several at a time and computes as one run of groups.
            (576, 192, 1, 1),
            (576, 1536, 1, 1),
            (576, 1536, 2, 1),
            // One column a matrix: plain q4_0 reads it expanded (`q4tiles::expand_col`),
            // several of them (three matrices), and long rows (a call's sixteen rows more
            // than an L1 cache).
            (256, 48, 1, 3),
            (8192, 32, 1, 1),
        ]
    };
    for ty in [ElementType::Q4_0, ElementType::Q4_1, ElementType::Q8_0] {
        for &(k, m, n, batch) in shapes {
            let plain = products(&cpu_buffer_type(), ty, k, m, n, batch);
            let packed = products(&cpu_repack_buffer_type(), ty, k, m, n, batch);
            for (t, (p, q)) in plain.iter().zip(&packed).enumerate() {
                assert_eq!(
                    p,
                    q,
                    "{ty:?} k={k} m={m} n={n} batch={batch}, {} threads",
                    t + 1
                );
                assert_eq!(p, &plain[0], "thread counts agree");
            }
        }
    }
}

/// `y = w · x` for plain weights `w_bytes` (`m` rows of `k` elements of `ty`) and the `n`
/// columns `x_bytes` (f32), two threads: y's bytes.
fn plain_product(ty: ElementType, k: i64, m: i64, w_bytes: &[u8], x_bytes: &[u8]) -> Vec<u8> {
    product_in(&cpu_buffer_type(), ty, k, m, w_bytes, x_bytes, 2)
}

/// `y = w · x` as [`plain_product`], the weights in a buffer of `weights`, on `threads`
/// threads.
fn product_in(
    weights: &BufferType,
    ty: ElementType,
    k: i64,
    m: i64,
    w_bytes: &[u8],
    x_bytes: &[u8],
    threads: usize,
) -> Vec<u8> {
    let n = (x_bytes.len() / 4) as i64 / k;
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(ty, k, m).unwrap();
    let x = ctx.new_tensor_2d(ElementType::F32, k, n).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    let (nw, nx) = (ctx[w].nbytes(), ctx[x].nbytes());
    let wbuf = weights.alloc_buffer(nw).unwrap();
    tensor_alloc(&mut ctx, &wbuf, w, 0).unwrap();
    let buf = cpu_buffer_type()
        .alloc_buffer(nx.next_multiple_of(64) + ctx[y].nbytes())
        .unwrap();
    tensor_alloc(&mut ctx, &buf, x, 0).unwrap();
    tensor_alloc(&mut ctx, &buf, y, nx.next_multiple_of(64)).unwrap();
    tensor_set(&ctx, w, 0, w_bytes).unwrap();
    tensor_set(&ctx, x, 0, x_bytes).unwrap();
    let mut g = Graph::new(4);
    g.build_forward_expand(&mut ctx, y).unwrap();
    let backend = backend_cpu::init().unwrap();
    CpuBackend::from_backend(&backend)
        .unwrap()
        .set_n_threads(threads);
    backend.graph_compute(&ctx, g.as_view()).unwrap();
    read(&ctx, y)
}

/// One column against plain rows of one matrix (a decode step's product: on AVX-512 CPUs
/// plain q4_0 reads the column expanded, on Intel cores in interleaved blocks of 64 rows,
/// `q4tiles`) gives the bits of the same product over repacked weights, at every thread
/// count: row counts with and without a partial block (multiples of 16, as repacking
/// needs), rows short and long.
#[test]
fn one_column_products_over_plain_rows_equal_the_repacked_ones() {
    let shapes: &[(i64, i64)] = if cfg!(miri) {
        &[(64, 16)]
    } else {
        &[(256, 208), (256, 64), (4096, 80), (8192, 128)]
    };
    for ty in [ElementType::Q4_0, ElementType::Q4_1, ElementType::Q8_0] {
        for &(k, m) in shapes {
            let mut ctx = Context::new();
            let t = ctx.new_tensor_2d(ty, k, m).unwrap();
            let w_bytes = q4_bytes_of(ty, 11, ctx[t].nbytes());
            let x_bytes = f32_bytes(12, k as usize);
            let repacked = product_in(&cpu_repack_buffer_type(), ty, k, m, &w_bytes, &x_bytes, 2);
            for threads in [1, 2, 3] {
                let plain = product_in(&cpu_buffer_type(), ty, k, m, &w_bytes, &x_bytes, threads);
                assert_eq!(plain, repacked, "{ty:?} k={k} m={m}, {threads} threads");
            }
        }
    }
}

/// Plain weights against several columns, where the executor repacks each group of sixteen
/// rows on the fly for the repacked kernels (and the rows after the last whole group go the
/// plain way), give every column the bits of that column alone (a one-column product, which
/// reads the plain rows in place): column counts on both sides of each type's threshold.
#[test]
fn plain_products_of_many_columns_equal_one_column_products() {
    if cfg!(miri) {
        // Under Miri the kernels with intrinsics are compiled out, and with them the
        // repacking on the fly; the plain paths are checked by the tests above.
        return;
    }
    let (k, counts): (i64, &[i64]) = (256, &[2, 4, 7, 8, 16, 35, 64, 70]);
    for ty in [ElementType::Q4_0, ElementType::Q4_1, ElementType::Q8_0] {
        for m in [48, 40] {
            let mut ctx = Context::new();
            let t = ctx.new_tensor_2d(ty, k, m).unwrap();
            let nw = ctx[t].nbytes();
            let w_bytes = q4_bytes_of(ty, 9, nw);
            for &n in counts {
                let x_bytes = f32_bytes(n as u64, (k * n) as usize);
                let all = plain_product(ty, k, m, &w_bytes, &x_bytes);
                let col = 4 * m as usize;
                for j in 0..n as usize {
                    let xj = &x_bytes[4 * k as usize * j..4 * k as usize * (j + 1)];
                    let one = plain_product(ty, k, m, &w_bytes, xj);
                    assert_eq!(
                        all[col * j..col * (j + 1)],
                        one[..],
                        "{ty:?} m={m} n={n}, column {j}"
                    );
                }
            }
        }
    }
}

/// q4_1 matrices (20-byte blocks: scale, minimum, quants) go through the same layout: whole
/// and partial writes read back as written, the stored bytes are permuted.
#[test]
fn q4_1_round_trips_whole_and_in_parts() {
    round_trips_whole_and_in_parts(ElementType::Q4_1);
}

/// q8_0 matrices (34-byte blocks; their layout puts a group's scales after its quants) too.
#[test]
fn q8_0_round_trips_whole_and_in_parts() {
    round_trips_whole_and_in_parts(ElementType::Q8_0);
}

fn round_trips_whole_and_in_parts(ty: ElementType) {
    let (k, m) = (64, 32);
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(ty, k, m).unwrap();
    let nw = ctx[w].nbytes();
    let buf = cpu_repack_buffer_type().alloc_buffer(nw).unwrap();
    tensor_alloc(&mut ctx, &buf, w, 0).unwrap();
    let mut want = q4_bytes_of(ty, 7, nw);
    tensor_set(&ctx, w, 0, &want).unwrap();
    assert_eq!(read(&ctx, w), want);
    let mut c2 = Context::new();
    let raw = c2.new_tensor_1d(ElementType::I8, nw as i64).unwrap();
    tensor_alloc(&mut c2, &buf, raw, 0).unwrap();
    assert_ne!(read(&c2, raw), want);
    for (i, (off, len)) in [(0, 3), (3, 20), (21, 45), (300, 700)]
        .into_iter()
        .enumerate()
    {
        let patch = q4_bytes_of(ty, 20 + i as u64, len);
        write_and_read_back(&ctx, w, &mut want, off, &patch);
    }
}

#[test]
fn only_mul_mat_reads_repacked_weights() {
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(ElementType::Q4_0, 64, 16).unwrap();
    let buf = cpu_repack_buffer_type()
        .alloc_buffer(ctx[w].nbytes())
        .unwrap();
    tensor_alloc(&mut ctx, &buf, w, 0).unwrap();
    let x = ctx.new_tensor_2d(ElementType::F32, 64, 2).unwrap();
    let ids = ctx.new_tensor_1d(ElementType::I32, 2).unwrap();
    let mm = ctx.mul_mat(w, x).unwrap();
    let rows = ctx.get_rows(w, ids).unwrap();
    let view = ctx.view_2d(w, 64, 8, ctx[w].nb()[1], 0).unwrap();
    let mm_view = ctx.mul_mat(view, x).unwrap();
    let dev = cpu_device();
    assert!(dev.supports_op(&ctx, mm));
    assert!(
        !dev.supports_op(&ctx, rows),
        "GET_ROWS would read interleaved bytes"
    );
    assert!(
        !dev.supports_op(&ctx, mm_view),
        "a view into a repacked tensor"
    );
    // Weights in a plain buffer: all of them are fine.
    let mut c2 = Context::new();
    let w = c2.new_tensor_2d(ElementType::Q4_0, 64, 16).unwrap();
    let pbuf = cpu_buffer_type().alloc_buffer(c2[w].nbytes()).unwrap();
    tensor_alloc(&mut c2, &pbuf, w, 0).unwrap();
    let ids = c2.new_tensor_1d(ElementType::I32, 2).unwrap();
    let rows = c2.get_rows(w, ids).unwrap();
    assert!(dev.supports_op(&c2, rows));
}

/// `WeightBufferTypes` probes without placing: the weight stays unplaced after a selection,
/// a placed weight or a view is a typed error, no uses select nothing.
#[test]
fn weight_buffer_types_probe_without_placing() {
    let extra = WeightBufferTypes::new(&cpu_device(), true);
    assert_eq!(
        extra.types().cloned().collect::<Vec<_>>(),
        vec![cpu_repack_buffer_type()]
    );
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(ElementType::Q4_1, 64, 32).unwrap();
    let x = ctx.new_tensor_2d(ElementType::F32, 64, 1).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    assert_eq!(
        extra.select(&mut ctx, w, &[y]).unwrap(),
        Some(cpu_repack_buffer_type())
    );
    assert!(!ctx[w].has_storage());
    assert_eq!(extra.select(&mut ctx, w, &[]).unwrap(), None);
    let view = ctx.view_2d(w, 64, 16, ctx[w].nb()[1], 0).unwrap();
    assert!(matches!(
        extra.select(&mut ctx, view, &[y]),
        Err(BackendError::AlreadyAllocated(_))
    ));
    let buf = cpu_buffer_type().alloc_buffer(ctx[w].nbytes()).unwrap();
    tensor_alloc(&mut ctx, &buf, w, 0).unwrap();
    assert!(matches!(
        extra.select(&mut ctx, w, &[y]),
        Err(BackendError::AlreadyAllocated(_))
    ));
    assert!(
        ctx[w].has_storage(),
        "a refused probe leaves the placement alone"
    );
}

/// The products of one graph that share their input: `(k, m)` weights of `ty` in `buft`
/// (the first `m` of `ms` with a view of its result between it and the next), all times one
/// `x` of `n` columns, on one to three threads. The CPU backend runs such products as one
/// job; each result must have the bits of the same product computed alone.
fn shared_input_products(
    buft: &BufferType,
    ty: ElementType,
    k: i64,
    ms: &[i64],
    n: i64,
) -> (Vec<Vec<Vec<u8>>>, Vec<Vec<u8>>) {
    let mut ctx = Context::new();
    let x = ctx.new_tensor_2d(ElementType::F32, k, n).unwrap();
    let ws: Vec<TensorId> = ms
        .iter()
        .map(|&m| ctx.new_tensor_2d(ty, k, m).unwrap())
        .collect();
    let ys: Vec<TensorId> = ws.iter().map(|&w| ctx.mul_mat(w, x).unwrap()).collect();
    let wsize: Vec<usize> = ws
        .iter()
        .map(|&w| ctx[w].nbytes().next_multiple_of(64))
        .collect();
    let wbuf = buft.alloc_buffer(wsize.iter().sum()).unwrap();
    let mut at = 0;
    for (i, &w) in ws.iter().enumerate() {
        tensor_alloc(&mut ctx, &wbuf, w, at).unwrap();
        tensor_set(&ctx, w, 0, &q4_bytes_of(ty, 20 + i as u64, ctx[w].nbytes())).unwrap();
        at += wsize[i];
    }
    let sizes: Vec<usize> = std::iter::once(x)
        .chain(ys.iter().copied())
        .map(|t| ctx[t].nbytes().next_multiple_of(64))
        .collect();
    let buf = cpu_buffer_type().alloc_buffer(sizes.iter().sum()).unwrap();
    let mut at = 0;
    for (t, size) in std::iter::once(x).chain(ys.iter().copied()).zip(&sizes) {
        tensor_alloc(&mut ctx, &buf, t, at).unwrap();
        at += size;
    }
    tensor_set(&ctx, x, 0, &f32_bytes(7, ctx[x].nbytes() / 4)).unwrap();
    let mut g = Graph::new(16);
    g.build_forward_expand(&mut ctx, ys[0]).unwrap();
    let view = ctx.reshape_1d(ys[0], ms[0] * n).unwrap();
    g.build_forward_expand(&mut ctx, view).unwrap();
    for &y in &ys[1..] {
        g.build_forward_expand(&mut ctx, y).unwrap();
    }
    let backend = backend_cpu::init().unwrap();
    let cpu = CpuBackend::from_backend(&backend).unwrap();
    let together = [1, 2, 3]
        .into_iter()
        .map(|t| {
            cpu.set_n_threads(t);
            for &y in &ys {
                tensor_set(&ctx, y, 0, &vec![0xff; ctx[y].nbytes()]).unwrap();
            }
            backend.graph_compute(&ctx, g.as_view()).unwrap();
            ys.iter().map(|&y| read(&ctx, y)).collect()
        })
        .collect();
    cpu.set_n_threads(2);
    let alone = ys
        .iter()
        .map(|&y| {
            let mut g1 = Graph::new(4);
            g1.build_forward_expand(&mut ctx, y).unwrap();
            tensor_set(&ctx, y, 0, &vec![0xff; ctx[y].nbytes()]).unwrap();
            backend.graph_compute(&ctx, g1.as_view()).unwrap();
            read(&ctx, y)
        })
        .collect();
    (together, alone)
}

#[test]
fn products_of_one_input_run_together_with_the_bits_of_each_alone() {
    let cases: &[(i64, &[i64], i64)] = if cfg!(miri) {
        &[(64, &[16, 32], 1)]
    } else {
        &[
            // SmolLM2-135M's Q, K and V; gate and up; with two columns.
            (576, &[576, 192, 192], 1),
            (576, &[1536, 1536], 1),
            (576, &[576, 192, 192], 2),
            // Short last groups, and more products than one job takes.
            (64, &[48, 16, 80, 64, 16], 3),
        ]
    };
    for ty in [ElementType::Q4_0, ElementType::Q4_1, ElementType::Q8_0] {
        for buft in [cpu_buffer_type(), cpu_repack_buffer_type()] {
            for &(k, ms, n) in cases {
                let (together, alone) = shared_input_products(&buft, ty, k, ms, n);
                for (t, results) in together.iter().enumerate() {
                    let differ = results.iter().zip(&alone).position(|(a, b)| a != b);
                    assert!(
                        differ.is_none(),
                        "{ty:?} in {} k={k} m={ms:?} n={n}, {} threads: product {differ:?}",
                        buft.name(),
                        t + 1
                    );
                }
            }
        }
    }
}

/// Products of one input where a result lies over the other product's weights (placed so
/// by hand; no allocator does this): they run one after the other, as the graph orders
/// them, on any thread count.
#[test]
fn products_of_one_input_over_each_others_weights_run_in_graph_order() {
    // Enough work for every thread (and little under Miri).
    let (k, m, repeats) = if cfg!(miri) {
        (64, 16, 1)
    } else {
        (1024, 64, 20)
    };
    let run = |threads: usize, together: bool| -> (Vec<u8>, Vec<u8>) {
        let mut ctx = Context::new();
        let x = ctx.new_tensor_2d(ElementType::F32, k, 1).unwrap();
        let w1 = ctx.new_tensor_2d(ElementType::Q8_0, k, m).unwrap();
        let w2 = ctx.new_tensor_2d(ElementType::Q8_0, k, m).unwrap();
        let y1 = ctx.mul_mat(w1, x).unwrap();
        let y2 = ctx.mul_mat(w2, x).unwrap();
        let nw = ctx[w1].nbytes();
        let buf = cpu_buffer_type().alloc_buffer(4096 + 3 * nw).unwrap();
        tensor_alloc(&mut ctx, &buf, x, 0).unwrap();
        tensor_alloc(&mut ctx, &buf, w1, 4096).unwrap();
        tensor_alloc(&mut ctx, &buf, w2, 4096 + nw).unwrap();
        tensor_alloc(&mut ctx, &buf, y1, 4096 + 2 * nw).unwrap();
        // y2 over the end of w1: y1 must read w1 before y2 is written.
        let y2_at = 4096 + nw - ctx[y2].nbytes();
        tensor_alloc(&mut ctx, &buf, y2, y2_at).unwrap();
        tensor_set(&ctx, x, 0, &f32_bytes(8, k as usize)).unwrap();
        tensor_set(
            &ctx,
            w1,
            0,
            &q4_bytes_of(ElementType::Q8_0, 9, ctx[w1].nbytes()),
        )
        .unwrap();
        tensor_set(
            &ctx,
            w2,
            0,
            &q4_bytes_of(ElementType::Q8_0, 10, ctx[w2].nbytes()),
        )
        .unwrap();
        let backend = backend_cpu::init().unwrap();
        CpuBackend::from_backend(&backend)
            .unwrap()
            .set_n_threads(threads);
        let graphs: Vec<Vec<TensorId>> = if together {
            vec![vec![y1, y2]]
        } else {
            vec![vec![y1], vec![y2]]
        };
        for outs in graphs {
            let mut g = Graph::new(8);
            for y in outs {
                g.build_forward_expand(&mut ctx, y).unwrap();
            }
            backend.graph_compute(&ctx, g.as_view()).unwrap();
        }
        (read(&ctx, y1), read(&ctx, y2))
    };
    let one_by_one = run(1, false);
    for threads in [1, 2, 3] {
        for _ in 0..repeats {
            assert!(run(threads, true) == one_by_one, "{threads} threads");
        }
    }
}
