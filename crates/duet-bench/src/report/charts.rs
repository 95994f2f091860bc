//! The PNG charts of each workload's results (`plot` draws them): one
//! function per workload, each reading only the figures and series of a
//! result, so `report` can redraw every chart from the JSON alone.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::plot;
use crate::result::{BenchResult, Figure};

/// Charts drawn so far: (title, file path).
type Drawn = Vec<(String, PathBuf)>;

/// Draw the charts of one result into `dir`; returns (title, file path).
pub fn charts_for(r: &BenchResult, dir: &Path) -> Result<Drawn> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut out = Vec::new();
    match r.workload.as_str() {
        "ycsb" => ycsb(r, dir, &mut out)?,
        "htap" => htap(r, dir, &mut out)?,
        "snapshot" => snapshot(r, dir, &mut out)?,
        "space" => space(r, dir, &mut out)?,
        "ycsb-t" => ycsb_t(r, dir, &mut out)?,
        "tpcch" => tpcch(r, dir, &mut out)?,
        _ => {}
    }
    Ok(out)
}

/// YCSB: throughput per core workload, one series per target (and thread count).
fn ycsb(r: &BenchResult, dir: &Path, out: &mut Drawn) -> Result<()> {
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
    Ok(())
}

/// HTAP: update throughput, p95 latency and scan duration over K per target and strategy; scan duration per scan kind at the largest K.
fn htap(r: &BenchResult, dir: &Path, out: &mut Drawn) -> Result<()> {
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
                            && matches!(f.case.get("scan").map(String::as_str), Some("full" | "-"))
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
    Ok(())
}

/// snapshot: creation time vs data size (db.snapshot(), fork(), deep copy) of the embedded target.
fn snapshot(r: &BenchResult, dir: &Path, out: &mut Drawn) -> Result<()> {
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
    Ok(())
}

/// space: old versions over time per system, one chart per (distribution, queries).
fn space(r: &BenchResult, dir: &Path, out: &mut Drawn) -> Result<()> {
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
    Ok(())
}

/// YCSB-T: commits and p99 commit latency per strategy and isolation.
fn ycsb_t(r: &BenchResult, dir: &Path, out: &mut Drawn) -> Result<()> {
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
    Ok(())
}

/// TPC-CH: tpmC per strategy and isolation; query latency per query and strategy at the largest K.
fn tpcch(r: &BenchResult, dir: &Path, out: &mut Drawn) -> Result<()> {
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
        // (target, strategy): duet's strategies, then a peer's native snapshot.
        let mut sources: Vec<(String, String)> = Vec::new();
        for f in r.figures.iter().filter(|f| f.metric == "query_ms_median") {
            if let (Some(q), Some(s)) = (f.case.get("query"), f.case.get("strategy")) {
                if !cats.contains(q) {
                    cats.push(q.clone());
                }
                let src = (f.target.clone(), s.clone());
                if !sources.contains(&src) {
                    sources.push(src);
                }
            }
        }
        let series: Vec<(String, Vec<f64>)> = sources
            .iter()
            .map(|(t, s)| {
                let v = cats
                    .iter()
                    .map(|q| {
                        r.find(
                            t,
                            &[("strategy", s), ("analytics", &ks), ("query", q)],
                            "query_ms_median",
                        )
                        .map_or(0.0, |f| f.median)
                    })
                    .collect();
                let label = if t == "duetdb-embedded" {
                    s.clone()
                } else {
                    t.clone()
                };
                (label, v)
            })
            .collect();
        if !series.is_empty() {
            let title = format!("TPC-H query latency beside TPC-C, K = {k_max}");
            let p = dir.join("tpcch-query-latency.png");
            plot::bars(&p, &title, "ms (median, log)", &cats, &series, true)?;
            out.push((title, p));
        }
    }
    Ok(())
}

fn series_label(target: &str, f: &Figure) -> String {
    match f.case.get("strategy") {
        Some(st) => format!("{target} / {st}"),
        None => target.to_string(),
    }
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
    // Series: (target, isolation); labelled by isolation alone for one target.
    let mut isolations: Vec<(String, String)> = Vec::new();
    let mut strategies: Vec<String> = Vec::new();
    for f in r.figures.iter().filter(plain) {
        if let Some(i) = f.case.get("isolation") {
            let key = (f.target.clone(), i.clone());
            if !isolations.contains(&key) {
                isolations.push(key);
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
    let one_target = isolations.iter().all(|(t, _)| *t == isolations[0].0);
    let series = isolations
        .iter()
        .map(|(target, iso)| {
            let find = |s: &str, k: &str| {
                r.figures
                    .iter()
                    .filter(plain)
                    .find(|f| {
                        f.target == *target
                            && f.case.get("isolation") == Some(iso)
                            && f.case.get("strategy").map(String::as_str) == Some(s)
                            && f.case.get("analytics").map(String::as_str) == Some(k)
                    })
                    .map_or(0.0, |f| f.median)
            };
            let mut v = vec![find("-", "0")];
            v.extend(strategies.iter().map(|s| find(s, &ks)));
            let label = if one_target {
                iso.clone()
            } else {
                format!("{target} / {iso}")
            };
            (label, v)
        })
        .collect();
    Some((cats, series))
}
