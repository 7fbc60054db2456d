//! Weft's environment tunables, in one pattern.
//!
//! Each component declares its knobs in one table of [`Tunable`]s (name, default,
//! meaning), reads them itself through the parsers here, and `weft info` lists the
//! tables. One syntax everywhere:
//!
//! - unset, empty or `auto`: the default (the table's, which a component's tests parse);
//! - sizes ([`Tunable::size`]): a whole number with an optional binary suffix `k`, `m`,
//!   `g` (any case, also `KiB`/`kb`, ..., and `b`);
//! - counts ([`Tunable::count`]): a whole number;
//! - switches ([`Tunable::switch`]): `on`/`off`, `1`/`0`, `true`/`false`, `yes`/`no`;
//! - durations ([`Tunable::millis`]): a whole number with a unit `ms` or `s` (a bare
//!   number is milliseconds);
//! - choices ([`Tunable::choice`]): one of the words the caller lists.
//!
//! A value that does not parse, or lies outside the range the caller gives, is a
//! [`BadTunable`] naming the variable, its value and what it should be.
//!
//! ```
//! use weft_tunables::Tunable;
//! const QUEUE: Tunable = Tunable::new("WEFT_DOC_QUEUE", "4m", "bytes queued per peer");
//! let lookup = |name: &str| (name == "WEFT_DOC_QUEUE").then(|| "64k".to_string());
//! assert_eq!(QUEUE.size_in(&lookup, 1, 1 << 30), Ok(64 * 1024));
//! assert_eq!(QUEUE.size_in(&|_: &str| None, 1, 1 << 30), Ok(4 << 20));
//! ```

use std::time::Duration;

/// One tunable: its environment variable, its default as text (`auto` or a description
/// where the default is decided at run time) and what it sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tunable {
    /// The environment variable.
    pub name: &'static str,
    /// Its default, as text.
    pub default: &'static str,
    /// What it sets.
    pub meaning: &'static str,
}

/// A tunable set to what it cannot be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value:?} is not valid: {expected}")]
pub struct BadTunable {
    /// The variable.
    pub name: &'static str,
    /// Its value.
    pub value: String,
    /// What it should be.
    pub expected: String,
}

impl BadTunable {
    /// Why the value is refused, as components word it in their own errors
    /// (`must be a size in 0..=100`).
    pub fn reason(&self) -> String {
        format!("must be {}", self.expected)
    }
}

/// Where values come from: the environment ([`env`]), or a table in tests.
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment as a [`Lookup`].
pub fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Whether `v` means "the default": empty or `auto`.
fn unset(v: &str) -> bool {
    let v = v.trim();
    v.is_empty() || v.eq_ignore_ascii_case("auto")
}

/// A size: a whole number with an optional binary suffix (`k`, `m`, `g`, any case, also
/// `KiB`, `MiB`, `GiB`).
pub fn parse_size(v: &str) -> Result<u64, String> {
    let t = v.trim();
    let lower = t.to_ascii_lowercase();
    const SUFFIXES: [(&str, u32); 10] = [
        ("kib", 10),
        ("mib", 20),
        ("gib", 30),
        ("kb", 10),
        ("mb", 20),
        ("gb", 30),
        ("k", 10),
        ("m", 20),
        ("g", 30),
        ("b", 0),
    ];
    let (digits, shift) = SUFFIXES
        .iter()
        .find_map(|(s, n)| lower.strip_suffix(s).map(|d| (d.trim_end(), *n)))
        .unwrap_or((lower.as_str(), 0));
    let n: u64 = digits
        .parse()
        .map_err(|_| "a whole number of bytes, optionally with k, m or g".to_owned())?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| "a size that fits in 64 bits".to_owned())
}

/// A duration: a whole number with a unit `ms` or `s` (bare: milliseconds).
pub fn parse_millis(v: &str) -> Result<Duration, String> {
    let t = v.trim().to_ascii_lowercase();
    let (digits, mult) = if let Some(d) = t.strip_suffix("ms") {
        (d.trim_end(), 1)
    } else if let Some(d) = t.strip_suffix('s') {
        (d.trim_end(), 1000)
    } else {
        (t.as_str(), 1)
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| "a whole number of milliseconds, or with a unit ms or s".to_owned())?;
    n.checked_mul(mult)
        .map(Duration::from_millis)
        .ok_or_else(|| "a duration that fits in 64 bits of milliseconds".to_owned())
}

/// A switch: `on`/`off`, `1`/`0`, `true`/`false`, `yes`/`no`.
pub fn parse_switch(v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "on" | "1" | "true" | "yes" => Ok(true),
        "off" | "0" | "false" | "no" => Ok(false),
        _ => Err("on or off (also 1/0, true/false, yes/no)".to_owned()),
    }
}

fn in_range(n: u64, min: u64, max: u64, unit: &str) -> Result<u64, String> {
    if n < min || n > max {
        return Err(format!("{unit} in {min}..={max}"));
    }
    Ok(n)
}

impl Tunable {
    /// A table entry.
    pub const fn new(name: &'static str, default: &'static str, meaning: &'static str) -> Tunable {
        Tunable {
            name,
            default,
            meaning,
        }
    }

    /// The value set for it, if any (unset, empty and `auto` are none).
    pub fn set_in(&self, lookup: Lookup<'_>) -> Option<String> {
        lookup(self.name).filter(|v| !unset(v))
    }

    /// [`set_in`](Tunable::set_in) the environment.
    pub fn set(&self) -> Option<String> {
        self.set_in(&env)
    }

    /// Parses the value set (else the table's default) with `parse`.
    fn parse_in<T>(
        &self,
        lookup: Lookup<'_>,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<T, BadTunable> {
        let value = self
            .set_in(lookup)
            .unwrap_or_else(|| self.default.to_owned());
        parse(&value).map_err(|expected| BadTunable {
            name: self.name,
            value,
            expected,
        })
    }

    /// A size in bytes within `min..=max` (see the crate's syntax).
    pub fn size_in(&self, lookup: Lookup<'_>, min: u64, max: u64) -> Result<u64, BadTunable> {
        self.parse_in(lookup, |v| {
            parse_size(v).and_then(|n| in_range(n, min, max, "a size"))
        })
    }

    /// [`size_in`](Tunable::size_in) the environment.
    pub fn size(&self, min: u64, max: u64) -> Result<u64, BadTunable> {
        self.size_in(&env, min, max)
    }

    /// A whole number within `min..=max`.
    pub fn count_in(&self, lookup: Lookup<'_>, min: u64, max: u64) -> Result<u64, BadTunable> {
        self.parse_in(lookup, |v| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| format!("a whole number in {min}..={max}"))
                .and_then(|n| in_range(n, min, max, "a whole number"))
        })
    }

    /// [`count_in`](Tunable::count_in) the environment.
    pub fn count(&self, min: u64, max: u64) -> Result<u64, BadTunable> {
        self.count_in(&env, min, max)
    }

    /// `read` of this tunable if a value is set (`None`: unset or `auto`), for tunables
    /// whose default is decided at run time or by the caller:
    /// `t.if_set(get, |t| t.size_in(get, 1, 1 << 30))`.
    pub fn if_set<T>(
        &self,
        lookup: Lookup<'_>,
        read: impl FnOnce(&Tunable) -> Result<T, BadTunable>,
    ) -> Result<Option<T>, BadTunable> {
        if self.set_in(lookup).is_none() {
            return Ok(None);
        }
        read(self).map(Some)
    }

    /// A switch.
    pub fn switch_in(&self, lookup: Lookup<'_>) -> Result<bool, BadTunable> {
        self.parse_in(lookup, parse_switch)
    }

    /// [`switch_in`](Tunable::switch_in) the environment.
    pub fn switch(&self) -> Result<bool, BadTunable> {
        self.switch_in(&env)
    }

    /// A duration within `min..=max`.
    pub fn millis_in(
        &self,
        lookup: Lookup<'_>,
        min: Duration,
        max: Duration,
    ) -> Result<Duration, BadTunable> {
        self.parse_in(lookup, |v| {
            let d = parse_millis(v)?;
            if d < min || d > max {
                return Err(format!(
                    "a duration in {}..={} ms",
                    min.as_millis(),
                    max.as_millis()
                ));
            }
            Ok(d)
        })
    }

    /// [`millis_in`](Tunable::millis_in) the environment.
    pub fn millis(&self, min: Duration, max: Duration) -> Result<Duration, BadTunable> {
        self.millis_in(&env, min, max)
    }

    /// One of `words` (any case).
    pub fn choice_in(
        &self,
        lookup: Lookup<'_>,
        words: &[&'static str],
    ) -> Result<&'static str, BadTunable> {
        self.parse_in(lookup, |v| {
            let v = v.trim();
            words
                .iter()
                .find(|w| w.eq_ignore_ascii_case(v))
                .copied()
                .ok_or_else(|| format!("one of {}", words.join(", ")))
        })
    }

    /// [`choice_in`](Tunable::choice_in) the environment.
    pub fn choice(&self, words: &[&'static str]) -> Result<&'static str, BadTunable> {
        self.choice_in(&env, words)
    }
}

/// The entry of `table` named `name`; a name not in the table is a bug of the caller's
/// (each component's tests read every entry).
pub fn find(table: &'static [Tunable], name: &str) -> &'static Tunable {
    table
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("{name} is not in the tunables table"))
}

/// The line `weft info` prints for `t`: name, default, meaning, and the value set.
pub fn info_line(t: &Tunable) -> String {
    let cur = env(t.name)
        .map(|v| format!(" (set: {v})"))
        .unwrap_or_default();
    format!(
        "  {:<30} default {:<10} {}{cur}",
        t.name, t.default, t.meaning
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T: Tunable = Tunable::new("WEFT_T", "8k", "a test size");

    fn set(v: &'static str) -> impl Fn(&str) -> Option<String> {
        move |n: &str| (n == "WEFT_T").then(|| v.to_owned())
    }

    #[test]
    fn sizes_take_binary_suffixes_and_unset_means_the_default() {
        for (v, want) in [
            ("4096", 4096),
            ("64k", 65536),
            ("64K", 65536),
            ("64KiB", 65536),
            ("2m", 2 << 20),
            ("1G", 1 << 30),
            (" 3 k ", 3072),
            ("", 8192),
            ("auto", 8192),
            ("AUTO", 8192),
        ] {
            assert_eq!(T.size_in(&set(v), 0, u64::MAX), Ok(want), "{v:?}");
        }
        assert_eq!(T.size_in(&|_: &str| None, 0, u64::MAX), Ok(8192));
    }

    #[test]
    fn errors_name_the_variable_the_value_and_what_it_should_be() {
        let e = T.size_in(&set("lots"), 0, 100).unwrap_err();
        assert_eq!(e.name, "WEFT_T");
        assert_eq!(e.value, "lots");
        assert!(e.to_string().contains("WEFT_T=\"lots\""), "{e}");
        assert!(e.expected.contains("k, m or g"), "{e}");
        let e = T.size_in(&set("1k"), 0, 100).unwrap_err();
        assert!(e.expected.contains("0..=100"), "{e}");
        let e = T.size_in(&set("99999999999g"), 0, u64::MAX).unwrap_err();
        assert!(e.expected.contains("64 bits"), "{e}");
        let e = T.count_in(&set("4k"), 0, 1 << 20).unwrap_err();
        assert!(e.expected.contains("whole number"), "{e}");
        let e = T.choice_in(&set("ring2"), &["ring", "bruck"]).unwrap_err();
        assert_eq!(e.expected, "one of ring, bruck");
    }

    #[test]
    fn switches_durations_choices_and_optional_counts() {
        for (v, want) in [
            ("on", true),
            ("1", true),
            ("Yes", true),
            ("off", false),
            ("0", false),
        ] {
            assert_eq!(T.switch_in(&set(v)), Ok(want), "{v}");
        }
        assert!(T.switch_in(&set("maybe")).is_err());
        let d = |v| T.millis_in(&set(v), Duration::ZERO, Duration::from_secs(3600));
        assert_eq!(d("250"), Ok(Duration::from_millis(250)));
        assert_eq!(d("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(d("30s"), Ok(Duration::from_secs(30)));
        assert!(d("2h").is_err());
        assert!(d("7200s").is_err(), "out of range");
        assert_eq!(T.choice_in(&set("RING"), &["ring", "bruck"]), Ok("ring"));
        let opt = |v| T.if_set(&set(v), |t| t.count_in(&set(v), 0, 9));
        assert_eq!(opt("auto"), Ok(None));
        assert_eq!(opt("7"), Ok(Some(7)));
        assert!(opt("10").is_err());
    }

    proptest! {
        #[test]
        fn a_size_written_with_any_suffix_reads_back(n in 0u64..(1 << 30), s in 0usize..4) {
            let (suffix, shift) = [("", 0), ("k", 10), ("m", 20), ("g", 30)][s];
            let n = n >> shift;
            prop_assert_eq!(parse_size(&format!("{n}{suffix}")), Ok(n << shift));
        }
    }
}
