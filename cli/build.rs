//! Exports the PMIx server's guard against OpenPMIx 4.2's attribute queries from the
//! `weft` executable (weft-pmix's `attrs_guard`): exported, it is the
//! `PMIx_Query_info_nb` the library's own calls resolve to.
fn main() {
    println!("cargo::rustc-link-arg-bin=weft=-Wl,--export-dynamic-symbol=PMIx_Query_info_nb");
}
