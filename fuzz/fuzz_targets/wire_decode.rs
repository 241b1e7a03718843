//! Any datagram: decoding never panics, and what decodes re-encodes to the
//! same message.
#![no_main]
use libfuzzer_sys::fuzz_target;
use netspeed::wire::{self, Message};

fuzz_target!(|data: &[u8]| {
    match wire::decode(data) {
        Ok(Message::Data(h)) => {
            let mut buf = data.to_vec();
            assert!(wire::write_data_header(&mut buf, &h));
            assert_eq!(wire::decode(&buf), Ok(Message::Data(h)));
        }
        Ok(Message::End(e)) => assert_eq!(wire::decode(&wire::encode_end(&e)), Ok(Message::End(e))),
        Ok(Message::EndAck(a)) => assert_eq!(wire::decode(&wire::encode_end_ack(&a)), Ok(Message::EndAck(a))),
        Ok(Message::Hello(h)) => assert_eq!(wire::decode(&wire::encode_hello(&h)), Ok(Message::Hello(h))),
        Ok(Message::HelloAck(a)) => assert_eq!(wire::decode(&wire::encode_hello_ack(&a)), Ok(Message::HelloAck(a))),
        Ok(Message::Start(s)) => assert_eq!(wire::decode(&wire::encode_start(&s)), Ok(Message::Start(s))),
        Ok(Message::StartAck(a)) => assert_eq!(wire::decode(&wire::encode_start_ack(&a)), Ok(Message::StartAck(a))),
        Ok(Message::Feedback(f)) => assert_eq!(wire::decode(&wire::encode_feedback(&f)), Ok(Message::Feedback(f))),
        Ok(Message::Probe(p)) => assert_eq!(wire::decode(&wire::encode_probe(&p)), Ok(Message::Probe(p))),
        Ok(Message::ProbeAck(a)) => assert_eq!(wire::decode(&wire::encode_probe_ack(&a)), Ok(Message::ProbeAck(a))),
        Err(_) => {}
    }
});
