//! The server's accounting under hostile input: a sequence of datagrams from
//! a few sources, each either raw bytes or a netspeed header with fuzzed
//! fields. The table never panics, stays bounded, and answers are never
//! larger than what caused them.
#![no_main]
use libfuzzer_sys::fuzz_target;
use netspeed::server::peers::PeerTable;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fuzz_target!(|data: &[u8]| {
    let t0 = Instant::now();
    let mut table = PeerTable::new(8, Duration::from_millis(50), t0, 2);
    let mut replies = Vec::new();
    let mut sink = |_| {};
    for (i, chunk) in data.chunks(97).enumerate() {
        let Some((&control, rest)) = chunk.split_first() else { continue };
        let from = SocketAddr::from(([10, 0, 0, control % 4], 1000 + u16::from(control % 16)));
        let now = t0 + Duration::from_millis(i as u64 * u64::from(control % 8));
        let mut datagram = rest.to_vec();
        if control & 0x80 != 0 && datagram.len() >= 6 {
            datagram[..4].copy_from_slice(b"NSPD");
            datagram[4] = 1;
            datagram[5] %= 3;
        }
        let segment = (control & 0x40 != 0).then_some(1 + usize::from(control % 32));
        let before = replies.len();
        table.on_receive(&datagram, segment, from, now, usize::from(control % 2), Some(u64::from(control)), &mut sink, &mut replies);
        for (reply, _) in &replies[before..] {
            assert!(reply.len() <= datagram.len(), "answer larger than its request");
        }
        if control % 5 == 0 {
            table.expire(now, &mut sink);
        }
        assert!(table.len() <= 16, "tables bounded by --max-peers each");
    }
    table.tick_intervals(t0 + Duration::from_secs(1), &mut sink);
    table.finish_all(&mut sink);
});
