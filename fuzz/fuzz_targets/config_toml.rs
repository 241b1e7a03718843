//! Config files: any text gives a config or a one-line error, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use netspeed::config::{parse_toml, ClientFile, ServerFile};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(e) = parse_toml::<ServerFile>(text) {
        assert!(!e.contains('\n'));
    }
    if let Err(e) = parse_toml::<ClientFile>(text) {
        assert!(!e.contains('\n'));
    }
});
