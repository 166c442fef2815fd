//! Element-type table, row sizes and `nbytes` for every type, contiguous and strided.
//!
//! Every expected number below is worked out by hand from the spec
//! (`../shared/spec/ggml-core-and-alloc.md` §1.2–§1.4), with the arithmetic in a comment;
//! none is produced by the code under test.
//!
//! Rules used (spec §1.3):
//! * `row_size(T, n) = type_size * n / blck`
//! * default strides: `nb0 = type_size`, `nb1 = nb0 * ne0 / blck`, `nb2 = nb1 * ne1`,
//!   `nb3 = nb2 * ne2`
//! * `nbytes`, blck == 1: `type_size + Σ_{i=0..3} (ne_i - 1) * nb_i`
//! * `nbytes`, blck > 1:  `ne0 * nb0 / blck + Σ_{i=1..3} (ne_i - 1) * nb_i`
//! * 0 when any extent is 0.

use graph::{Context, ElementType, GraphError, Op, contiguous_strides, nbytes};
use proptest::prelude::*;

use ElementType::*;

/// (type, ggml id, name, block size, bytes per block, quantized) — spec §1.4's table.
const TABLE: [(ElementType, u32, &str, usize, usize, bool); 20] = [
    (F32, 0, "f32", 1, 4, false),
    (F16, 1, "f16", 1, 2, false),
    (Q4_0, 2, "q4_0", 32, 18, true),
    (Q4_1, 3, "q4_1", 32, 20, true),
    (Q5_0, 6, "q5_0", 32, 22, true),
    (Q5_1, 7, "q5_1", 32, 24, true),
    (Q8_0, 8, "q8_0", 32, 34, true),
    (Q8_1, 9, "q8_1", 32, 36, true),
    (Q2_K, 10, "q2_K", 256, 84, true),
    (Q3_K, 11, "q3_K", 256, 110, true),
    (Q4_K, 12, "q4_K", 256, 144, true),
    (Q5_K, 13, "q5_K", 256, 176, true),
    (Q6_K, 14, "q6_K", 256, 210, true),
    (Q8_K, 15, "q8_K", 256, 292, true),
    (I8, 24, "i8", 1, 1, false),
    (I16, 25, "i16", 1, 2, false),
    (I32, 26, "i32", 1, 4, false),
    (I64, 27, "i64", 1, 8, false),
    (F64, 28, "f64", 1, 8, false),
    (BF16, 30, "bf16", 1, 2, false),
];

#[test]
fn type_table_matches_the_spec() {
    assert_eq!(ElementType::ALL.len(), TABLE.len());
    for (ty, id, name, blck, size, quantized) in TABLE {
        assert_eq!(ty.id(), id, "{name}");
        assert_eq!(ElementType::from_id(id), Some(ty), "{name}");
        assert_eq!(ty.name(), name);
        assert_eq!(ty.to_string(), name);
        assert_eq!(name.parse::<ElementType>(), Ok(ty));
        assert_eq!(name.to_uppercase().parse::<ElementType>(), Ok(ty));
        assert_eq!(ty.block_size(), blck, "{name}");
        assert_eq!(ty.type_size(), size, "{name}");
        assert_eq!(ty.is_quantized(), quantized, "{name}");
    }
    // Deprecated (4, 5), never-enabled (37, 38) and unknown ids have no type.
    for id in [4, 5, 16, 29, 31, 37, 38, 1000] {
        assert_eq!(ElementType::from_id(id), None, "id {id}");
    }
    assert_eq!(
        "q4_2".parse::<ElementType>(),
        Err(graph::UnknownType("q4_2".to_owned()))
    );
}

/// `row_size(T, 2 * blck) = size * 2 * blck / blck = 2 * size`, and `row_size(T, 4 * blck) = 4 * size`.
#[test]
fn row_size_for_every_type() {
    let expected: [(ElementType, usize, usize, usize); 20] = [
        // (type, n, row_size(n), row_size(2n))
        (F32, 2, 8, 16),        // 4*2, 4*4
        (F16, 2, 4, 8),         // 2*2, 2*4
        (Q4_0, 64, 36, 72),     // 18*64/32, 18*128/32
        (Q4_1, 64, 40, 80),     // 20*2, 20*4
        (Q5_0, 64, 44, 88),     // 22*2, 22*4
        (Q5_1, 64, 48, 96),     // 24*2, 24*4
        (Q8_0, 64, 68, 136),    // 34*2, 34*4
        (Q8_1, 64, 72, 144),    // 36*2, 36*4
        (Q2_K, 512, 168, 336),  // 84*512/256, 84*4
        (Q3_K, 512, 220, 440),  // 110*2, 110*4
        (Q4_K, 512, 288, 576),  // 144*2, 144*4
        (Q5_K, 512, 352, 704),  // 176*2, 176*4
        (Q6_K, 512, 420, 840),  // 210*2, 210*4
        (Q8_K, 512, 584, 1168), // 292*2, 292*4
        (I8, 2, 2, 4),          // 1*2, 1*4
        (I16, 2, 4, 8),         // 2*2, 2*4
        (I32, 2, 8, 16),        // 4*2, 4*4
        (I64, 2, 16, 32),       // 8*2, 8*4
        (F64, 2, 16, 32),       // 8*2, 8*4
        (BF16, 2, 4, 8),        // 2*2, 2*4
    ];
    for (ty, n, r1, r2) in expected {
        assert_eq!(ty.row_size(n), r1, "{ty}");
        assert_eq!(ty.row_size(2 * n), r2, "{ty}");
        assert_eq!(ty.row_size(0), 0, "{ty}");
    }
}

/// A contiguous `[2*blck, 3, 2]` tensor of every type.
///
/// Strides: `nb = [s, 2s, 6s, 12s]` (nb1 = s * 2blck/blck, nb2 = 2s * 3, nb3 = 6s * 2).
/// nbytes, block types: `2blck * s / blck + 2 * 2s + 1 * 6s + 0 = 2s + 4s + 6s = 12s`;
/// plain types (blck = 1, ne0 = 2): `s + 1*s + 2*2s + 1*6s = 12s`. Row size = 2s.
#[test]
fn contiguous_nbytes_for_every_type() {
    let expected: [(ElementType, [usize; 4], usize); 20] = [
        (F32, [4, 8, 24, 48], 48),            // s = 4
        (F16, [2, 4, 12, 24], 24),            // s = 2
        (Q4_0, [18, 36, 108, 216], 216),      // s = 18
        (Q4_1, [20, 40, 120, 240], 240),      // s = 20
        (Q5_0, [22, 44, 132, 264], 264),      // s = 22
        (Q5_1, [24, 48, 144, 288], 288),      // s = 24
        (Q8_0, [34, 68, 204, 408], 408),      // s = 34
        (Q8_1, [36, 72, 216, 432], 432),      // s = 36
        (Q2_K, [84, 168, 504, 1008], 1008),   // s = 84
        (Q3_K, [110, 220, 660, 1320], 1320),  // s = 110
        (Q4_K, [144, 288, 864, 1728], 1728),  // s = 144
        (Q5_K, [176, 352, 1056, 2112], 2112), // s = 176
        (Q6_K, [210, 420, 1260, 2520], 2520), // s = 210
        (Q8_K, [292, 584, 1752, 3504], 3504), // s = 292
        (I8, [1, 2, 6, 12], 12),              // s = 1
        (I16, [2, 4, 12, 24], 24),            // s = 2
        (I32, [4, 8, 24, 48], 48),            // s = 4
        (I64, [8, 16, 48, 96], 96),           // s = 8
        (F64, [8, 16, 48, 96], 96),           // s = 8
        (BF16, [2, 4, 12, 24], 24),           // s = 2
    ];
    let mut ctx = Context::new();
    for (ty, nb, bytes) in expected {
        let ne0 = 2 * ty.block_size() as i64;
        let t = ctx.new_tensor_3d(ty, ne0, 3, 2).unwrap();
        assert_eq!(ctx[t].ne(), [ne0, 3, 2, 1], "{ty}");
        assert_eq!(ctx[t].nb(), nb, "{ty}");
        assert_eq!(contiguous_strides(ty, [ne0, 3, 2, 1]), nb, "{ty}");
        assert_eq!(ctx[t].nbytes(), bytes, "{ty}");
        assert_eq!(nbytes(ty, [ne0, 3, 2, 1], nb), bytes, "{ty}");
        assert_eq!(ctx[t].row_size(), nb[1], "{ty}");
        assert_eq!(ctx[t].nelements(), ne0 * 6, "{ty}");
        assert_eq!(ctx[t].nrows(), 6, "{ty}");
        assert!(ctx[t].is_contiguous(), "{ty}");
    }
}

/// A padded 2-d view of every type: the root is `[4*blck, 3]` (rows of 4s bytes), the view keeps
/// the first half of each row: `ne = [2*blck, 3]`, `nb1 = 4s`, offset 0.
///
/// view_2d strides: `nb = [s, 4s, 12s, 12s]` (nb2 = nb1 * ne1 = 12s, nb3 = nb2).
/// nbytes, block types: `2blck * s / blck + (3 - 1) * 4s = 2s + 8s = 10s`;
/// plain (ne0 = 2): `s + 1*s + 2*4s = 10s` — less than the root's `12s`, more than the
/// `6s` of elements actually seen: it spans from the first to the last byte.
#[test]
fn padded_view_nbytes_for_every_type() {
    let expected: [(ElementType, usize); 20] = [
        (F32, 40),    // 10*4
        (F16, 20),    // 10*2
        (Q4_0, 180),  // 10*18
        (Q4_1, 200),  // 10*20
        (Q5_0, 220),  // 10*22
        (Q5_1, 240),  // 10*24
        (Q8_0, 340),  // 10*34
        (Q8_1, 360),  // 10*36
        (Q2_K, 840),  // 10*84
        (Q3_K, 1100), // 10*110
        (Q4_K, 1440), // 10*144
        (Q5_K, 1760), // 10*176
        (Q6_K, 2100), // 10*210
        (Q8_K, 2920), // 10*292
        (I8, 10),     // 10*1
        (I16, 20),    // 10*2
        (I32, 40),    // 10*4
        (I64, 80),    // 10*8
        (F64, 80),    // 10*8
        (BF16, 20),   // 10*2
    ];
    let mut ctx = Context::new();
    for (ty, bytes) in expected {
        let (b, s) = (ty.block_size() as i64, ty.type_size());
        let root = ctx.new_tensor_2d(ty, 4 * b, 3).unwrap();
        let v = ctx.view_2d(root, 2 * b, 3, 4 * s, 0).unwrap();
        assert_eq!(ctx[v].nb(), [s, 4 * s, 12 * s, 12 * s], "{ty}");
        assert_eq!(ctx[v].nbytes(), bytes, "{ty}");
        assert!(!ctx[v].is_contiguous(), "{ty}");
        assert!(ctx[v].is_contiguous_rows(), "{ty}");
    }
}

#[test]
fn spec_observed_examples() {
    let mut ctx = Context::new();
    // Q4_0 [64, 3]: nb = [18, 36, 108, 108], nbytes = 64*18/32 + 2*36 = 36 + 72 = 108.
    let q = ctx.new_tensor_2d(Q4_0, 64, 3).unwrap();
    assert_eq!(ctx[q].nb(), [18, 36, 108, 108]);
    assert_eq!(ctx[q].nbytes(), 108);
    assert_eq!(ctx[q].row_size(), 36);
    // Q4_K [512, 2]: nb = [144, 288, 576, 576], nbytes = 512*144/256 + 1*288 = 576.
    let k = ctx.new_tensor_2d(Q4_K, 512, 2).unwrap();
    assert_eq!(ctx[k].nb(), [144, 288, 576, 576]);
    assert_eq!(ctx[k].nbytes(), 576);
    // transpose of F32 [3, 5]: ne = [5, 3], nb = [12, 4, 60, 60],
    // nbytes = 4 + 4*12 + 2*4 = 60.
    let a = ctx.new_tensor_2d(F32, 3, 5).unwrap();
    let t = ctx.transpose(a).unwrap();
    assert_eq!(ctx[t].ne(), [5, 3, 1, 1]);
    assert_eq!(ctx[t].nb(), [12, 4, 60, 60]);
    assert_eq!(ctx[t].nbytes(), 60);
    // F32 [0, 5]: nbytes = 0.
    let e = ctx.new_tensor_2d(F32, 0, 5).unwrap();
    assert_eq!(ctx[e].nbytes(), 0);
}

#[test]
fn strided_nbytes_by_hand() {
    let mut ctx = Context::new();

    // Transposed F16 [4, 6]: root nb = [2, 8, 48, 48]; transposed ne = [6, 4], nb = [8, 2, 48, 48].
    // nbytes = 2 + 5*8 + 3*2 = 48 (the whole root).
    let a = ctx.new_tensor_2d(F16, 4, 6).unwrap();
    let at = ctx.transpose(a).unwrap();
    assert_eq!(ctx[at].nb(), [8, 2, 48, 48]);
    assert_eq!(ctx[at].nbytes(), 48);
    assert!(ctx[at].is_transposed());
    assert!(!ctx[at].is_contiguous());

    // Permuted F32 [2, 3, 4] by axes [2, 0, 1, 3]: root nb = [4, 8, 24, 96].
    // dim 0 -> 2, dim 1 -> 0, dim 2 -> 1: ne = [3, 4, 2, 1], nb = [8, 24, 4, 96].
    // nbytes = 4 + 2*8 + 3*24 + 1*4 + 0*96 = 4 + 16 + 72 + 4 = 96 (the whole root).
    let b = ctx.new_tensor_3d(F32, 2, 3, 4).unwrap();
    let bp = ctx.permute(b, [2, 0, 1, 3]).unwrap();
    assert_eq!(ctx[bp].ne(), [3, 4, 2, 1]);
    assert_eq!(ctx[bp].nb(), [8, 24, 4, 96]);
    assert_eq!(ctx[bp].nbytes(), 96);
    assert!(ctx[bp].is_permuted());

    // Padded F32 view: root [8, 4] (nb1 = 32, 128 bytes), view ne = [5, 3], nb1 = 32, offset 4:
    // nb = [4, 32, 96, 96], nbytes = 4 + 4*4 + 2*32 = 84; bounds: 5*4*3 + 4 = 64 <= 128.
    let c = ctx.new_tensor_2d(F32, 8, 4).unwrap();
    let cv = ctx.view_2d(c, 5, 3, 32, 4).unwrap();
    assert_eq!(ctx[cv].nb(), [4, 32, 96, 96]);
    assert_eq!(ctx[cv].nbytes(), 84);
    assert_eq!(ctx[cv].view_offs(), 4);

    // Padded Q4_0 view: root [128, 4] (row 4*18 = 72, nbytes 288), view ne = [64, 3], nb1 = 72,
    // offset 72: nb = [18, 72, 216, 216], nbytes = 64*18/32 + 2*72 = 36 + 144 = 180;
    // bounds: 36*3 + 72 = 180 <= 288.
    let q = ctx.new_tensor_2d(Q4_0, 128, 4).unwrap();
    let qv = ctx.view_2d(q, 64, 3, 72, 72).unwrap();
    assert_eq!(ctx[qv].nb(), [18, 72, 216, 216]);
    assert_eq!(ctx[qv].nbytes(), 180);

    // Permuted Q8_0 [64, 3, 2] by [0, 2, 1, 3]: root nb = [34, 68, 204, 408];
    // ne = [64, 2, 3, 1], nb = [34, 204, 68, 408]; nbytes = 64*34/32 + 1*204 + 2*68 = 68 + 204
    // + 136 = 408 (the whole root).
    let r = ctx.new_tensor_3d(Q8_0, 64, 3, 2).unwrap();
    let rp = ctx.permute(r, [0, 2, 1, 3]).unwrap();
    assert_eq!(ctx[rp].nb(), [34, 204, 68, 408]);
    assert_eq!(ctx[rp].nbytes(), 408);

    // 4-d view of I32 with explicit strides: root [4, 4, 4, 4] (1024 bytes), view ne = [2, 2, 2, 2],
    // nb = [4, 16, 64, 256] (every other element block), offset 0:
    // nbytes = 4 + 1*4 + 1*16 + 1*64 + 1*256 = 344.
    let d = ctx.new_tensor_4d(I32, 4, 4, 4, 4).unwrap();
    let dv = ctx.view_4d(d, 2, 2, 2, 2, 16, 64, 256, 0).unwrap();
    assert_eq!(ctx[dv].nb(), [4, 16, 64, 256]);
    assert_eq!(ctx[dv].nbytes(), 344);

    // Any zero extent gives 0, also for block types and views.
    assert_eq!(nbytes(Q4_0, [0, 3, 1, 1], [18, 0, 0, 0]), 0);
    assert_eq!(nbytes(F32, [4, 3, 0, 1], [4, 16, 48, 0]), 0);
    let z = ctx.view_2d(c, 0, 3, 32, 0).unwrap();
    assert_eq!(ctx[z].nbytes(), 0);
}

#[test]
fn block_types_need_whole_blocks() {
    let mut ctx = Context::new();
    for ty in ElementType::ALL {
        let b = ty.block_size() as i64;
        if b == 1 {
            continue;
        }
        let before = ctx.len();
        assert_eq!(
            ctx.new_tensor_1d(ty, b + 1),
            Err(GraphError::BlockMisaligned {
                ty,
                ne0: b + 1,
                block: b as usize
            })
        );
        assert_eq!(ctx.len(), before);
    }
}

/// Highest byte touched by any element (or block) plus its size, by visiting every index.
fn naive_span(ty: ElementType, ne: [i64; 4], nb: [usize; 4]) -> usize {
    if ne.contains(&0) {
        return 0;
    }
    let blocks0 = ne[0] as usize / ty.block_size();
    let mut max = 0;
    for i3 in 0..ne[3] as usize {
        for i2 in 0..ne[2] as usize {
            for i1 in 0..ne[1] as usize {
                for i0 in 0..blocks0 {
                    let addr = i0 * nb[0] + i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
                    max = max.max(addr + ty.type_size());
                }
            }
        }
    }
    max
}

fn permutation() -> impl Strategy<Value = [i32; 4]> {
    Just([0, 1, 2, 3])
        .prop_shuffle()
        .prop_map(|v| [v[0], v[1], v[2], v[3]])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 8 } else { 256 }))]

    /// nbytes of any permutation of a plain-type tensor is the highest address touched plus the
    /// element size, and (for a permutation of a contiguous tensor) equals the root's size.
    #[test]
    fn permuted_nbytes_is_the_span(
        ty in prop::sample::select(vec![F32, F16, I8, I16, I32, I64, F64, BF16]),
        ne in prop::array::uniform4(1i64..5),
        axes in permutation(),
    ) {
        let mut ctx = Context::new();
        let a = ctx.new_tensor(ty, &ne).unwrap();
        let p = ctx.permute(a, axes).unwrap();
        let t = &ctx[p];
        prop_assert_eq!(t.nbytes(), naive_span(ty, t.ne(), t.nb()));
        prop_assert_eq!(t.nbytes(), ctx[a].nbytes());
        prop_assert_eq!(t.nelements(), ctx[a].nelements());
    }

    /// Block types: permutations keep dimension 0 (ggml only permutes rows of whole blocks).
    #[test]
    fn permuted_block_nbytes_is_the_span(
        ty in prop::sample::select(vec![Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q4_K, Q6_K]),
        blocks in 1i64..4,
        ne in prop::array::uniform3(1i64..5),
        rest in Just([1, 2, 3]).prop_shuffle(),
    ) {
        let mut ctx = Context::new();
        let ne0 = blocks * ty.block_size() as i64;
        let a = ctx.new_tensor(ty, &[ne0, ne[0], ne[1], ne[2]]).unwrap();
        let p = ctx.permute(a, [0, rest[0], rest[1], rest[2]]).unwrap();
        let t = &ctx[p];
        prop_assert_eq!(t.nbytes(), naive_span(ty, t.ne(), t.nb()));
        prop_assert_eq!(t.nbytes(), ctx[a].nbytes());
    }

    /// A padded 2-d view spans from its first to its last element.
    #[test]
    fn padded_view_nbytes_is_the_span(
        cols in 1i64..8, pad in 0i64..4, rows in 1i64..6, off_rows in 0i64..3,
    ) {
        let mut ctx = Context::new();
        let root = ctx.new_tensor_2d(F32, cols + pad, rows + off_rows).unwrap();
        let row = 4 * (cols + pad) as usize;
        let v = ctx.view_2d(root, cols, rows, row, off_rows as usize * row).unwrap();
        let t = &ctx[v];
        prop_assert_eq!(t.nbytes(), naive_span(F32, t.ne(), t.nb()));
        prop_assert_eq!(t.view_offs(), off_rows as usize * row);
    }
}

/// Regression: `Context::set_src` indexed its slot unchecked although it returns a `Result`.
#[test]
fn set_src_refuses_a_slot_past_the_last() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    let b = ctx.sqr(a).unwrap();
    for slot in [graph::MAX_SRC, graph::MAX_SRC + 1, usize::MAX] {
        assert!(matches!(
            ctx.set_src(b, slot, Some(a)),
            Err(GraphError::IndexOutOfRange { index, limit: graph::MAX_SRC, .. }) if index == slot
        ));
    }
    assert_eq!(ctx[b].src(0), Some(a));
    // the last slot is fine, and the tensor is usable after the errors
    ctx.set_src(b, graph::MAX_SRC - 1, Some(a)).unwrap();
    assert_eq!(ctx[b].src(graph::MAX_SRC - 1), Some(a));
    ctx.set_src(b, graph::MAX_SRC - 1, None).unwrap();
    assert_eq!(ctx[b].srcs_used().len(), 1);
}

/// Regression: `Tensor::src` indexed its slot unchecked although it returns an `Option` (and
/// with it `sched::Scheduler::effective_src`): a slot past the last is empty.
#[test]
fn src_past_the_last_slot_is_empty() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    let b = ctx.sqr(a).unwrap();
    for slot in [graph::MAX_SRC, graph::MAX_SRC + 1, usize::MAX] {
        assert_eq!(ctx[b].src(slot), None);
    }
    assert_eq!(ctx[b].src(0), Some(a));
}

/// Regression: `view_2d` with a row stride near `usize::MAX` was accepted with a byte size
/// that wrapped to 0, and the CPU kernel's row check fired later.
#[test]
fn strided_views_with_overflowing_or_overlong_extents_are_refused() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_2d(ElementType::F32, 4, 4).unwrap(); // 64 bytes
    let n = ctx.len();
    for nb1 in [
        usize::MAX,
        usize::MAX - 3,
        usize::MAX / 2,
        usize::MAX / 3 + 1,
    ] {
        assert!(
            matches!(
                ctx.view_2d(a, 4, 4, nb1, 0),
                Err(GraphError::ViewOutOfRange { .. })
            ),
            "nb1 = {nb1}"
        );
        assert!(matches!(
            ctx.view_3d(a, 4, 2, 2, 16, nb1, 0),
            Err(GraphError::ViewOutOfRange { .. })
        ));
        assert!(matches!(
            ctx.view_4d(a, 4, 1, 1, 2, 16, 16, nb1, 0),
            Err(GraphError::ViewOutOfRange { .. })
        ));
    }
    // the exact bound: 3 rows of 16 bytes + 16 bytes = 64 fits, one byte more of stride not
    assert_eq!(ctx.len(), n, "a refused view creates nothing");
    let v = ctx.view_2d(a, 4, 4, 16, 0).unwrap();
    assert_eq!(ctx[v].nbytes(), 64);
    let r = ctx.view_2d(a, 4, 4, 17, 0);
    assert!(matches!(r, Err(GraphError::ViewOutOfRange { .. })), "{r:?}");
    assert!(ctx.view_2d(a, 4, 3, 16, 16).is_ok());
    let r = ctx.view_2d(a, 4, 3, 16, 17);
    assert!(matches!(r, Err(GraphError::ViewOutOfRange { .. })), "{r:?}");
    // a view of a view counts from the root
    let w = ctx.view_1d(a, 8, 32).unwrap();
    assert!(ctx.view_2d(w, 4, 2, 16, 0).is_ok());
    let r = ctx.view_2d(w, 4, 2, 16, 4);
    assert!(matches!(r, Err(GraphError::ViewOutOfRange { .. })), "{r:?}");
    // strides of 0 (broadcast rows) are fine
    assert_eq!(ctx.view_2d(a, 4, 4, 0, 0).map(|v| ctx[v].nbytes()), Ok(16));
    // extents of 0: empty, whatever the stride
    assert_eq!(
        ctx.view_2d(a, 4, 0, usize::MAX, 0).map(|v| ctx[v].nbytes()),
        Ok(0)
    );
}

/// Regressions found by the scheduler's property test: `reshape` and `cont_shape` multiplied
/// the requested extents unchecked (a debug panic), and `nbytes` of a block type multiplied
/// `ne0 * nb0` before dividing by the block size, overflowing for rows whose byte size fits.
#[test]
fn element_counts_and_block_row_sizes_do_not_overflow() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(ElementType::F32, 1).unwrap();
    let n = ctx.len();
    for ne in [
        [2, 1 << 62],
        [1 << 32, 1 << 32],
        [i64::MAX, 2],
        [-1, i64::MIN],
    ] {
        assert!(matches!(
            ctx.reshape(a, &ne),
            Err(GraphError::ShapeMismatch { .. })
        ));
        assert!(matches!(
            ctx.cont_shape(a, &ne),
            Err(GraphError::ShapeMismatch { .. })
        ));
    }
    assert_eq!(ctx.len(), n);
    // q4_0: 18 bytes per 32 elements; a row of 2^62 elements is 18 * 2^57 bytes
    let q = ctx.new_tensor_2d(ElementType::Q4_0, 1 << 62, 0).unwrap();
    assert_eq!(ctx[q].nb()[1], 18 << 57);
    assert_eq!(
        nbytes(ElementType::Q4_0, [1 << 62, 1, 1, 1], [18, 18 << 57, 0, 0]),
        18 << 57
    );
    assert_eq!(
        graph::checked_nbytes(ElementType::Q4_0, [64, 1, 1, 1], [18, 36, 36, 36]),
        Some(36)
    );
}

/// Regression: an empty view could sit at any offset (ggml skips the range check for empty
/// views), so placing it added an arbitrary offset to its root's; the graph allocator's sum
/// overflowed for a root placed above offset 0. Empty views past their root's end are refused.
#[test]
fn empty_views_past_the_end_of_their_root_are_refused() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    assert!(ctx.view_1d(a, 0, 16).is_ok());
    for offset in [17, 1 << 40, usize::MAX] {
        assert!(matches!(
            ctx.view_1d(a, 0, offset),
            Err(GraphError::ViewOutOfRange { .. })
        ));
        assert!(matches!(
            ctx.view_2d(a, 4, 0, 16, offset),
            Err(GraphError::ViewOutOfRange { .. })
        ));
    }
}

/// Every constructor that takes extents, strides or offsets, at and around its bounds.
#[test]
fn constructors_at_their_bounds() {
    let mut ctx = Context::new();
    // extents: 0 is an empty tensor, negative or overflowing products are refused
    assert_eq!(
        ctx.new_tensor_1d(ElementType::F32, 0)
            .map(|t| ctx[t].nbytes()),
        Ok(0)
    );
    for ne in [
        vec![-1],
        vec![i64::MAX],
        vec![1 << 62, 2],
        vec![i64::MAX, 0, -1],
        vec![1 << 31, 1 << 31, 1 << 31],
        vec![],
        vec![1, 1, 1, 1, 1],
    ] {
        let n = ctx.len();
        assert!(
            matches!(
                ctx.new_tensor(ElementType::F32, &ne),
                Err(GraphError::InvalidShape { .. })
            ),
            "{ne:?}"
        );
        assert_eq!(ctx.len(), n);
    }
    // the largest f32 row whose byte size fits
    let max = (usize::MAX / 4) as i64;
    assert!(ctx.new_tensor_1d(ElementType::F32, max).is_ok());
    let r = ctx.new_tensor_1d(ElementType::F32, max + 1);
    assert!(matches!(r, Err(GraphError::InvalidShape { .. })), "{r:?}");

    // view offsets: up to the exact end of the root, with checked sums through a view chain
    let a = ctx.new_tensor_1d(ElementType::F32, 16).unwrap(); // 64 bytes
    for (ne, offset, ok) in [
        (16, 0, true),
        (1, 60, true),
        (1, 61, false),
        (2, 60, false),
        (0, 64, true),
        (0, 65, false),
        (1, usize::MAX, false),
        (1, usize::MAX - 3, false),
        (16, usize::MAX - 63, false),
    ] {
        assert_eq!(
            ctx.view_1d(a, ne, offset).is_ok(),
            ok,
            "view_1d {ne} at {offset}"
        );
    }
    let v = ctx.view_1d(a, 8, 32).unwrap();
    assert!(ctx.view_1d(v, 8, 0).is_ok());
    for r in [ctx.view_1d(v, 8, 4), ctx.view_1d(v, 1, usize::MAX - 31)] {
        assert!(matches!(r, Err(GraphError::ViewOutOfRange { .. })), "{r:?}");
    }
    // strides: a 4-d view at its exact extent, and one stride past it
    let b = ctx.new_tensor_1d(ElementType::F32, 16).unwrap();
    assert!(ctx.view_4d(b, 2, 2, 2, 2, 8, 16, 32, 0).is_ok());
    for r in [
        ctx.view_4d(b, 2, 2, 2, 2, 8, 16, 33, 0),
        ctx.view_4d(b, 2, 2, 2, 2, 8, 16, usize::MAX, 0),
        ctx.view(b, &[2, 2], Some([4, usize::MAX, 0, 0]), 0),
    ] {
        assert!(matches!(r, Err(GraphError::ViewOutOfRange { .. })), "{r:?}");
    }
    // explicit strides through the graph-file form
    assert!(ctx.view(b, &[2, 2], Some([4, 8, 16, 16]), 0).is_ok());
    // reshape: element counts must match exactly
    assert!(ctx.reshape(b, &[4, 4]).is_ok());
    for r in [
        ctx.reshape(b, &[4, 5]),
        ctx.reshape(b, &[i64::MAX, i64::MAX]),
    ] {
        assert!(
            matches!(
                r,
                Err(GraphError::ShapeMismatch {
                    op: Op::Reshape,
                    ..
                })
            ),
            "{r:?}"
        );
    }
    // graph ranges and source slots
    let s = ctx.sqr(b).unwrap();
    let mut g = graph::Graph::new(4);
    g.build_forward_expand(&mut ctx, s).unwrap();
    assert!(g.view(0..1).is_ok());
    assert!(g.view(1..1).is_ok());
    for r in [
        g.view(0..2).map(|_| ()),
        g.view(usize::MAX..usize::MAX).map(|_| ()),
    ] {
        assert!(
            matches!(r, Err(GraphError::IndexOutOfRange { .. })),
            "{r:?}"
        );
    }
    let r = ctx.set_src(s, graph::MAX_SRC, None);
    assert!(
        matches!(
            r,
            Err(GraphError::IndexOutOfRange {
                what: "source slot",
                ..
            })
        ),
        "{r:?}"
    );
}
