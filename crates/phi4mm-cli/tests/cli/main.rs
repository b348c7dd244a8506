//! The `phi4mm` tool as a user runs it: the real binary, on the fixture checkpoint.

mod batch;
mod bench_batch;
mod cache;
mod frontend;
mod generate;
