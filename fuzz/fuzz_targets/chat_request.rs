//! Arbitrary bytes as a chat request body through the host's JSON parse and its conversion to
//! the plugin request (field checks, data-URI and base64 media decoding). Seeds: seeds/chat_request.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = switchyard::server::chat_request_from_json(data, 1);
});
