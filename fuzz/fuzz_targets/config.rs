//! Arbitrary text as a config file through the TOML reading and the whole-config validation.
//! Seeds: seeds/config.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = switchyard::config::from_toml_str(text, std::path::Path::new("/nonexistent"));
    }
});
