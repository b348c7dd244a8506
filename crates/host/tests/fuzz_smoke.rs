//! A bounded, stable-Rust stand-in for the cargo-fuzz targets `chat_request` and `config`
//! (`fuzz/fuzz_targets/`, which need nightly to run): the same functions get the fuzz seeds and
//! a few thousand deterministic mutations of them, and must answer every one without a panic.

use std::path::{Path, PathBuf};

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target);
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 2, "seeds missing in {}", dir.display());
    seeds
}

/// xorshift64*: deterministic, so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Interesting bytes for JSON and TOML: delimiters, quotes, escapes, digits, big numbers.
const TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b"\\",
    b",",
    b":",
    b"=",
    b"\n",
    b"null",
    b"true",
    b"-1",
    b"1e309",
    b"18446744073709551616",
    b"\\u0000",
    b"\\ud800",
    b"data:;base64,",
    b"====",
    b"[[models]]",
    b"[server]",
    b"\xff",
    b"\"content\":[",
    b"\"type\":\"image_url\"",
];

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut data = seeds[rng.below(seeds.len())].clone();
    for _ in 0..1 + rng.below(8) {
        let at = rng.below(data.len() + 1);
        match rng.below(5) {
            0 if !data.is_empty() => {
                let i = at.min(data.len() - 1);
                data[i] ^= 1 << rng.below(8);
            }
            1 if !data.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(data.len());
                data.drain(at.min(end)..end);
            }
            2 => {
                let token = TOKENS[rng.below(TOKENS.len())];
                data.splice(at..at, token.iter().copied());
            }
            3 => {
                // A piece of another seed.
                let other = &seeds[rng.below(seeds.len())];
                let from = rng.below(other.len());
                let to = (from + rng.below(64)).min(other.len());
                data.splice(at..at, other[from..to].iter().copied());
            }
            _ if !data.is_empty() => {
                // A repeated piece (deep nesting, long strings).
                let from = rng.below(data.len());
                let to = (from + 1 + rng.below(8)).min(data.len());
                let piece: Vec<u8> = data[from..to].repeat(1 + rng.below(64));
                data.splice(at..at, piece);
            }
            _ => data.push(b'{'),
        }
    }
    data
}

const MUTATIONS: usize = 3000;

#[test]
fn chat_request_conversion_never_panics() {
    let seeds = seeds("chat_request");
    let convert = |data: &[u8]| switchyard::server::chat_request_from_json(data, 1).is_ok();
    assert!(seeds.iter().filter(|s| convert(s)).count() >= 3);
    let mut rng = Rng(0x5eed_0001);
    let accepted = (0..MUTATIONS)
        .filter(|_| convert(&mutate(&mut rng, &seeds)))
        .count();
    // The mutations reach past the JSON parser: some still convert.
    assert!(accepted > 0, "no mutation converted");
}

#[test]
fn config_validation_never_panics() {
    let seeds = seeds("config");
    let base = Path::new("/nonexistent");
    let mut rng = Rng(0x5eed_0002);
    let mutations = (0..MUTATIONS).map(|_| mutate(&mut rng, &seeds));
    let mut validated = 0;
    for data in seeds.iter().cloned().chain(mutations) {
        let Ok(text) = std::str::from_utf8(&data) else {
            continue;
        };
        if let Err(e) = switchyard::config::from_toml_str(text, base) {
            // Reached validation (errors that name keys), not only the TOML parser.
            if e.0
                .iter()
                .any(|m| m.contains("models[") || m.contains("server."))
            {
                validated += 1;
            }
        }
    }
    assert!(validated > 0, "no mutation reached validation");
}
