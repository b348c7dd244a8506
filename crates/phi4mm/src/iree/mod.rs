//! The IREE-compiled backend (feature `iree`): StableHLO emitters, compilation through the
//! verified artifact cache, and the IREE runtime on worker threads, driven by the same scheduler
//! as the host backend.

pub mod audio;
pub mod backend;
pub mod compiler;
pub mod context;
pub mod decoder;
pub mod emit;
mod error;
pub mod mlir;
pub mod tiles;
pub mod vision;
pub mod weights;
pub mod worker;

pub use error::{IreeError, IreeResult};
