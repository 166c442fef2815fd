//! Test helpers: ggml's real server, and hex parsing.
#![allow(dead_code)]

pub mod real;

/// Bytes from a hex dump in the spec's format (`0000: 0e 18 00 ...` lines).
pub fn hex(dump: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for line in dump.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let body = line.split_once(':').map_or(line, |(_, b)| b);
        for tok in body.split_whitespace() {
            out.push(u8::from_str_radix(tok, 16).expect("hex byte"));
        }
    }
    out
}
