//! Backends whose claims the kit must hold them to: host memory without a host pointer, a
//! backend without SCALE (the asynchronous-compute check must use another op), and F16 ADD
//! claimed beyond the CPU reference's F32 (checked, right and wrong).

use std::any::Any;

use backend_core::{
    Backend, BackendImpl, BufferImpl, BufferType, BufferTypeImpl, ComputeStatus, Device,
    DeviceImpl, DeviceType, Guid, Result, tensor_get_vec, tensor_set_slice,
};
use conformance::{CaseOutcome, OpOptions, Outcome};
use graph::{Context, ElementType, GraphView, Op, TensorId};
use half::f16;
use test_device::{TestDevice, TestDeviceConfig};

/// How the wrapped backend computes F16 ADD, which it claims on top of its inner device.
#[derive(Clone, Copy, PartialEq)]
enum F16Add {
    /// Not claimed.
    No,
    /// Claimed and computed right.
    Right,
    /// Claimed and computed as `a - b`.
    Wrong,
}

/// A device wrapping another one: its own buffer type, some ops refused, F16 ADD maybe added.
struct Wrap {
    name: &'static str,
    inner: Device,
    buft: BufferType,
    refuse: &'static [Op],
    f16_add: F16Add,
}

fn is_f16_add(ctx: &Context, n: TensorId) -> bool {
    let t = &ctx[n];
    t.op() == Op::Add
        && t.ty() == ElementType::F16
        && t.srcs().iter().flatten().all(|&s| {
            ctx[s].ty() == ElementType::F16 && ctx[s].ne() == t.ne() && ctx[s].is_contiguous()
        })
}

impl DeviceImpl for Wrap {
    fn name(&self) -> &str {
        self.name
    }
    fn description(&self) -> &str {
        "a wrapped device for the kit's own tests"
    }
    fn memory(&self) -> (usize, usize) {
        self.inner.memory()
    }
    fn device_type(&self) -> DeviceType {
        self.inner.device_type()
    }
    fn init_backend(&self, device: &Device, params: &str) -> Result<Backend> {
        Ok(Backend::new(WrapBackend {
            inner: self.inner.init_backend(params)?,
            device: device.clone(),
            f16_add: self.f16_add,
        }))
    }
    fn buffer_type(&self) -> BufferType {
        self.buft.clone()
    }
    fn supports_op(&self, ctx: &Context, op: TensorId) -> bool {
        if self.f16_add != F16Add::No && is_f16_add(ctx, op) {
            return true;
        }
        !self.refuse.contains(&ctx[op].op()) && self.inner.supports_op(ctx, op)
    }
    fn supports_buft(&self, buft: &BufferType) -> bool {
        *buft == self.buft || self.inner.supports_buft(buft)
    }
}

struct WrapBackend {
    inner: Backend,
    device: Device,
    f16_add: F16Add,
}

fn io(e: backend_core::TensorIoError) -> backend_core::BackendError {
    backend_core::BackendError::failed("WRAP", e.to_string())
}

impl BackendImpl for WrapBackend {
    fn name(&self) -> &str {
        "WRAP"
    }
    fn guid(&self) -> Guid {
        [7; 16]
    }
    fn device(&self) -> Device {
        self.device.clone()
    }
    fn graph_compute(&self, ctx: &Context, g: GraphView<'_>) -> Result<ComputeStatus> {
        for n in g.nodes {
            if self.f16_add != F16Add::No && is_f16_add(ctx, *n) {
                let [a, b] = [0, 1].map(|i| ctx[*n].src(i).expect("ADD has two sources"));
                let (a, b) = (
                    tensor_get_vec::<f16>(ctx, a).map_err(io)?,
                    tensor_get_vec::<f16>(ctx, b).map_err(io)?,
                );
                let sign = if self.f16_add == F16Add::Right {
                    1.0
                } else {
                    -1.0
                };
                let y: Vec<f16> = a
                    .iter()
                    .zip(&b)
                    .map(|(x, y)| f16::from_f32(x.to_f32() + sign * y.to_f32()))
                    .collect();
                tensor_set_slice(ctx, *n, &y).map_err(io)?;
            } else {
                self.inner
                    .graph_compute(ctx, GraphView::new(std::slice::from_ref(n), &[]))?;
            }
        }
        Ok(ComputeStatus::Success)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A buffer type that says it is host memory while its buffers (the test device's) have no
/// host pointer.
struct ClaimsHost(BufferType);

impl BufferTypeImpl for ClaimsHost {
    fn name(&self) -> &str {
        "CLAIMS-HOST"
    }
    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn BufferImpl>> {
        self.0.implementation().alloc_buffer(size)
    }
    fn alignment(&self) -> usize {
        self.0.alignment()
    }
    fn is_host(&self) -> bool {
        true
    }
}

fn wrap(name: &'static str, inner: Device, buft: BufferType, refuse: &'static [Op]) -> Backend {
    wrap_with(name, inner, buft, refuse, F16Add::No)
}

fn wrap_with(
    name: &'static str,
    inner: Device,
    buft: BufferType,
    refuse: &'static [Op],
    f16_add: F16Add,
) -> Backend {
    Device::new(Wrap {
        name,
        inner,
        buft,
        refuse,
        f16_add,
    })
    .init_backend("")
    .unwrap()
}

fn outcome<'r>(report: &'r conformance::Report, name: &str) -> &'r Outcome {
    &report
        .checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name}:\n{report}"))
        .outcome
}

#[test]
fn host_memory_without_a_host_pointer_fails_the_contract() {
    let dev = TestDevice::create(TestDeviceConfig::named("CLAIMS-HOST-INNER")).unwrap();
    let buft = BufferType::new(ClaimsHost(dev.buffer_type()));
    let backend = wrap("CLAIMS-HOST", dev, buft, &[]);
    let report = conformance::check_contract(&backend, None);
    assert!(
        matches!(
            outcome(&report, "buffer/host-pointer"),
            Outcome::Failed(m) if m.contains("CLAIMS-HOST says is_host() but") && m.contains("no host_ptr()")
        ),
        "{report}"
    );
}

#[test]
fn real_host_memory_passes_the_host_pointer_check() {
    let cpu = backend_cpu::init().unwrap();
    let report = conformance::check_contract(&cpu, None);
    assert_eq!(outcome(&report, "buffer/host-pointer"), &Outcome::Passed);
}

#[test]
fn async_compute_is_checked_with_another_op_when_scale_is_missing() {
    let cpu = backend_cpu::cpu_device();
    let no_scale = wrap("NO-SCALE", cpu.clone(), cpu.buffer_type(), &[Op::Scale]);
    let report = conformance::check_contract(&no_scale, None);
    let name = "backend/compute-completes-before-synchronize";
    assert_eq!(outcome(&report, name), &Outcome::Passed, "{report}");

    // With none of the chain ops, the check says which it looked for.
    let none = wrap(
        "NO-CHAIN",
        cpu.clone(),
        cpu.buffer_type(),
        &[Op::Scale, Op::Add, Op::Mul, Op::Cpy, Op::Dup],
    );
    let report = conformance::check_contract(&none, None);
    assert!(
        matches!(outcome(&report, name), Outcome::Skipped(m) if m.contains("SCALE, ADD, MUL")),
        "{report}"
    );
}

fn add_cases(f16_add: F16Add) -> conformance::OpReport {
    let cpu = backend_cpu::cpu_device();
    let backend = wrap_with("F16-ADD", cpu.clone(), cpu.buffer_type(), &[], f16_add);
    let opts = OpOptions {
        filter: Some("ADD".into()),
        ..Default::default()
    };
    conformance::check_ops(&backend, &backend_cpu::init().unwrap(), &opts)
}

fn f16_cases(report: &conformance::OpReport) -> Vec<&conformance::CaseResult> {
    report
        .cases
        .iter()
        .filter(|c| c.desc.contains("f16"))
        .collect()
}

#[test]
fn a_claimed_f16_add_is_checked_against_the_f32_reference() {
    let report = add_cases(F16Add::Right);
    report.assert_passed();
    let f16 = f16_cases(&report);
    // Claimed for same-shape operands only: the one such case, computed via f32 on the CPU.
    assert_eq!(f16.len(), 1, "{report}");
    assert!(f16[0].desc.contains("same shape") && f16[0].desc.contains("reference via f32"));
    assert!(
        matches!(f16[0].outcome, CaseOutcome::Passed { max_nmse } if max_nmse == 0.0),
        "{report}"
    );
}

#[test]
fn a_wrong_f16_add_fails() {
    let report = add_cases(F16Add::Wrong);
    let failed: Vec<&str> = report.failed().map(|c| c.desc.as_str()).collect();
    assert_eq!(failed.len(), 1, "{report}");
    assert!(failed[0].contains("f16"), "{report}");
}

#[test]
fn unclaimed_types_are_not_listed() {
    let report = add_cases(F16Add::No);
    report.assert_passed();
    assert!(f16_cases(&report).is_empty(), "{report}");
    assert!(report.unsupported_ops().is_empty(), "{report}");
}
