//! CPU compute kernels for `graph` graphs, with ggml's semantics.
//!
//! [`CpuCompute`] owns a persistent worker pool and reusable scratch memory and computes the
//! nodes of a [`graph::GraphView`] in order; [`supports_op`] says exactly which nodes it can
//! compute (op and element types), so a scheduler can route everything else elsewhere. The
//! CPU backend (`backend-cpu`) wraps this in a `BackendImpl`.
//!
//! # What is implemented
//!
//! | op | types |
//! | --- | --- |
//! | ADD, SUB, MUL, DIV (src1 broadcast over src0, any strides) | f32 |
//! | SQR, SQRT, SCALE, UNARY (ABS, NEG, TANH, RELU, SIGMOID, GELU, SILU, EXP, GELU_ERF) | f32 |
//! | NORM, RMS_NORM (eps) | f32 |
//! | SOFT_MAX (scale, optional f32/f16 mask broadcast over dims 2 and 3, ALiBi `max_bias`) | f32 |
//! | ROPE (normal and NeoX, n_dims, freq base/scale, YaRN ext/attn factors) | f32, i32 positions |
//! | GET_ROWS | f32, f16, bf16, q8_0, q4_0, q4_1 → f32; i32 → i32 |
//! | MUL_MAT (broadcast over dims 2 and 3, any src1 strides) | src0 f32, f16, bf16, q8_0, q4_0, q4_1; src1 f32 |
//! | CPY, DUP, CONT | f32 ↔ f16 ↔ bf16; any plain type to itself; f32 → q8_0, q4_0, q4_1 (same extents) |
//! | NONE, VIEW, RESHAPE, PERMUTE, TRANSPOSE | compute nothing |
//!
//! GELU uses the tanh formula in f32; ggml's default build instead looks the result up in a
//! table indexed by x rounded to f16, so the two differ by at most that rounding's effect.
//! GELU_ERF is evaluated branch-free in f64 (a fitted `erfc` form, see `math`), so it
//! vectorises; results are within about one f32 ulp of the exact function.
//! Row reductions (norms, softmax sums) accumulate in f64 like ggml's `ggml_float`; RMS_NORM
//! sums the f32-rounded squares, as ggml does. SILU and SOFT_MAX's exponentials use ggml's
//! vector `exp` polynomial lane for lane (module `gexp`), not libm, so a llama decode step
//! matches llama.cpp's to the bit in those ops. ROPE in normal mode rotates each pair with
//! the fused multiply-adds ggml's compiled loop uses (`x0·cos − (x1·sin)` and
//! `x0·sin + (x1·cos)`, the bracketed products rounded).
//!
//! # Design choices
//!
//! * **f32 weights on a CPU with AVX-512** take our own blocked product (module `sgemm`)
//!   from 80 columns: the weights packed once per op into 64-row panels, a 64 × 6 register
//!   tile (24 zmm accumulators) over `src1`'s columns in place, in units of 256 columns
//!   (1024 where the packed weights exceed a core's L2, so each unit's pass over them from
//!   L3 is paid back over four times the work). The `gemm` crate below,
//!   built without its nightly feature, runs AVX2 kernels only, so it cannot pass half of
//!   such a CPU's FMA peak. Each result is one FMA chain over `k` in order, so results do
//!   not depend on the thread count or the blocking (`benches/gemm.rs` measures it against
//!   an FMA loop).
//! * **Other matrix products** use the [`gemm`] crate for products with at least 16 columns in
//!   `src1` (80 for f32 weights; prefill, batched work): it is maintained, pure Rust, selects
//!   AVX2/AVX-512/NEON kernels at run time, reaches close to peak FLOP/s, and needs no C
//!   toolchain. We call it single-threaded on row blocks from our own pool, so no second
//!   thread pool exists. f16, bf16 and q8_0 weights are dequantized into a per-thread f32
//!   panel first. f32 weights with 4 to 79 columns take register tiles of 4 rows × 3 columns
//!   instead (twelve accumulators, each row and column vector loaded once per step, the
//!   length cut into passes that keep a unit's rows and columns in L2): with so few columns
//!   the gemm's packing is not paid back, and on the development machine (one thread) the
//!   tiles took 0.6× its time at 32 columns and 0.74× at 64, while from 96 columns the gemm
//!   was faster. Thin products
//!   (decode: 1 to 15 columns) are memory bound, so they take a dot-product path: f32/f16/bf16
//!   rows against f32 columns; for q8_0/q4_0 weights the columns are quantized to q8_0 once
//!   and each row is dotted block by block with integer sums, as ggml does. q4_0 and f32 rows
//!   are dotted eight at a time, so each column load serves several rows and several weight
//!   streams run side by side.
//! * **q4_1 and thin q8_0 products are ggml's, bit for bit** (module `qdot`): the column is
//!   quantized by ggml's x86 rule (`id = 127/amax`, ties to even; q8_1 with its `s` for
//!   q4_1 rows) and each output is the integer dot in ggml's AVX2 summation order (eight
//!   four-byte lanes, an FMA per block, ggml's horizontal sum). Models checked token for
//!   token against llama.cpp (SmolLM2 Q4_1, its tied Q8_0 output head) need that: their
//!   greedy margins can be 0.1 logit. One column takes eight rows per call (decode), more
//!   columns take 4 × 4 tiles. q4_1 never takes the gemm; q8_0 from 16 columns still does.
//!   **f16 weights** (the attention over an f16 KV cache) likewise take the dot path at
//!   any column count: the column is rounded to f16 (ggml's `vec_dot_type`) and each output
//!   summed in ggml's order for the shape (module `hdot`). With AVX-512, one-column-order
//!   products read the f16 rows in place, converting in registers: one column six rows a
//!   call, several columns of one matrix (grouped-query heads) sixteen products a call.
//! * **q4_0 weights always take the dot-product path**, at any column count: its kernel
//!   takes four columns per call, so each block of eight rows is unpacked (nibbles, scales)
//!   once for four columns, and the integer dot products cost less than dequantizing to f32
//!   for the gemm. Measured on the development machine (2 threads): 4096×4096 × 32 columns
//!   took ≈26 ms through dequantize + gemm against ≈9 ms now, × 512 columns ≈270 ms against
//!   ≈130 ms. (For q8_0 the per-row dot path is the slower one from 16 columns, so q8_0 keeps
//!   the gemm.)
//! * **The thin q4_0 kernel** is compute bound (4096×4096 q4_0 weights are 9.4 MiB and stay
//!   in L3), so it is built around the work per block. The column is packed for it once per
//!   call (q8_0's quants and f16-rounded scales, but the scales stored as f32 and `8 · Σ q`
//!   precomputed per block; quantized with AVX2, since the portable quantizer calls `roundf`
//!   per element). The kernel multiplies unsigned nibbles with `maddubs`, packs the eight
//!   rows' exact block sums into the eight lanes of one vector (`hadd`s and one permute), and
//!   then needs one conversion, one scale multiply (eight row scales in one F16C conversion)
//!   and one FMA per block for all eight rows. The previous four-row kernel converted,
//!   broadcast and accumulated per row and converted the column scale per block (which LLVM
//!   chained behind an accumulator's FMA through a merged `vpinsrw`): on the development
//!   machine one thread took 1.5–1.8 ms for 4096×4096 against 0.6–0.7 ms now (ggml's
//!   one-row AVX2 loop: 0.95 ms). The portable version repeats the SIMD operations in order
//!   (with `f32::mul_add`), so every level gives the same bits. The crate is compiled for the baseline x86-64 target,
//!   so these dot products have AVX2/FMA/F16C and AVX-512 (F, BW, VL, VNNI) versions chosen
//!   at run time (`quant`'s `x86` module, intrinsics), with portable versions that Miri
//!   checks and tests compare against. (The AVX-512 level runs the eight f32 rows as two
//!   passes of its four-row kernel: the development machine has no AVX-512 to tune or test
//!   an eight-row version on.)
//! * **Repacked q4_0, q4_1 and q8_0 weights** (module [`repack`]): such matrices placed in the CPU device's
//!   `CPU_REPACK` buffer type (`backend-cpu`; ggml has a buffer type of that name for the
//!   same purpose) are stored with the blocks of sixteen rows interleaved, so that the
//!   AVX-512 VNNI kernel computes sixteen rows in the sixteen lanes of a vector with four
//!   loads, eight nibble masks and eight `dpbusd` per block and no shuffles (the plain
//!   kernel above gathers scales and quants from eight rows and packs its sums with `hadd`s),
//!   and one group of rows is one sequential stream. Same exact integer block sums, same
//!   f32 operations in the same order: the same bits as over plain weights, at every level
//!   (AVX2 and portable versions exist). q4_1 is interleaved the same way (the minimums
//!   after the scales) and its kernel keeps `qdot`'s eight lane accumulators per row as
//!   eight registers of sixteen rows: measured 1.4–3× faster than the plain q4_1 kernels at
//!   every column count from 1 to 512 (docs/benchmarks.md). Only MUL_MAT reads such a
//!   tensor, as its weights; `supports_op` refuses every other op on it, any view into it,
//!   and any tensor the buffer stores as it is.
//! * **The thin f32 kernel** (decode with f32 weights) is bound by DRAM reads: 4096×4096
//!   weights are 64 MiB, twice the L3. On the 2-core Zen 3 (EPYC Milan) development machine
//!   a core reads markedly faster from several streams than from one: a plain sequential
//!   AVX2 sum reached about 60 % of eight streams read side by side. So the kernel dots
//!   eight rows per pass (eight streams, eight independent FMA chains, one column load per
//!   eight row loads) and prefetches 256 bytes ahead in each row. Measured against each
//!   other in a kernel-only harness: one or two rows per pass were 25–40 % slower, four
//!   rows (the previous kernel) a few percent slower, twelve rows or two vectors per row no
//!   better, prefetching 1 KiB or more ahead slower than none. `benches/kernels.rs` measures
//!   the ceiling in the same run (`mul_mat/read_64MiB_baseline`, eight streams per thread).
//!   Each row's dot product is a function of that row and the column only, so results do
//!   not depend on the thread count or on how rows fall into groups.
//! * **The decode step's q4_1 / q8_0 mat-vec** (eight weight rows against one column, the
//!   SmolLM2 decode path) has an AVX-512 + VNNI kernel of its own (`qmv512`): two rows per
//!   512-bit register, `dpbusd` for the exact four-byte lane sums, the eight rows' block
//!   scales converted and multiplied in one vector. The AVX2 kernel spilled its eight rows'
//!   state to the stack on every block. Same operations per row in the same order, so the
//!   same bits as the AVX2 and portable kernels (its test compares all three). One-column
//!   products go sixteen rows per call to its transposing kernels (the plain blocks
//!   rearranged in registers into the repacked kernels' register contents), which keep the
//!   weights streaming closer to the read than two eight-row calls. On Intel cores, whose
//!   512-bit shuffles share one port, q4_1 takes a kernel without transposes instead (four
//!   rows to a register, one per 128-bit lane; the headers by one gather): 1.2× the
//!   transposing kernel's rate there, same bits.
//! * **`half`** converts f16/bf16: it is the standard crate for these types, exact in both
//!   directions (round to nearest even), and uses the F16C instructions when the CPU has them.
//!   Slices of f16 (KV-cache rows read, the V-cache column written per decode step) go
//!   through `mem`'s own F16C loops instead: `half`'s slice conversion makes one out-of-line
//!   call per eight values and copies short slices through a chunk buffer.
//! * **Threads**: a persistent pool (see `pool`: a job is handed over through atomics, with no
//!   lock while the threads are awake), work split per op into row units; ops below
//!   a work threshold run on the calling thread only. Units are claimed in chunks from a
//!   shared counter, except in the thin matrix products: there each thread owns one
//!   contiguous range of weight rows and walks it in order, stealing from the back of the
//!   other threads' ranges when its own is done. With a shared counter the two cores take
//!   alternate chunks of one region; in a kernel-only harness that read 5–15 % slower than
//!   contiguous halves in most runs (within the noise of the criterion bench on the shared
//!   machine). The stealing keeps the load balance the counter gave on a loaded machine.
//!   An owner claims at least `OWN_CLAIM_WORK` of its range at once (a decode step's
//!   units of 16 short rows cost about as much to claim as to compute) and the product
//!   paths compute a claim's row blocks as one run; a thief takes small chunks.
//! * **Products of one input run as one job**: MUL_MAT nodes over quantized weights that
//!   follow each other in the graph (views between them aside) and multiply the same `src1`
//!   (a layer's Q, K and V; gate and up) pack that input once and hand the threads one job,
//!   every product's row blocks in one numbering (`exec::shared_column_run`). Each result is
//!   the same bits as the product computed alone. Each job costs a hand-over to the workers
//!   (time stamps in a decode step: the worker starts 0.16–0.21 µs after the job is posted,
//!   the caller waits 0.3–0.6 µs for it at the end), and a SmolLM2-135M step's 210 products
//!   became 120 jobs. Sixty such layers' products (`step_q4_1_repack_60_layers` in
//!   `benches/matvec.rs`, 240 jobs instead of 420) took 2.72–3.12 ms against 3.21–3.42,
//!   five alternations. A result that overlaps a source or another result (no allocator
//!   does this) makes the nodes run one at a time, in graph order.
//! * **Memory**: all raw pointer work on tensor bytes is in one module (`mem`); kernels read
//!   rows into per-thread f32 scratch and write results back, which makes in-place ops and
//!   arbitrary strides correct. The only other `unsafe` code: the pool's lifetime-erased job
//!   pointer (`pool`) and the SIMD loads from block slices (`quant`, `qdot`, `qmv512`). Miri
//!   runs the test suite with small shapes (the gemm path, which needs large shapes and SIMD,
//!   is skipped there).
//! * **Bad input** (unallocated or non-host tensors, out-of-range row indices, unsupported
//!   nodes) gives a [`BackendError`], never a panic. Writing through a buffer over read-only
//!   host memory is the buffer's business: this crate trusts `host_ptr`.
//!
//! ```
//! use backend_core::ComputeStatus;
//! use cpu_kernels::{CpuCompute, supports_op};
//! use graph::{Context, ElementType, Graph};
//! # fn host_buffer(size: usize) -> backend_core::Buffer { cpu_kernels::doc_support::host_buffer(size) }
//!
//! let mut ctx = Context::new();
//! let a = ctx.new_tensor_1d(ElementType::F32, 4)?;
//! let b = ctx.new_tensor_1d(ElementType::F32, 4)?;
//! let c = ctx.add(a, b)?;
//! let mut g = Graph::default();
//! g.build_forward_expand(&mut ctx, c)?;
//! assert!(supports_op(&ctx, c));
//!
//! let buf = host_buffer(3 * 32);
//! for (i, t) in [a, b, c].into_iter().enumerate() {
//!     backend_core::tensor_alloc(&mut ctx, &buf, t, i * 32)?;
//! }
//! let f = |v: [f32; 4]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
//! backend_core::tensor_set(&ctx, a, 0, &f([1.0, 2.0, 3.0, 4.0]))?;
//! backend_core::tensor_set(&ctx, b, 0, &f([10.0, 20.0, 30.0, 40.0]))?;
//!
//! let cpu = CpuCompute::new(2);
//! assert_eq!(cpu.compute(&ctx, g.as_view(), None)?, ComputeStatus::Success);
//! let mut out = [0u8; 16];
//! backend_core::tensor_get(&ctx, c, 0, &mut out)?;
//! assert_eq!(out, f([11.0, 22.0, 33.0, 44.0])[..]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod exec;
mod gexp;
mod hdot;
mod isa;
mod math;
mod mem;
mod pool;
mod q4tiles;
mod qdot;
#[cfg(all(target_arch = "x86_64", not(miri)))]
mod qmv512;
mod quant;
pub mod repack;
mod sgemm;

#[doc(hidden)]
pub mod doc_support;

pub use isa::{IsaPath, isa_paths, isa_summary};

use std::ptr::NonNull;
use std::sync::Arc;

use backend_core::{BackendError, Buffer, ComputeStatus};
use graph::{Context, ElementType, GraphView, Op, TensorId, UnaryOp};
use parking_lot::Mutex;

use crate::exec::{Exec, Scratch};
use crate::pool::Pool;

/// An abort callback: polled between ops; returning `true` stops the compute.
pub type AbortFn = dyn Fn() -> bool + Send + Sync;

/// Options of one compute: how many threads to use and an optional abort callback.
///
/// ```
/// use cpu_kernels::ComputeOptions;
/// let o = ComputeOptions::default();
/// assert!(o.n_threads >= 1);
/// assert!(o.abort.is_none());
/// ```
#[derive(Clone)]
pub struct ComputeOptions {
    /// Threads to use (at most the pool's size; at least 1).
    pub n_threads: usize,
    /// Called between ops; `true` aborts the compute with [`ComputeStatus::Aborted`].
    pub abort: Option<Arc<AbortFn>>,
}

impl Default for ComputeOptions {
    fn default() -> Self {
        ComputeOptions {
            n_threads: default_threads(),
            abort: None,
        }
    }
}

impl std::fmt::Debug for ComputeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComputeOptions")
            .field("n_threads", &self.n_threads)
            .field("abort", &self.abort.is_some())
            .finish()
    }
}

/// Where the bytes of a buffer are, for a compute over memory that is not host memory: a
/// device that runs these kernels on memory it owns (the in-process test device) passes one
/// to [`CpuCompute::compute_resolved`]. With a resolver, every buffer of every node is
/// resolved through it (host buffers included), so the device alone decides what its
/// kernels may address.
///
/// # Safety
///
/// A pointer returned for `buffer` must be valid for reads and writes of `buffer.size()`
/// bytes for the whole compute call it was asked in, and nothing else may access those bytes
/// during that call except the kernels (which write each destination element once, from one
/// thread, as for host memory).
///
/// ```
/// use std::ptr::NonNull;
/// use backend_core::Buffer;
/// /// Addresses host buffers only (what a compute without a resolver does).
/// struct HostOnly;
/// // SAFETY: host pointers are valid for the buffer's size by `BufferImpl`'s contract.
/// unsafe impl cpu_kernels::MemoryResolver for HostOnly {
///     fn base_ptr(&self, buffer: &Buffer) -> Option<NonNull<u8>> {
///         buffer.host_ptr()
///     }
/// }
/// ```
pub unsafe trait MemoryResolver: Sync {
    /// The base pointer of `buffer`'s memory, or `None` if this compute cannot address it
    /// (the compute then fails with an error naming the tensor).
    fn base_ptr(&self, buffer: &Buffer) -> Option<NonNull<u8>>;
}

/// The machine's available parallelism (1 if unknown).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A compute engine: a persistent pool of `n_threads - 1` workers (the caller is thread 0)
/// and scratch memory reused across computes. `Send + Sync`; concurrent computes on one
/// engine run one after the other.
///
/// ```
/// use cpu_kernels::CpuCompute;
/// let cpu = CpuCompute::new(2);
/// assert_eq!(cpu.n_threads(), 2);
/// ```
pub struct CpuCompute {
    pool: Mutex<Pool>,
    scratch: Mutex<Scratch>,
}

impl std::fmt::Debug for CpuCompute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuCompute")
            .field("n_threads", &self.n_threads())
            .finish()
    }
}

/// A plan for one graph (`ggml_graph_plan`): the nodes it was made for, checked, and its
/// own scratch memory, which stays allocated across [`CpuCompute::compute_plan`] calls.
///
/// ```
/// # use graph::{Context, ElementType, Graph};
/// # let mut ctx = Context::new();
/// # let a = ctx.new_tensor_1d(ElementType::F32, 4)?;
/// # let s = ctx.sqr(a)?;
/// # let mut g = Graph::default();
/// # g.build_forward_expand(&mut ctx, s)?;
/// let cpu = cpu_kernels::CpuCompute::new(1);
/// let plan = cpu.plan(&ctx, g.as_view())?;
/// assert_eq!(plan.n_nodes(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct CpuPlan {
    nodes: Vec<TensorId>,
    scratch: Scratch,
}

impl CpuPlan {
    /// Number of nodes the plan covers.
    pub fn n_nodes(&self) -> usize {
        self.nodes.len()
    }
    /// Bytes of scratch memory the plan currently holds (grows to the largest need, then
    /// stays).
    pub fn scratch_bytes(&self) -> usize {
        self.scratch.capacity_bytes()
    }
}

impl backend_core::GraphPlan for CpuPlan {}

impl CpuCompute {
    /// An engine with `n_threads` threads (0 means [`default_threads`]).
    pub fn new(n_threads: usize) -> Self {
        let n = if n_threads == 0 {
            default_threads()
        } else {
            n_threads
        };
        let pool = Pool::new(n);
        let n = pool.n_threads();
        CpuCompute {
            pool: Mutex::new(pool),
            scratch: Mutex::new(Scratch::new(n)),
        }
    }

    /// Threads in the pool, the caller included.
    pub fn n_threads(&self) -> usize {
        self.pool.lock().n_threads()
    }

    /// How many times the pool's workers have gone to sleep (blocked on a condition variable
    /// after polling for work) since the engine was made. Workers poll for a few microseconds
    /// between jobs and sleep only when idle longer, so a count that climbs during a model's
    /// decode says the hand-over between ops waits for wake-ups.
    ///
    /// ```
    /// let compute = cpu_kernels::CpuCompute::new(2);
    /// // An idle worker goes to sleep soon after it starts.
    /// while compute.worker_sleeps() == 0 {
    ///     std::thread::sleep(std::time::Duration::from_millis(1));
    /// }
    /// ```
    pub fn worker_sleeps(&self) -> u64 {
        self.pool.lock().worker_sleeps()
    }

    /// Compute every node of `graph` in order with all threads. `abort` is polled before each
    /// node (before each run of products of one input, which compute together); when it
    /// returns `true` the compute stops with [`ComputeStatus::Aborted`] (nodes computed so far
    /// keep their results; nothing is left half-written).
    pub fn compute(
        &self,
        ctx: &Context,
        graph: GraphView<'_>,
        abort: Option<&(dyn Fn() -> bool + Send + Sync)>,
    ) -> Result<ComputeStatus, BackendError> {
        let pool = self.pool.lock();
        let mut scratch = self.scratch.lock();
        let n = pool.n_threads();
        run(&pool, n, &mut scratch, ctx, graph.nodes, abort, None)
    }

    /// [`CpuCompute::compute_with`] over memory found through `resolver` instead of host
    /// pointers: the entry point for a device whose memory only it can address.
    pub fn compute_resolved(
        &self,
        ctx: &Context,
        graph: GraphView<'_>,
        opts: &ComputeOptions,
        resolver: &dyn MemoryResolver,
    ) -> Result<ComputeStatus, BackendError> {
        self.run_locked(ctx, graph, opts, Some(resolver))
    }

    /// [`CpuCompute::compute`] with explicit options (thread count capped by the pool size).
    pub fn compute_with(
        &self,
        ctx: &Context,
        graph: GraphView<'_>,
        opts: &ComputeOptions,
    ) -> Result<ComputeStatus, BackendError> {
        self.run_locked(ctx, graph, opts, None)
    }

    /// Run `graph` holding the pool and scratch, with memory found through `resolver` or,
    /// without one, through host pointers.
    fn run_locked(
        &self,
        ctx: &Context,
        graph: GraphView<'_>,
        opts: &ComputeOptions,
        resolver: Option<&dyn MemoryResolver>,
    ) -> Result<ComputeStatus, BackendError> {
        let pool = self.pool.lock();
        let mut scratch = self.scratch.lock();
        run(
            &pool,
            opts.n_threads.max(1),
            &mut scratch,
            ctx,
            graph.nodes,
            opts.abort.as_deref(),
            resolver,
        )
    }

    /// Check every node of `graph` and make a plan holding its own scratch memory.
    pub fn plan(&self, ctx: &Context, graph: GraphView<'_>) -> Result<CpuPlan, BackendError> {
        check_nodes(ctx, graph.nodes)?;
        Ok(CpuPlan {
            nodes: graph.nodes.to_vec(),
            scratch: Scratch::new(self.n_threads()),
        })
    }

    /// Re-target `plan` at a changed graph (`graph_plan_update`), keeping its scratch.
    pub fn update_plan(
        &self,
        plan: &mut CpuPlan,
        ctx: &Context,
        graph: GraphView<'_>,
    ) -> Result<(), BackendError> {
        check_nodes(ctx, graph.nodes)?;
        plan.nodes.clear();
        plan.nodes.extend_from_slice(graph.nodes);
        Ok(())
    }

    /// Compute the graph a plan was made for. `graph` must have the plan's nodes.
    pub fn compute_plan(
        &self,
        plan: &mut CpuPlan,
        ctx: &Context,
        graph: GraphView<'_>,
        abort: Option<&(dyn Fn() -> bool + Send + Sync)>,
    ) -> Result<ComputeStatus, BackendError> {
        if graph.nodes != plan.nodes.as_slice() {
            return Err(BackendError::failed(
                "CPU",
                "graph plan computed with a graph it was not made for (update the plan)",
            ));
        }
        let pool = self.pool.lock();
        let n = pool.n_threads();
        run(&pool, n, &mut plan.scratch, ctx, &plan.nodes, abort, None)
    }
}

fn check_nodes(ctx: &Context, nodes: &[TensorId]) -> Result<(), BackendError> {
    for &id in nodes {
        if !supports_op(ctx, id) {
            return Err(BackendError::UnsupportedOp {
                backend: "CPU".to_owned(),
                op: ctx.get(id)?.op().name(),
                tensor: id,
            });
        }
    }
    Ok(())
}

fn run(
    pool: &Pool,
    n_threads: usize,
    scratch: &mut Scratch,
    ctx: &Context,
    nodes: &[TensorId],
    abort: Option<&(dyn Fn() -> bool + Send + Sync)>,
    resolver: Option<&dyn MemoryResolver>,
) -> Result<ComputeStatus, BackendError> {
    scratch.even_out();
    let mut exec = Exec {
        pool,
        n_threads,
        scratch,
        resolver,
    };
    let mut i = 0;
    while let Some(&id) = nodes.get(i) {
        let t = ctx.get(id)?;
        if t.op() == Op::None || t.op().is_view_op() {
            i += 1;
            continue;
        }
        if abort.is_some_and(|f| f()) {
            tracing::debug!(node = ?id, "compute aborted");
            return Ok(ComputeStatus::Aborted);
        }
        // Products of one input (a layer's Q, K and V) go to the threads as one job.
        let (covered, products) = exec::shared_column_run(ctx, &nodes[i..]);
        if products.len() >= 2 {
            exec.shared_column_products(ctx, &products)?;
            i += covered;
        } else {
            exec.node(ctx, id)?;
            i += 1;
        }
    }
    Ok(ComputeStatus::Success)
}

/// Whether the rows of a quantized tensor are dense runs of whole blocks, which is what the
/// block kernels read and write (`TView::row_bytes`). A permuted view can have a row length
/// that is not a multiple of the block size; the kernels would then fill only the whole
/// blocks and leave the rest of each row as stale scratch.
fn block_rows(t: &graph::Tensor) -> bool {
    t.is_contiguous_rows() && t.ne()[0] % t.ty().block_size() as i64 == 0
}

fn is_float(t: ElementType) -> bool {
    matches!(t, ElementType::F32 | ElementType::F16 | ElementType::BF16)
}

/// Whether [`CpuCompute`] computes node `op` of `ctx`: the op, its parameters and the types of
/// its sources and result are all implemented. Stale ids and missing sources give `false`.
///
/// ```
/// use graph::{Context, ElementType};
/// let mut ctx = Context::new();
/// let w = ctx.new_tensor_2d(ElementType::Q4_0, 64, 8)?;
/// let x = ctx.new_tensor_2d(ElementType::F32, 64, 2)?;
/// let y = ctx.mul_mat(w, x)?;
/// assert!(cpu_kernels::supports_op(&ctx, y));
/// let w5 = ctx.new_tensor_2d(ElementType::Q5_0, 64, 8)?;
/// let y5 = ctx.mul_mat(w5, x)?;
/// assert!(!cpu_kernels::supports_op(&ctx, y5));
/// # Ok::<(), graph::GraphError>(())
/// ```
pub fn supports_op(ctx: &Context, op: TensorId) -> bool {
    let Ok(t) = ctx.get(op) else { return false };
    if !repack::layouts_supported(ctx, op) {
        return false;
    }
    let src = |i: usize| t.src(i).and_then(|s| ctx.get(s).ok());
    let f32_ = ElementType::F32;
    match t.op() {
        Op::None | Op::View | Op::Reshape | Op::Permute | Op::Transpose => true,
        Op::Add | Op::Sub | Op::Mul | Op::Div => match (src(0), src(1)) {
            (Some(a), Some(b)) => {
                a.ty() == f32_
                    && b.ty() == f32_
                    && t.ty() == f32_
                    && a.ne() == t.ne()
                    && b.can_repeat(a)
            }
            _ => false,
        },
        Op::Sqr | Op::Sqrt | Op::Scale | Op::Norm | Op::RmsNorm => {
            src(0).is_some_and(|a| a.ty() == f32_ && a.ne() == t.ne()) && t.ty() == f32_
        }
        Op::Unary(u) => {
            matches!(
                u,
                UnaryOp::Abs
                    | UnaryOp::Neg
                    | UnaryOp::Tanh
                    | UnaryOp::Relu
                    | UnaryOp::Sigmoid
                    | UnaryOp::Gelu
                    | UnaryOp::Silu
                    | UnaryOp::Exp
                    | UnaryOp::GeluErf
            ) && src(0).is_some_and(|a| a.ty() == f32_ && a.ne() == t.ne())
                && t.ty() == f32_
        }
        Op::SoftMax => {
            let Some(a) = src(0) else { return false };
            let mask_ok = match t.src(1) {
                None => t.op_params().f32(1) <= 0.0,
                Some(_) => src(1).is_some_and(|m| {
                    matches!(m.ty(), ElementType::F32 | ElementType::F16)
                        && m.ne()[0] == a.ne()[0]
                        && m.ne()[1] >= a.ne()[1]
                        && m.ne()[2] > 0
                        && m.ne()[3] > 0
                        && a.ne()[2] % m.ne()[2] == 0
                        && a.ne()[3] % m.ne()[3] == 0
                }),
            };
            a.ty() == f32_ && t.ty() == f32_ && a.ne() == t.ne() && mask_ok
        }
        Op::Rope => {
            let p = t.op_params();
            let (n_dims, mode) = (p.i32(1), p.i32(2));
            match (src(0), src(1)) {
                (Some(a), Some(pos)) => {
                    a.ty() == f32_
                        && t.ty() == f32_
                        && a.ne() == t.ne()
                        && pos.ty() == ElementType::I32
                        // The kernel reads `pos[i2, 0, 0, 0]` for every `i2 < a.ne2`.
                        && pos.ne()[0] >= a.ne()[2]
                        && pos.ne()[1..].iter().all(|&n| n > 0)
                        && (mode == graph::rope_mode::NORMAL || mode == graph::rope_mode::NEOX)
                        && n_dims > 0
                        && n_dims % 2 == 0
                        && i64::from(n_dims) <= a.ne()[0]
                }
                _ => false,
            }
        }
        Op::GetRows => match (src(0), src(1)) {
            (Some(a), Some(r)) => {
                let ok_src = match a.ty() {
                    ElementType::Q8_0 | ElementType::Q4_0 | ElementType::Q4_1 => {
                        block_rows(a) && t.ty() == f32_
                    }
                    ElementType::I32 => t.ty() == ElementType::I32,
                    ty => is_float(ty) && t.ty() == f32_,
                };
                ok_src
                    && r.ty() == ElementType::I32
                    && t.ne() == [a.ne()[0], r.ne()[0], r.ne()[1], r.ne()[2]]
                    && a.ne()[2] == r.ne()[1]
                    && a.ne()[3] == r.ne()[2]
                    && r.ne()[3] == 1
            }
            _ => false,
        },
        Op::MulMat => match (src(0), src(1)) {
            (Some(a), Some(b)) => {
                let ok_a = match a.ty() {
                    ElementType::Q8_0 | ElementType::Q4_0 | ElementType::Q4_1 => block_rows(a),
                    ty => is_float(ty),
                };
                let (an, bn) = (a.ne(), b.ne());
                ok_a && b.ty() == f32_
                    && t.ty() == f32_
                    && an[0] == bn[0]
                    && an[2] > 0
                    && an[3] > 0
                    && bn[2] % an[2] == 0
                    && bn[3] % an[3] == 0
                    && t.ne() == [an[1], bn[1], bn[2], bn[3]]
            }
            _ => false,
        },
        Op::Cpy | Op::Dup | Op::Cont => {
            let Some(a) = src(0) else { return false };
            if a.nelements() != t.nelements() {
                return false;
            }
            let (from, to) = (a.ty(), t.ty());
            if to.is_quantized() {
                from == f32_
                    && matches!(
                        to,
                        ElementType::Q8_0 | ElementType::Q4_0 | ElementType::Q4_1
                    )
                    && a.ne() == t.ne()
                    && block_rows(t)
            } else if from.is_quantized() {
                false
            } else {
                from == to || (is_float(from) && is_float(to))
            }
        }
        _ => false,
    }
}
