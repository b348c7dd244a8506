//! What a compiled module depends on, and the key derived from it.
//!
//! The key is a sha256 over every input that can change the compiled bytes, in a fixed order, each
//! field length-prefixed so that no two different identities can serialise to the same byte stream
//! (e.g. entry "ab" + config "c" vs entry "a" + config "bc").

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;

/// Bumped whenever the key derivation or the manifest layout changes: old entries then simply
/// stop matching (and `gc` removes them as invalid).
pub const IDENTITY_VERSION: &str = "switchyard-iree-artifact-v1";

/// One weight argument of a module, in argument order: the schema entry `name:dtype:shape`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WeightSpec {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
}

impl WeightSpec {
    pub fn new(name: impl Into<String>, dtype: impl Into<String>, shape: &[usize]) -> Self {
        Self {
            name: name.into(),
            dtype: dtype.into(),
            shape: shape.to_vec(),
        }
    }
}

impl fmt::Display for WeightSpec {
    /// `name:dtype:d0xd1x…` (a scalar has an empty shape: `name:dtype:`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shape: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        write!(f, "{}:{}:{}", self.name, self.dtype, shape.join("x"))
    }
}

/// Everything about the compiler that can change the bytes it produces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompilerIdentity {
    /// sha256 of the compiler library (or executable) file: a rebuilt library with the same
    /// version string is a different compiler.
    pub library_sha256: String,
    /// The compiler's own revision string (`ireeCompilerGetRevision`).
    pub version: String,
    /// Every flag passed to the compiler, in order.
    pub flags: Vec<String>,
    /// The resolved target CPU: for `host`, the actual CPU model and feature set, because a module
    /// built for one host may use instructions another host lacks.
    pub target_cpu: String,
}

/// What the caller asks for: one entry point of one configuration.
#[derive(Debug, Clone, Copy)]
pub struct ModuleRequest<'a> {
    /// Entry name, e.g. `audio.main`; also names the cache files, so it must be file-name safe
    /// (ASCII letters, digits, `.`, `_`, `-`; not starting with `.`).
    pub entry: &'a str,
    /// Architecture numbers, bucket, precision, ABI tag, … as one string.
    pub config_identity: &'a str,
    /// The MLIR text to compile.
    pub mlir: &'a str,
    /// The ordered weight schema of the module's weight arguments.
    pub weights: &'a [WeightSpec],
}

/// All identity parts of one module, as recorded in its manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    pub entry: String,
    pub config_identity: String,
    pub compiler: CompilerIdentity,
    pub mlir_sha256: String,
    /// The weight schema entries, `name:dtype:shape`, in argument order.
    pub weights: Vec<String>,
}

impl Identity {
    pub fn new(req: &ModuleRequest<'_>, compiler: &CompilerIdentity) -> Self {
        Self {
            entry: req.entry.to_owned(),
            config_identity: req.config_identity.to_owned(),
            compiler: compiler.clone(),
            mlir_sha256: sha256_hex(req.mlir.as_bytes()),
            weights: req.weights.iter().map(|w| w.to_string()).collect(),
        }
    }

    /// The cache key: sha256 (hex) over the identity parts in their fixed order (the order
    /// `docs/operations.md`, "IREE artifact cache", lists).
    pub fn key(&self) -> String {
        let mut h = Sha256::new();
        let mut field = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        field(IDENTITY_VERSION.as_bytes());
        field(self.entry.as_bytes());
        field(self.config_identity.as_bytes());
        field(self.compiler.library_sha256.as_bytes());
        field(self.compiler.version.as_bytes());
        field(&(self.compiler.flags.len() as u64).to_le_bytes());
        for flag in &self.compiler.flags {
            field(flag.as_bytes());
        }
        field(self.compiler.target_cpu.as_bytes());
        field(self.mlir_sha256.as_bytes());
        field(&(self.weights.len() as u64).to_le_bytes());
        for w in &self.weights {
            field(w.as_bytes());
        }
        hex(&h.finalize())
    }

    /// The first field that differs from `other`, for log messages ("why was this rebuilt").
    pub fn first_difference(&self, other: &Identity) -> Option<&'static str> {
        let c = (&self.compiler, &other.compiler);
        [
            ("entry", self.entry == other.entry),
            (
                "config identity",
                self.config_identity == other.config_identity,
            ),
            (
                "compiler library sha256",
                c.0.library_sha256 == c.1.library_sha256,
            ),
            ("compiler version", c.0.version == c.1.version),
            ("compiler flags", c.0.flags == c.1.flags),
            ("target cpu", c.0.target_cpu == c.1.target_cpu),
            ("mlir sha256", self.mlir_sha256 == other.mlir_sha256),
            ("weight schema", self.weights == other.weights),
        ]
        .into_iter()
        .find(|(_, same)| !same)
        .map(|(name, _)| name)
    }
}

/// Entry names become file names: keep them to a portable, unambiguous alphabet. `~` (temp-file
/// separator) and `/` are excluded on purpose.
pub fn valid_entry_name(entry: &str) -> bool {
    !entry.is_empty()
        && entry.len() <= 128
        && !entry.starts_with('.')
        && entry
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

pub(crate) fn is_key(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Resolves a `--iree-llvmcpu-target-cpu` value to what the cache records. A named CPU is itself;
/// `host` becomes `host:<model name>:<hash of the CPU feature flags>` read from /proc/cpuinfo,
/// because the compiler expands `host` to the features of the machine it runs on, and a module
/// built that way may not run (or run differently) on another machine sharing the cache dir.
pub fn resolve_target_cpu(cpu: &str) -> String {
    if cpu != "host" {
        return cpu.to_owned();
    }
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    describe_host_cpu(&info)
}

fn describe_host_cpu(cpuinfo: &str) -> String {
    let field = |name: &str| {
        cpuinfo.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim().to_owned())
        })
    };
    let model = field("model name")
        .or_else(|| field("uarch"))
        .or_else(|| field("CPU part"))
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned());
    // x86 calls them "flags", arm64 "Features". Sorted so the order /proc prints them in is moot.
    let features = field("flags")
        .or_else(|| field("Features"))
        .unwrap_or_default();
    let mut flags: Vec<&str> = features.split_whitespace().collect();
    flags.sort_unstable();
    let digest = sha256_hex(flags.join(" ").as_bytes());
    format!("host:{model}:{}", &digest[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compiler() -> CompilerIdentity {
        CompilerIdentity {
            library_sha256: "ab".repeat(32),
            version: "3.13.0".into(),
            flags: vec!["--a".into(), "--b".into()],
            target_cpu: "znver4".into(),
        }
    }

    fn identity(weights: &[WeightSpec]) -> Identity {
        let req = ModuleRequest {
            entry: "audio.main",
            config_identity: "cfg",
            mlir: "module {}",
            weights,
        };
        Identity::new(&req, &compiler())
    }

    #[test]
    fn weight_spec_formats_as_schema_entry() {
        assert_eq!(
            WeightSpec::new("w", "f32", &[3, 4]).to_string(),
            "w:f32:3x4"
        );
        assert_eq!(WeightSpec::new("s", "bf16", &[]).to_string(), "s:bf16:");
    }

    #[test]
    fn every_identity_part_changes_the_key() {
        let w = [WeightSpec::new("w", "f32", &[3, 4])];
        let base = identity(&w);
        let key = base.key();
        assert!(is_key(&key));
        assert_eq!(key, identity(&w).key(), "deterministic");
        let mut variants = Vec::new();
        let mut v = base.clone();
        v.entry = "vision.main".into();
        variants.push(v);
        let mut v = base.clone();
        v.config_identity = "cfg2".into();
        variants.push(v);
        let mut v = base.clone();
        v.compiler.library_sha256 = "cd".repeat(32);
        variants.push(v);
        let mut v = base.clone();
        v.compiler.version = "3.12.0".into();
        variants.push(v);
        let mut v = base.clone();
        v.compiler.flags.push("--c".into());
        variants.push(v);
        let mut v = base.clone();
        v.compiler.flags.reverse();
        variants.push(v);
        let mut v = base.clone();
        v.compiler.target_cpu = "generic".into();
        variants.push(v);
        let mut v = base.clone();
        v.mlir_sha256 = sha256_hex(b"module { }");
        variants.push(v);
        variants.push(identity(&[WeightSpec::new("w", "f32", &[4, 3])]));
        variants.push(identity(&[WeightSpec::new("w", "bf16", &[3, 4])]));
        variants.push(identity(&[]));
        for v in &variants {
            assert_ne!(v.key(), key, "{v:?}");
            assert!(v.first_difference(&base).is_some());
        }
        assert_eq!(base.first_difference(&base.clone()), None);
    }

    #[test]
    fn fields_are_length_prefixed() {
        let mut a = identity(&[]);
        let mut b = a.clone();
        a.compiler.flags = vec!["--ab".into(), "c".into()];
        b.compiler.flags = vec!["--a".into(), "bc".into()];
        assert_ne!(a.key(), b.key());
    }

    #[test]
    fn entry_names_are_file_name_safe() {
        for ok in ["audio.main", "decoder.prefill_b8", "vision-main"] {
            assert!(valid_entry_name(ok), "{ok}");
        }
        for bad in ["", ".hidden", "a/b", "a~b", "a b", "..", "ä"] {
            assert!(!valid_entry_name(bad), "{bad}");
        }
    }

    #[test]
    fn host_cpu_includes_model_and_features() {
        let a = describe_host_cpu("model name\t: Fancy CPU\nflags\t\t: sse avx512f\n");
        let b = describe_host_cpu("model name\t: Fancy CPU\nflags\t\t: avx512f sse\n");
        let c = describe_host_cpu("model name\t: Fancy CPU\nflags\t\t: sse\n");
        assert!(a.starts_with("host:Fancy CPU:"));
        assert_eq!(a, b, "flag order does not matter");
        assert_ne!(a, c, "a different feature set is a different target");
        assert_eq!(resolve_target_cpu("znver4"), "znver4");
        assert!(resolve_target_cpu("host").starts_with("host:"));
    }
}
