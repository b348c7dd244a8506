//! [`Progress`]: the weight-scan progress callback.

/// Called with (bytes checked, total bytes) while weights are scanned.
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Sync);
