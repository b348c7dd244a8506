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

/// The key of [`ModelStats::details_json`] under which a plugin built against API 2.1 carries
/// its [`ModelResources`] (the export glue puts [`crate::PluginModel::resources`] there).
pub const RESOURCES_KEY: &str = "resources";

/// What an instance holds for the requests it runs: its KV cache and its LoRA adapters. The host
/// shows it in the inference-gateway metrics (`vllm:kv_cache_usage_perc`, `vllm:lora_requests_info`)
/// that endpoint pickers route by. API 2.1.
///
/// It crosses the boundary as JSON inside `ModelStats::details_json`, not as a new vtable entry:
/// abi_stable refuses a library whose prefix types have fewer fields than the loader's, so a new
/// `Model` method would have locked every 2.0 plugin out of a 2.1 host.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelResources {
    /// KV-cache positions (tokens) the instance can hold over all its slots; 0 when it keeps no
    /// KV cache it can count (the host then reports slot occupancy instead).
    pub kv_capacity_tokens: u64,
    /// KV-cache positions held now by the requests it runs.
    pub kv_used_tokens: u64,
    /// The most adapters the instance can hold at once (vLLM's `max_lora`); 0: none.
    pub max_adapters: u32,
    /// Adapters loaded now and ready to serve, by name.
    pub resident_adapters: Vec<String>,
    /// Adapters that waiting requests asked for and that are not loaded yet, by name.
    pub waiting_adapters: Vec<String>,
}

impl ModelStats {
    /// The resources a 2.1 plugin reported; `None` from a 2.0 plugin (or a malformed entry).
    pub fn resources(&self) -> Option<ModelResources> {
        let details: serde_json::Value = serde_json::from_str(&self.details_json).ok()?;
        serde_json::from_value(details.get(RESOURCES_KEY)?.clone()).ok()
    }

    /// Puts `resources` into `details_json` under [`RESOURCES_KEY`], keeping the plugin's other
    /// details (an empty or non-object `details_json` becomes an object).
    pub fn attach_resources(&mut self, resources: &ModelResources) {
        let mut details = match serde_json::from_str(&self.details_json) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        let value = serde_json::to_value(resources).expect("plain data serialises");
        details.insert(RESOURCES_KEY.into(), value);
        self.details_json = serde_json::Value::Object(details).to_string().into();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_ride_in_the_details_beside_the_plugins_own_keys() {
        let resources = ModelResources {
            kv_capacity_tokens: 64,
            kv_used_tokens: 9,
            max_adapters: 2,
            resident_adapters: vec!["speech".into(), "vision".into()],
            waiting_adapters: Vec::new(),
        };
        // What a 2.0 plugin sends: its own details, no resources.
        let mut stats = ModelStats {
            details_json: r#"{"slots":[null]}"#.into(),
            ..ModelStats::default()
        };
        assert_eq!(stats.resources(), None);
        stats.attach_resources(&resources);
        assert_eq!(stats.resources(), Some(resources.clone()));
        let details: serde_json::Value = serde_json::from_str(&stats.details_json).unwrap();
        assert_eq!(details["slots"], serde_json::json!([null]));
        // Empty or non-object details become an object with the resources alone.
        for odd in ["", "[1]", "not json"] {
            let mut stats = ModelStats {
                details_json: odd.into(),
                ..ModelStats::default()
            };
            stats.attach_resources(&resources);
            assert_eq!(stats.resources(), Some(resources.clone()), "{odd}");
        }
    }
}
