//! Mutation fuzzing of the header and tensor-info parser: bit flips, byte and word
//! overwrites with boundary values (huge counts and lengths, bad type ids, bad offsets),
//! truncations, duplicated, moved and deleted ranges (duplicate keys and tensors), applied to
//! a synthetic file with every value type and to the real model's header (shrunk and whole).
//!
//! Each mutated file must parse or fail with a typed error — a panic fails the test — and no
//! single allocation may exceed a small multiple of the input's size (a counting global
//! allocator checks that lengths and counts are validated before anything is sized from them).
//!
//! `GGUF_FUZZ_CASES` sets the number of files (default 100,000; 24 under Miri),
//! `GGUF_FUZZ_SEED` the seed. A million cases: `GGUF_FUZZ_CASES=1000000 cargo nextest run
//! --release -p gguf mutated --no-capture`.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use gguf::Header;

struct MaxAlloc;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only records sizes.
unsafe impl GlobalAlloc for MaxAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours, passed through.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: same contract as ours, passed through.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: MaxAlloc = MaxAlloc;

/// splitmix64: small, seedable, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const WORDS64: [u64; 10] = [
    0,
    1,
    u64::MAX,
    i64::MAX as u64,
    1 << 63,
    1 << 32,
    1 << 40,
    0xFFFF_FFFF,
    63,
    64,
];
const WORDS32: [u32; 12] = [0, 1, 2, 3, 4, 5, 8, 9, 12, 13, 0xFFFF_FFFF, 0x8000_0000];

/// A position, biased towards the start and the end of the header where the counts, the
/// small pairs and the tensor infos are (the middle of a real header is token strings).
fn position(rng: &mut Rng, len: usize) -> usize {
    match rng.below(4) {
        0 => rng.below(len.min(512)),
        1 => len.saturating_sub(1 + rng.below(len.min(16 << 10))),
        _ => rng.below(len),
    }
}

fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(3) {
        let len = bytes.len();
        if len == 0 {
            return;
        }
        let at = position(rng, len);
        match rng.below(9) {
            0 | 1 => bytes[at] ^= 1 << rng.below(8),
            2 => bytes[at] = rng.next() as u8,
            3 => {
                let w = WORDS64[rng.below(WORDS64.len())].to_le_bytes();
                let n = w.len().min(len - at);
                bytes[at..at + n].copy_from_slice(&w[..n]);
            }
            4 => {
                let w = WORDS32[rng.below(WORDS32.len())].to_le_bytes();
                let n = w.len().min(len - at);
                bytes[at..at + n].copy_from_slice(&w[..n]);
            }
            5 => bytes.truncate(at),
            6 => {
                // Duplicate a range in place (repeats a pair or a tensor info).
                let n = 1 + rng.below(64.min(len - at));
                let copy = bytes[at..at + n].to_vec();
                bytes.splice(at..at, copy);
            }
            7 => {
                let n = 1 + rng.below(64.min(len - at));
                bytes.drain(at..at + n);
            }
            _ => {
                // Copy a range over another place.
                let n = 1 + rng.below(32.min(len - at));
                let src = bytes[at..at + n].to_vec();
                let to = position(rng, len);
                let m = n.min(len - to);
                bytes[to..to + m].copy_from_slice(&src[..m]);
            }
        }
    }
}

#[derive(Default, Debug)]
struct Outcomes {
    ok: u64,
    kinds: std::collections::BTreeMap<String, u64>,
}

fn check(bytes: &[u8], file_len: u64, out: &mut Outcomes) {
    let limit = 16 * bytes.len() + (1 << 20);
    LARGEST.store(0, Ordering::Relaxed);
    let result = Header::parse(bytes).and_then(|h| {
        h.check_bounds(file_len)?;
        // Exercise the accessors on what was accepted.
        for t in h.tensors() {
            assert!(h.tensor(t.name()).is_ok());
            assert!(t.n_elements() <= i64::MAX as u64);
        }
        let _ = h.metadata().u32("general.alignment");
        Ok(h.tensors().len())
    });
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(
        largest <= limit,
        "an allocation of {largest} bytes for a {}-byte input",
        bytes.len()
    );
    match result {
        Ok(_) => out.ok += 1,
        Err(e) => {
            let _ = e.to_string();
            let name = format!("{:?}", e.root());
            let kind = name.split([' ', '(', '{']).next().unwrap_or("").to_owned();
            *out.kinds.entry(kind).or_default() += 1;
        }
    }
}

fn cases() -> u64 {
    let default = if cfg!(miri) { 24 } else { 100_000 };
    std::env::var("GGUF_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
#[allow(clippy::print_stderr)]
fn mutated_headers_never_panic() {
    let seed = std::env::var("GGUF_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED_6775);
    let mut rng = Rng(seed);
    let mut seeds: Vec<(Vec<u8>, &str)> = Vec::new();
    let mut v2 = common::synthetic();
    v2.version = 2;
    seeds.push((common::synthetic().build(), "synthetic v3"));
    seeds.push((v2.build(), "synthetic v2"));
    // The real model's header, shrunk (all 33 keys and 272 tensor infos, arrays cut to 16
    // elements) and, for a few cases, whole (the first 1.8 MB of the file).
    let mut whole = None;
    if let Some(path) = common::real_model_or_skip("mutated_headers_never_panic") {
        let file = gguf::GgufFile::open(&path).unwrap();
        let prefix = file.as_bytes()[..file.header().data_offset() as usize].to_vec();
        seeds.push((common::shrunk(file.header(), 16), "real, shrunk"));
        whole = Some((prefix, file.len() as u64));
    }
    for (s, name) in &seeds {
        let h = Header::parse(s).unwrap_or_else(|e| panic!("{name} seed must parse: {e}"));
        assert!(!h.tensors().is_empty());
    }
    let n = cases();
    let whole_every = 500; // a whole-header case costs as much as ~500 small ones in debug
    let start = Instant::now();
    let mut out = Outcomes::default();
    let mut whole_cases = 0u64;
    for i in 0..n {
        match &whole {
            Some((prefix, file_len)) if i % whole_every == whole_every - 1 => {
                let mut bytes = prefix.clone();
                mutate(&mut rng, &mut bytes);
                check(&bytes, *file_len, &mut out);
                whole_cases += 1;
            }
            _ => {
                let (s, _) = &seeds[rng.below(seeds.len())];
                let mut bytes = s.clone();
                mutate(&mut rng, &mut bytes);
                let len = if rng.below(4) == 0 {
                    1 << 30
                } else {
                    bytes.len() as u64
                };
                check(&bytes, len.max(bytes.len() as u64), &mut out);
            }
        }
    }
    let elapsed = start.elapsed();
    eprintln!(
        "gguf fuzz: {n} mutated files ({whole_cases} whole real headers) in {:.1} s, seed {seed:#x}: \
         {} parsed, errors {:?}",
        elapsed.as_secs_f64(),
        out.ok,
        out.kinds
    );
    if n >= 10_000 {
        // The mutations reach deep: both outcomes, and many kinds of error, are seen.
        assert!(out.ok > n / 100, "{out:?}");
        for kind in [
            "Truncated",
            "CountTooLarge",
            "BadOffset",
            "DuplicateKey",
            "BadValueType",
            "UnknownType",
        ] {
            assert!(out.kinds.contains_key(kind), "no {kind} in {out:?}");
        }
    }
}
