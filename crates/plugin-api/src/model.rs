use crate::{
    error::{ErrorKind, PluginError},
    event::EventSinkBox,
    request::{Prompt, Request},
    stats::{ModelResources, ModelStats},
};
use abi_stable::{sabi_trait, std_types::RResult};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A model instance as the host sees it, across the ABI. Plugins do not implement this directly:
/// they implement [`PluginModel`], which [`crate::export_plugin!`] wraps so that no panic crosses
/// the boundary.
#[sabi_trait]
pub trait Model: Send + Sync {
    /// Prepares the instance to serve (loads, compiles, runs a tiny request). Called once by the
    /// host before the instance receives traffic; a failure aborts the (re)load.
    fn warm(&self) -> RResult<(), PluginError>;

    /// Admits a request. Events go to `sink`. Returns an error (and sends no event) when the
    /// request is refused at admission; once `Ok` is returned, exactly one `Finished` or `Failed`
    /// event will follow.
    fn submit(&self, request: Request, sink: EventSinkBox) -> RResult<(), PluginError>;

    /// Cancels a request wherever it is (queue or slot). Returns whether it was found.
    fn cancel(&self, request_id: u64) -> bool;

    fn stats(&self) -> ModelStats;

    /// Stops admitting requests; the ones already admitted run to completion.
    fn drain(&self);

    /// Cancels everything still running and stops the instance's threads. Called once, last.
    #[sabi(last_prefix_field)]
    fn shutdown(&self);
}

/// The refusal of a model that takes no raw prompts.
fn no_raw_prompts() -> PluginError {
    PluginError::new(
        ErrorKind::Unsupported,
        "this model takes no raw prompts (/v1/completions); use /v1/chat/completions",
    )
}

/// An owned, FFI-safe model instance.
pub type ModelBox = Model_TO<'static, abi_stable::std_types::RBox<()>>;

/// What a plugin author implements for a model instance: plain Rust, no FFI types beyond the
/// request and event values.
pub trait PluginModel: Send + Sync + 'static {
    fn warm(&self) -> Result<(), PluginError> {
        Ok(())
    }
    fn submit(&self, request: Request, sink: EventSinkBox) -> Result<(), PluginError>;
    /// Admits a completion (API 2.1, `/v1/completions`): `prompt` is read raw, with no chat
    /// template, in place of `request.messages`, which are empty; otherwise as `submit`. The
    /// export glue calls it for a request that carries a prompt (see [`Prompt`]). By default it
    /// is refused as `Unsupported`.
    fn submit_prompt(
        &self,
        request: Request,
        prompt: Prompt,
        sink: EventSinkBox,
    ) -> Result<(), PluginError> {
        let _ = (request, prompt, sink);
        Err(no_raw_prompts())
    }
    fn cancel(&self, request_id: u64) -> bool;
    fn stats(&self) -> ModelStats;
    fn drain(&self);
    fn shutdown(&self);
    /// The instance's KV cache and adapters (API 2.1), called with every `stats`; the export
    /// glue carries them in `ModelStats::details_json` (see [`ModelResources`]). The default
    /// reports nothing: no KV cache to count, no adapters.
    fn resources(&self) -> ModelResources {
        ModelResources::default()
    }
}

/// Wraps a [`PluginModel`] so that every call catches panics. A panic in `submit` or `warm`
/// becomes an error of kind `Panic`; in the other calls it becomes a neutral answer, because the
/// host cannot do anything better with it and the process must keep serving.
pub(crate) struct Guarded<M>(pub(crate) M);

impl<M: PluginModel> Model for Guarded<M> {
    fn warm(&self) -> RResult<(), PluginError> {
        catch_unwind(AssertUnwindSafe(|| self.0.warm()))
            .unwrap_or_else(|p| Err(PluginError::from_panic("warm", p)))
            .into()
    }

    fn submit(&self, mut request: Request, sink: EventSinkBox) -> RResult<(), PluginError> {
        catch_unwind(AssertUnwindSafe(|| match request.take_prompt() {
            Ok(None) => self.0.submit(request, sink),
            Ok(Some(prompt)) => self.0.submit_prompt(request, prompt, sink),
            Err(message) => Err(PluginError::invalid_request(message)),
        }))
        .unwrap_or_else(|p| Err(PluginError::from_panic("submit", p)))
        .into()
    }

    fn cancel(&self, request_id: u64) -> bool {
        catch_unwind(AssertUnwindSafe(|| self.0.cancel(request_id))).unwrap_or(false)
    }

    fn stats(&self) -> ModelStats {
        catch_unwind(AssertUnwindSafe(|| {
            let mut stats = self.0.stats();
            stats.attach_resources(&self.0.resources());
            stats
        }))
        .unwrap_or_else(|payload| {
            // Zeros, and why, where an operator looks (`/admin/status`'s details).
            let error = PluginError::from_panic("stats", payload);
            ModelStats {
                details_json: serde_json::json!({ "error": error.message.as_str() })
                    .to_string()
                    .into(),
                ..ModelStats::default()
            }
        })
    }

    fn drain(&self) {
        let _ = catch_unwind(AssertUnwindSafe(|| self.0.drain()));
    }

    fn shutdown(&self) {
        let _ = catch_unwind(AssertUnwindSafe(|| self.0.shutdown()));
    }
}

impl<M: PluginModel> Guarded<M> {
    pub(crate) fn boxed(model: M) -> ModelBox {
        Model_TO::from_value(Guarded(model), abi_stable::sabi_trait::TD_Opaque)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model whose every call panics.
    struct Broken;

    impl PluginModel for Broken {
        fn submit(&self, _: Request, _: EventSinkBox) -> Result<(), PluginError> {
            panic!("submit is broken")
        }
        fn cancel(&self, _: u64) -> bool {
            panic!("cancel is broken")
        }
        fn stats(&self) -> ModelStats {
            panic!("stats is broken")
        }
        fn drain(&self) {
            panic!("drain is broken")
        }
        fn shutdown(&self) {
            panic!("shutdown is broken")
        }
    }

    #[test]
    fn a_panic_in_stats_reads_as_zeros_and_says_why_in_the_details() {
        let model = Guarded::boxed(Broken);
        let stats = model.stats();
        assert_eq!((stats.running, stats.queued, stats.free_slots), (0, 0, 0));
        let details: serde_json::Value = serde_json::from_str(&stats.details_json).unwrap();
        assert_eq!(
            details["error"], "plugin panicked in stats: stats is broken",
            "{details}"
        );
        // The other calls answer neutrally.
        assert!(!model.cancel(1));
        model.drain();
        model.shutdown();
    }
}
