//! The server's accounting under hostile input: a sequence of datagrams from
//! a few sources, each either raw bytes or a netspeed header with fuzzed
//! fields. The table never panics, stays bounded, and answers are never
//! larger than what caused them.
#![no_main]
use libfuzzer_sys::fuzz_target;
use netspeed::meter::account::{PeerTable, Rx, TableConfig};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fuzz_target!(|data: &[u8]| {
    let t0 = Instant::now();
    let cfg = TableConfig {
        max_peers: 8,
        idle_timeout: Duration::from_millis(50),
        end_grace: Duration::from_millis(5),
        sockets: 2,
        intervals: true,
        ..TableConfig::default()
    };
    let mut table = PeerTable::new(cfg, t0);
    let mut replies = Vec::new();
    let mut sink = |_| {};
    let mut biggest_request = 0;
    for (i, chunk) in data.chunks(97).enumerate() {
        let Some((&control, rest)) = chunk.split_first() else { continue };
        let from = SocketAddr::from(([10, 0, 0, control % 4], 1000 + u16::from(control % 16)));
        let now = t0 + Duration::from_millis(i as u64 * u64::from(control % 8));
        let mut datagram = rest.to_vec();
        if control & 0x80 != 0 && datagram.len() >= 6 {
            datagram[..4].copy_from_slice(b"NSPD");
            datagram[4] = netspeed::wire::VERSION;
            datagram[5] %= 5;
            // Now and then a Data datagram past the End's total, to reach
            // the conflict paths.
            if datagram[5] == 0 && datagram.len() >= 24 && control & 0x08 != 0 {
                datagram[16..24].copy_from_slice(&u64::from(control).to_be_bytes());
            }
            // Give control messages their length now and then.
            match (datagram[5], control & 0x20 != 0) {
                (1, true) => datagram.resize(netspeed::wire::END_LEN, 0),
                (3, true) => datagram.resize(netspeed::wire::HELLO_LEN, 0),
                _ => {}
            }
        }
        biggest_request = biggest_request.max(datagram.len());
        let segment = (control & 0x40 != 0).then_some(1 + usize::from(control % 32));
        let before = replies.len();
        let rx = Rx {
            from,
            arrived: now,
            processed: now,
            socket: usize::from(control % 2),
            drops: Some(u32::from(control) << 24),
            local: None,
            segment_size: segment,
            truncated: control & 0x10 != 0,
            cpu: None,
        };
        table.on_receive(&datagram, &rx, &mut replies);
        for reply in &replies[before..] {
            assert!(reply.bytes.as_slice().len() <= datagram.len(), "answer larger than its request");
        }
        if control % 5 == 0 {
            table.expire(now, &mut sink, &mut replies);
            for reply in &replies {
                assert!(reply.bytes.as_slice().len() <= biggest_request, "answer larger than any request");
            }
        }
        replies.clear();
        assert!(table.len() <= 16 + table.records_bound(), "tables bounded");
    }
    table.tick_intervals(t0 + Duration::from_secs(1), None, &mut sink);
    table.finish_all(t0 + Duration::from_secs(2), &mut sink, &mut replies);
});
