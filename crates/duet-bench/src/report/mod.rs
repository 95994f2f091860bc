//! Markdown from results, and `duet bench report`: reads every JSON result in
//! a directory, draws the charts, and replaces the generated sections of
//! BENCHMARKS.md (between `<!-- BEGIN bench:NAME -->` and `<!-- END bench:NAME -->`),
//! leaving everything written by hand around them untouched.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::result::{BenchResult, Figure};

mod charts;

pub use charts::charts_for;

/// A number with about three significant digits.
pub fn num(x: f64) -> String {
    let a = x.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if a >= 100.0 {
        format!("{:.0}", x)
    } else if a >= 10.0 {
        format!("{:.1}", x)
    } else if a >= 1.0 {
        format!("{:.2}", x)
    } else {
        format!("{:.3}", x)
    }
}

fn cell(f: &Figure) -> String {
    let mut s = num(f.median);
    if f.runs.len() > 1 {
        let _ = write!(s, " ({}–{})", num(f.min), num(f.max));
    }
    if f.noisy {
        s.push_str(" ~");
    }
    s
}

/// One Markdown table: case columns, metric columns, rows of cells.
struct Table {
    case_keys: Vec<String>,
    metrics: Vec<String>,
    rows: Vec<Vec<String>>,
}

/// Rows grouped into tables by their set of metrics, in order of appearance.
fn tables(r: &BenchResult) -> Vec<Table> {
    // row key: target + case; value: metric → figure
    let mut rows: Vec<(String, BTreeMap<String, String>, Vec<&Figure>)> = Vec::new();
    for f in &r.figures {
        match rows
            .iter_mut()
            .find(|(t, c, _)| *t == f.target && *c == f.case)
        {
            Some((_, _, figs)) => figs.push(f),
            None => rows.push((f.target.clone(), f.case.clone(), vec![f])),
        }
    }
    let mut out: Vec<Table> = Vec::new();
    for (target, case, figs) in rows {
        let metrics: Vec<String> = figs.iter().map(|f| f.metric.clone()).collect();
        let case_keys: Vec<String> = case.keys().cloned().collect();
        let mut cells = vec![target.clone()];
        cells.extend(case.values().cloned());
        cells.extend(figs.iter().map(|f| cell(f)));
        match out
            .iter_mut()
            .find(|t| t.case_keys == case_keys && t.metrics == metrics)
        {
            Some(t) => t.rows.push(cells),
            None => out.push(Table {
                case_keys,
                metrics,
                rows: vec![cells],
            }),
        }
    }
    out
}

/// The Markdown section of one result; `charts` are (title, relative path).
pub fn markdown_for(r: &BenchResult, charts: Option<&[(String, String)]>) -> String {
    let mut s = String::new();
    let when = r.started_unix_s;
    let m = &r.machine;
    let _ = writeln!(
        s,
        "### `{}`{}\n",
        r.workload,
        if r.noisy { " (noisy)" } else { "" }
    );
    let _ = writeln!(s, "```sh\n{}\n```\n", r.command_line);
    let _ = writeln!(
        s,
        "Commit `{}`{}, {} build; {} cores ({}), {} MiB RAM ({} MiB available), load {:.2} at start; started at unix time {when}, took {:.0} s; {} repeat(s).\n",
        &m.commit.get(..12).unwrap_or(&m.commit),
        if m.commit_dirty { " (+ uncommitted changes)" } else { "" },
        m.build_profile,
        m.cores,
        m.cpu_model,
        m.memory_mb_total,
        m.memory_mb_available,
        m.loadavg_1m_start,
        r.wall_s,
        r.repeats,
    );
    let _ = writeln!(s, "Parameters: `{}`\n", r.params);
    if r.repeats > 1 {
        let _ = writeln!(s, "Cells: median (min–max) over the repeats; `~` marks a figure whose spread exceeds 20 % of its median.\n");
    }
    for Table {
        case_keys,
        metrics,
        rows,
    } in tables(r)
    {
        let mut header = vec!["target".to_string()];
        header.extend(case_keys.iter().cloned());
        header.extend(metrics.iter().cloned());
        let _ = writeln!(s, "| {} |", header.join(" | "));
        let _ = writeln!(
            s,
            "|{}|",
            header
                .iter()
                .enumerate()
                .map(|(i, _)| if i <= case_keys.len() { "---" } else { "---:" })
                .collect::<Vec<_>>()
                .join("|")
        );
        for cells in rows {
            let _ = writeln!(s, "| {} |", cells.join(" | "));
        }
        s.push('\n');
    }
    if !r.notes.is_empty() {
        s.push_str("Notes:\n\n");
        for n in &r.notes {
            let _ = writeln!(s, "- {n}");
        }
        s.push('\n');
    }
    for (title, path) in charts.unwrap_or_default() {
        let _ = writeln!(s, "![{title}]({path})\n");
    }
    s
}

const ORDER: [&str; 7] = [
    "ycsb", "htap", "snapshot", "space", "ycsb-t", "tpcch", "changes",
];

fn skeleton() -> String {
    "# Benchmarks\n\n\
     Measured figures of duetdb and its peers, with the commands that produced them.\n\
     Sections between `BEGIN bench:` / `END bench:` markers are regenerated by\n\
     `duet bench report` from the JSON results; everything else is written by hand.\n\n\
     ## Engine micro-benchmarks (criterion)\n\n\
     `cargo bench -p duetdb --bench engine` — run by the lead engineer separately;\n\
     figures go here.\n\n"
        .to_string()
}

/// Replace (or append) the section `name` in `doc`.
pub fn splice(doc: &str, name: &str, body: &str) -> String {
    let begin = format!("<!-- BEGIN bench:{name} -->");
    let end = format!("<!-- END bench:{name} -->");
    let block = format!("{begin}\n{body}{end}\n");
    if let (Some(b), Some(e)) = (doc.find(&begin), doc.find(&end)) {
        if b < e {
            let after = doc[e + end.len()..].trim_start_matches('\n');
            return format!(
                "{}{block}{}{after}",
                &doc[..b],
                if after.is_empty() { "" } else { "\n" }
            );
        }
    }
    let mut out = doc.to_string();
    if !out.ends_with("\n\n") {
        out.push('\n');
    }
    out.push_str(&block);
    out
}

/// `duet bench report`.
pub fn regenerate(results: &Path, out_md: &Path, charts_dir: &Path) -> Result<()> {
    let mut found: Vec<(PathBuf, BenchResult)> = Vec::new();
    let entries =
        std::fs::read_dir(results).with_context(|| format!("reading {}", results.display()))?;
    for e in entries {
        let path = e?.path();
        if path.extension().and_then(|x| x.to_str()) == Some("json") {
            found.push((path.clone(), BenchResult::read(&path)?));
        }
    }
    found.sort_by_key(|(p, r)| {
        (
            ORDER
                .iter()
                .position(|w| *w == r.workload)
                .unwrap_or(ORDER.len()),
            p.clone(),
        )
    });
    let mut doc = match std::fs::read_to_string(out_md) {
        Ok(s) => s,
        Err(_) => skeleton(),
    };
    let base = out_md
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    for (path, r) in &found {
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or(&r.workload)
            .to_string();
        let chart_dir = charts_dir.join(&stem);
        let charts = charts_for(r, &chart_dir)?;
        let rel: Vec<(String, String)> = charts
            .into_iter()
            .map(|(t, p)| {
                let shown = relative(&p, base);
                (t, shown)
            })
            .collect();
        doc = splice(&doc, &stem, &markdown_for(r, Some(&rel)));
        eprintln!("report: {} → section {stem}", path.display());
    }
    std::fs::write(out_md, doc).with_context(|| format!("writing {}", out_md.display()))?;
    eprintln!("wrote {}", out_md.display());
    Ok(())
}

fn relative(p: &Path, base: &Path) -> String {
    let abs = |x: &Path| std::fs::canonicalize(x).unwrap_or_else(|_| x.to_path_buf());
    let (p, base) = (abs(p), abs(base));
    p.strip_prefix(&base)
        .map_or_else(|_| p.display().to_string(), |r| r.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splice_replaces_only_its_section() {
        let doc = "# B\n\nhand text\n";
        let once = splice(doc, "x", "one\n");
        assert!(once.contains("hand text") && once.contains("one\n"));
        let twice = splice(&once, "x", "two\n");
        assert!(twice.contains("two\n") && !twice.contains("one\n") && twice.contains("hand text"));
        let other = splice(&twice, "y", "why\n");
        assert!(other.contains("two\n") && other.contains("why\n"));
    }
}
