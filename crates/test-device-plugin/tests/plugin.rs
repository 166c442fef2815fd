//! The plugin loader against real shared libraries: the test device built as a plugin computes
//! through the scheduler exactly as the linked one does; broken libraries are typed errors
//! naming the file; `load_best` picks the variant that scores highest here; `unload` refuses
//! while a handle from the plugin lives.
//!
//! The libraries are built by running `cargo build -p test-device-plugin --lib --examples`
//! from the test (into the same target directory, so the build is shared with the workspace
//! and is a no-op after the first run); their paths come from cargo's JSON messages rather than
//! from guessing the target layout. Run them as `cargo test -p test-device-plugin` (as `cargo
//! xtask test` does): a test binary built in a run that resolves the dependency graph with
//! other features (`--workspace --features minilm/candle`) is another compilation of
//! `backend-core`, and the loader refuses the plugins with `PluginError::TypeIdentity`.
//! Miri cannot open libraries: these tests are ignored there.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use backend_core::plugin::{PLUGIN_ABI_VERSION, PluginError};
use backend_core::{Device, GlobalRegistry, tensor_alloc, tensor_get, tensor_set};
use graph::{Context, ElementType, Graph};
use sched::Scheduler;
use test_device::{TestDevice, TestDeviceConfig};

/// The built libraries, by target name.
struct Built(Vec<(String, PathBuf)>);

impl Built {
    fn get(&self, name: &str) -> &Path {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.as_path())
            .unwrap_or_else(|| panic!("cargo built no library for {name}: {:?}", self.0))
    }
}

fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.current_dir(env!("CARGO_MANIFEST_DIR")).args([
            "build",
            "-p",
            "test-device-plugin",
            "--lib",
            "--examples",
            "--message-format=json-render-diagnostics",
        ]);
        if !cfg!(debug_assertions) {
            cmd.arg("--release");
        }
        let out = cmd.output().expect("run cargo");
        assert!(
            out.status.success(),
            "building the plugins failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut libs = Vec::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if msg["reason"] != "compiler-artifact" {
                continue;
            }
            let name = msg["target"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let lib = msg["filenames"]
                .as_array()
                .into_iter()
                .flatten()
                .find_map(|f| {
                    f.as_str()
                        .filter(|f| f.ends_with(std::env::consts::DLL_SUFFIX))
                        .map(PathBuf::from)
                });
            if let Some(lib) = lib {
                libs.push((name, lib));
            }
        }
        Built(libs)
    })
}

/// A fresh directory for one test's copies of the libraries.
fn scratch(test: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("test-device-plugin-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn lib_name(stem: &str) -> String {
    format!(
        "{}{stem}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    )
}

fn floats(n: usize, seed: u32) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .flat_map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            ((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5).to_le_bytes()
        })
        .collect()
}

/// `((w·x) + b)²` with `w`, `b` in `dev`'s memory and `x` in host memory, through a scheduler
/// over a backend of `dev` and the CPU; returns the result's bytes.
fn compute_through_scheduler(dev: &Device) -> Vec<u8> {
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(ElementType::F32, 16, 8).unwrap();
    let b = ctx.new_tensor_1d(ElementType::F32, 8).unwrap();
    let x = ctx.new_tensor_2d(ElementType::F32, 16, 4).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    let z = ctx.add(y, b).unwrap();
    let out = ctx.mul(z, z).unwrap();
    ctx.set_output(out).unwrap();
    let mut graph = Graph::new(16);
    graph.build_forward_expand(&mut ctx, out).unwrap();

    let weights = dev.buffer_type().alloc_buffer(1 << 12).unwrap();
    tensor_alloc(&mut ctx, &weights, w, 0).unwrap();
    tensor_alloc(&mut ctx, &weights, b, 1 << 11).unwrap();
    let host = backend_cpu::cpu_device()
        .buffer_type()
        .alloc_buffer(1 << 10)
        .unwrap();
    tensor_alloc(&mut ctx, &host, x, 0).unwrap();
    tensor_set(&ctx, w, 0, &floats(16 * 8, 1)).unwrap();
    tensor_set(&ctx, b, 0, &floats(8, 2)).unwrap();
    tensor_set(&ctx, x, 0, &floats(16 * 4, 3)).unwrap();

    let on_dev = dev.init_backend("").unwrap();
    let cpu = backend_cpu::init().unwrap();
    let mut sched = Scheduler::new(vec![on_dev, cpu], None, 64, false).unwrap();
    sched.alloc_graph(&mut ctx, &graph).unwrap();
    assert!(
        sched.splits().iter().any(|s| s.backend_index() == 0),
        "nothing was scheduled on {}",
        dev.name()
    );
    sched.graph_compute(&mut ctx, &graph).unwrap();
    let mut bytes = vec![0u8; ctx[out].nbytes()];
    tensor_get(&ctx, out, 0, &mut bytes).unwrap();
    bytes
}

#[test]
#[cfg_attr(miri, ignore)]
fn the_plugin_computes_through_the_scheduler_like_the_linked_device() {
    let global = GlobalRegistry::default();
    let path = built().get("test_device_plugin");
    let reg = global.load(path).unwrap();
    assert_eq!(reg.name(), "TEST");
    assert_eq!(
        global.loaded_plugins(),
        vec![("TEST".to_owned(), path.to_path_buf())]
    );
    let dev = global.device_by_name("TEST0").unwrap();
    assert_eq!(dev.registry(), Some(reg.clone()));
    assert_eq!(dev.buffer_type().device(), Some(dev.clone()));
    assert!(dev.supports_buft(&dev.buffer_type()));

    let from_plugin = compute_through_scheduler(&dev);
    let linked =
        compute_through_scheduler(&TestDevice::create(TestDeviceConfig::default()).unwrap());
    assert!(from_plugin.iter().any(|&b| b != 0));
    assert!(from_plugin == linked, "plugin and linked device differ");

    // Loading a second registry of the same name is refused, naming the file.
    let again = global.load(path).unwrap_err();
    assert_eq!(
        again,
        PluginError::AlreadyLoaded {
            path: path.to_path_buf(),
            name: "TEST".to_owned()
        }
    );
}

#[test]
#[cfg_attr(miri, ignore)]
fn broken_libraries_are_typed_errors_naming_the_file() {
    let global = GlobalRegistry::default();
    let b = built();

    let p = b.get("wrong_abi");
    match global.load(p).unwrap_err() {
        PluginError::AbiVersion {
            path,
            found,
            expected,
        } => {
            assert_eq!(
                (path.as_path(), found, expected),
                (p, 999, PLUGIN_ABI_VERSION)
            );
        }
        e => panic!("{e}"),
    }

    let p = b.get("wrong_fingerprint");
    match global.load(p).unwrap_err() {
        PluginError::Fingerprint {
            path,
            found,
            expected,
        } => {
            assert_eq!(path, p);
            assert!(found.contains("backend-core=0.0.0"), "{found}");
            assert_eq!(expected, backend_core::plugin::BUILD_FINGERPRINT);
        }
        e => panic!("{e}"),
    }

    let p = b.get("other_types");
    let e = global.load(p).unwrap_err();
    assert_eq!(
        e,
        PluginError::TypeIdentity {
            path: p.to_path_buf()
        }
    );

    let p = b.get("no_entry");
    let e = global.load(p).unwrap_err();
    assert!(
        matches!(&e, PluginError::NotAPlugin { path, .. } if path == p),
        "{e}"
    );
    assert!(e.to_string().contains(&*p.to_string_lossy()), "{e}");

    let p = b.get("zero_score");
    let e = global.load(p).unwrap_err();
    assert_eq!(
        e,
        PluginError::CannotRun {
            path: p.to_path_buf(),
            name: "ZERO".to_owned()
        }
    );

    let dir = scratch("broken");
    let text = dir.join(lib_name("backend_text"));
    std::fs::write(&text, "not a library").unwrap();
    let e = global.load(&text).unwrap_err();
    assert!(
        matches!(&e, PluginError::Open { path, .. } if *path == text),
        "{e}"
    );
    let missing = dir.join(lib_name("backend_missing"));
    let e = global.load(&missing).unwrap_err();
    assert_eq!(e.path(), Some(missing.as_path()));

    assert!(global.registries().is_empty());
    assert!(global.loaded_plugins().is_empty());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
#[cfg_attr(miri, ignore)]
fn load_best_picks_the_variant_that_runs_best_here() {
    let b = built();
    let dir = scratch("best");
    for (from, to) in [
        ("test_device_plugin", "backend_test"),
        ("backend_test_avx2", "backend_test_avx2"),
        ("zero_score", "backend_zero"),
        ("no_entry", "backend_test_broken"),
    ] {
        std::fs::copy(b.get(from), dir.join(lib_name(to))).unwrap();
    }
    // The AVX2 variant scores 2 where the kernels take their AVX2 path, 0 elsewhere; the
    // portable one scores 1 everywhere.
    let avx2 = cpu_kernels::isa_paths()
        .iter()
        .any(|p| p.name == "avx2" && p.runs_here);
    let (want_dev, want_file) = if avx2 {
        ("TEST0-AVX2", "backend_test_avx2")
    } else {
        ("TEST0", "backend_test")
    };

    let global = GlobalRegistry::default();
    let reg = global
        .load_best_from("test", std::slice::from_ref(&dir))
        .unwrap();
    assert_eq!(reg.devices()[0].name(), want_dev);
    let linked = TestDevice::create(TestDeviceConfig::default()).unwrap();
    assert!(
        compute_through_scheduler(&reg.devices()[0]) == compute_through_scheduler(&linked),
        "the chosen variant computes like the linked device"
    );
    assert_eq!(
        global.loaded_plugins(),
        vec![("TEST".to_owned(), dir.join(lib_name(want_file)))]
    );
    let e = global
        .load_best_from("zero", std::slice::from_ref(&dir))
        .unwrap_err();
    assert!(
        matches!(&e, PluginError::NoCandidate { name, tried: 1, .. } if name == "zero"),
        "{e}"
    );
    let e = global
        .load_best_from("absent", std::slice::from_ref(&dir))
        .unwrap_err();
    assert!(
        matches!(e, PluginError::NoCandidate { tried: 0, .. }),
        "{e}"
    );

    // load_all: the best TEST variant; the score-0 and broken files reported, not fatal.
    let all = GlobalRegistry::default();
    let report = all.load_all_from(std::slice::from_ref(&dir));
    assert_eq!(report.loaded.len(), 1);
    assert_eq!(report.loaded[0].devices()[0].name(), want_dev);
    let mut failed: Vec<String> = report
        .failed
        .iter()
        .map(|e| {
            e.path()
                .and_then(Path::file_name)
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    failed.sort();
    assert_eq!(
        failed,
        vec![lib_name("backend_test_broken"), lib_name("backend_zero")]
    );
    drop((reg, report));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
#[cfg_attr(miri, ignore)]
fn unload_refuses_while_a_handle_lives() {
    let global = GlobalRegistry::default();
    let path = built().get("test_device_plugin");
    let busy = |g: &GlobalRegistry| {
        let e = g.unload("test").unwrap_err();
        assert_eq!(
            e,
            PluginError::Busy {
                path: path.to_path_buf(),
                name: "test".to_owned()
            }
        );
        assert!(
            g.registry("TEST").is_some(),
            "a refused unload changed nothing"
        );
    };

    let reg = global.load(path).unwrap();
    busy(&global); // the registry handle
    drop(reg);

    let dev = global.device_by_name("TEST0").unwrap();
    busy(&global);
    let backend = dev.init_backend("").unwrap();
    let buft = dev.buffer_type();
    let buffer = buft.alloc_buffer(256).unwrap();
    let event = dev.event_new().unwrap();
    drop((dev, buft));
    busy(&global); // the backend holds the device
    backend.event_record(&event).unwrap();
    event.synchronize().unwrap();
    drop(backend);
    busy(&global); // the event
    drop(event);
    busy(&global); // the buffer holds the buffer type
    drop(buffer);

    global.unload("TEST").unwrap();
    assert!(global.registry("TEST").is_none());
    assert!(global.loaded_plugins().is_empty());
    assert_eq!(
        global.unload("TEST").unwrap_err(),
        PluginError::NotLoaded {
            name: "TEST".to_owned()
        }
    );
    // Loaded again after an unload, it works as before.
    let reg = global.load(path).unwrap();
    let dev = reg.devices().remove(0);
    let buf = dev.buffer_type().alloc_buffer(64).unwrap();
    buf.clear(7).unwrap();
    drop((reg, dev, buf));
    global.unload("test").unwrap();
}

/// Unloading on a thread that ran the plugin's code (its drops, here), after another thread
/// computed with it: that thread's exit runs the thread-local destructors the plugin's copy of
/// `std` registered, which must still find their code (a segfault at thread exit otherwise).
/// So `unload` releases the plugin's objects but keeps its code mapped.
#[test]
#[cfg_attr(miri, ignore)]
fn a_thread_that_unloaded_a_plugin_exits_cleanly() {
    let path = built().get("test_device_plugin").to_path_buf();
    let global = std::thread::scope(|s| {
        s.spawn(|| {
            let global = GlobalRegistry::default();
            let reg = global.load(&path).unwrap();
            let dev = reg.devices().remove(0);
            let _ = compute_through_scheduler(&dev);
            global
        })
        .join()
        .unwrap()
    });
    std::thread::scope(|s| {
        s.spawn(|| global.unload("TEST").unwrap()).join().unwrap();
    });
    #[cfg(target_os = "linux")]
    assert!(
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .contains(&*path.to_string_lossy()),
        "the plugin's code stays mapped after unload"
    );
}
