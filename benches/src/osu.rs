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
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

mod plot;
#[cfg(test)]
mod tests;

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
