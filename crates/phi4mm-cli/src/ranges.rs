//! The ranges of the numeric options, checked while clap parses them: a value out of range is
//! refused with the option's name before anything loads, instead of panicking deep in the model
//! (`--slots 0`, `--iree-prefill-chunk 0`) or allocating without bound (`--slots 10^11`,
//! `--threads 10^5`). The plugin's own limits are the ones used, so the CLI and a served
//! instance accept the same values.

use std::ops::RangeInclusive;
use switchyard_phi4mm::config::{MAX_SLOTS, MAX_THREADS};

/// A count of one or more: rounds, tokens, a chunk or a context, bytes.
pub fn at_least_one(value: &str) -> Result<usize, String> {
    within(value, 1..=usize::MAX)
}

/// `--slots`: as a served instance's `slots`.
pub fn slots(value: &str) -> Result<usize, String> {
    within(value, 1..=MAX_SLOTS)
}

/// `--threads`: 0 for one per core, else as a served instance's `threads`.
pub fn threads(value: &str) -> Result<usize, String> {
    within(value, 0..=MAX_THREADS)
}

/// `--new-tokens` of `bench`: its decode figure times the steps after the first token.
pub fn at_least_two(value: &str) -> Result<usize, String> {
    within(value, 2..=usize::MAX)
}

fn within(value: &str, range: RangeInclusive<usize>) -> Result<usize, String> {
    let n: usize = value.parse().map_err(|e| format!("{e}"))?;
    match (range.contains(&n), *range.end()) {
        (true, _) => Ok(n),
        (false, usize::MAX) => Err(format!("must be at least {}", range.start())),
        (false, end) => Err(format!("must be in {}..={end}", range.start())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_out_of_range_are_refused_with_the_range() {
        assert_eq!(slots("4"), Ok(4));
        assert_eq!(
            slots("0").unwrap_err(),
            format!("must be in 1..={MAX_SLOTS}")
        );
        assert!(slots("100000000000").is_err());
        assert_eq!(threads("0"), Ok(0));
        assert!(threads("100000").is_err());
        assert_eq!(at_least_one("0").unwrap_err(), "must be at least 1");
        assert_eq!(at_least_two("1").unwrap_err(), "must be at least 2");
        assert!(at_least_one("-3").is_err());
    }
}
