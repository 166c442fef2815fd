//! Agreement with llama.cpp: every line of `golden/llama-tokenize.jsonl` (written by the
//! reference build's libllama, see `golden/README.md`) must give identical ids, and the ids
//! must detokenize (control tokens rendered) to the reference's text.

mod common;

use serde::Deserialize;

#[derive(Deserialize)]
struct Line {
    text: String,
    parse_special: bool,
    ids: Vec<u32>,
    detok: String,
}

#[test]
fn every_golden_line_matches_llama_cpp() {
    let Some(tok) = common::tokenizer("every_golden_line_matches_llama_cpp") else {
        return;
    };
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/llama-tokenize.jsonl"
    );
    let data = std::fs::read_to_string(path).expect("golden file is committed");
    let lines: Vec<Line> = data
        .lines()
        .map(|l| serde_json::from_str(l).expect("golden line parses"))
        .collect();
    assert!(lines.len() >= 80, "{} golden lines", lines.len());
    let mut failures = Vec::new();
    for (n, g) in lines.iter().enumerate() {
        let ids = tok.tokenize(&g.text, true, g.parse_special);
        if ids != g.ids {
            failures.push(format!(
                "line {}: {:?} (parse_special {}):\n  ours {:?}\n  ref  {:?}",
                n + 1,
                g.text,
                g.parse_special,
                ids,
                g.ids
            ));
        }
        let detok = tok.detokenize(&g.ids, true).unwrap();
        if detok != g.detok.as_bytes() {
            failures.push(format!(
                "line {}: detok of {:?}: ours {:?} ref {:?}",
                n + 1,
                g.text,
                String::from_utf8_lossy(&detok),
                g.detok
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
