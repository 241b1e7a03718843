//! tcp_proxy: forwards TCP connections (being written; see issue 4).
fn main() {
    eprintln!("tcp_proxy: not built yet");
    std::process::exit(1);
}
