//! Graph files (`shared/fixtures/FORMAT.md`) and planning-only backends that honour them.
//!
//! Why backends made from a file: the scheduler's decisions depend only on what backends
//! say about themselves (device type, which ops they run, which buffer types they read,
//! which ops they want offloaded) and on where weights live. A graph file states exactly
//! that, so any plan of the reference can be reproduced without the hardware. The
//! backends' buffers are real (Vec-backed, allocated on first write so that planning a
//! 7-billion-parameter layout costs no memory) and their compute does nothing but count.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use backend_core::{
    Backend, BackendError, BackendImpl, Buffer, BufferImpl, BufferType, BufferTypeImpl,
    BufferUsage, ComputeStatus, Device, DeviceImpl, DeviceType, Guid,
};
use graph::{Context, ElementType, Graph, GraphError, GraphView, Op, Tensor, TensorId, UnaryOp};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::error::SchedError;
use crate::plan::Plan;
use crate::sched::Scheduler;

/// Why a graph file could not be turned into a plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FixtureError {
    /// The file is not valid JSON of the graph-file shape.
    #[error("invalid graph file: {0}")]
    Json(String),
    /// Something the file says is inconsistent or unknown.
    #[error("{0}")]
    Invalid(String),
    /// A tensor could not be built.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// A buffer operation failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The scheduler rejected the graph.
    #[error(transparent)]
    Sched(#[from] SchedError),
}

fn invalid(s: impl Into<String>) -> FixtureError {
    FixtureError::Invalid(s.into())
}

/// A set of ops named as in graph files (`NONE`, `UNARY` for every unary op, …).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct OpSet(u128);

impl OpSet {
    /// Every op.
    pub const ALL: OpSet = OpSet(u128::MAX);
    /// No op.
    pub const EMPTY: OpSet = OpSet(0);

    fn bit(op: Op) -> u128 {
        1u128 << (op.ggml_id() & 127)
    }

    /// Whether `op` is in the set.
    pub fn contains(self, op: Op) -> bool {
        self.0 & Self::bit(op) != 0
    }

    /// The set of ops named in `names`.
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Result<OpSet, FixtureError> {
        let mut m = 0u128;
        for n in names {
            let n = n.as_ref();
            let op = match n {
                "UNARY" => Op::Unary(UnaryOp::Silu),
                _ => Op::from_name(n).ok_or_else(|| invalid(format!("unknown op name {n:?}")))?,
            };
            m |= Self::bit(op);
        }
        Ok(OpSet(m))
    }

    /// Every op except those in `other`.
    pub fn complement(self) -> OpSet {
        OpSet(!self.0)
    }
}

/// `supports_ops` of a graph file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OpsSpec {
    /// `"all"`.
    All(String),
    /// `{"only": [...]}`.
    Only {
        /// The ops.
        only: Vec<String>,
    },
    /// `{"except": [...]}`.
    Except {
        /// The ops.
        except: Vec<String>,
    },
}

impl Default for OpsSpec {
    fn default() -> Self {
        OpsSpec::All("all".into())
    }
}

impl OpsSpec {
    fn op_set(&self) -> Result<OpSet, FixtureError> {
        match self {
            OpsSpec::All(s) if s == "all" => Ok(OpSet::ALL),
            OpsSpec::All(s) => Err(invalid(format!("supports_ops: unknown value {s:?}"))),
            OpsSpec::Only { only } => OpSet::from_names(only),
            OpsSpec::Except { except } => Ok(OpSet::from_names(except)?.complement()),
        }
    }
}

/// One backend of a graph file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendSpec {
    /// Unique name; also the default buffer type's name.
    pub name: String,
    /// `"cpu"`, `"gpu"` or `"accel"`.
    pub device_type: String,
    /// Buffer type it computes in (default: its name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_type: Option<String>,
    /// Whether that buffer type is host memory (default: device type is cpu).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<bool>,
    /// Buffer type alignment (default 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alignment: Option<usize>,
    /// Ops it computes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supports_ops: Option<OpsSpec>,
    /// Ops it wants offloaded from host weights.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub offload_ops: Vec<String>,
    /// Other buffer types it can read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reads_buffer_types: Vec<String>,
}

impl BackendSpec {
    /// A CPU backend with every default.
    pub fn cpu(name: &str) -> Self {
        BackendSpec {
            name: name.into(),
            device_type: "cpu".into(),
            ..Default::default()
        }
    }
    /// A GPU backend with every default.
    pub fn gpu(name: &str) -> Self {
        BackendSpec {
            name: name.into(),
            device_type: "gpu".into(),
            ..Default::default()
        }
    }
}

/// One tensor of a graph file (a leaf without `op`, else an op).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TensorSpec {
    /// Unique name.
    pub name: String,
    /// Element type (leafs).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub ty: Option<String>,
    /// Extents (leafs; VIEW and RESHAPE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ne: Option<Vec<i64>>,
    /// Buffer type to pre-allocate the leaf in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer: Option<String>,
    /// Usage of that buffer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<String>,
    /// `"input"`, `"output"`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<String>,
    /// The op.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    /// Source names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub src: Vec<String>,
    /// SCALE / SOFT_MAX scale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<f32>,
    /// Norm epsilon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eps: Option<f32>,
    /// SOFT_MAX max bias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bias: Option<f32>,
    /// ROPE dimensions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_dims: Option<i32>,
    /// ROPE mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<i32>,
    /// UNARY function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unary: Option<String>,
    /// VIEW strides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nb: Option<Vec<usize>>,
    /// VIEW offset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<usize>,
    /// PERMUTE axes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub axes: Option<[i32; 4]>,
}

impl TensorSpec {
    /// A leaf.
    pub fn leaf(name: &str, ty: &str, ne: &[i64]) -> Self {
        TensorSpec {
            name: name.into(),
            ty: Some(ty.into()),
            ne: Some(ne.to_vec()),
            ..Default::default()
        }
    }
    /// An op over sources.
    pub fn op(name: &str, op: &str, src: &[&str]) -> Self {
        TensorSpec {
            name: name.into(),
            op: Some(op.into()),
            src: src.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        }
    }
    /// Pre-allocate in `buffer` (weights usage).
    pub fn in_buffer(mut self, buffer: &str) -> Self {
        self.buffer = Some(buffer.into());
        self
    }
    /// Add a flag.
    pub fn flag(mut self, f: &str) -> Self {
        self.flags.push(f.into());
        self
    }
}

/// A graph file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GraphFile {
    /// Free text.
    #[serde(default)]
    pub name: String,
    /// Scheduler and graph capacity.
    pub graph_size: usize,
    /// Pipeline parallelism.
    #[serde(default)]
    pub parallel: bool,
    /// Backends in priority order.
    pub backends: Vec<BackendSpec>,
    /// Tensors in creation order.
    pub tensors: Vec<TensorSpec>,
    /// Tensors to expand the graph from, in order.
    pub expand: Vec<String>,
    /// User assignments: tensor name → backend name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub assign: BTreeMap<String, String>,
}

// ---- fixture backends ----

/// A buffer type of a graph file.
#[derive(Debug)]
struct FixtureBufferType {
    name: String,
    host: bool,
    alignment: usize,
}

impl BufferTypeImpl for FixtureBufferType {
    fn name(&self) -> &str {
        &self.name
    }
    fn alloc_buffer(&self, size: usize) -> backend_core::Result<Box<dyn BufferImpl>> {
        Ok(Box::new(FixtureBuffer {
            size,
            data: Mutex::new(None),
        }))
    }
    fn alignment(&self) -> usize {
        self.alignment
    }
    fn is_host(&self) -> bool {
        self.host
    }
}

/// Vec-backed memory, materialised on first write or read.
struct FixtureBuffer {
    size: usize,
    data: Mutex<Option<Vec<u8>>>,
}

impl FixtureBuffer {
    fn with<R>(&self, f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        let mut g = self.data.lock();
        let v = g.get_or_insert_with(|| vec![0u8; self.size]);
        f(v)
    }
    fn range(&self, t: &Tensor, offset: usize, len: usize) -> backend_core::Result<(usize, usize)> {
        let base = t.storage().map_or(0, |s| s.offset);
        let start = base + offset;
        match start.checked_add(len) {
            Some(end) if end <= self.size => Ok((start, end)),
            _ => Err(BackendError::OutOfBounds {
                what: "fixture buffer",
                offset: start,
                size: len,
                limit: self.size,
            }),
        }
    }
}

impl BufferImpl for FixtureBuffer {
    fn memset_tensor(
        &self,
        tensor: &Tensor,
        value: u8,
        offset: usize,
        size: usize,
    ) -> backend_core::Result<()> {
        let (a, b) = self.range(tensor, offset, size)?;
        self.with(|v| v[a..b].fill(value));
        Ok(())
    }
    fn set_tensor(&self, tensor: &Tensor, offset: usize, data: &[u8]) -> backend_core::Result<()> {
        let (a, b) = self.range(tensor, offset, data.len())?;
        self.with(|v| v[a..b].copy_from_slice(data));
        Ok(())
    }
    fn get_tensor(
        &self,
        tensor: &Tensor,
        offset: usize,
        data: &mut [u8],
    ) -> backend_core::Result<()> {
        let (a, b) = self.range(tensor, offset, data.len())?;
        self.with(|v| data.copy_from_slice(&v[a..b]));
        Ok(())
    }
    fn clear(&self, value: u8) -> backend_core::Result<()> {
        self.with(|v| v.fill(value));
        Ok(())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

struct FixtureDevice {
    name: String,
    device_type: DeviceType,
    buft: BufferType,
    reads: Vec<BufferType>,
    supports: OpSet,
    offload: OpSet,
}

impl DeviceImpl for FixtureDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        "planning-only fixture device"
    }
    fn memory(&self) -> (usize, usize) {
        (0, 0)
    }
    fn device_type(&self) -> DeviceType {
        self.device_type
    }
    fn init_backend(&self, device: &Device, _params: &str) -> backend_core::Result<Backend> {
        Ok(Backend::new(FixtureBackend::new(
            &self.name,
            device.clone(),
        )))
    }
    fn buffer_type(&self) -> BufferType {
        self.buft.clone()
    }
    fn supports_op(&self, ctx: &Context, op: TensorId) -> bool {
        ctx.get(op).is_ok_and(|t| self.supports.contains(t.op()))
    }
    fn supports_buft(&self, buft: &BufferType) -> bool {
        *buft == self.buft
            || self.reads.contains(buft)
            || (self.device_type == DeviceType::Cpu && buft.is_host())
    }
    fn offload_op(&self, ctx: &Context, op: TensorId) -> bool {
        ctx.get(op).is_ok_and(|t| self.offload.contains(t.op()))
    }
}

/// A planning-only backend: it "computes" by counting nodes.
struct FixtureBackend {
    name: String,
    device: Device,
    computed: Arc<AtomicUsize>,
}

impl FixtureBackend {
    fn new(name: &str, device: Device) -> Self {
        FixtureBackend {
            name: name.to_owned(),
            device,
            computed: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl BackendImpl for FixtureBackend {
    fn name(&self) -> &str {
        &self.name
    }
    fn guid(&self) -> Guid {
        let mut g = [0u8; 16];
        for (d, s) in g.iter_mut().zip(self.name.bytes()) {
            *d = s;
        }
        g
    }
    fn device(&self) -> Device {
        self.device.clone()
    }
    fn graph_compute(
        &self,
        _ctx: &Context,
        graph: GraphView<'_>,
    ) -> backend_core::Result<ComputeStatus> {
        self.computed.fetch_add(graph.n_nodes(), Ordering::Relaxed);
        Ok(ComputeStatus::Success)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The backends and buffer types a graph file describes.
#[derive(Clone, Debug)]
pub struct FixtureBackends {
    backends: Vec<Backend>,
    bufts: Vec<(String, BufferType)>,
    counters: Vec<Arc<AtomicUsize>>,
}

impl FixtureBackends {
    /// Backends for `specs` in priority order. Buffer types are shared by name; the first
    /// backend naming one decides its host flag and alignment.
    pub fn new(specs: &[BackendSpec]) -> Result<Self, FixtureError> {
        let mut out = FixtureBackends {
            backends: Vec::new(),
            bufts: Vec::new(),
            counters: Vec::new(),
        };
        for s in specs {
            let device_type = match s.device_type.as_str() {
                "cpu" => DeviceType::Cpu,
                "gpu" => DeviceType::Gpu,
                "accel" => DeviceType::Accel,
                o => return Err(invalid(format!("{}: unknown device type {o:?}", s.name))),
            };
            if out.backends.iter().any(|b| b.name() == s.name) {
                return Err(invalid(format!("duplicate backend name {:?}", s.name)));
            }
            let buft_name = s.buffer_type.clone().unwrap_or_else(|| s.name.clone());
            let host = s.host.unwrap_or(device_type == DeviceType::Cpu);
            let alignment = s.alignment.unwrap_or(32);
            if !alignment.is_power_of_two() {
                return Err(invalid(format!("{}: alignment {alignment}", s.name)));
            }
            let buft = match out.buffer_type(&buft_name) {
                Some(b) => {
                    if s.host.is_some_and(|h| h != b.is_host())
                        || s.alignment.is_some_and(|a| a != b.alignment())
                    {
                        return Err(invalid(format!(
                            "{}: buffer type {buft_name} defined with another host flag or alignment",
                            s.name
                        )));
                    }
                    b
                }
                None => out.add_buffer_type(&buft_name, host, alignment),
            };
            let reads = s
                .reads_buffer_types
                .iter()
                .map(|n| match out.buffer_type(n) {
                    Some(b) => b,
                    None => out.add_buffer_type(n, false, 32),
                })
                .collect();
            let device = Device::new(FixtureDevice {
                name: s.name.clone(),
                device_type,
                buft,
                reads,
                supports: s.supports_ops.clone().unwrap_or_default().op_set()?,
                offload: OpSet::from_names(&s.offload_ops)?,
            });
            let imp = FixtureBackend::new(&s.name, device);
            out.counters.push(imp.computed.clone());
            out.backends.push(Backend::new(imp));
        }
        Ok(out)
    }

    fn add_buffer_type(&mut self, name: &str, host: bool, alignment: usize) -> BufferType {
        let b = BufferType::new(FixtureBufferType {
            name: name.to_owned(),
            host,
            alignment,
        });
        self.bufts.push((name.to_owned(), b.clone()));
        b
    }

    /// The buffer type named `name`.
    pub fn buffer_type(&self, name: &str) -> Option<BufferType> {
        self.bufts
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.clone())
    }

    /// The backends, priority order.
    pub fn backends(&self) -> &[Backend] {
        &self.backends
    }

    /// Nodes "computed" so far by backend `i`.
    pub fn computed(&self, i: usize) -> usize {
        self.counters
            .get(i)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

// ---- building ----

/// A graph file turned into backends, a context with pre-allocated leafs, and a graph.
#[derive(Debug)]
pub struct Built {
    /// The backends.
    pub backends: FixtureBackends,
    /// The tensors.
    pub ctx: Context,
    /// The graph.
    pub graph: Graph,
    /// Tensor ids by name.
    pub names: HashMap<String, TensorId>,
    /// The buffers holding the pre-allocated leafs.
    pub buffers: Vec<Buffer>,
    /// User assignments (tensor, backend index).
    pub assign: Vec<(TensorId, usize)>,
    /// Scheduler capacity.
    pub graph_size: usize,
    /// Pipeline parallelism.
    pub parallel: bool,
}

impl Built {
    /// A scheduler for these backends with the reference limits on and the user
    /// assignments applied (not yet allocated).
    pub fn scheduler(&self) -> Result<Scheduler, FixtureError> {
        let mut s = Scheduler::builder(self.backends.backends().to_vec())
            .graph_size(self.graph_size)
            .parallel(self.parallel)
            .reference_limits(true)
            .build()?;
        for &(t, b) in &self.assign {
            s.set_tensor_backend(&self.ctx, t, b)?;
        }
        Ok(s)
    }
}

fn parse_usage(u: Option<&str>) -> Result<BufferUsage, FixtureError> {
    match u {
        None | Some("weights") => Ok(BufferUsage::Weights),
        Some("any") => Ok(BufferUsage::Any),
        Some("compute") => Ok(BufferUsage::Compute),
        Some(o) => Err(invalid(format!("unknown usage {o:?}"))),
    }
}

impl GraphFile {
    /// Parse a graph file.
    pub fn from_json(s: &str) -> Result<Self, FixtureError> {
        serde_json::from_str(s).map_err(|e| FixtureError::Json(e.to_string()))
    }

    /// The graph file as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Build backends, tensors (pre-allocated leafs first) and the graph.
    pub fn build(&self) -> Result<Built, FixtureError> {
        let backends = FixtureBackends::new(&self.backends)?;
        let mut ctx = Context::with_capacity(self.tensors.len() * 2);
        let mut names: HashMap<String, TensorId> = HashMap::new();

        // leafs first, so that pre-allocated ones have memory before any view is made
        let mut groups: Vec<(String, BufferUsage, Vec<TensorId>)> = Vec::new();
        for t in self.tensors.iter().filter(|t| t.op.is_none()) {
            if names.contains_key(&t.name) {
                return Err(invalid(format!("duplicate tensor name {:?}", t.name)));
            }
            let ty: ElementType =
                t.ty.as_deref()
                    .ok_or_else(|| invalid(format!("{}: leaf without type", t.name)))?
                    .parse()
                    .map_err(|e: graph::UnknownType| invalid(e.to_string()))?;
            let ne =
                t.ne.as_deref()
                    .ok_or_else(|| invalid(format!("{}: leaf without ne", t.name)))?;
            let id = ctx.new_tensor(ty, ne)?;
            ctx.set_name(id, &t.name)?;
            names.insert(t.name.clone(), id);
            if let Some(b) = &t.buffer {
                let usage = parse_usage(t.usage.as_deref())?;
                match groups.iter_mut().find(|g| &g.0 == b) {
                    Some(g) => {
                        if g.1 != usage {
                            return Err(invalid(format!("buffer {b}: tensors disagree on usage")));
                        }
                        g.2.push(id);
                    }
                    None => groups.push((b.clone(), usage, vec![id])),
                }
            }
        }
        let mut buffers = Vec::new();
        let mut all_bufts = backends.clone();
        for (bname, usage, ids) in &groups {
            let buft = match all_bufts.buffer_type(bname) {
                Some(b) => b,
                None => all_bufts.add_buffer_type(bname, false, 32),
            };
            let align = buft.alignment().max(1);
            let mut offsets = Vec::with_capacity(ids.len());
            let mut size = 0usize;
            for &id in ids {
                let overflow =
                    || invalid(format!("the tensors of buffer {bname:?} overflow usize"));
                size = size.checked_next_multiple_of(align).ok_or_else(overflow)?;
                offsets.push(size);
                size = size
                    .checked_add(buft.alloc_size(&ctx[id]))
                    .ok_or_else(overflow)?;
            }
            let buf = buft.alloc_buffer(size)?;
            buf.set_usage(*usage);
            for (&id, &off) in ids.iter().zip(&offsets) {
                backend_core::tensor_alloc(&mut ctx, &buf, id, off)?;
            }
            buffers.push(buf);
        }

        for t in self.tensors.iter().filter(|t| t.op.is_some()) {
            if names.contains_key(&t.name) {
                return Err(invalid(format!("duplicate tensor name {:?}", t.name)));
            }
            let id = build_op(&mut ctx, &names, t)?;
            ctx.set_name(id, &t.name)?;
            names.insert(t.name.clone(), id);
        }
        for t in &self.tensors {
            // every tensor of the file was named by one of the two loops above
            let id = names[&t.name];
            for f in &t.flags {
                match f.as_str() {
                    "input" => ctx.set_input(id)?,
                    "output" => ctx.set_output(id)?,
                    o => return Err(invalid(format!("{}: unknown flag {o:?}", t.name))),
                }
            }
        }

        let mut graph = Graph::new(self.graph_size);
        for e in &self.expand {
            let id = *names
                .get(e)
                .ok_or_else(|| invalid(format!("expand: unknown tensor {e:?}")))?;
            graph.build_forward_expand(&mut ctx, id)?;
        }
        let mut assign = Vec::new();
        for (t, b) in &self.assign {
            let id = *names
                .get(t)
                .ok_or_else(|| invalid(format!("assign: unknown tensor {t:?}")))?;
            let bi = backends
                .backends()
                .iter()
                .position(|x| x.name() == b)
                .ok_or_else(|| invalid(format!("assign: unknown backend {b:?}")))?;
            assign.push((id, bi));
        }
        Ok(Built {
            backends,
            ctx,
            graph,
            names,
            buffers,
            assign,
            graph_size: self.graph_size,
            parallel: self.parallel,
        })
    }

    /// Build, schedule and allocate: the built graph and the scheduler after `alloc_graph`.
    pub fn schedule(&self) -> Result<(Built, Scheduler), FixtureError> {
        let mut built = self.build()?;
        let mut s = built.scheduler()?;
        s.alloc_graph(&mut built.ctx, &built.graph)?;
        Ok((built, s))
    }

    /// The plan-file form of the schedule.
    pub fn plan(&self) -> Result<Plan, FixtureError> {
        let (b, s) = self.schedule()?;
        Ok(Plan::from_scheduler(&s, &b.ctx, &b.graph))
    }

    /// The schedule as Graphviz DOT ([`crate::dot::write_dot`]), headed by `title`.
    pub fn dot(&self, title: &str) -> Result<String, FixtureError> {
        let (b, s) = self.schedule()?;
        let mut out = String::new();
        crate::dot::write_dot(&s, &b.ctx, &b.graph, title, &mut out);
        Ok(out)
    }

    /// The `GGML_SCHED_DEBUG` layout (level 2) of the schedule.
    pub fn debug_layout(&self) -> Result<String, FixtureError> {
        let (b, s) = self.schedule()?;
        Ok(s.layout(&b.ctx, &b.graph, 2).to_string())
    }
}

fn build_op(
    ctx: &mut Context,
    names: &HashMap<String, TensorId>,
    t: &TensorSpec,
) -> Result<TensorId, FixtureError> {
    let op = t.op.as_deref().unwrap_or("NONE");
    let src: Vec<TensorId> = t
        .src
        .iter()
        .map(|n| {
            names
                .get(n)
                .copied()
                .ok_or_else(|| invalid(format!("{}: unknown source {n:?}", t.name)))
        })
        .collect::<Result<_, _>>()?;
    let need = |n: usize| -> Result<(), FixtureError> {
        if src.len() < n {
            Err(invalid(format!("{}: {op} needs {n} sources", t.name)))
        } else {
            Ok(())
        }
    };
    let ne = || {
        t.ne.as_deref()
            .ok_or_else(|| invalid(format!("{}: {op} needs ne", t.name)))
    };
    let id = match op {
        "ADD" | "SUB" | "MUL" | "DIV" => {
            need(2)?;
            match op {
                "ADD" => ctx.add(src[0], src[1])?,
                "SUB" => ctx.sub(src[0], src[1])?,
                "MUL" => ctx.mul(src[0], src[1])?,
                _ => ctx.div(src[0], src[1])?,
            }
        }
        "SCALE" => {
            need(1)?;
            ctx.scale(src[0], t.scale.unwrap_or(1.0))?
        }
        "MUL_MAT" => {
            need(2)?;
            ctx.mul_mat(src[0], src[1])?
        }
        "GET_ROWS" => {
            need(2)?;
            ctx.get_rows(src[0], src[1])?
        }
        "RMS_NORM" => {
            need(1)?;
            ctx.rms_norm(src[0], t.eps.unwrap_or(1e-5))?
        }
        "NORM" => {
            need(1)?;
            ctx.norm(src[0], t.eps.unwrap_or(1e-5))?
        }
        "SOFT_MAX" => {
            need(1)?;
            ctx.soft_max_ext(
                src[0],
                src.get(1).copied(),
                t.scale.unwrap_or(1.0),
                t.max_bias.unwrap_or(0.0),
            )?
        }
        "ROPE" => {
            need(2)?;
            let n_dims = t
                .n_dims
                .ok_or_else(|| invalid(format!("{}: ROPE needs n_dims", t.name)))?;
            ctx.rope(src[0], src[1], n_dims, t.mode.unwrap_or(0))?
        }
        "UNARY" => {
            need(1)?;
            let u = t.unary.as_deref().unwrap_or("");
            let u = UnaryOp::from_name(u)
                .ok_or_else(|| invalid(format!("{}: unknown unary {u:?}", t.name)))?;
            ctx.unary(src[0], u)?
        }
        "CONT" => {
            need(1)?;
            ctx.cont(src[0])?
        }
        "DUP" => {
            need(1)?;
            ctx.dup(src[0])?
        }
        "CPY" => {
            need(2)?;
            ctx.cpy(src[0], src[1])?
        }
        "VIEW" => {
            need(1)?;
            let ne = ne()?;
            let nb = match &t.nb {
                Some(v) if v.len() == 4 => Some([v[0], v[1], v[2], v[3]]),
                Some(_) => return Err(invalid(format!("{}: nb needs 4 entries", t.name))),
                None => None,
            };
            ctx.view(src[0], ne, nb, t.offset.unwrap_or(0))?
        }
        "RESHAPE" => {
            need(1)?;
            ctx.reshape(src[0], ne()?)?
        }
        "PERMUTE" => {
            need(1)?;
            let axes = t
                .axes
                .ok_or_else(|| invalid(format!("{}: PERMUTE needs axes", t.name)))?;
            ctx.permute(src[0], axes)?
        }
        "TRANSPOSE" => {
            need(1)?;
            ctx.transpose(src[0])?
        }
        o => return Err(invalid(format!("{}: unsupported op {o:?}", t.name))),
    };
    Ok(id)
}
