//! Computes the parts of the plugin build fingerprint (`plugin::BUILD_FINGERPRINT`) that only
//! the build knows: the exact compiler, the target, and a hash of this crate's sources (the
//! trait definitions whose layout a plugin and its host must share).

use std::path::Path;
use std::process::Command;

fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let version = Command::new(&rustc)
        .arg("-vV")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| {
            // "rustc 1.x.y (hash date)" plus "commit-hash: ..." and "LLVM version: ..."
            s.lines()
                .filter(|l| {
                    l.starts_with("rustc ")
                        || l.starts_with("commit-hash:")
                        || l.starts_with("LLVM version:")
                })
                .collect::<Vec<_>>()
                .join(" | ")
        })
        .unwrap_or_else(|| "unknown rustc".to_owned());
    println!("cargo:rustc-env=BACKEND_CORE_RUSTC={version}");
    let target = std::env::var("TARGET").unwrap_or_default();
    println!("cargo:rustc-env=BACKEND_CORE_TARGET={target}");

    // FNV-1a over every source file, in name order.
    let src = Path::new("src");
    let mut files = Vec::new();
    collect(src, &mut files);
    files.sort();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in &files {
        let bytes = std::fs::read(f).unwrap_or_default();
        for b in f.to_string_lossy().bytes().chain(bytes) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    println!("cargo:rustc-env=BACKEND_CORE_SRC_HASH={h:016x}");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RUSTC");
}

fn collect(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}
