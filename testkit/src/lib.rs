//! Weft's test support (not published): the probe programs under `src/bin/` that the
//! integration tests of `weft-cli` (`cli/tests/`) and the `ci/` scripts (chaos, the
//! soft-RoCE VM) launch under `weft run`, each printing lines the tests match (none is an
//! example to copy: those are in the `weft` package's `examples/`); and [`corpus`], the
//! wire-up client messages of every kind that the fuzz tests of `weft-wireup` and
//! `weft-runtime` and the live-server scenario of `wireup_probe` mutate. The mutator and
//! the time-budgeted loop are the dependency-free `weft-fuzz` crate (`testkit/fuzz`).
#![forbid(unsafe_code)]

pub mod corpus;
