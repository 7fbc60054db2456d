//! Sets of PUs (hardware threads) named by their OS index, in the Linux cpu-list form
//! `0-3,8` (`taskset`, `/proc/self/status`'s `Cpus_allowed_list`). The launcher's
//! bindings travel in this form and a process reads its own in [`crate::ProcInfo`]; the
//! machine's topology and binding itself live in `weft_runtime::topology` (hwloc), which
//! an application does not link.

use std::fmt;
use std::str::FromStr;

/// The largest PU index a [`CpuList`] accepts, plus one (2^20).
///
/// Linux kernels support at most several thousand CPUs (`NR_CPUS`); the bound
/// only keeps a hostile list such as `0-4294967295` from allocating gigabytes.
const PU_INDEX_LIMIT: u32 = 1 << 20;

/// A set of PUs (hardware threads), named by their OS index, printable in the
/// Linux cpu-list form `0-3,8`.
///
/// Lists built by Weft are sorted and free of duplicates; [`Display`] prints
/// any list in that canonical form, so `to_string` then `parse` gives back the
/// canonical list.
///
/// [`Display`]: fmt::Display
//
// Public (not crate-private) because the crate root re-exports it: it is part
// of `ProcInfo::cpuset`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CpuList(Vec<u32>);

impl From<Vec<u32>> for CpuList {
    /// The list of exactly these PUs, in this order (as hwloc or a launcher's plan
    /// gives them; [`Display`](fmt::Display) prints any list in canonical form).
    fn from(pus: Vec<u32>) -> Self {
        Self(pus)
    }
}

impl CpuList {
    /// The PUs' OS indexes, in the order the list holds them (ascending for
    /// lists built by Weft).
    pub fn pus(&self) -> &[u32] {
        &self.0
    }
}

impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut pus = self.0.clone();
        pus.sort_unstable();
        pus.dedup();
        let mut rest = pus.as_slice();
        let mut first_run = true;
        while let [start, ..] = rest {
            // Length of the run of consecutive indexes beginning at `start`
            // (checked so that a run ending at u32::MAX does not overflow).
            let len = 1 + rest
                .windows(2)
                .take_while(|pair| pair[0].checked_add(1) == Some(pair[1]))
                .count();
            let end = rest[len - 1];
            if !first_run {
                f.write_str(",")?;
            }
            first_run = false;
            if end == *start {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            rest = &rest[len..];
        }
        Ok(())
    }
}

impl FromStr for CpuList {
    type Err = CpuListError;

    /// Parses `0-3,8`: comma-separated items, each a PU index or an inclusive
    /// range `first-last` with `first <= last`. Blank text is the empty list;
    /// whitespace around the whole text and around numbers is ignored (the
    /// kernel's files end in a newline). Overlaps are allowed and merged.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Ok(Self(Vec::new()));
        }
        let mut pus = Vec::new();
        for item in trimmed.split(',') {
            let bad = |reason: &'static str| CpuListError {
                input: text.to_owned(),
                item: item.to_owned(),
                reason,
            };
            let (first, last) = match item.split_once('-') {
                Some((first, last)) => (
                    parse_pu_index(first).map_err(bad)?,
                    parse_pu_index(last).map_err(bad)?,
                ),
                None => {
                    let pu = parse_pu_index(item).map_err(bad)?;
                    (pu, pu)
                }
            };
            if first > last {
                return Err(bad("the range runs backwards"));
            }
            pus.extend(first..=last);
        }
        pus.sort_unstable();
        pus.dedup();
        Ok(Self(pus))
    }
}

/// Parses one PU index of a cpu list, or says what is wrong with it.
fn parse_pu_index(text: &str) -> Result<u32, &'static str> {
    let digits = text.trim();
    if digits.is_empty() {
        return Err("a PU index is missing");
    }
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err("a PU index is not a decimal number");
    }
    match digits.parse::<u32>() {
        Ok(pu) if pu < PU_INDEX_LIMIT => Ok(pu),
        _ => Err("a PU index is 2^20 or more"),
    }
}

/// Text that is not a cpu list in the `0-3,8` form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cpu list {input:?}: {reason} in item {item:?} (expected e.g. \"0-3,8\")")]
pub struct CpuListError {
    /// The whole text that was parsed.
    input: String,
    /// The comma-separated item that is wrong.
    item: String,
    /// What is wrong with it.
    reason: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn list(pus: &[u32]) -> CpuList {
        CpuList(pus.to_vec())
    }

    #[test]
    fn cpu_list_known_forms() {
        let cases: &[(&str, &[u32])] = &[
            ("", &[]),
            ("0", &[0]),
            ("7", &[7]),
            ("0-1", &[0, 1]),
            ("0-3,8", &[0, 1, 2, 3, 8]),
            ("1,3,5", &[1, 3, 5]),
            ("0-2,4-6,9,11-12", &[0, 1, 2, 4, 5, 6, 9, 11, 12]),
            ("1048575", &[1_048_575]),
        ];
        for &(text, pus) in cases {
            let parsed: CpuList = text.parse().unwrap();
            assert_eq!(parsed, list(pus), "parsing {text:?}");
            assert_eq!(parsed.pus(), pus);
            assert_eq!(list(pus).to_string(), text, "printing {pus:?}");
        }
    }

    #[test]
    fn cpu_list_lenient_input_is_canonicalised() {
        let cases: &[(&str, &str)] = &[
            ("0-3,8\n", "0-3,8"),
            ("  ", ""),
            ("7-7", "7"),
            ("8,0-3", "0-3,8"),
            ("0-3,2-5,5", "0-5"),
            ("1, 2 - 3", "1-3"),
            ("007", "7"),
        ];
        for &(text, canonical) in cases {
            let parsed: CpuList = text.parse().unwrap();
            assert_eq!(parsed.to_string(), canonical, "parsing {text:?}");
        }
        // Display canonicalises unsorted, duplicated lists built by hand, and
        // copes with indexes no parse would produce.
        assert_eq!(list(&[8, 3, 2, 3, 1, 0]).to_string(), "0-3,8");
        assert_eq!(
            list(&[u32::MAX, 0, u32::MAX - 1]).to_string(),
            "0,4294967294-4294967295"
        );
    }

    #[test]
    fn cpu_list_rejects_malformed_text() {
        for text in [
            "3-1",
            "a",
            "1,,2",
            "1,",
            ",1",
            "-1",
            "1-",
            "1-2-3",
            "+1",
            "0x1",
            "1.5",
            "1 2",
            "1048576",
            "99999999999",
            "0-4294967295",
            "1:2",
            "0-7:2/4",
        ] {
            let err = text.parse::<CpuList>().expect_err(text);
            let message = err.to_string();
            assert_eq!(err.input, text);
            assert!(
                message.contains(&format!("{text:?}")),
                "{text:?}: message {message:?} should quote the input"
            );
        }
        let err = "1,,2".parse::<CpuList>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid cpu list \"1,,2\": a PU index is missing in item \"\" (expected e.g. \"0-3,8\")"
        );
        let err = "3-1".parse::<CpuList>().unwrap_err();
        assert!(err.to_string().contains("backwards"), "{err}");
    }

    proptest! {
        #[test]
        fn cpu_list_round_trips(pus in proptest::collection::vec(0u32..200, 0..40)) {
            let mut canonical = pus.clone();
            canonical.sort_unstable();
            canonical.dedup();
            let text = CpuList(pus).to_string();
            let parsed: CpuList = text.parse().unwrap();
            prop_assert_eq!(&parsed.0, &canonical);
            prop_assert_eq!(parsed.to_string(), text);
        }

        #[test]
        fn cpu_list_round_trips_large_indexes(
            pus in proptest::collection::vec(0u32..PU_INDEX_LIMIT, 1..8),
        ) {
            let mut canonical = pus.clone();
            canonical.sort_unstable();
            canonical.dedup();
            let parsed: CpuList = CpuList(pus).to_string().parse().unwrap();
            prop_assert_eq!(parsed.0, canonical);
        }

        #[test]
        fn cpu_list_parse_never_panics(text in "[0-9,\\- a]{0,12}") {
            let _ = text.parse::<CpuList>();
        }
    }
}
