//! The smallest wire-up: init, commit, one Full fence over all, finalize, exit 0.
//! Prints nothing unless something fails. Used to time job startup, e.g.
//! `hyperfine 'target/release/weft run -n 16 target/release/examples/init_fence_exit'`.

use std::process::ExitCode;
use std::time::Duration;

use weft_wireup::{Client, FenceMode, Procs};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("init_fence_exit: {e}");
            ExitCode::from(1)
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let wire = Client::init()?;
    wire.commit()?;
    wire.fence(Procs::All, FenceMode::Full, Some(Duration::from_secs(60)))?;
    wire.finalize()?;
    Ok(())
}
