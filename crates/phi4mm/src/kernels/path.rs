//! Which instruction set the bf16 kernels run on: the best the CPU has (AMX tiles for many-row
//! products with AVX-512 for the rest, then AVX-512, then AVX2+FMA, then portable scalar code),
//! unless forced.
//!
//! Forcing exists to test and measure every path on one machine: the environment variable
//! `SWITCHYARD_PHI4MM_KERNELS` (`auto`, `amx`, `avx512`, `avx2`, `scalar`), read once at the first kernel
//! call, or [`force`] from code (tests, benchmarks). A path the CPU lacks is never run: asking for
//! it falls back to the best supported one with a warning on stderr (the env var) or an error
//! ([`force`]). All paths compute the same f32 sums (widened bf16 weights, f32 accumulation); they
//! differ only in summation order, within the fixture tolerances.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// The environment variable that forces a kernel path.
pub const ENV_VAR: &str = "SWITCHYARD_PHI4MM_KERNELS";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelPath {
    /// AMX-BF16 tiles for the many-row products (prefill, encoders: `amx`), AVX-512 for the rest.
    Amx,
    /// AVX-512F + BW + VL (16 bf16 widened per instruction, masked tails).
    Avx512,
    /// AVX2 + FMA (8 bf16 widened per instruction).
    Avx2,
    /// Portable Rust; also serves f16/f32 weights on every CPU.
    Scalar,
}

impl KernelPath {
    pub const ALL: [KernelPath; 4] = [
        KernelPath::Amx,
        KernelPath::Avx512,
        KernelPath::Avx2,
        KernelPath::Scalar,
    ];

    pub fn name(self) -> &'static str {
        match self {
            KernelPath::Amx => "amx",
            KernelPath::Avx512 => "avx512",
            KernelPath::Avx2 => "avx2",
            KernelPath::Scalar => "scalar",
        }
    }

    /// The path of the one- to few-row kernels (GEMV, exponentials): AMX has none of its own.
    pub fn vector(self) -> KernelPath {
        match self {
            KernelPath::Amx => KernelPath::Avx512,
            p => p,
        }
    }

    /// Whether this CPU can run the path.
    pub fn supported(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            KernelPath::Amx => KernelPath::Avx512.supported() && super::amx::supported(),
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx512 => {
                static HAS: OnceLock<bool> = OnceLock::new();
                *HAS.get_or_init(|| {
                    is_x86_feature_detected!("avx512f")
                        && is_x86_feature_detected!("avx512bw")
                        && is_x86_feature_detected!("avx512vl")
                })
            }
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx2 => {
                static HAS: OnceLock<bool> = OnceLock::new();
                *HAS.get_or_init(|| {
                    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
                })
            }
            #[cfg(not(target_arch = "x86_64"))]
            KernelPath::Amx | KernelPath::Avx512 | KernelPath::Avx2 => false,
            KernelPath::Scalar => true,
        }
    }

    fn code(self) -> u8 {
        match self {
            KernelPath::Avx512 => 1,
            KernelPath::Avx2 => 2,
            KernelPath::Scalar => 3,
            KernelPath::Amx => 4,
        }
    }

    fn from_code(c: u8) -> Option<KernelPath> {
        KernelPath::ALL.into_iter().find(|p| p.code() == c)
    }

    /// The best path this CPU supports.
    pub fn detected() -> KernelPath {
        KernelPath::ALL
            .into_iter()
            .find(|p| p.supported())
            .unwrap_or(KernelPath::Scalar)
    }
}

impl fmt::Display for KernelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A path that cannot be forced on this CPU.
#[derive(Debug, thiserror::Error)]
#[error("kernel path {0} is not supported by this CPU (best available: {1})")]
pub struct Unsupported(pub KernelPath, pub KernelPath);

/// 0: not forced from code (the env var or detection decides).
static FORCED: AtomicU8 = AtomicU8::new(0);

/// Forces every later kernel call in the process onto `path` (`None`: back to the env var or
/// detection). Meant for tests and benchmarks; calls already running finish on their path.
pub fn force(path: Option<KernelPath>) -> Result<(), Unsupported> {
    match path {
        Some(p) if !p.supported() => Err(Unsupported(p, KernelPath::detected())),
        Some(p) => {
            FORCED.store(p.code(), Ordering::Relaxed);
            Ok(())
        }
        None => {
            FORCED.store(0, Ordering::Relaxed);
            Ok(())
        }
    }
}

/// The path the kernels use now.
#[inline]
pub fn active() -> KernelPath {
    KernelPath::from_code(FORCED.load(Ordering::Relaxed)).unwrap_or_else(from_env)
}

/// The env var's choice (or detection), resolved once.
fn from_env() -> KernelPath {
    static ENV: OnceLock<KernelPath> = OnceLock::new();
    *ENV.get_or_init(|| {
        let best = KernelPath::detected();
        let Ok(v) = std::env::var(ENV_VAR) else {
            return best;
        };
        match parse(&v) {
            Ok(None) => best,
            Ok(Some(p)) if p.supported() => p,
            Ok(Some(p)) => {
                eprintln!(
                    "warning: {ENV_VAR}={v}: {}; using {best}",
                    Unsupported(p, best)
                );
                best
            }
            Err(e) => {
                eprintln!("warning: {ENV_VAR}: {e}; using {best}");
                best
            }
        }
    })
}

/// `auto` → `None`, a path name → that path.
pub fn parse(v: &str) -> Result<Option<KernelPath>, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "" | "auto" => Ok(None),
        s => KernelPath::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .map(Some)
            .ok_or_else(|| format!("{v:?} is not one of auto, amx, avx512, avx2, scalar")),
    }
}

/// For unit tests: whether `path` runs on this CPU. If not, says so on stderr, outside the test
/// harness's capture, so that a skipped path is visible in every test log.
#[cfg(test)]
pub(crate) fn supported_or_report(path: KernelPath, test: &str) -> bool {
    use std::io::Write;
    if path.supported() {
        return true;
    }
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: kernel path {path} is not supported by this CPU; its {test} did not run"
    );
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for p in KernelPath::ALL {
            assert_eq!(parse(p.name()).unwrap(), Some(p));
        }
        assert_eq!(parse("AUTO").unwrap(), None);
        let e = parse("sse2").unwrap_err();
        // The caller names where the value came from (the env var, `--kernel-path`).
        assert!(
            e.contains("\"sse2\"") && e.contains("avx512") && !e.contains(ENV_VAR),
            "{e}"
        );
    }

    #[test]
    fn scalar_is_always_supported_and_detection_picks_a_supported_path() {
        assert!(KernelPath::Scalar.supported());
        assert!(KernelPath::detected().supported());
    }
}
