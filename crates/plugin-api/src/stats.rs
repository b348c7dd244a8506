use abi_stable::{
    std_types::{RString, RVec},
    StableAbi,
};
use serde::{Deserialize, Serialize};

/// How many running rows use one adapter (for example `base`, `speech`, `vision`).
#[repr(C)]
#[derive(StableAbi, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdapterRows {
    pub adapter: RString,
    pub rows: u32,
}

/// A snapshot of a model instance's load.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelStats {
    /// Requests being computed now.
    pub running: u32,
    /// Requests admitted and waiting for a slot.
    pub queued: u32,
    /// Slots that could take a request now.
    pub free_slots: u32,
    pub adapters: RVec<AdapterRows>,
    /// Plugin-specific details as a JSON object (for example an artifact cache summary);
    /// `{}` when there is nothing to add. The host shows it verbatim in `/admin/status`.
    pub details_json: RString,
}
