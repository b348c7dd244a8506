//! One deployed configuration: a validated config with the plugins it loaded, the instances it
//! created and the route table over them. It does not change once built; a reload builds the
//! next one beside it (`crate::reload`) and the runtime swaps that in.

use crate::{config::ValidConfig, instance::Instance, registry::LoadedPlugin, router::RouteTable};
use std::{collections::HashMap, sync::Arc};

pub struct Deployment {
    /// Counts the deployments of this process, 0 being the empty one it starts with; shown as
    /// `generation` in `/ready`, `/admin/status` and reload reports.
    pub generation: u64,
    /// When it began serving (Unix seconds): its models' `created` in `/v1/models`.
    pub created: u64,
    pub config: ValidConfig,
    pub table: RouteTable,
    /// The libraries its instances use, one each.
    pub plugins: Vec<Arc<LoadedPlugin>>,
}

impl Deployment {
    /// What serves before the first reload: nothing.
    pub fn empty() -> Self {
        let config = ValidConfig::empty();
        Self {
            generation: 0,
            created: 0,
            table: RouteTable::build(&config, HashMap::new()),
            config,
            plugins: Vec::new(),
        }
    }

    /// Its instances in the config's order of models, the same at every call: the metrics'
    /// gauges list them so, and a picker that reads the first series of a name must find the
    /// same instance from one scrape to the next, and after a reload.
    pub fn instances(&self) -> impl Iterator<Item = &Arc<Instance>> {
        let instances = self.table.instances();
        self.config
            .models()
            .iter()
            .filter_map(move |model| instances.get(&model.name))
    }
}
