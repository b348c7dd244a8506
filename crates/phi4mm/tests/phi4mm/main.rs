//! The Phi4MM plugin against the phi4mm-tiny fixture: checkpoint loading and validation, every
//! model case on the host backend, batching and the scheduler, the plugin through its ABI, and
//! (feature `iree`) the IREE backend and its artifact cache with real compiles, (feature `mlx`) the
//! MLX producer.

#[cfg(feature = "iree")]
mod iree_support;
mod model_support;
mod scheduler_support;

mod kernel_paths;
mod model_batch;
mod model_cases;
mod model_checkpoint;
mod model_real_checkpoint;
mod scheduler_mixed;
mod scheduler_plugin;
mod scheduler_slots;

#[cfg(feature = "iree")]
mod iree_audio;
#[cfg(feature = "iree")]
mod iree_backend;
#[cfg(feature = "iree")]
mod iree_cache;
#[cfg(feature = "iree")]
mod iree_compiler;
#[cfg(feature = "iree")]
mod iree_cuda;
#[cfg(feature = "iree")]
mod iree_decoder;
#[cfg(feature = "iree")]
mod iree_vision;

#[cfg(feature = "mlx")]
mod mlx_producer;
