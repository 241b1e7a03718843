//! Kernel control-message buffers (cmsghdr chains): the walker never reads
//! out of bounds and never panics, whatever the bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = netspeed::sys::parse_control(data);
});
