//! The CPU registry's proc-address lookup under ggml's names, and the CPU device's link back
//! to its registry.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use backend_core::proc::{self, AbortCallback};
use backend_core::*;
use backend_cpu::*;
use graph::{Context, ElementType, GraphView};

#[test]
fn the_cpu_device_knows_its_registry() {
    let dev = cpu_device();
    let reg = dev.registry().unwrap();
    assert_eq!(reg, cpu_registry());
    assert_eq!(reg.devices(), vec![dev.clone()]);
    // through the global registry too: the device found by name leads to the same registry
    register();
    let found = GlobalRegistry::get().device_by_name("CPU").unwrap();
    assert_eq!(found.registry(), Some(cpu_registry()));
}

#[test]
fn ggml_set_n_threads_sets_a_cpu_backend_and_refuses_others() {
    let reg = cpu_registry();
    let set = reg.proc_address(proc::SET_N_THREADS).unwrap();
    let b = init().unwrap();
    set(&b, 5).unwrap();
    assert_eq!(CpuBackend::from_backend(&b).unwrap().n_threads(), 5);
    // the crate's own name answers the same function type
    let own = reg.extension_as::<SetNThreads>(EXT_SET_N_THREADS).unwrap();
    own(&b, 2).unwrap();
    assert_eq!(CpuBackend::from_backend(&b).unwrap().n_threads(), 2);
    // a name answered with another type than asked is no answer
    assert!(
        reg.extension_as::<fn() -> usize>(proc::SET_N_THREADS.name())
            .is_none()
    );
}

#[test]
fn ggml_dev_get_extra_bufts_lists_cpu_repack_for_the_cpu_device() {
    let reg = cpu_registry();
    let get = reg.proc_address(proc::DEV_GET_EXTRA_BUFTS).unwrap();
    let bufts = get(&cpu_device());
    assert_eq!(bufts, vec![cpu_repack_buffer_type()]);
    assert_eq!(bufts, cpu_device().extra_buffer_types());
    assert_eq!(bufts[0].name(), "CPU_REPACK");
}

#[test]
fn ggml_set_abort_callback_stops_a_compute() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(ElementType::F32, 4).unwrap();
    let s = ctx.add(a, a).unwrap();
    let u = ctx.scale(s, 3.0).unwrap();
    let buf = cpu_buffer_type().alloc_buffer(192).unwrap();
    for (i, t) in [a, s, u].into_iter().enumerate() {
        tensor_alloc(&mut ctx, &buf, t, 64 * i).unwrap();
    }
    let b = init().unwrap();
    let set = cpu_registry()
        .proc_address(proc::SET_ABORT_CALLBACK)
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let stop_at_second: AbortCallback = Arc::new(move || c.fetch_add(1, Ordering::SeqCst) >= 1);
    set(&b, Some(stop_at_second)).unwrap();
    let nodes = [s, u];
    assert_eq!(
        b.graph_compute(&ctx, GraphView::new(&nodes, &[])).unwrap(),
        ComputeStatus::Aborted
    );
    assert!(calls.load(Ordering::SeqCst) >= 2);
    set(&b, None).unwrap();
    assert_eq!(
        b.graph_compute(&ctx, GraphView::new(&nodes, &[])).unwrap(),
        ComputeStatus::Success
    );
}

#[test]
fn unknown_names_have_no_answer() {
    let reg = cpu_registry();
    assert!(reg.extension("ggml_backend_no_such_function").is_none());
    const OTHER: ProcName<fn() -> bool> = ProcName::new("ggml_backend_cpu_no_such_thing");
    assert!(reg.proc_address(OTHER).is_none());
}
