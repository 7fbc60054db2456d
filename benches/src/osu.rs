//! Output shared by the OSU-style sweep benchmarks (`latency`, `bw`, `bibw`, `mr`, `limit`):
//! size sweeps, OSU-style tables, `--json` lines, a progress bar, and `--plot FILE.svg`.
//!
//! A benchmark flattens [`SweepArgs`] into its options, builds a [`Sweep`] (the sizes, on
//! every rank) and, on the rank that prints, a [`Report`]:
//!
//! ```text
//! let sweep = Sweep::new(&args.sweep, default_sizes(0, MAX_DEFAULT_SIZE));
//! let mut report = Report::new(&args.sweep, &sweep, "latency", "Weft Latency Test",
//!                              Metric::LATENCY).field("impl", "weft");
//! report.comment("2 processes, cores 0 and 1")?;
//! for &size in sweep.sizes() { report.row(size, measure(size))?; }
//! report.series("limit (cache line)")?;          // optional: a second curve
//! report.row(64, 0.11)?;
//! report.finish()?;                                // writes the plot, if asked
//! ```
//!
//! Table output follows the OSU micro-benchmarks: a `# OSU-style <title>` header, `#`
//! comment lines, a `# Size   <column>` line, then one `size value` row per size.
//! `--json` prints instead one object per row: `{"bench":..,"size":..,<metric key>:..}`
//! plus the report's extra fields (and `"series"` once a series was named). A plot draws
//! every series as one polyline of value against size (log2 x axis, log y for latency).

use std::fmt::{self, Write as _};
use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Largest size of the default sweeps (4 MiB).
pub(crate) const MAX_DEFAULT_SIZE: usize = 4 << 20;
/// Largest size `--sizes` accepts (1 GiB).
pub(crate) const MAX_SIZE: usize = 1 << 30;
/// Sweeps with at least this many sizes show a progress bar (when stderr is a terminal).
const LONG_SWEEP: usize = 8;
/// Environment variable that turns the progress bar on (`1`) or off (`0`); unset, the bar
/// shows when stderr is a terminal. A benchmark that launches itself sets it for its
/// ranks (see [`progress_env`]), whose stderr is a pipe to the launcher.
pub(crate) const PROGRESS_ENV: &str = "WEFT_BENCH_PROGRESS";

/// The sizes given with `--sizes`: ascending, without duplicates, never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sizes(pub(crate) Vec<usize>);

/// A `--sizes` list that does not parse; names the offending text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SizeError {
    /// The item (or whole list) that was refused.
    pub(crate) text: String,
    /// Why.
    pub(crate) reason: String,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "size {:?}: {}", self.text, self.reason)
    }
}

impl std::error::Error for SizeError {}

/// Parses one size: a decimal number of bytes, optionally followed by `K`, `M` or `G`
/// (also `KiB`, `MiB`, `GiB`; powers of 1024).
pub(crate) fn parse_size(text: &str) -> Result<usize, SizeError> {
    let err = |reason: String| SizeError {
        text: text.to_owned(),
        reason,
    };
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(digits_end);
    if digits.is_empty() {
        return Err(err(
            "expected a number of bytes, e.g. 8, 4096 or 4M".to_owned()
        ));
    }
    let scale: usize = match suffix.trim() {
        "" => 1,
        "K" | "k" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        other => {
            return Err(err(format!(
                "unknown suffix {other:?} (use K, M or G, powers of 1024)"
            )))
        }
    };
    let n: usize = digits
        .parse()
        .map_err(|_| err("number too large".to_owned()))?;
    match n.checked_mul(scale) {
        Some(v) if v <= MAX_SIZE => Ok(v),
        _ => Err(err(format!("larger than the limit of {MAX_SIZE} bytes"))),
    }
}

/// Parses a comma-separated `--sizes` list; the result is sorted and deduplicated.
pub(crate) fn parse_sizes(text: &str) -> Result<Sizes, SizeError> {
    if text.trim().is_empty() {
        return Err(SizeError {
            text: text.to_owned(),
            reason: "names no size".to_owned(),
        });
    }
    let mut v = text
        .split(',')
        .map(parse_size)
        .collect::<Result<Vec<_>, _>>()?;
    v.sort_unstable();
    v.dedup();
    Ok(Sizes(v))
}

/// The OSU default sweep between `min` and `max`: 0 if `min` is 0, then every power of two
/// from `min` (rounded up to one) to `max`.
pub(crate) fn default_sizes(min: usize, max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    if min == 0 {
        v.push(0);
    }
    let mut s = min.max(1).next_power_of_two();
    while s <= max {
        v.push(s);
        s = match s.checked_mul(2) {
            Some(n) => n,
            None => break,
        };
    }
    v
}

/// Options every sweep benchmark shares (`#[command(flatten)]` them).
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct SweepArgs {
    /// Sizes to measure, in bytes (K, M and G suffixes are powers of 1024)
    /// [default: powers of two up to 4 MiB].
    #[arg(long, value_name = "BYTES[,BYTES...]", value_parser = parse_sizes)]
    pub(crate) sizes: Option<Sizes>,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also draw the results as an SVG plot into FILE.
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<PathBuf>,
}

/// The sizes a benchmark measures, in order: `--sizes`, or the benchmark's default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sweep {
    sizes: Vec<usize>,
}

impl Sweep {
    /// The sizes of `--sizes`, or `default` when it was not given.
    pub(crate) fn new(args: &SweepArgs, default: Vec<usize>) -> Sweep {
        Sweep {
            sizes: args.sizes.clone().map_or(default, |s| s.0),
        }
    }

    /// The sizes, ascending.
    pub(crate) fn sizes(&self) -> &[usize] {
        &self.sizes
    }
}

/// What a report measures: its JSON key, table column, plot axis and scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Metric {
    /// JSON key of the value, e.g. `latency_us`.
    pub(crate) key: &'static str,
    /// Table column heading, e.g. `Latency (us)`.
    pub(crate) column: &'static str,
    /// Digits after the decimal point in the table.
    pub(crate) decimals: usize,
    /// Draw the value axis logarithmically.
    pub(crate) log_y: bool,
}

impl Metric {
    /// One-way latency in microseconds (half a round trip).
    pub(crate) const LATENCY: Metric = Metric {
        key: "latency_us",
        column: "Latency (us)",
        decimals: 2,
        log_y: true,
    };
    /// Bandwidth in MB/s (10^6 bytes per second).
    pub(crate) const BANDWIDTH: Metric = Metric {
        key: "bandwidth_mbs",
        column: "Bandwidth (MB/s)",
        decimals: 2,
        log_y: false,
    };
    /// Messages per second.
    pub(crate) const MSG_RATE: Metric = Metric {
        key: "msg_rate",
        column: "Messages/s",
        decimals: 2,
        log_y: false,
    };
}

/// One curve of a plot: a label and (size, value) points.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Series {
    /// Legend text.
    pub(crate) label: String,
    /// The points, in any order.
    pub(crate) points: Vec<(usize, f64)>,
}

/// A value-against-size plot, drawn as a self-contained SVG.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plot {
    /// Heading above the plot.
    pub(crate) title: String,
    /// Label of the value axis.
    pub(crate) y_label: String,
    /// Logarithmic value axis (values that are not positive are left out).
    pub(crate) log_y: bool,
    /// The curves, one polyline each.
    pub(crate) series: Vec<Series>,
}

/// Prints the rows of one benchmark as a table or JSON lines and collects them for a plot.
///
/// Output goes to the writer as each row arrives (so a long sweep shows progress, and a
/// failure late in the sweep keeps the rows measured so far); the plot is written by
/// [`finish`](Report::finish).
pub(crate) struct Report<W: Write = io::Stdout> {
    out: W,
    bench: String,
    title: String,
    metric: Metric,
    json: bool,
    plot: Option<PathBuf>,
    extra: Vec<(String, serde_json::Value)>,
    /// Finished series and the current one (last).
    series: Vec<Series>,
    /// A series was named with [`Report::series`]: JSON lines carry it.
    named: bool,
    /// The current series's column heading is printed.
    column_printed: bool,
    header_printed: bool,
    bar: Option<ProgressBar>,
}

impl<W: Write> fmt::Debug for Report<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Report")
            .field("bench", &self.bench)
            .field("metric", &self.metric.key)
            .field("json", &self.json)
            .field("plot", &self.plot)
            .finish_non_exhaustive()
    }
}

/// The `PROGRESS_ENV` setting a self-launching benchmark passes to its ranks: `1` when
/// this process's stderr is a terminal and its stdout is not (rows on a terminal show the
/// progress themselves, and two forwarded pipes could interleave a bar with them), else
/// `0`; a value the user set is passed on unchanged.
pub(crate) fn progress_env() -> (String, String) {
    let value = std::env::var(PROGRESS_ENV).unwrap_or_else(|_| {
        let bar = io::stderr().is_terminal() && !io::stdout().is_terminal();
        if bar { "1" } else { "0" }.to_owned()
    });
    (PROGRESS_ENV.to_owned(), value)
}

/// Whether to draw a progress bar, and where: `None` (no bar), `Some(true)` (stderr is a
/// terminal), `Some(false)` (stderr is a pipe that ends at a terminal, per `PROGRESS_ENV`).
fn progress_target() -> Option<bool> {
    let tty = io::stderr().is_terminal();
    match std::env::var(PROGRESS_ENV).as_deref() {
        Ok("0") => None,
        Ok("1") => Some(tty),
        _ => tty.then_some(true),
    }
}

/// Draws the progress bar with plain ANSI sequences on stderr, terminal or not (for ranks
/// whose stderr the launcher forwards to the user's terminal).
#[derive(Debug)]
struct AnsiStderr;

impl AnsiStderr {
    fn put(&self, s: &str) -> io::Result<()> {
        io::stderr().lock().write_all(s.as_bytes())
    }
}

impl indicatif::TermLike for AnsiStderr {
    fn width(&self) -> u16 {
        80
    }
    fn move_cursor_up(&self, n: usize) -> io::Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.put(&format!("\x1b[{n}A"))
    }
    fn move_cursor_down(&self, n: usize) -> io::Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.put(&format!("\x1b[{n}B"))
    }
    fn move_cursor_right(&self, n: usize) -> io::Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.put(&format!("\x1b[{n}C"))
    }
    fn move_cursor_left(&self, n: usize) -> io::Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.put(&format!("\x1b[{n}D"))
    }
    fn write_line(&self, s: &str) -> io::Result<()> {
        self.put(&format!("{s}\n"))
    }
    fn write_str(&self, s: &str) -> io::Result<()> {
        self.put(s)
    }
    fn clear_line(&self) -> io::Result<()> {
        self.put("\r\x1b[2K")
    }
    fn flush(&self) -> io::Result<()> {
        io::stderr().flush()
    }
}

impl Report<io::Stdout> {
    /// A report of `bench` (the JSON `bench` value) on stdout, as `args` asks (table or
    /// JSON, plot or not). `title` follows `# OSU-style` in the table header, e.g.
    /// `"Weft Latency Test"`. Shows a progress bar on stderr when the sweep is long and
    /// stderr is a terminal (or `PROGRESS_ENV` says it ends at one).
    pub(crate) fn new(
        args: &SweepArgs,
        sweep: &Sweep,
        bench: &str,
        title: &str,
        metric: Metric,
    ) -> Report<io::Stdout> {
        let mut r = Report::to_writer(io::stdout(), args, bench, title, metric);
        let n = sweep.sizes().len();
        let target = if n >= LONG_SWEEP {
            progress_target()
        } else {
            None
        };
        if let Some(tty) = target {
            let draw = if tty {
                ProgressDrawTarget::stderr()
            } else {
                ProgressDrawTarget::term_like_with_hz(Box::new(AnsiStderr), 10)
            };
            let bar = ProgressBar::with_draw_target(Some(n as u64), draw);
            if let Ok(style) =
                ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} sizes {elapsed}")
            {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(bench.to_owned());
            r.bar = Some(bar);
        }
        r
    }
}

impl<W: Write> Report<W> {
    /// A report written to `out` (no progress bar); see [`Report::new`].
    pub(crate) fn to_writer(
        out: W,
        args: &SweepArgs,
        bench: &str,
        title: &str,
        metric: Metric,
    ) -> Report<W> {
        Report {
            out,
            bench: bench.to_owned(),
            title: title.to_owned(),
            metric,
            json: args.json,
            plot: args.plot.clone(),
            extra: Vec::new(),
            series: vec![Series {
                label: bench.to_owned(),
                points: Vec::new(),
            }],
            named: false,
            column_printed: false,
            header_printed: false,
            bar: None,
        }
    }

    /// Adds `key: value` to every JSON line (e.g. `"impl": "weft"`); tables ignore it.
    pub(crate) fn field(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        self.extra.push((key.to_owned(), value.into()));
        self
    }

    /// Sets `key` to `value` in the JSON lines of the rows that follow (adding it if it
    /// is not there yet), e.g. `"impl": "limit"` for a reference series.
    pub(crate) fn set_field(&mut self, key: &str, value: impl Into<serde_json::Value>) {
        let value = value.into();
        match self.extra.iter_mut().find(|(k, _)| k == key) {
            Some(kv) => kv.1 = value,
            None => self.extra.push((key.to_owned(), value)),
        }
    }

    /// Names the first series `label` in the plot legend (default: the bench name),
    /// without adding a `series` field to the JSON lines.
    pub(crate) fn label(mut self, label: &str) -> Self {
        if let Some(s) = self.series.first_mut() {
            s.label = label.to_owned();
        }
        self
    }

    /// Leaves the plot out, whatever `--plot` says (for a second report of one run).
    pub(crate) fn without_plot(mut self) -> Self {
        self.plot = None;
        self
    }

    /// Leaves the `# OSU-style` header out (for a second report that continues a table).
    pub(crate) fn without_header(mut self) -> Self {
        self.header_printed = true;
        self
    }

    /// Writes `# ` before each line of `text` in table mode (after the header; an empty
    /// line is a lone `#`); nothing in JSON mode.
    pub(crate) fn comment(&mut self, text: &str) -> io::Result<()> {
        if self.json {
            return Ok(());
        }
        let mut s = self.header();
        for l in text.split('\n') {
            if l.is_empty() {
                s.push_str("#\n");
            } else {
                let _ = writeln!(s, "# {l}");
            }
        }
        self.emit(&s)
    }

    /// Starts a new series named `label`: its rows make a separate table section, carry
    /// `"series": label` in JSON, and a separate polyline in the plot. The rows before the
    /// first call belong to a series named after the bench.
    pub(crate) fn series(&mut self, label: &str) -> io::Result<()> {
        let current = self.series.last_mut().filter(|s| s.points.is_empty());
        match current {
            Some(s) => s.label = label.to_owned(),
            None => self.series.push(Series {
                label: label.to_owned(),
                points: Vec::new(),
            }),
        }
        self.named = true;
        if let Some(bar) = &self.bar {
            bar.set_position(0);
            bar.set_prefix(format!("{} {label}", self.bench));
        }
        if self.json {
            return Ok(());
        }
        let mut s = self.header();
        if self.column_printed {
            s.push_str("#\n");
        }
        let _ = writeln!(s, "# {label}");
        self.column_printed = false;
        self.emit(&s)
    }

    /// Records and prints the value measured at `size`.
    pub(crate) fn row(&mut self, size: usize, value: f64) -> io::Result<()> {
        self.row_with(size, value, &[])
    }

    /// A row with more values after the metric: `(JSON key, column title, value)` each,
    /// printed with the metric's decimals (the column titles come from the first row).
    pub(crate) fn row_with(
        &mut self,
        size: usize,
        value: f64,
        more: &[(&str, &str, f64)],
    ) -> io::Result<()> {
        if let Some(s) = self.series.last_mut() {
            s.points.push((size, value));
        }
        let prec = self.metric.decimals;
        let line = if self.json {
            self.json_line(size, value, more)
        } else {
            let mut s = self.header();
            if !self.column_printed {
                let _ = write!(s, "{:<10}{:>18}", "# Size", self.metric.column);
                for (_, title, _) in more {
                    let _ = write!(s, "{title:>14}");
                }
                s.push('\n');
                self.column_printed = true;
            }
            let _ = write!(s, "{size:<10}{value:>18.prec$}");
            for (_, _, v) in more {
                let _ = write!(s, "{v:>14.prec$}");
            }
            s.push('\n');
            s
        };
        self.emit(&line)?;
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
        Ok(())
    }

    /// Clears the progress bar, writes the plot if `--plot` asked for one, flushes the
    /// output, and returns the writer.
    pub(crate) fn finish(mut self) -> io::Result<W> {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        if !self.json && !self.header_printed {
            let h = self.header();
            self.emit(&h)?;
        }
        if let Some(path) = &self.plot {
            self.plot().write(path)?;
        }
        self.out.flush()?;
        Ok(self.out)
    }

    /// The plot of everything recorded so far.
    pub(crate) fn plot(&self) -> Plot {
        Plot {
            title: self.title.clone(),
            y_label: self.metric.column.to_owned(),
            log_y: self.metric.log_y,
            series: self
                .series
                .iter()
                .filter(|s| !s.points.is_empty())
                .cloned()
                .collect(),
        }
    }

    /// The OSU header, the first time it is asked for; empty after.
    fn header(&mut self) -> String {
        if self.header_printed {
            return String::new();
        }
        self.header_printed = true;
        format!("# OSU-style {}\n", self.title)
    }

    fn json_line(&self, size: usize, value: f64, more: &[(&str, &str, f64)]) -> String {
        let mut s = String::from("{");
        let mut field = |k: &str, v: &serde_json::Value| {
            if s.len() > 1 {
                s.push(',');
            }
            // Serialising a string or a JSON value cannot fail.
            s.push_str(&serde_json::to_string(k).unwrap_or_default());
            s.push(':');
            s.push_str(&serde_json::to_string(v).unwrap_or_default());
        };
        field("bench", &self.bench.as_str().into());
        field("size", &size.into());
        field(self.metric.key, &json_number(value));
        if self.named {
            if let Some(cur) = self.series.last() {
                field("series", &cur.label.as_str().into());
            }
        }
        for (k, v) in &self.extra {
            field(k, v);
        }
        for (k, _, v) in more {
            field(k, &json_number(*v));
        }
        s.push_str("}\n");
        s
    }

    fn emit(&mut self, text: &str) -> io::Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        let out = &mut self.out;
        match &self.bar {
            Some(bar) => bar.suspend(|| out.write_all(text.as_bytes()).and_then(|()| out.flush())),
            None => out.write_all(text.as_bytes()),
        }
    }
}

/// `v` rounded to 4 decimals as a JSON number (`null` when not finite).
fn json_number(v: f64) -> serde_json::Value {
    let r = (v * 1e4).round() / 1e4;
    serde_json::Value::from(if r.is_finite() { r } else { v })
}

// ---------------------------------------------------------------------------------------
// SVG

/// Width and height of the drawing, and the plot area's margins.
const SVG_W: f64 = 860.0;
const SVG_H: f64 = 520.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 70.0;
/// Series colours, in order (then repeated).
const COLOURS: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// Escapes text for XML content and attribute values.
fn xml_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

/// A size as the x-axis labels show it: `512`, `4K`, `4M`.
fn size_label(s: usize) -> String {
    if s >= 1 << 30 && s % (1 << 30) == 0 {
        format!("{}G", s >> 30)
    } else if s >= 1 << 20 && s % (1 << 20) == 0 {
        format!("{}M", s >> 20)
    } else if s >= 1 << 10 && s % (1 << 10) == 0 {
        format!("{}K", s >> 10)
    } else {
        s.to_string()
    }
}

/// A value as a tick label: short, without trailing zeros; millions and billions as
/// `15M`, `2.5G`.
fn value_label(v: f64) -> String {
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            s
        }
    };
    let a = v.abs();
    if a == 0.0 {
        "0".to_owned()
    } else if a >= 1e9 {
        format!("{}G", trim(format!("{:.2}", v / 1e9)))
    } else if a >= 1e6 {
        format!("{}M", trim(format!("{:.2}", v / 1e6)))
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        trim(format!("{v:.2}"))
    } else {
        trim(format!("{v:.4}"))
    }
}

/// A "nice" step (1, 2 or 5 times a power of ten) near `range / 5`.
fn nice_step(range: f64) -> f64 {
    let raw = (range / 5.0).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

impl Plot {
    /// The plot as a self-contained SVG document.
    pub(crate) fn svg(&self) -> String {
        let usable = |v: f64| v.is_finite() && (!self.log_y || v > 0.0);
        let points: Vec<(usize, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|&(_, v)| usable(v))
            .collect();

        // x: log2 of the size; size 0 sits one step left of the smallest positive size.
        let lo_pos = points
            .iter()
            .filter(|p| p.0 > 0)
            .map(|p| (p.0 as f64).log2().floor())
            .fold(f64::INFINITY, f64::min);
        let lo_pos = if lo_pos.is_finite() { lo_pos } else { 0.0 };
        let zero_pos = lo_pos - 1.0;
        let xpos = |s: usize| {
            if s == 0 {
                zero_pos
            } else {
                (s as f64).log2()
            }
        };
        let (mut x0, mut x1) = points
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |a, p| {
                (a.0.min(xpos(p.0)), a.1.max(xpos(p.0)))
            });
        if !x0.is_finite() {
            (x0, x1) = (0.0, 1.0);
        }
        if x1 - x0 < 1.0 {
            x0 -= 0.5;
            x1 += 0.5;
        }

        // y: linear from 0 (or the minimum if negative), or log10.
        let (vmin, vmax) = points
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |a, p| {
                (a.0.min(p.1), a.1.max(p.1))
            });
        let (vmin, vmax) = if vmin.is_finite() {
            (vmin, vmax)
        } else if self.log_y {
            (1.0, 10.0)
        } else {
            (0.0, 1.0)
        };
        let (y0, y1, yticks): (f64, f64, Vec<f64>) = if self.log_y {
            let a = vmin.log10().floor();
            let mut b = vmax.log10().ceil();
            if b <= a {
                b = a + 1.0;
            }
            let mut ticks = Vec::new();
            let mults: &[f64] = if b - a <= 2.0 {
                &[1.0, 2.0, 5.0]
            } else {
                &[1.0]
            };
            let mut e = a;
            while e <= b {
                for m in mults {
                    let t = m * 10f64.powf(e);
                    if t.log10() <= b + 1e-9 {
                        ticks.push(t);
                    }
                }
                e += 1.0;
            }
            (a, b, ticks)
        } else {
            let lo = vmin.min(0.0);
            let hi = if vmax > lo { vmax } else { lo + 1.0 };
            let step = nice_step(hi - lo);
            let lo = (lo / step).floor() * step;
            let hi = (hi / step).ceil() * step;
            let n = ((hi - lo) / step).round() as usize;
            let ticks = (0..=n).map(|i| lo + i as f64 * step).collect();
            (lo, hi, ticks)
        };
        let yval = |v: f64| if self.log_y { v.log10() } else { v };

        let pw = SVG_W - LEFT - RIGHT;
        let ph = SVG_H - TOP - BOTTOM;
        let px = |pos: f64| LEFT + (pos - x0) / (x1 - x0) * pw;
        let py = |v: f64| TOP + ph - (yval(v) - y0) / (y1 - y0) * ph;

        let mut o = String::new();
        let _ = writeln!(o, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
        let _ = writeln!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{SVG_W}" height="{SVG_H}" viewBox="0 0 {SVG_W} {SVG_H}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(o, "<title>{}</title>", xml_escape(&self.title));
        let _ = writeln!(
            o,
            r#"<rect x="0" y="0" width="{SVG_W}" height="{SVG_H}" fill="white"/>"#
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="28" text-anchor="middle" font-size="16">{}</text>"#,
            LEFT + pw / 2.0,
            xml_escape(&self.title)
        );

        // Grid, ticks and labels.
        let _ = writeln!(o, r##"<g class="x-axis" stroke="#000">"##);
        let first = x0.ceil() as i64;
        let last = x1.floor() as i64;
        let count = (last - first + 1).max(1);
        let every = ((count + 11) / 12).max(1);
        for k in first..=last {
            let pos = k as f64;
            let x = px(pos);
            let _ = writeln!(
                o,
                r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}"/>"#,
                TOP + ph,
                TOP + ph + 5.0
            );
            let label = if (pos - zero_pos).abs() < 1e-9 && points.iter().any(|p| p.0 == 0) {
                Some("0".to_owned())
            } else if (0..63).contains(&k) && (last - k) % every == 0 {
                Some(size_label(1usize << k))
            } else {
                None
            };
            if let Some(l) = label {
                let _ = writeln!(
                    o,
                    r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle" stroke="none">{}</text>"#,
                    TOP + ph + 20.0,
                    xml_escape(&l)
                );
            }
        }
        let _ = writeln!(o, "</g>");
        let _ = writeln!(o, r##"<g class="y-axis" stroke="#000">"##);
        for &t in &yticks {
            let y = py(t);
            let _ = writeln!(
                o,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/>"##,
                LEFT + pw
            );
            let _ = writeln!(
                o,
                r#"<line x1="{:.1}" y1="{y:.1}" x2="{LEFT}" y2="{y:.1}"/>"#,
                LEFT - 5.0
            );
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end" stroke="none">{}</text>"#,
                LEFT - 8.0,
                y + 4.0,
                xml_escape(&value_label(t))
            );
        }
        let _ = writeln!(o, "</g>");
        let _ = writeln!(
            o,
            r##"<rect x="{LEFT}" y="{TOP}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#000"/>"##
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">Message size (bytes, log2 scale)</text>"#,
            LEFT + pw / 2.0,
            SVG_H - 20.0
        );
        let scale = if self.log_y { ", log scale" } else { "" };
        let _ = writeln!(
            o,
            r#"<text x="20" y="{:.1}" text-anchor="middle" transform="rotate(-90 20 {:.1})">{}{scale}</text>"#,
            TOP + ph / 2.0,
            TOP + ph / 2.0,
            xml_escape(&self.y_label)
        );

        // One polyline (with point markers) and a legend entry per series.
        for (i, s) in self.series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let mut pts: Vec<(usize, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|&(_, v)| usable(v))
                .collect();
            pts.sort_by_key(|p| p.0);
            let _ = writeln!(o, r#"<g class="series" fill="{colour}" stroke="{colour}">"#);
            let coords: Vec<String> = pts
                .iter()
                .map(|&(sz, v)| format!("{:.1},{:.1}", px(xpos(sz)), py(v)))
                .collect();
            let _ = writeln!(
                o,
                r#"<polyline fill="none" stroke-width="2" points="{}"><title>{}</title></polyline>"#,
                coords.join(" "),
                xml_escape(&s.label)
            );
            for &(sz, v) in &pts {
                let _ = writeln!(
                    o,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3"><title>{}: {sz} B, {}</title></circle>"#,
                    px(xpos(sz)),
                    py(v),
                    xml_escape(&s.label),
                    value_label(v)
                );
            }
            let ly = TOP + 10.0 + 20.0 * i as f64;
            let lx = LEFT + pw + 15.0;
            let _ = writeln!(
                o,
                r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke-width="2"/>"#,
                lx + 25.0
            );
            let _ = writeln!(
                o,
                r##"<text x="{:.1}" y="{:.1}" stroke="none" fill="#000">{}</text>"##,
                lx + 32.0,
                ly + 4.0,
                xml_escape(&s.label)
            );
            let _ = writeln!(o, "</g>");
        }
        let _ = writeln!(o, "</svg>");
        o
    }

    /// Writes [`svg`](Plot::svg) to `path`.
    pub(crate) fn write(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, self.svg()).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot write the plot {}: {e}", path.display()),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_sort_and_dedup() {
        assert_eq!(parse_sizes("8,4194304").unwrap().0, vec![8, 4 << 20]);
        assert_eq!(
            parse_sizes("4M, 1K,0,1K").unwrap().0,
            vec![0, 1024, 4 << 20]
        );
        assert_eq!(parse_size("2GiB").unwrap_err().text, "2GiB");
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
    }

    #[test]
    fn size_errors_name_the_bad_text() {
        for (list, bad) in [
            ("8,abc", "abc"),
            ("8,,16", ""),
            ("12x", "12x"),
            ("99999999999999999999999", "99999999999999999999999"),
            ("2G", "2G"),
            ("-1", "-1"),
        ] {
            let e = parse_sizes(list).unwrap_err();
            assert_eq!(e.text, bad, "{list}");
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
        assert!(parse_sizes(" ")
            .unwrap_err()
            .to_string()
            .contains("names no size"));
    }

    #[test]
    fn default_sweeps() {
        let d = default_sizes(0, MAX_DEFAULT_SIZE);
        assert_eq!(&d[..4], &[0, 1, 2, 4]);
        assert_eq!(d.last(), Some(&(4 << 20)));
        assert_eq!(d.len(), 24);
        assert_eq!(default_sizes(8, 64), vec![8, 16, 32, 64]);
        assert_eq!(default_sizes(5, 16), vec![8, 16]);
    }

    #[test]
    fn sweep_args_parse_through_clap() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct A {
            #[command(flatten)]
            sweep: SweepArgs,
        }
        let a =
            A::try_parse_from(["x", "--sizes", "8,4194304", "--json", "--plot", "p.svg"]).unwrap();
        let s = Sweep::new(&a.sweep, default_sizes(0, 16));
        assert_eq!(s.sizes(), &[8, 4 << 20]);
        assert!(a.sweep.json);
        assert_eq!(a.sweep.plot.as_deref(), Some(Path::new("p.svg")));
        let a = A::try_parse_from(["x"]).unwrap();
        assert_eq!(Sweep::new(&a.sweep, vec![1, 2]).sizes(), &[1, 2]);
        let e = A::try_parse_from(["x", "--sizes", "8,oops"]).unwrap_err();
        assert!(e.to_string().contains("oops"), "{e}");
    }

    fn args(json: bool) -> SweepArgs {
        SweepArgs {
            sizes: None,
            json,
            plot: None,
        }
    }

    #[test]
    fn table_is_osu_style() {
        let mut r = Report::to_writer(
            Vec::new(),
            &args(false),
            "latency",
            "Weft Latency Test",
            Metric::LATENCY,
        );
        r.comment("two processes").unwrap();
        r.row(0, 0.123).unwrap();
        r.row(8, 0.25).unwrap();
        r.series("limit").unwrap();
        r.row(64, 0.11).unwrap();
        let text = String::from_utf8(r.finish().unwrap()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "# OSU-style Weft Latency Test");
        assert_eq!(lines[1], "# two processes");
        assert_eq!(lines[2], "# Size          Latency (us)");
        assert_eq!(lines[3], "0                       0.12");
        assert_eq!(lines[4], "8                       0.25");
        assert_eq!(
            &lines[5..],
            &["#", "# limit", lines[2], "64                      0.11"]
        );
    }

    #[test]
    fn rows_with_more_values_carry_them_in_json_and_columns() {
        let more = [
            ("median_us", "Median (us)", 1.23456),
            ("p99_us", "P99 (us)", 9.5),
        ];
        let report = |json| {
            Report::to_writer(
                Vec::new(),
                &args(json),
                "latency",
                "Weft Latency Test",
                Metric::LATENCY,
            )
        };
        let mut r = report(true);
        r.row_with(8, 2.5, &more).unwrap();
        let text = String::from_utf8(r.finish().unwrap()).unwrap();
        let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(v["latency_us"], 2.5);
        assert_eq!(v["median_us"], 1.2346);
        assert_eq!(v["p99_us"], 9.5);
        let mut r = report(false);
        r.row_with(8, 2.5, &more).unwrap();
        r.row_with(16, 3.0, &more).unwrap();
        let text = String::from_utf8(r.finish().unwrap()).unwrap();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with("# ") || l.starts_with("# Size"))
            .collect();
        assert!(
            lines[0].starts_with("# Size") && lines[0].ends_with("Median (us)      P99 (us)"),
            "{text}"
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["8", "2.50", "1.23", "9.50"]
        );
        assert_eq!(lines.len(), 3, "{text}");
    }

    #[test]
    fn json_lines_parse_with_serde_json() {
        let mut r = Report::to_writer(
            Vec::new(),
            &args(true),
            "bw",
            "Weft Bandwidth Test",
            Metric::BANDWIDTH,
        )
        .field("impl", "weft");
        r.comment("not in JSON").unwrap();
        r.row(8, 12.345678).unwrap();
        r.row(4 << 20, f64::NAN).unwrap();
        r.series("memcpy").unwrap();
        r.row(16, 1e5).unwrap();
        let text = String::from_utf8(r.finish().unwrap()).unwrap();
        let v: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(v.len(), 3);
        assert_eq!(v[0]["bench"], "bw");
        assert_eq!(v[0]["size"], 8);
        assert_eq!(v[0]["bandwidth_mbs"], 12.3457);
        assert_eq!(v[0]["impl"], "weft");
        assert!(v[0].get("series").is_none());
        assert!(v[1]["bandwidth_mbs"].is_null());
        assert_eq!(v[2]["series"], "memcpy");
        assert_eq!(v[2]["bandwidth_mbs"], 100000.0);
        assert!(text.starts_with("{\"bench\":\"bw\",\"size\":8,"));
    }

    #[test]
    fn set_field_changes_the_rows_that_follow() {
        let mut r = Report::to_writer(
            Vec::new(),
            &args(true),
            "bw",
            "Weft Bandwidth Test",
            Metric::BANDWIDTH,
        )
        .field("impl", "weft");
        r.row(8, 1.0).unwrap();
        r.series("memcpy").unwrap();
        r.set_field("impl", "limit");
        r.set_field("runs", 7);
        r.row(8, 2.0).unwrap();
        let text = String::from_utf8(r.finish().unwrap()).unwrap();
        let v: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(v[0]["impl"], "weft");
        assert!(v[0].get("runs").is_none());
        assert_eq!((&v[1]["impl"], &v[1]["runs"]), (&"limit".into(), &7.into()));
    }

    /// A small XML well-formedness check: balanced, properly nested elements, quoted
    /// attributes, no stray `<` or `&` in text, one root element.
    fn check_xml(doc: &str) -> Result<usize, String> {
        let b = doc.as_bytes();
        let mut stack: Vec<String> = Vec::new();
        let mut roots = 0;
        let mut elements = 0;
        let mut i = 0;
        let check_text = |t: &str| -> Result<(), String> {
            let mut rest = t;
            while let Some(p) = rest.find('&') {
                let after = &rest[p + 1..];
                let end = after.find(';').ok_or("unterminated entity")?;
                let ent = &after[..end];
                if !["amp", "lt", "gt", "quot", "apos"].contains(&ent) {
                    return Err(format!("unknown entity &{ent};"));
                }
                rest = &after[end + 1..];
            }
            if t.contains('>') && !t.trim().is_empty() {
                // '>' is legal in text, but our writer always escapes it.
                return Err(format!("unescaped '>' in {t:?}"));
            }
            Ok(())
        };
        while i < b.len() {
            if b[i] != b'<' {
                let end = doc[i..].find('<').map_or(doc.len(), |p| i + p);
                let text = &doc[i..end];
                if stack.is_empty() && !text.trim().is_empty() {
                    return Err(format!("text outside the root: {text:?}"));
                }
                check_text(text)?;
                i = end;
                continue;
            }
            let rest = &doc[i..];
            if rest.starts_with("<?") {
                i += rest.find("?>").ok_or("unterminated <?")? + 2;
                continue;
            }
            if rest.starts_with("<!--") {
                i += rest.find("-->").ok_or("unterminated comment")? + 3;
                continue;
            }
            // Find the end of the tag, skipping quoted attribute values.
            let mut j = 1;
            let mut quote = None;
            while j < rest.len() {
                let c = rest.as_bytes()[j];
                match quote {
                    Some(q) if c == q => quote = None,
                    Some(_) if c == b'<' => return Err("'<' in an attribute".into()),
                    Some(_) => {}
                    None if c == b'"' || c == b'\'' => quote = Some(c),
                    None if c == b'>' => break,
                    None if c == b'<' => return Err("'<' inside a tag".into()),
                    None => {}
                }
                j += 1;
            }
            if j >= rest.len() {
                return Err("unterminated tag".into());
            }
            let tag = &rest[1..j];
            i += j + 1;
            if let Some(name) = tag.strip_prefix('/') {
                let open = stack
                    .pop()
                    .ok_or(format!("</{name}> without an open element"))?;
                if open != name.trim() {
                    return Err(format!("</{name}> closes <{open}>"));
                }
                continue;
            }
            let self_closing = tag.ends_with('/');
            let name: String = tag
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '/')
                .collect();
            if name.is_empty() {
                return Err("empty tag name".into());
            }
            // Attributes: name="value" pairs.
            let attrs = tag[name.len()..].trim_end_matches('/');
            let mut a = attrs.trim();
            while !a.is_empty() {
                let eq = a
                    .find('=')
                    .ok_or(format!("attribute without value in <{name}>"))?;
                let q = a[eq + 1..].chars().next().ok_or("missing quote")?;
                if q != '"' && q != '\'' {
                    return Err(format!("unquoted attribute in <{name}>"));
                }
                let close = a[eq + 2..].find(q).ok_or("unterminated attribute")?;
                check_text(&a[eq + 2..eq + 2 + close])?;
                a = a[eq + 2 + close + 1..].trim_start();
            }
            elements += 1;
            if stack.is_empty() {
                roots += 1;
            }
            if !self_closing {
                stack.push(name);
            }
        }
        if !stack.is_empty() {
            return Err(format!("unclosed elements {stack:?}"));
        }
        if roots != 1 {
            return Err(format!("{roots} root elements"));
        }
        Ok(elements)
    }

    #[test]
    fn xml_checker_catches_mistakes() {
        assert!(check_xml("<a><b/></a>").is_ok());
        assert!(check_xml("<a><b></a>").is_err());
        assert!(check_xml("<a>x & y</a>").is_err());
        assert!(check_xml("<a x=1/>").is_err());
        assert!(check_xml("<a/><b/>").is_err());
    }

    #[test]
    fn svg_is_well_formed_and_holds_every_point() {
        let plot = Plot {
            title: "Weft <Latency> & \"friends\"".into(),
            y_label: "Latency (us)".into(),
            log_y: true,
            series: vec![
                Series {
                    label: "weft".into(),
                    points: vec![(0, 0.2), (1, 0.21), (8, 0.22), (4 << 20, 350.0)],
                },
                Series {
                    label: "limit <cache line>".into(),
                    points: vec![(64, 0.11), (128, 0.0)], // 0 is left out on a log axis
                },
            ],
        };
        let svg = plot.svg();
        check_xml(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
        assert!(svg.starts_with("<?xml"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 5);
        for needle in [
            "weft: 0 B, 0.2<",
            "weft: 4194304 B, 350<",
            "limit &lt;cache line&gt;: 64 B, 0.11<",
            ">4M<",
            ">0<",
            "Latency (us), log scale",
            "&amp; &quot;friends&quot;",
        ] {
            assert!(svg.contains(needle), "{needle} missing:\n{svg}");
        }
        // The first polyline has four points, in size order, left to right.
        let pl = svg.split("<polyline").nth(1).unwrap();
        let pts = pl
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        let xs: Vec<f64> = pts
            .split(' ')
            .map(|p| p.split(',').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(xs.len(), 4);
        assert!(xs.windows(2).all(|w| w[0] < w[1]), "{xs:?}");
        assert!(xs.iter().all(|&x| (LEFT..=SVG_W - RIGHT).contains(&x)));
    }

    #[test]
    fn svg_of_linear_and_degenerate_plots() {
        let mut p = Plot {
            title: "bw".into(),
            y_label: "Bandwidth (MB/s)".into(),
            log_y: false,
            series: vec![Series {
                label: "one".into(),
                points: vec![(4096, 1234.5)],
            }],
        };
        check_xml(&p.svg()).unwrap();
        assert!(p.svg().contains(">4K<"));
        p.series.clear();
        check_xml(&p.svg()).unwrap();
    }

    #[test]
    fn report_writes_the_plot() {
        let dir = std::env::temp_dir().join(format!("weft-osu-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lat.svg");
        let mut a = args(false);
        a.plot = Some(path.clone());
        let mut r = Report::to_writer(
            Vec::new(),
            &a,
            "latency",
            "Weft Latency Test",
            Metric::LATENCY,
        )
        .label("weft");
        r.row(8, 0.3).unwrap();
        r.series("limit").unwrap();
        r.row(64, 0.1).unwrap();
        r.finish().unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        check_xml(&svg).unwrap();
        assert!(svg.contains("weft: 8 B, 0.3<") && svg.contains("limit: 64 B, 0.1<"));
        assert!(svg.contains("<title>Weft Latency Test</title>"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn labels() {
        assert_eq!(size_label(4 << 20), "4M");
        assert_eq!(size_label(1024), "1K");
        assert_eq!(size_label(1536), "1536");
        assert_eq!(value_label(0.5), "0.5");
        assert_eq!(value_label(2.0), "2");
        assert_eq!(value_label(12500.0), "12500");
        assert_eq!(value_label(1.5e7), "15M");
        assert_eq!(value_label(2.5e9), "2.5G");
        assert_eq!(value_label(0.0001), "0.0001");
        assert_eq!(nice_step(10.0), 2.0);
        assert_eq!(nice_step(4000.0), 1000.0);
    }
}
