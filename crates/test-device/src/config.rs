//! What a test device looks like: its memory, its ops, its speed.

use std::time::Duration;

use graph::Op;

/// The knobs of a test device. Start from [`TestDeviceConfig::default`] (or
/// [`TestDeviceConfig::named`]) and change what the test needs.
///
/// ```
/// use std::time::Duration;
/// use graph::Op;
/// use test_device::TestDeviceConfig;
/// let cfg = TestDeviceConfig::named("GPU0")
///     .alignment(256)
///     .max_buffer_size(1 << 20)
///     .supported_ops([Op::Add, Op::MulMat])
///     .op_latency(Op::MulMat, Duration::from_micros(50));
/// assert_eq!(cfg.name, "GPU0");
/// assert!(cfg.supports(Op::Add) && !cfg.supports(Op::SoftMax));
/// assert_eq!(cfg.latency_of(Op::MulMat), Duration::from_micros(50));
/// assert_eq!(cfg.latency_of(Op::Add), Duration::ZERO);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct TestDeviceConfig {
    /// Device name (and buffer type and backend name), e.g. `"TEST0"`.
    pub name: String,
    /// Alignment of every allocation and tensor offset (a power of two).
    pub alignment: usize,
    /// Largest single buffer.
    pub max_buffer_size: usize,
    /// Total device memory; allocations beyond it fail with `AllocationFailed`.
    pub memory: usize,
    /// Ops the device computes (view ops and `NONE` are always accepted: they compute
    /// nothing). `None`: every op the CPU kernels compute.
    pub supported_ops: Option<Vec<Op>>,
    /// Latency added before each computed node, per op (ops not listed: `default_latency`).
    pub latencies: Vec<(Op, Duration)>,
    /// Latency added before each computed node whose op has no entry in `latencies`.
    pub default_latency: Duration,
    /// Latency added before each transfer command (set/get/copy/memset).
    pub transfer_latency: Duration,
    /// Threads the CPU kernels use on the device's worker (1 keeps results bit-for-bit
    /// deterministic).
    pub compute_threads: usize,
    /// Answer of `offload_op` (whether ops with host weights are worth moving here).
    pub offload: bool,
}

impl Default for TestDeviceConfig {
    fn default() -> Self {
        TestDeviceConfig {
            name: "TEST0".to_owned(),
            alignment: 128,
            max_buffer_size: usize::MAX,
            memory: 1 << 30,
            supported_ops: None,
            latencies: Vec::new(),
            default_latency: Duration::ZERO,
            transfer_latency: Duration::ZERO,
            compute_threads: 1,
            offload: false,
        }
    }
}

impl TestDeviceConfig {
    /// The default configuration with another name.
    pub fn named(name: &str) -> Self {
        TestDeviceConfig {
            name: name.to_owned(),
            ..Self::default()
        }
    }
    /// Set the alignment.
    pub fn alignment(mut self, alignment: usize) -> Self {
        self.alignment = alignment;
        self
    }
    /// Set the max buffer size.
    pub fn max_buffer_size(mut self, size: usize) -> Self {
        self.max_buffer_size = size;
        self
    }
    /// Set the total memory.
    pub fn memory(mut self, bytes: usize) -> Self {
        self.memory = bytes;
        self
    }
    /// Restrict the computed ops to `ops`.
    pub fn supported_ops(mut self, ops: impl IntoIterator<Item = Op>) -> Self {
        self.supported_ops = Some(ops.into_iter().collect());
        self
    }
    /// Add `latency` before every node computing `op`.
    pub fn op_latency(mut self, op: Op, latency: Duration) -> Self {
        self.latencies.retain(|(o, _)| *o != op);
        self.latencies.push((op, latency));
        self
    }
    /// Add `latency` before every computed node of an op without its own latency.
    pub fn default_latency(mut self, latency: Duration) -> Self {
        self.default_latency = latency;
        self
    }
    /// Add `latency` before every transfer.
    pub fn transfer_latency(mut self, latency: Duration) -> Self {
        self.transfer_latency = latency;
        self
    }
    /// Set the kernel threads.
    pub fn compute_threads(mut self, n: usize) -> Self {
        self.compute_threads = n.max(1);
        self
    }
    /// Set the `offload_op` answer.
    pub fn offload(mut self, offload: bool) -> Self {
        self.offload = offload;
        self
    }

    /// Whether the configuration lists `op` (view ops and `NONE` always count).
    pub fn supports(&self, op: Op) -> bool {
        op == Op::None
            || op.is_view_op()
            || self
                .supported_ops
                .as_ref()
                .is_none_or(|ops| ops.contains(&op))
    }

    /// The latency before a node computing `op`.
    pub fn latency_of(&self, op: Op) -> Duration {
        self.latencies
            .iter()
            .find(|(o, _)| *o == op)
            .map_or(self.default_latency, |(_, d)| *d)
    }
}
