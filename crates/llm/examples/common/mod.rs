//! The `main` both examples share: logs (`RUST_LOG`, `warn` by default) to stderr, then the
//! command line's contract — `--help` prints the usage to stdout and exits 0, bad arguments
//! print the error and the usage to stderr and exit 2, a failed run prints its error and
//! exits 1.

use std::fmt::Display;
use std::process::ExitCode;

/// Sets up logging, parses with `parse` (`Ok(None)` means `--help`) and runs `run`; `name`
/// prefixes the error lines.
pub fn main<A, P: Display, R: Display>(
    name: &str,
    usage: &str,
    parse: impl FnOnce() -> Result<Option<A>, P>,
    run: impl FnOnce(&A) -> Result<(), R>,
) -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = match parse() {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{usage}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{name}: {e}\n\n{usage}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}
