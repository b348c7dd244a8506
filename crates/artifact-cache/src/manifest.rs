//! The JSON manifest beside each module: every identity part plus the module's sha256 and length.
//!
//! Parsing is strict (`deny_unknown_fields` everywhere): a manifest this code did not write, or
//! one from a future layout, is invalid and the entry is rebuilt, never loaded on a guess.

use crate::identity::{is_key, sha256_hex, Identity};
use crate::Invalid;
use serde::{Deserialize, Serialize};

/// Manifest layout version; see also [`super::identity::IDENTITY_VERSION`].
pub const MANIFEST_FORMAT: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: u32,
    /// `identity.key()`, also in the file names.
    pub key: String,
    pub identity: Identity,
    /// sha256 (hex) of the module bytes.
    pub module_sha256: String,
    pub module_len: u64,
    /// Seconds since the Unix epoch when the module was published.
    pub created_unix: u64,
}

impl Manifest {
    pub fn new(identity: Identity, module: &[u8]) -> Self {
        let created_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Manifest {
            format: MANIFEST_FORMAT,
            key: identity.key(),
            identity,
            module_sha256: sha256_hex(module),
            module_len: module.len() as u64,
            created_unix,
        }
    }

    /// Strict parse plus self-consistency: known format, and the key is the one the recorded
    /// identity hashes to (a hand-edited identity field does not survive this).
    pub fn parse(bytes: &[u8]) -> Result<Manifest, Invalid> {
        let m: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| Invalid::ManifestUnparsable(e.to_string()))?;
        if m.format != MANIFEST_FORMAT {
            return Err(Invalid::Format {
                found: m.format,
                reads: MANIFEST_FORMAT,
            });
        }
        if !is_key(&m.key) || m.key != m.identity.key() {
            return Err(Invalid::KeyNotIdentity);
        }
        Ok(m)
    }

    pub fn to_json(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("manifest serialises");
        v.push(b'\n');
        v
    }

    /// Do these module bytes match the manifest (length, then sha256)?
    pub fn check_module(&self, module: &[u8]) -> Result<(), Invalid> {
        if module.len() as u64 != self.module_len {
            return Err(Invalid::ModuleLength {
                found: module.len() as u64,
                expected: self.module_len,
            });
        }
        if sha256_hex(module) != self.module_sha256 {
            return Err(Invalid::ModuleHash);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{CompilerIdentity, ModuleRequest, WeightSpec};

    fn manifest() -> Manifest {
        let w = [WeightSpec::new("w", "f32", &[2, 2])];
        let req = ModuleRequest {
            entry: "e",
            config_identity: "c",
            mlir: "m",
            weights: &w,
        };
        let compiler = CompilerIdentity {
            library_sha256: "00".repeat(32),
            version: "v".into(),
            flags: vec!["--f".into()],
            target_cpu: "generic".into(),
        };
        Manifest::new(Identity::new(&req, &compiler), b"module bytes")
    }

    #[test]
    fn round_trips_and_checks_the_module() {
        let m = manifest();
        let parsed = Manifest::parse(&m.to_json()).unwrap();
        assert_eq!(parsed, m);
        parsed.check_module(b"module bytes").unwrap();
        assert!(parsed.check_module(b"module bytez").is_err());
        assert!(parsed.check_module(b"module byte").is_err());
    }

    fn edited(f: impl FnOnce(&mut serde_json::Value)) -> Result<Manifest, Invalid> {
        let mut v: serde_json::Value = serde_json::from_slice(&manifest().to_json()).unwrap();
        f(&mut v);
        Manifest::parse(&serde_json::to_vec(&v).unwrap())
    }

    #[test]
    fn unknown_fields_are_rejected_at_every_level() {
        assert!(edited(|v| v["extra"] = 1.into()).is_err());
        assert!(edited(|v| v["identity"]["extra"] = 1.into()).is_err());
        assert!(edited(|v| v["identity"]["compiler"]["extra"] = 1.into()).is_err());
        assert!(edited(|_| {}).is_ok());
    }

    #[test]
    fn missing_fields_other_formats_and_edited_identities_are_rejected() {
        assert!(edited(|v| {
            v.as_object_mut().unwrap().remove("module_sha256");
        })
        .is_err());
        assert!(edited(|v| v["format"] = 2.into()).is_err());
        assert!(edited(|v| v["identity"]["compiler"]["version"] = "other".into()).is_err());
        assert!(edited(|v| v["identity"]["weights"][0] = "w:f32:2x3".into()).is_err());
        assert!(Manifest::parse(b"{").is_err());
        assert!(Manifest::parse(b"").is_err());
    }
}
