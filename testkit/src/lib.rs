//! Weft's test support (not published): the probe programs under `src/bin/` that the
//! integration tests of `weft-cli` (`cli/tests/`) and the `ci/` scripts (chaos, the
//! soft-RoCE VM) launch under `weft run`. Each prints lines the tests match; none is an
//! example to copy (those are in the `weft` package's `examples/`).
#![forbid(unsafe_code)]
