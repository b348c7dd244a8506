//! Why an entry on disk is not loaded. Every reason leads to the same action (rebuild, or `gc`
//! removes it); the variants exist so that what an operator reads names the exact fault.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("no manifest")]
    NoManifest,
    /// The I/O error's text (an `io::Error` is not `Clone`).
    #[error("manifest unreadable: {0}")]
    ManifestUnreadable(String),
    #[error("manifest does not parse: {0}")]
    ManifestUnparsable(String),
    #[error("manifest format {found} (this build reads {reads})")]
    Format { found: u32, reads: u32 },
    #[error("manifest key does not match its recorded identity")]
    KeyNotIdentity,
    /// Names the first identity field that differs.
    #[error("manifest {0} differs from the request")]
    DiffersFromRequest(&'static str),
    #[error("manifest key differs from the request")]
    KeyDiffersFromRequest,
    #[error("manifest belongs to another entry")]
    OtherEntry,
    #[error("no module file")]
    NoModule,
    #[error("module unreadable: {0}")]
    ModuleUnreadable(String),
    #[error("module is {found} bytes, manifest says {expected}")]
    ModuleLength { found: u64, expected: u64 },
    #[error("module sha256 does not match the manifest")]
    ModuleHash,
}
