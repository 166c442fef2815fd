//! An engine on two backends, end to end: a second device (the test device, standing in for a
//! GPU) and the CPU, driven by the scheduler.
//!
//! Run: `cargo run -p sched --example two_backends`. It prints where each part of the graph
//! ran and the result, and fails if the result differs from the same arithmetic done in plain
//! Rust. CI runs this file as a doctest (`workspace_docs` in `crates/conformance/src/lib.rs`).
//!
//! The model is `y = w2 · silu(w1 · x)`: `w1` lives in device memory, `w2` in host memory.
//! The order of calls is the one every engine follows:
//!
//! 1. once: create the backends and the scheduler, place the weights, mark their buffers
//!    `BufferUsage::Weights`, write the weights;
//! 2. per step: build the graph, `alloc_graph`, write the inputs, `graph_compute`, read the
//!    results.

use std::error::Error;

use backend_core::{BufferUsage, tensor_get_vec, tensor_set_slice};
use graph::{Context, ElementType, Graph};
use graph_alloc::alloc_ctx_tensors;
use sched::Scheduler;
use test_device::{TestDevice, TestDeviceConfig};

const N_IN: usize = 4;
const N_HIDDEN: usize = 3;
const N_OUT: usize = 2;

/// The weights, row by row: `W1[r]` is row `r` of `w1` (`N_HIDDEN` rows of `N_IN`).
const W1: [[f32; N_IN]; N_HIDDEN] = [
    [0.5, -1.0, 0.25, 2.0],
    [1.0, 1.0, -0.5, 0.0],
    [-0.75, 0.5, 1.5, -1.0],
];
const W2: [[f32; N_HIDDEN]; N_OUT] = [[1.0, -2.0, 0.5], [0.25, 0.75, -1.0]];

/// What one step printed: per split, its backend and the tensors copied into it; the result.
pub struct Step {
    /// `(backend name, names of the split's input copies)` per split, in order.
    pub splits: Vec<(String, Vec<String>)>,
    /// `y`.
    pub y: Vec<f32>,
}

/// Run the model on each of `inputs` and return what each step did.
pub fn run(inputs: &[[f32; N_IN]]) -> Result<Vec<Step>, Box<dyn Error>> {
    // Two backends in priority order: the device first, the CPU last (the scheduler requires
    // the last one to be a CPU backend: graph inputs and anything no other backend runs go
    // there).
    let device = TestDevice::create(TestDeviceConfig::named("GPU0"))?;
    let gpu = device.init_backend("")?;
    let cpu = backend_cpu::init()?;
    let mut sched = Scheduler::builder(vec![gpu.clone(), cpu.clone()])
        .graph_size(64)
        .build()?;

    // The weights, in a context of their own that lives as long as the model.
    let mut ctx = Context::new();
    let w1 = ctx.new_tensor_2d(ElementType::F32, N_IN as i64, N_HIDDEN as i64)?;
    let w2 = ctx.new_tensor_2d(ElementType::F32, N_HIDDEN as i64, N_OUT as i64)?;
    ctx.set_name(w1, "w1")?;
    ctx.set_name(w2, "w2")?;
    let on_gpu = alloc_ctx_tensors(&mut ctx, [w1], &gpu.default_buffer_type())?
        .ok_or("w1 has bytes, so it gets a buffer")?;
    let on_cpu = alloc_ctx_tensors(&mut ctx, [w2], &cpu.default_buffer_type())?
        .ok_or("w2 has bytes, so it gets a buffer")?;
    // Mark the weight buffers. This is what makes the scheduler run an op where its weight
    // already is: an op reading a tensor of a `Weights` buffer is assigned to the first
    // backend that can use that buffer and run the op. Left unmarked (`BufferUsage::Any`),
    // the op is placed by its neighbours and by which backend can read most of its inputs
    // instead, and wherever that is a backend that cannot read the weight's memory, the
    // weight is copied into that backend's compute memory before every compute. (Here, with
    // both lines left out, the whole graph runs on GPU0 and `w2` is copied to the device at
    // every step.)
    on_gpu.set_usage(BufferUsage::Weights);
    on_cpu.set_usage(BufferUsage::Weights);
    // Typed writes: the element type and the length are checked against the tensor, and the
    // bytes go to the device through its buffer (there is no host pointer to write through).
    tensor_set_slice(&ctx, w1, W1.as_flattened())?;
    tensor_set_slice(&ctx, w2, W2.as_flattened())?;

    let mut steps = Vec::new();
    for input in inputs {
        // The graph of one step. An engine rebuilds it every step (its shapes change with
        // the batch); the weights keep their storage, everything else is placed by the
        // scheduler's allocator.
        let mut gctx = ctx.clone();
        let x = gctx.new_tensor_1d(ElementType::F32, N_IN as i64)?;
        gctx.set_name(x, "x")?;
        gctx.set_input(x)?;
        let h = gctx.mul_mat(w1, x)?;
        gctx.set_name(h, "h")?;
        let a = gctx.silu(h)?;
        gctx.set_name(a, "a")?;
        let y = gctx.mul_mat(w2, a)?;
        gctx.set_name(y, "y")?;
        gctx.set_output(y)?;
        let mut graph = Graph::new(64);
        graph.build_forward_expand(&mut gctx, y)?;

        // Assign backends, split, and allocate every tensor without storage. Inputs get their
        // place here, so they are written after this call, never before.
        sched.alloc_graph(&mut gctx, &graph)?;
        tensor_set_slice(&gctx, x, input)?;
        // Copies the inputs each split needs, runs the splits, and waits for them.
        sched.graph_compute(&mut gctx, &graph)?;
        let y = tensor_get_vec::<f32>(&gctx, y)?;

        let splits = sched
            .splits()
            .iter()
            .map(|s| {
                let backend = s.backend().name().to_owned();
                let inputs = s.inputs().iter().map(|&t| gctx[t].name().to_owned());
                (backend, inputs.collect())
            })
            .collect();
        steps.push(Step { splits, y });
    }
    Ok(steps)
}

/// `y` computed in plain Rust.
pub fn expected(x: &[f32; N_IN]) -> [f32; N_OUT] {
    let silu = |v: f32| v / (1.0 + (-v).exp());
    let a = W1.map(|row| silu(row.iter().zip(x).map(|(w, x)| w * x).sum()));
    W2.map(|row| row.iter().zip(&a).map(|(w, a)| w * a).sum())
}

#[allow(clippy::print_stdout)] // an example's output is its point
fn main() -> Result<(), Box<dyn Error>> {
    let inputs = [[1.0, 2.0, 3.0, 4.0], [-0.5, 0.25, 1.0, -2.0]];
    for (x, step) in inputs.iter().zip(run(&inputs)?) {
        for (i, (backend, copied)) in step.splits.iter().enumerate() {
            println!("split {i}: {backend:<5} copies in {copied:?}");
        }
        println!("x = {x:?} -> y = {:?}", step.y);
        if !step.splits.iter().any(|(b, _)| b == "GPU0") {
            return Err("the device got no work: are its weights marked?".into());
        }
        let want = expected(x);
        if step.y.len() != want.len() {
            return Err(format!("y has {} elements, not {}", step.y.len(), want.len()).into());
        }
        for (got, w) in step.y.iter().zip(want) {
            if (got - w).abs() > 1e-5 * w.abs().max(1.0) {
                return Err(format!("y = {:?}, plain Rust says {want:?}", step.y).into());
            }
        }
    }
    Ok(())
}
