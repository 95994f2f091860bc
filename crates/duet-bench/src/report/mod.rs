//! Markdown from results, and `duet bench report`: reads every JSON result in
//! a directory, draws the charts, and replaces the generated sections of
//! BENCHMARKS.md (between `<!-- BEGIN bench:NAME -->` and `<!-- END bench:NAME -->`),
//! leaving everything written by hand around them untouched.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::plot;
use crate::result::{BenchResult, Figure};

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

fn series_label(target: &str, f: &Figure) -> String {
    match f.case.get("strategy") {
        Some(st) => format!("{target} / {st}"),
        None => target.to_string(),
    }
}

/// Draw the charts of one result into `dir`; returns (title, file path).
pub fn charts_for(r: &BenchResult, dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut out = Vec::new();
    match r.workload.as_str() {
        "ycsb" => {
            let mut cats: Vec<String> = Vec::new();
            for f in &r.figures {
                if let Some(w) = f.case.get("workload") {
                    if w != "load" && !cats.contains(w) {
                        cats.push(w.clone());
                    }
                }
            }
            // One series per target, or per (target, threads) when the run
            // covered several client thread counts (`--thread-counts`).
            let mut keys: Vec<(String, Option<String>)> = Vec::new();
            for f in &r.figures {
                let k = (f.target.clone(), f.case.get("threads").cloned());
                if !keys.contains(&k) {
                    keys.push(k);
                }
            }
            let series: Vec<(String, Vec<f64>)> = keys
                .into_iter()
                .map(|(t, threads)| {
                    let v = cats
                        .iter()
                        .map(|w| {
                            let mut filter = vec![("workload", w.as_str())];
                            if let Some(n) = &threads {
                                filter.push(("threads", n.as_str()));
                            }
                            r.find(&t, &filter, "ops_per_s").map_or(0.0, |f| f.median)
                        })
                        .collect();
                    match threads {
                        Some(n) => (format!("{t} ×{n} threads"), v),
                        None => (t, v),
                    }
                })
                .collect();
            let p = dir.join("ycsb-throughput.png");
            plot::bars(
                &p,
                "YCSB throughput per core workload",
                "operations / s",
                &cats,
                &series,
                false,
            )?;
            out.push(("YCSB throughput per core workload".to_string(), p));
        }
        "htap" => {
            // Lines per target/strategy over K for full scans (K = 0 is the baseline).
            let mut keys: Vec<(String, String)> = Vec::new();
            for f in &r.figures {
                if let Some(st) = f.case.get("strategy") {
                    let k = (f.target.clone(), st.clone());
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                }
            }
            for (metric, title, y, file) in [
                (
                    "update_ops_per_s",
                    "Update throughput vs concurrent full scans",
                    "updates / s",
                    "htap-update-throughput.png",
                ),
                (
                    "update_latency_us_p95",
                    "p95 update latency vs concurrent full scans",
                    "µs",
                    "htap-update-p95.png",
                ),
                (
                    "scan_ms_median",
                    "Full-scan duration vs concurrent full scans",
                    "ms (median)",
                    "htap-scan-duration.png",
                ),
            ] {
                let series: Vec<(String, Vec<(f64, f64)>)> = keys
                    .iter()
                    .map(|(t, st)| {
                        let mut pts: Vec<(f64, f64)> = r
                            .figures
                            .iter()
                            .filter(|f| {
                                &f.target == t
                                    && f.metric == metric
                                    && f.case.get("strategy") == Some(st)
                                    && matches!(
                                        f.case.get("scan").map(String::as_str),
                                        Some("full" | "-")
                                    )
                            })
                            .filter_map(|f| {
                                let k: f64 = f.case.get("analytics")?.parse().ok()?;
                                Some((k, f.median))
                            })
                            .collect();
                        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                        let label = r
                            .figures
                            .iter()
                            .find(|f| &f.target == t && f.case.get("strategy") == Some(st))
                            .map_or_else(|| t.clone(), |f| series_label(t, f));
                        (label, pts)
                    })
                    .filter(|(_, pts)| !pts.is_empty())
                    .collect();
                if series.is_empty() {
                    continue;
                }
                let p = dir.join(file);
                plot::lines(&p, title, "concurrent analytics (K)", y, &series)?;
                out.push((title.to_string(), p));
            }
            // Scan duration per scan kind at the largest K.
            let k_max = r
                .figures
                .iter()
                .filter_map(|f| f.case.get("analytics")?.parse::<usize>().ok())
                .max()
                .unwrap_or(0);
            if k_max > 0 {
                let ks = k_max.to_string();
                let mut cats: Vec<String> = Vec::new();
                for f in &r.figures {
                    if let Some(sc) = f.case.get("scan") {
                        if sc != "-" && !cats.contains(sc) {
                            cats.push(sc.clone());
                        }
                    }
                }
                let series: Vec<(String, Vec<f64>)> = keys
                    .iter()
                    .map(|(t, st)| {
                        let v = cats
                            .iter()
                            .map(|sc| {
                                r.find(
                                    t,
                                    &[("strategy", st), ("analytics", &ks), ("scan", sc)],
                                    "scan_ms_median",
                                )
                                .map_or(0.0, |f| f.median)
                            })
                            .collect();
                        (format!("{t} / {st}"), v)
                    })
                    .collect();
                let title = format!("Scan duration per query, K = {k_max}");
                let p = dir.join("htap-scan-kinds.png");
                plot::bars(&p, &title, "ms (median, log)", &cats, &series, true)?;
                out.push((title, p));
            }
        }
        "snapshot" => {
            let mut sizes: Vec<String> = Vec::new();
            for f in &r.figures {
                if let Some(s) = f.case.get("data_mb") {
                    if !sizes.contains(s) {
                        sizes.push(s.clone());
                    }
                }
            }
            let t = "duetdb-embedded";
            let get = |s: &str, metric: &str, scale: f64| {
                r.find(t, &[("data_mb", s), ("what", "create")], metric)
                    .map_or(0.0, |f| f.median * scale)
            };
            let series = vec![
                (
                    "duetdb db.snapshot()".to_string(),
                    sizes
                        .iter()
                        .map(|s| get(s, "duet_snapshot_us_median", 1e-3))
                        .collect(),
                ),
                (
                    "fork()".to_string(),
                    sizes
                        .iter()
                        .map(|s| get(s, "fork_ms_median", 1.0))
                        .collect(),
                ),
                (
                    "deep copy".to_string(),
                    sizes.iter().map(|s| get(s, "deep_copy_ms", 1.0)).collect(),
                ),
            ];
            let cats: Vec<String> = sizes.iter().map(|s| format!("{s} MiB")).collect();
            let title = "Snapshot creation time vs data size";
            let p = dir.join("snapshot-creation.png");
            plot::bars(&p, title, "ms (log scale)", &cats, &series, true)?;
            out.push((title.to_string(), p));
        }
        "space" => {
            // One chart per (distribution, queries): old versions over time per system.
            let mut cells: Vec<(String, String)> = Vec::new();
            for sr in &r.series {
                if let (Some(d), Some(q)) = (sr.case.get("dist"), sr.case.get("queries")) {
                    let c = (d.clone(), q.clone());
                    if !cells.contains(&c) {
                        cells.push(c);
                    }
                }
            }
            // Runs of several targets (embedded and wire) name their lines
            // "system (target)", so the legend tells them apart.
            let mut targets: Vec<&str> = r.series.iter().map(|s| s.target.as_str()).collect();
            targets.sort_unstable();
            targets.dedup();
            let several = targets.len() > 1;
            for (d, q) in cells {
                let lines: Vec<(String, Vec<(f64, f64)>)> = r
                    .series
                    .iter()
                    .filter(|sr| {
                        sr.metric == "old_versions"
                            && sr.case.get("dist") == Some(&d)
                            && sr.case.get("queries") == Some(&q)
                    })
                    .map(|sr| {
                        let system = sr.case.get("system").cloned().unwrap_or_default();
                        let name = if several {
                            format!("{system} ({})", sr.target)
                        } else {
                            system
                        };
                        (name, sr.points.iter().map(|p| (p[0], p[1])).collect())
                    })
                    .filter(|(_, pts): &(String, Vec<(f64, f64)>)| !pts.is_empty())
                    .collect();
                if lines.is_empty() {
                    continue;
                }
                let title = format!("Old versions over time, {d} updates, {q} concurrent queries");
                let p = dir.join(format!("space-old-versions-{d}-q{q}.png"));
                plot::lines(&p, &title, "seconds", "old versions kept", &lines)?;
                out.push((title, p));
            }
        }
        "ycsb-t" => {
            for (metric, title, y, file) in [
                (
                    "commits_per_s",
                    "YCSB-T committed transactions beside concurrent scans",
                    "transactions / s",
                    "ycsbt-commits.png",
                ),
                (
                    "commit_latency_us_p99",
                    "YCSB-T p99 commit latency beside concurrent scans",
                    "µs",
                    "ycsbt-commit-p99.png",
                ),
            ] {
                if let Some((cats, series)) = by_strategy_and_isolation(r, metric) {
                    let p = dir.join(file);
                    plot::bars(&p, title, y, &cats, &series, false)?;
                    out.push((title.to_string(), p));
                }
            }
        }
        "tpcch" => {
            if let Some((cats, series)) = by_strategy_and_isolation(r, "tpmC") {
                let title = "TPC-CH tpmC beside concurrent TPC-H queries";
                let p = dir.join("tpcch-tpmc.png");
                plot::bars(&p, title, "NewOrders / min", &cats, &series, false)?;
                out.push((title.to_string(), p));
            }
            // Query latency per query and strategy at the largest K.
            let k_max = max_analytics(r);
            if k_max > 0 {
                let ks = k_max.to_string();
                let mut cats: Vec<String> = Vec::new();
                let mut strategies: Vec<String> = Vec::new();
                for f in r.figures.iter().filter(|f| f.metric == "query_ms_median") {
                    if let (Some(q), Some(s)) = (f.case.get("query"), f.case.get("strategy")) {
                        if !cats.contains(q) {
                            cats.push(q.clone());
                        }
                        if !strategies.contains(s) {
                            strategies.push(s.clone());
                        }
                    }
                }
                let series: Vec<(String, Vec<f64>)> = strategies
                    .iter()
                    .map(|s| {
                        let v = cats
                            .iter()
                            .map(|q| {
                                r.find(
                                    "duetdb-embedded",
                                    &[("strategy", s), ("analytics", &ks), ("query", q)],
                                    "query_ms_median",
                                )
                                .map_or(0.0, |f| f.median)
                            })
                            .collect();
                        (s.clone(), v)
                    })
                    .collect();
                if !series.is_empty() {
                    let title = format!("TPC-H query latency beside TPC-C, K = {k_max}");
                    let p = dir.join("tpcch-query-latency.png");
                    plot::bars(&p, &title, "ms (median, log)", &cats, &series, true)?;
                    out.push((title, p));
                }
            }
        }
        _ => {}
    }
    Ok(out)
}

fn max_analytics(r: &BenchResult) -> usize {
    r.figures
        .iter()
        .filter_map(|f| f.case.get("analytics")?.parse::<usize>().ok())
        .max()
        .unwrap_or(0)
}

/// Categories "K=0" (no analytics) and each strategy at the largest K; one
/// series per isolation level: the median of `metric` in the cell whose case
/// has no keys beyond isolation / strategy / analytics.
#[allow(clippy::type_complexity)]
fn by_strategy_and_isolation(
    r: &BenchResult,
    metric: &str,
) -> Option<(Vec<String>, Vec<(String, Vec<f64>)>)> {
    let k_max = max_analytics(r);
    let ks = k_max.to_string();
    let plain = |f: &&Figure| f.metric == metric && f.case.len() == 3;
    let mut isolations: Vec<String> = Vec::new();
    let mut strategies: Vec<String> = Vec::new();
    for f in r.figures.iter().filter(plain) {
        if let Some(i) = f.case.get("isolation") {
            if !isolations.contains(i) {
                isolations.push(i.clone());
            }
        }
        if f.case.get("analytics") == Some(&ks) && k_max > 0 {
            if let Some(s) = f.case.get("strategy") {
                if !strategies.contains(s) {
                    strategies.push(s.clone());
                }
            }
        }
    }
    if isolations.is_empty() {
        return None;
    }
    let mut cats = vec!["K=0".to_string()];
    cats.extend(strategies.iter().map(|s| format!("{s}, K={k_max}")));
    let series = isolations
        .iter()
        .map(|iso| {
            let find = |s: &str, k: &str| {
                r.figures
                    .iter()
                    .filter(plain)
                    .find(|f| {
                        f.case.get("isolation") == Some(iso)
                            && f.case.get("strategy").map(String::as_str) == Some(s)
                            && f.case.get("analytics").map(String::as_str) == Some(k)
                    })
                    .map_or(0.0, |f| f.median)
            };
            let mut v = vec![find("-", "0")];
            v.extend(strategies.iter().map(|s| find(s, &ks)));
            (iso.clone(), v)
        })
        .collect();
    Some((cats, series))
}

const ORDER: [&str; 6] = ["ycsb", "htap", "snapshot", "space", "ycsb-t", "tpcch"];

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
