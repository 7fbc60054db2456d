use super::plot::{nice_step, size_label, value_label, LEFT, RIGHT, SVG_W};
use super::*;
use std::path::Path;

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
    let a = A::try_parse_from(["x", "--sizes", "8,4194304", "--json", "--plot", "p.svg"]).unwrap();
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
