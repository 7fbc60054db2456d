//! Declares the `loom` cfg used by the loom model of the fastbox ring
//! (`RUSTFLAGS="--cfg loom" cargo test -p weft-shm --lib --release loom`).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(loom)");
}
