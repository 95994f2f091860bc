//! The data-directory campaign (issue 14, "Tests and evidence"): every file
//! of a durable database — WAL segments, both checkpoints, the pinned
//! snapshot image, MANIFEST, LOCK — deleted, truncated (to 0, to half, by one
//! byte) and with a byte flipped (header, middle, last record), one at a
//! time on a fresh copy; each open must recover every acknowledged write or
//! refuse with an error naming that file. See `duetdb::check::datadir`;
//! `duet check datadir` runs a bigger configuration.

use duetdb::check::datadir::{self, Damage, DatadirConfig, Outcome};

fn assert_clean(report: &datadir::DatadirReport) {
    eprintln!("{report}");
    let v = report.violations();
    assert!(
        v.is_empty(),
        "{} violations, first: {:?}",
        v.len(),
        &v[..v.len().min(5)]
    );
}

#[test]
fn every_damaged_file_is_recovered_from_or_refused_by_name() {
    let report = datadir::run(&DatadirConfig::default()).expect("campaign");
    assert_clean(&report);
    // The directory has what the campaign is about.
    let count = |kind: &str| {
        report
            .files
            .iter()
            .filter(|(n, _)| datadir::file_kind(n) == kind)
            .count()
    };
    assert!(count("wal") >= 3, "{:?}", report.files);
    assert_eq!(count("ckpt"), 2, "{:?}", report.files);
    assert_eq!(count("snapshot"), 1, "{:?}", report.files);
    assert_eq!(count("MANIFEST"), 1, "{:?}", report.files);
    // Deleting any named segment is refused; every other damage is refused
    // for the segments recovery reads (those before the current checkpoint
    // are read only when a fallback needs them, and their damage loses
    // nothing while the current checkpoint is sound).
    for damage in datadir::DAMAGES {
        let wal: Vec<_> = report
            .cases
            .iter()
            .filter(|c| c.damage == damage && datadir::file_kind(&c.file) == "wal")
            .collect();
        assert!(
            wal.iter().any(|c| c.outcome == Outcome::Refused),
            "{damage}"
        );
        if damage == Damage::Delete {
            assert!(wal.iter().all(|c| c.outcome == Outcome::Refused), "{wal:?}");
        }
    }
    // A damaged current checkpoint is survived through the previous one.
    assert!(report
        .cases
        .iter()
        .any(|c| datadir::file_kind(&c.file) == "ckpt" && c.outcome == Outcome::Intact));
}

/// The same on real files (fewer writes: each case copies a directory).
#[test]
fn the_campaign_on_real_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let report = datadir::run(&DatadirConfig {
        writes: 80,
        segment_bytes: 1024,
        seed: 7,
        real_dir: Some(tmp.path().to_path_buf()),
    })
    .expect("campaign");
    assert_clean(&report);
    assert!(report.cases.len() >= 7 * 6, "{}", report.cases.len());
}
