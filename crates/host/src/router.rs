//! The route table: a requested model name (plus the request's modality and headers) resolves to
//! an ordered list of candidate instances — the weighted choice first, then the fallbacks. The
//! table is immutable; a reload builds a new one with the deployment that it belongs to.

use crate::{config::ValidConfig, instance::Instance};
use axum::http::{HeaderMap, HeaderName};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};
use switchyard_plugin_api::Modality;

pub struct RouteTable {
    /// Requested model name → indices into `routes`, in config order.
    by_name: HashMap<String, Vec<usize>>,
    routes: Vec<Route>,
    instances: HashMap<String, Arc<Instance>>,
}

struct Route {
    modalities: Vec<Modality>,
    header: Option<(HeaderName, String)>,
    backends: Vec<Arc<Instance>>,
    /// Beside `backends`.
    weights: Vec<i64>,
    fallbacks: Vec<Arc<Instance>>,
    /// Smooth weighted round-robin state (nginx's algorithm): deterministic, and any window of
    /// `sum(weights)` picks has each backend exactly `weight` times.
    current: Mutex<Vec<i64>>,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("The model {} does not exist", crate::server::error::shown(.0))]
    UnknownModel(String),
    #[error(
        "no route for model {} takes {modality} requests with these headers",
        crate::server::error::shown(model)
    )]
    NoMatch { model: String, modality: Modality },
}

impl RouteTable {
    /// Builds the table. `instances` must hold every model the config names (validation ensures
    /// the names resolve; the runtime creates the instances).
    pub fn build(config: &ValidConfig, instances: HashMap<String, Arc<Instance>>) -> Self {
        let get = |name: &str| {
            instances
                .get(name)
                .cloned()
                .expect("validated config names an instance")
        };
        let mut by_name: HashMap<String, Vec<usize>> = HashMap::new();
        let mut routes = Vec::new();
        for (index, route) in config.routes().iter().enumerate() {
            for name in &route.models {
                by_name.entry(name.clone()).or_default().push(index);
            }
            let backends: Vec<_> = route.backends.iter().map(|b| get(&b.model)).collect();
            let weights = route.backends.iter().map(|b| b.weight as i64).collect();
            routes.push(Route {
                modalities: route
                    .modalities
                    .iter()
                    .filter_map(|m| Modality::parse(m))
                    .collect(),
                header: route.header.as_ref().and_then(|h| {
                    HeaderName::try_from(h.name.as_str())
                        .ok()
                        .map(|n| (n, h.value.clone()))
                }),
                current: Mutex::new(vec![0; backends.len()]),
                backends,
                weights,
                fallbacks: route.fallbacks.iter().map(|f| get(f)).collect(),
            });
        }
        Self {
            by_name,
            routes,
            instances,
        }
    }

    pub fn instances(&self) -> &HashMap<String, Arc<Instance>> {
        &self.instances
    }

    /// Candidates for a request, best first. They borrow from the table: resolving allocates
    /// nothing, for it runs on every request.
    pub fn resolve(
        &self,
        model: &str,
        modality: Modality,
        headers: &HeaderMap,
    ) -> Result<Candidates<'_>, RouteError> {
        if let Some(indices) = self.by_name.get(model) {
            for &i in indices {
                let route = &self.routes[i];
                if route.matches(modality, headers) {
                    return Ok(route.candidates());
                }
            }
            if !self.instances.contains_key(model) {
                return Err(RouteError::NoMatch {
                    model: model.into(),
                    modality,
                });
            }
        }
        // Every instance is also addressable by its own name.
        match self.instances.get(model) {
            Some(instance) => Ok(Candidates {
                chosen: instance,
                fallbacks: &[],
            }),
            None => Err(RouteError::UnknownModel(model.into())),
        }
    }
}

impl Route {
    fn matches(&self, modality: Modality, headers: &HeaderMap) -> bool {
        let modality_ok = self.modalities.is_empty() || self.modalities.contains(&modality);
        let header_ok = match &self.header {
            None => true,
            Some((name, value)) => {
                headers.get(name).and_then(|v| v.to_str().ok()) == Some(value.as_str())
            }
        };
        modality_ok && header_ok
    }

    fn candidates(&self) -> Candidates<'_> {
        let chosen = smooth_weighted_pick(&mut self.current.lock().unwrap(), &self.weights);
        Candidates {
            chosen: &self.backends[chosen],
            fallbacks: &self.fallbacks,
        }
    }
}

/// A request's candidate instances: the weighted choice, then the route's fallbacks, each
/// instance once.
#[derive(Clone, Copy)]
pub struct Candidates<'a> {
    chosen: &'a Arc<Instance>,
    fallbacks: &'a [Arc<Instance>],
}

impl<'a> Candidates<'a> {
    /// The best candidate.
    pub fn first(&self) -> &'a Arc<Instance> {
        self.chosen
    }

    /// Every candidate, best first, without repeats.
    pub fn iter(&self) -> impl Iterator<Item = &'a Arc<Instance>> + 'a {
        chosen_then_fallbacks(self.chosen, self.fallbacks)
    }
}

/// `chosen`, then each of `fallbacks` that is neither `chosen` nor an earlier fallback.
fn chosen_then_fallbacks<'a, T>(
    chosen: &'a Arc<T>,
    fallbacks: &'a [Arc<T>],
) -> impl Iterator<Item = &'a Arc<T>> + 'a {
    let rest = fallbacks.iter().enumerate().filter(move |&(i, f)| {
        !Arc::ptr_eq(f, chosen) && !fallbacks[..i].iter().any(|g| Arc::ptr_eq(f, g))
    });
    std::iter::once(chosen).chain(rest.map(|(_, f)| f))
}

/// One step of smooth weighted round-robin: every weight is added to its running value, the
/// largest wins and pays back the total.
fn smooth_weighted_pick(current: &mut [i64], weights: &[i64]) -> usize {
    let total: i64 = weights.iter().sum();
    let mut best = 0;
    for (i, weight) in weights.iter().enumerate() {
        current[i] += weight;
        if current[i] > current[best] {
            best = i;
        }
    }
    current[best] -= total;
    best
}

#[cfg(test)]
mod tests {
    use super::{chosen_then_fallbacks, smooth_weighted_pick};
    use std::sync::Arc;

    #[test]
    fn candidates_are_the_choice_then_each_other_fallback_once() {
        let (a, b, c) = (Arc::new('a'), Arc::new('b'), Arc::new('c'));
        let names = |chosen: &Arc<char>, fallbacks: &[Arc<char>]| -> String {
            chosen_then_fallbacks(chosen, fallbacks)
                .map(|x| **x)
                .collect()
        };
        assert_eq!(names(&a, &[]), "a");
        assert_eq!(names(&a, &[b.clone(), c.clone()]), "abc");
        // The chosen backend is also a fallback, and a fallback is named twice.
        assert_eq!(
            names(&b, &[a.clone(), b.clone(), a.clone(), c.clone()]),
            "bac"
        );
        // Equal values in different instances are different candidates.
        assert_eq!(names(&a, &[Arc::new('a')]), "aa");
    }

    #[test]
    fn weights_are_exact_in_every_window_and_interleaved() {
        let weights = [5, 1, 1];
        let mut current = [0; 3];
        let picks: Vec<usize> = (0..14)
            .map(|_| smooth_weighted_pick(&mut current, &weights))
            .collect();
        for window in picks.chunks(7) {
            assert_eq!(window.iter().filter(|&&p| p == 0).count(), 5);
            assert_eq!(window.iter().filter(|&&p| p == 1).count(), 1);
            assert_eq!(window.iter().filter(|&&p| p == 2).count(), 1);
        }
        // Smooth: the heavy backend never takes more than 3 in a row here (nginx's property).
        assert_eq!(&picks[..7], &[0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn zero_weight_backends_are_never_picked() {
        let mut current = [0; 2];
        assert!((0..10).all(|_| smooth_weighted_pick(&mut current, &[0, 3]) == 1));
    }
}
