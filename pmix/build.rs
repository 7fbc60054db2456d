//! Finds OpenPMIx with pkg-config and generates the `sys` bindings from its headers with
//! bindgen. Without it (or with `WEFT_PMIX=off`) the crate builds with no bindings and
//! reports the PMIx client unavailable at run time.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(weft_pmix)");
    println!("cargo::rerun-if-env-changed=WEFT_PMIX");
    println!("cargo::rerun-if-env-changed=PKG_CONFIG_PATH");
    if env::var("WEFT_PMIX").is_ok_and(|v| v == "off") {
        println!("cargo::warning=weft-pmix: WEFT_PMIX=off: built without the PMIx client");
        return;
    }
    let lib = match pkg_config::Config::new()
        .atleast_version("4.0")
        .probe("pmix")
    {
        Ok(l) => l,
        Err(e) => {
            println!(
                "cargo::warning=weft-pmix: OpenPMIx not found ({e}); built without the PMIx \
                 client (apt-get install libpmix-dev to have it)"
            );
            return;
        }
    };
    let mut b = bindgen::Builder::default()
        .header_contents(
            "weft_pmix.h",
            "#include <pmix.h>\n#include <pmix_server.h>\n",
        )
        .allowlist_function("PMIx_.*")
        .allowlist_type("pmix_.*")
        .allowlist_var("PMIX_.*")
        .derive_default(false)
        .derive_debug(false)
        .layout_tests(false)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for p in &lib.include_paths {
        b = b.clang_arg(format!("-I{}", p.display()));
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("pmix_sys.rs");
    match b.generate() {
        Ok(g) => {
            g.write_to_file(&out).expect("write the PMIx bindings");
            println!("cargo::rustc-cfg=weft_pmix");
            println!(
                "cargo::rustc-env=WEFT_PMIX_BUILT_WITH=OpenPMIx {} (pkg-config)",
                lib.version
            );
        }
        Err(e) => {
            println!(
                "cargo::warning=weft-pmix: generating bindings for OpenPMIx {} failed ({e}); \
                 built without the PMIx client",
                lib.version
            );
        }
    }
}
