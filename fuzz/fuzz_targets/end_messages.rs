//! The protocol's control messages: inputs are shaped into End-sized
//! buffers with a valid prefix, so the fuzzer spends its time on the fields.
#![no_main]
use libfuzzer_sys::fuzz_target;
use netspeed::wire::{self, Message, END_LEN, MAGIC, VERSION};

fuzz_target!(|data: &[u8]| {
    let mut buf = [0u8; END_LEN];
    buf[..4].copy_from_slice(&MAGIC);
    buf[4] = VERSION;
    let n = data.len().min(END_LEN - 5);
    buf[5..5 + n].copy_from_slice(&data[..n]);
    let len = data.first().map_or(END_LEN, |b| END_LEN - (*b as usize % 4) * 8);
    match wire::decode(&buf[..len]) {
        Ok(Message::End(e)) => {
            assert_eq!(len, END_LEN);
            assert_eq!(wire::decode(&wire::encode_end(&e)), Ok(Message::End(e)));
        }
        Ok(Message::EndAck(a)) => {
            assert_eq!(len, END_LEN);
            assert_eq!(wire::decode(&wire::encode_end_ack(&a)), Ok(Message::EndAck(a)));
        }
        Ok(Message::Hello(h)) => {
            assert_eq!(wire::decode(&wire::encode_hello(&h)), Ok(Message::Hello(h)));
        }
        Ok(Message::HelloAck(a)) => {
            assert_eq!(wire::decode(&wire::encode_hello_ack(&a)), Ok(Message::HelloAck(a)));
        }
        _ => {}
    }
});
