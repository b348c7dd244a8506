//! Finding the compiler library when no path is given: the iree-base-compiler package of the
//! active Python (`python3`, else `python`; `PHI4MM_IREE_PYTHON` names another), at the version
//! whose modules this build's IREE runtime loads.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::super::error::{IreeError, Result};

/// The iree-base-compiler release that matches the IREE runtime eerie builds in. A module is
/// run by the runtime of the same release; another compiler's modules may not load.
pub const PACKAGE_VERSION: &str = "3.13.0";

/// Environment variable naming the Python to ask.
pub const PYTHON_ENV: &str = "PHI4MM_IREE_PYTHON";

/// Prints the installed package's version and its library directory, one per line.
const PROBE: &str = "import importlib.metadata as m; d = m.distribution('iree-base-compiler'); \
                     print(d.version); print(d.locate_file('iree/compiler/_mlir_libs'))";

const LIBRARY: &str = "libIREECompiler.so";

/// The compiler library of the active Python's iree-base-compiler.
pub fn library_of_active_python() -> Result<PathBuf> {
    let pythons: Vec<OsString> = match std::env::var_os(PYTHON_ENV) {
        Some(python) => vec![python],
        None => vec!["python3".into(), "python".into()],
    };
    for python in &pythons {
        let output = match Command::new(python)
            .args(["-X", "utf8", "-c", PROBE])
            .stdin(Stdio::null())
            .output()
        {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(not_found(format!("{}: {e}", python.to_string_lossy()))),
            Ok(output) => output,
        };
        let python = python.to_string_lossy();
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let last = stderr.lines().last().unwrap_or("the probe failed");
            return Err(not_found(format!("{python}: {last}")));
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let mut lines = stdout.lines();
        let (Some(version), Some(dir)) = (lines.next(), lines.next()) else {
            return Err(not_found(format!("{python} gave no package location")));
        };
        if version.trim() != PACKAGE_VERSION {
            return Err(not_found(format!(
                "{python} has iree-base-compiler {}, not {PACKAGE_VERSION}",
                version.trim()
            )));
        }
        return Ok(PathBuf::from(dir.trim_end()).join(LIBRARY));
    }
    Err(not_found(format!(
        "no Python found ({})",
        pythons
            .iter()
            .map(|p| p.to_string_lossy())
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

fn not_found(details: String) -> IreeError {
    IreeError::CompilerNotFound(details)
}
