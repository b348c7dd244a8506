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

/// What an instance holds for the requests it runs: its KV cache and its LoRA adapters. The host
/// shows it in the inference-gateway metrics (`vllm:kv_cache_usage_perc`, `vllm:lora_requests_info`)
/// that endpoint pickers route by. Returned by [`crate::Model::resources`] (API 2.1).
///
/// A plain `#[repr(C)]` struct, so its layout is fixed: a later field needs a new method.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelResources {
    /// KV-cache positions (tokens) the instance can hold over all its slots; 0 when it keeps no
    /// KV cache it can count (the host then reports slot occupancy instead).
    pub kv_capacity_tokens: u64,
    /// KV-cache positions held now by the requests it runs.
    pub kv_used_tokens: u64,
    /// The most adapters the instance can hold at once (vLLM's `max_lora`); 0: none.
    pub max_adapters: u32,
    /// Adapters loaded now and ready to serve, by name.
    pub resident_adapters: RVec<RString>,
    /// Adapters that waiting requests asked for and that are not loaded yet, by name.
    pub waiting_adapters: RVec<RString>,
}
