//! stub
use crate::error::Result;
use crate::shutdown::Shutdown;
#[derive(clap::Args, Debug)]
pub struct TcpArgs {}
pub fn main(_a: &TcpArgs, _s: &Shutdown) -> Result<()> {
    Ok(())
}
