//! sockbench: the socket benchmark matrices (being written; see issue 5).
fn main() {
    eprintln!("sockbench: not built yet");
    std::process::exit(1);
}
