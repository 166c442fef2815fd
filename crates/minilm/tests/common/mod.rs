//! Shared test helpers.
#![allow(dead_code)]

pub mod naive;

use std::path::PathBuf;

/// The model directory, or `None` (with a message on stderr saying how to get it) when the
/// model package is not installed. CI installs it, so there a `None` is a failure of setup,
/// which `require_model` turns into a test failure.
pub fn model_dir() -> Option<PathBuf> {
    match minilm::find_model_dir(None) {
        Ok(d) => Some(d),
        Err(e) => {
            if std::env::var_os("CI").is_some() {
                panic!("CI must install the model: {e}");
            }
            #[allow(clippy::print_stderr)]
            {
                eprintln!("SKIPPED: {e}");
            }
            None
        }
    }
}

/// Sentences of different lengths, so batches carry padding.
pub const SENTENCES: [&str; 5] = [
    "The cat sits outside",
    "A man is playing guitar",
    "I love pasta",
    "The new movie is awesome, and the popcorn was great too, although the seats were not very comfortable",
    "Do you like pizza?",
];
