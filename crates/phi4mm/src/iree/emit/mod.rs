//! Emitters: each component of the model as a StableHLO module (MLIR text) plus its ordered
//! weight schema.

pub mod audio;
pub mod decoder;
pub mod vision;
