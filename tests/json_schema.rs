//! The JSON report matches the schema we ship (`docs/udp_client.schema.json`)
//! in the shapes a user can produce: one client, several, paced with a
//! send buffer, 0-byte datagrams, a target that is not a udp_server, and
//! both directions (`-R`, `--bidir`).
//! A field added to the report without the schema, or a type that changes,
//! fails here.

mod common;

use common::udp::{client, CLIENT, WAIT};
use common::{args, run_bounded};
use serde_json::Value;
use std::net::UdpSocket;
use std::process::Command;

fn schema() -> jsonschema::Validator {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/udp_client.schema.json");
    let text = std::fs::read_to_string(path).expect("docs/udp_client.schema.json");
    let schema: Value = serde_json::from_str(&text).expect("the schema is JSON");
    jsonschema::validator_for(&schema).expect("a valid JSON Schema")
}

fn check(validator: &jsonschema::Validator, what: &str, report: &Value) {
    let errors: Vec<String> = validator
        .iter_errors(report)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect();
    assert!(errors.is_empty(), "{what}: {errors:#?}\n{report}");
}

#[test]
fn real_reports_match_the_shipped_schema() {
    let validator = schema();
    for flags in [
        "--local -n 1000",
        "--local --rate 100M --sndbuf 1M -P 2 --duration 300ms -i 100ms",
        "--local -n 10 -b 0",
        "--local -n 200 --plain-send -B 127.0.0.1",
    ] {
        check(&validator, flags, &client(&args(flags)));
    }
    // Both directions: -R has one stream, --bidir two and its upload.
    for flags in ["--local -R -n 1000 -b 1400", "--local --bidir -n 1000 -P 2"] {
        let report = client(&args(flags));
        let streams = report["streams"].as_array().expect("streams");
        assert_eq!(streams.len(), if flags.contains("bidir") { 2 } else { 1 });
        check(&validator, flags, &report);
    }
    let mut wrong = client(&args("--local -R -n 10"));
    wrong["streams"][0]["direction"] = Value::String("sideways".into());
    assert!(
        !validator.is_valid(&wrong),
        "a bad direction fails the schema"
    );
    // A sink that is not a udp_server: no probe, no answer, no server side.
    let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
    let target = sink.local_addr().unwrap().to_string();
    let out = run_bounded(
        Command::new(CLIENT).args(["-s", &target, "--no-server", "-n", "100", "--json"]),
        WAIT,
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("a report");
    assert!(report["server"].is_null());
    check(&validator, "--no-server", &report);
    // And the schema is not vacuous: a report missing a field, or with a
    // field of the wrong type, fails it.
    let mut broken = client(&args("--local -n 10"));
    broken.as_object_mut().unwrap().remove("sent_packets");
    assert!(!validator.is_valid(&broken));
    let mut wrong = client(&args("--local -n 10"));
    wrong["clients"][0]["sent_bytes"] = Value::String("many".into());
    assert!(!validator.is_valid(&wrong));
}
