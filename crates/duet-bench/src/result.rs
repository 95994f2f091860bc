//! The result of one `duet bench` invocation: every figure of every repeated
//! run with its spread, the parameters, the machine, and notes — written as
//! JSON (the source of truth for `report`) and as a Markdown table.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::machine::Machine;
use crate::stats::spread;

/// Bumped when the JSON layout changes incompatibly.
pub const SCHEMA_VERSION: u32 = 1;

/// A figure whose (max - min) / median over repeats exceeds this is noisy.
pub const NOISY_REL_SPREAD: f64 = 0.20;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchResult {
    pub schema: u32,
    pub workload: String,
    /// The exact command line that produced this result.
    pub command_line: String,
    pub started_unix_s: u64,
    pub wall_s: f64,
    pub machine: Machine,
    pub params: serde_json::Value,
    pub repeats: usize,
    /// Any figure noisy, or the machine was loaded when the run started.
    pub noisy: bool,
    pub notes: Vec<String>,
    pub figures: Vec<Figure>,
    /// Time series (e.g. old versions over time) for charts; absent in older results.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub series: Vec<Series>,
}

/// Samples of one quantity over time for one target and case.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Series {
    pub target: String,
    pub case: BTreeMap<String, String>,
    /// Name with its unit, e.g. "old_versions".
    pub metric: String,
    /// (seconds since the cell started, value).
    pub points: Vec<[f64; 2]>,
}

/// One measured quantity for one target and case, over all repeated runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Figure {
    /// e.g. "duetdb-embedded", "sqlite-wal", "postgres".
    pub target: String,
    /// What distinguishes this case: e.g. {"workload": "A"} or {"analytics": "8", "scan": "full"}.
    pub case: BTreeMap<String, String>,
    /// Name with its unit: "update_ops_per_s", "latency_us_p99".
    pub metric: String,
    pub runs: Vec<f64>,
    pub min: f64,
    pub median: f64,
    pub max: f64,
    pub noisy: bool,
}

/// Collects samples of repeated runs and turns them into [`Figure`]s, keeping
/// the order in which metrics first appeared.
#[derive(Default)]
pub struct Collector {
    order: Vec<(String, BTreeMap<String, String>, String)>,
    values: BTreeMap<(String, String, String), Vec<f64>>,
}

/// What a workload body produces: figures, notes and time series.
#[derive(Default)]
pub struct Sink {
    pub col: Collector,
    pub notes: Vec<String>,
    pub series: Vec<Series>,
}

/// Build a case map from pairs.
pub fn case(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn case_key(case: &BTreeMap<String, String>) -> String {
    case.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

impl Collector {
    pub fn add(&mut self, target: &str, case: &BTreeMap<String, String>, metric: &str, value: f64) {
        let key = (target.to_string(), case_key(case), metric.to_string());
        let entry = self.values.entry(key).or_insert_with(|| {
            self.order
                .push((target.to_string(), case.clone(), metric.to_string()));
            Vec::new()
        });
        entry.push(value);
    }

    pub fn figures(&self) -> Vec<Figure> {
        self.order
            .iter()
            .map(|(target, case, metric)| {
                let runs = self
                    .values
                    .get(&(target.clone(), case_key(case), metric.clone()))
                    .cloned()
                    .unwrap_or_default();
                let (min, median, max) = spread(&runs);
                let noisy = runs.len() > 1
                    && median.abs() > f64::EPSILON
                    && (max - min) / median.abs() > NOISY_REL_SPREAD;
                Figure {
                    target: target.clone(),
                    case: case.clone(),
                    metric: metric.clone(),
                    runs,
                    min,
                    median,
                    max,
                    noisy,
                }
            })
            .collect()
    }
}

/// What is captured when an invocation starts.
pub struct Started {
    pub machine: Machine,
    pub at: std::time::SystemTime,
    pub instant: std::time::Instant,
}

impl Started {
    pub fn now() -> Started {
        Started {
            machine: crate::machine::collect(),
            at: std::time::SystemTime::now(),
            instant: std::time::Instant::now(),
        }
    }
}

impl BenchResult {
    /// Assemble a result; `noisy` is derived from the figures and machine load.
    pub fn finish(
        workload: &str,
        params: serde_json::Value,
        repeats: usize,
        started: Started,
        mut notes: Vec<String>,
        figures: Vec<Figure>,
    ) -> BenchResult {
        let machine = started.machine;
        let loaded = machine.loadavg_1m_start > machine.cores as f64 * 0.5;
        if loaded {
            notes.push(format!(
                "machine busy at start: load average {:.2} on {} cores (shared machine); figures are noisy",
                machine.loadavg_1m_start, machine.cores
            ));
        }
        let noisy = loaded || figures.iter().any(|f| f.noisy);
        BenchResult {
            schema: SCHEMA_VERSION,
            workload: workload.to_string(),
            command_line: command_line(),
            started_unix_s: started
                .at
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            wall_s: started.instant.elapsed().as_secs_f64(),
            machine,
            params,
            repeats,
            noisy,
            notes,
            figures,
            series: Vec::new(),
        }
    }

    /// Attach time series (the builder form keeps `finish`'s callers unchanged).
    pub fn with_series(mut self, series: Vec<Series>) -> BenchResult {
        self.series = series;
        self
    }

    /// Write `<dir>/<name>.json` and `<dir>/<name>.md`; returns the JSON path.
    pub fn write(&self, dir: &Path, name: &str) -> Result<PathBuf> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let json = dir.join(format!("{name}.json"));
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(&json, text).with_context(|| format!("writing {}", json.display()))?;
        let md = dir.join(format!("{name}.md"));
        std::fs::write(&md, crate::report::markdown_for(self, None))
            .with_context(|| format!("writing {}", md.display()))?;
        Ok(json)
    }

    pub fn read(path: &Path) -> Result<BenchResult> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let r: BenchResult =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        anyhow::ensure!(
            r.schema == SCHEMA_VERSION,
            "{}: schema {} (expected {SCHEMA_VERSION})",
            path.display(),
            r.schema
        );
        Ok(r)
    }

    /// The figure for (target, case ⊇ `filter`, metric), if any.
    pub fn find(&self, target: &str, filter: &[(&str, &str)], metric: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| {
            f.target == target
                && f.metric == metric
                && filter
                    .iter()
                    .all(|(k, v)| f.case.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// Targets in order of first appearance.
    pub fn targets(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for f in &self.figures {
            if !out.contains(&f.target) {
                out.push(f.target.clone());
            }
        }
        out
    }
}

/// The command line of this process, shell-quoted where needed.
pub fn command_line() -> String {
    std::env::args()
        .map(|a| {
            if a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./=,:".contains(c))
            {
                a
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}
