//! The Phi4MM front end: everything between a request's bytes and model inputs, with no
//! knowledge of any backend.
//!
//! - [`audio`]: WAV/FLAC/MP3/OGG decoding, resampling to 16 kHz, and the 80-bin log-mel features
//!   the audio encoder consumes;
//! - [`image`]: decoding and the dynamic-HD crop layout the vision tower consumes;
//! - [`prompt`]: the tokenizer, the chat template, reserved-token checks and placeholder
//!   expansion;
//! - [`limits`]: every bound the above enforce, each named in its error.
//!
//! It depends on no other workspace crate, so the fuzz targets link it alone.

pub mod audio;
pub mod image;
pub mod limits;
mod parallel;
pub mod prompt;
mod simd;
