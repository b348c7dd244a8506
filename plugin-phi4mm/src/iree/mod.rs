//! The IREE backend (feature `iree`).

pub mod compiler;
