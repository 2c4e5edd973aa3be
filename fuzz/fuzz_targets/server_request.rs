#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ternion_fuzz::server_request(data));
