//! Programs of `benches/mpi` and OpenPMIx's examples built for the tests that run MPI and
//! PMIx programs (`mpi.rs`, `jobs.rs`): built once per test binary, skipped with a printed
//! reason when a compiler or libpmix is missing (failing instead under
//! `WEFT_REQUIRE_OPENMPI`).
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::path::PathBuf;
use std::process::Command;

use super::{available, build_c, Done};

/// Open MPI's TCP transport kept on loopback (logical nodes of one machine).
pub const OMPI_LO: &str = "OMPI_MCA_btl_tcp_if_include=lo";

/// `benches/mpi/SOURCE.c` built with `mpicc.openmpi`, or `None` (skipped, with the reason
/// printed) when Open MPI's compiler is not installed and `WEFT_REQUIRE_OPENMPI` is not
/// set.
pub fn openmpi_program(source: &str) -> Option<String> {
    let have = Command::new("mpicc.openmpi")
        .arg("--showme")
        .output()
        .is_ok_and(|o| o.status.success());
    let hint = "mpicc.openmpi or libpmix is missing (apt-get install openmpi-bin \
                libopenmpi-dev libpmix-dev)";
    let have = have && weft_pmix::built_with().is_some();
    available(have, "WEFT_REQUIRE_OPENMPI", hint).then(|| {
        let flags = ["-DIMPL=\"openmpi\"".to_string()];
        build_c(
            "mpicc.openmpi",
            &format!("{source}.c"),
            &format!("{source}.openmpi"),
            &flags,
        )
    })
}

/// `benches/mpi/pmix_client.c` built with cc against libpmix (see `openmpi_program` for
/// when it is skipped).
pub fn pmix_client() -> Option<String> {
    let hint = "weft was built without libpmix (apt-get install libpmix-dev)";
    if !available(
        weft_pmix::built_with().is_some(),
        "WEFT_REQUIRE_OPENMPI",
        hint,
    ) {
        return None;
    }
    Some(build_c("cc", "pmix_client.c", "pmix_client", &pmix_flags()))
}

/// `-Wall` and what `pkg-config --cflags --libs pmix` says.
pub fn pmix_flags() -> Vec<String> {
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "pmix"])
        .output()
        .expect("pkg-config");
    assert!(flags.status.success(), "pkg-config pmix");
    let mut all = vec!["-Wall".to_string()];
    all.extend(
        String::from_utf8_lossy(&flags.stdout)
            .split_whitespace()
            .map(str::to_owned),
    );
    all
}

/// Where Debian's libpmix-dev puts OpenPMIx's example programs.
pub const PMIX_EXAMPLES: &str = "/usr/share/doc/libpmix-dev/examples";

/// OpenPMIx's unmodified example `NAME.c` (from Debian's libpmix-dev, which ships them
/// without the `examples.h` they include: OpenPMIx v4.2.2's is in
/// `benches/mpi/pmix_examples`) built with cc against libpmix, or `None` (skipped, the
/// reason printed) when libpmix or the example is missing and `WEFT_REQUIRE_OPENMPI`
/// is not set.
pub fn pmix_example(name: &str) -> Option<String> {
    let src = PathBuf::from(PMIX_EXAMPLES).join(format!("{name}.c"));
    let hint = format!(
        "weft was built without libpmix, or {} is missing (apt-get install libpmix-dev)",
        src.display()
    );
    let have = weft_pmix::built_with().is_some() && src.exists();
    if !available(have, "WEFT_REQUIRE_OPENMPI", &hint) {
        return None;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("pmix-example-{name}"));
    // Built under a name of this process, then renamed: two tests that use the same
    // example (`log`) never start a half-written one ("Permission denied").
    let tmp = out.with_extension(format!("{}.tmp", std::process::id()));
    let built = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&tmp)
        .arg("-I")
        .arg(root.join("benches/mpi/pmix_examples"))
        .arg(&src)
        .args(pmix_flags())
        .arg("-lpthread")
        .output()
        .unwrap_or_else(|e| panic!("cc: {e}"));
    assert!(
        built.status.success(),
        "cc {}: {}",
        src.display(),
        String::from_utf8_lossy(&built.stderr)
    );
    std::fs::rename(&tmp, &out).unwrap_or_else(|e| panic!("rename {}: {e}", tmp.display()));
    Some(out.display().to_string())
}

/// The stderr lines of `d` that hold `pat`.
pub fn err_lines<'a>(d: &'a Done, pat: &str) -> Vec<&'a str> {
    d.stderr.lines().filter(|l| l.contains(pat)).collect()
}
