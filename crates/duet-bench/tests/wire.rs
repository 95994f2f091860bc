//! The wire target against a `duet serve` spawned in process (`--uri self`):
//! a tiny run of every wire-capable workload beside the embedded target, exact
//! counts over the wire under every strategy while updates run, and the clear
//! refusal of `space` on targets that are not duetdb (`space --targets wire`
//! is in `wire_space.rs`). Nothing here asserts performance.

mod common;
use common::{metric, parse, report, result, temp_dir};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use duet_bench::targets::HtapTarget;
use duet_bench::wire::{WireSpec, WireTarget};
use duetdb::Strategy;

#[test]
fn ycsb_runs_embedded_and_over_the_wire_at_several_thread_counts() {
    let dir = temp_dir("wire-ycsb");
    let y = result(&[
        "ycsb",
        "--targets",
        "duet,wire",
        "--uri",
        "self",
        "--records",
        "200",
        "--operations",
        "120",
        "--thread-counts",
        "1,3",
        "--repeat",
        "1",
        "--field-length",
        "10",
        "--out",
        dir.to_str().expect("utf-8"),
        "--quiet",
    ]);
    for target in ["duetdb-embedded", "duetdb-wire"] {
        for threads in ["1", "3"] {
            for w in ["A", "B", "C", "D", "E", "F"] {
                let c = [("threads", threads), ("workload", w)];
                assert!(metric(&y, target, &c, "ops_per_s") > 0.0, "{target} {c:?}");
            }
            let e = [("threads", threads), ("workload", "E")];
            assert!(metric(&y, target, &e, "scan_latency_us_p99") > 0.0);
        }
    }
    // Every read and update of A–C, E and F found its record, over the wire
    // too. D is left out: with several threads its "latest" reads may pick a
    // key another thread has not finished inserting (gen.rs `KeySequence`),
    // which the harness counts and notes by design.
    assert!(
        !y.notes
            .iter()
            .any(|n| n.contains("found no record") && !n.contains("workload D")),
        "{:?}",
        y.notes
    );
    let wire_note = y
        .notes
        .iter()
        .find(|n| n.starts_with("duetdb-wire:"))
        .expect("the wire target is described");
    assert!(wire_note.contains("spawned in this process"), "{wire_note}");
    assert!(wire_note.contains("in-memory"), "{wire_note}");
    assert_eq!(y.params["threads"], serde_json::json!([1, 3]));
    // The report draws one series per target and thread count.
    let text = report(&dir);
    assert!(text.contains("| duetdb-wire | 3 | A |"), "{text}");
    let png = dir.join("charts").join("ycsb/ycsb-throughput.png");
    assert!(std::fs::metadata(&png).map_or(0, |m| m.len()) > 1000);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn htap_runs_over_the_wire_with_exact_counts_and_remset_peaks() {
    let dir = temp_dir("wire-htap");
    let h = result(&[
        "htap",
        "--targets",
        "wire",
        "--records",
        "2000",
        "--seconds",
        "0.2",
        "--repeat",
        "1",
        "--analytics",
        "0,2",
        "--scans",
        "full,idx5",
        "--strategy",
        "none,cow,vls,olcp",
        "--out",
        dir.to_str().expect("utf-8"),
        "--quiet",
    ]);
    for st in ["none", "cow", "vls", "olcp"] {
        let c = [("strategy", st), ("analytics", "2"), ("scan", "full")];
        assert!(
            metric(&h, "duetdb-wire", &c, "update_ops_per_s") > 0.0,
            "{st}"
        );
        assert!(
            metric(&h, "duetdb-wire", &c, "scans_completed") >= 2.0,
            "{st}"
        );
        assert!(
            metric(&h, "duetdb-wire", &c, "scan_ms_median") > 0.0,
            "{st}"
        );
        // Taken over the wire from serverStatus (exact per cell when spawned).
        assert!(metric(&h, "duetdb-wire", &c, "remset_entries_peak") >= 0.0);
        assert!(metric(&h, "duetdb-wire", &c, "rss_mb_peak") > 0.0);
    }
    assert!(
        !h.notes.iter().any(|n| n.contains("wrong count")),
        "{:?}",
        h.notes
    );
    assert!(h
        .notes
        .iter()
        .any(|n| n.contains("vls over the wire (`count` with `$duet")));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The check the htap workload relies on, made directly: while updates
/// stream through one connection, every count through another is exact
/// (updates never change `b` or `v`, so the answer is known).
#[test]
fn counts_over_the_wire_are_exact_while_updates_run() {
    let t = WireTarget::connect(&WireSpec::Spawn { durable: false }).expect("spawned server");
    assert!(t.is_duet());
    let records = 600;
    t.load(records).expect("load");
    let stop = AtomicBool::new(false);
    let updates = AtomicU64::new(0);
    std::thread::scope(|s| {
        let updater = s.spawn(|| {
            let mut sess = t.session().expect("session");
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                sess.update((i * 7919) % records, &duet_bench::targets::htap_payload(i))
                    .expect("update");
                updates.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        });
        let mut sess = t.session().expect("session");
        // Five rounds at least, and on until updates ran beside them (the
        // updater's own connection may take a while on a loaded machine).
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut rounds = 0;
        while rounds < 5
            || (updates.load(Ordering::Relaxed) < 10 && std::time::Instant::now() < give_up)
        {
            for st in [Strategy::None, Strategy::Cow, Strategy::Vls, Strategy::Olcp] {
                assert_eq!(sess.full_scan_count(st).expect("count"), records, "{st:?}");
                assert_eq!(sess.range_count(100, 160, st).expect("range"), 60, "{st:?}");
            }
            rounds += 1;
        }
        stop.store(true, Ordering::Relaxed);
        updater.join().expect("updater");
    });
    assert!(updates.load(Ordering::Relaxed) > 0);
}

#[test]
fn snapshot_runs_over_the_wire_and_space_refuses_other_targets() {
    let dir = temp_dir("wire-snapshot");
    let out = dir.to_str().expect("utf-8");
    let s = result(&[
        "snapshot",
        "--targets",
        "wire",
        "--sizes-mb",
        "1,2",
        "--rewrite-pct",
        "10",
        "--first-writes",
        "20",
        "--out",
        out,
        "--quiet",
    ]);
    let create = [("data_mb", "2"), ("what", "create")];
    assert!(metric(&s, "duetdb-wire", &create, "create_snapshot_us_median") > 0.0);
    assert!(metric(&s, "duetdb-wire", &create, "drop_snapshot_us_median") > 0.0);
    assert!(metric(&s, "duetdb-wire", &create, "ping_us_median") > 0.0);
    let rewrite = [("data_mb", "2"), ("what", "rewrite_10pct")];
    let rewritten = metric(&s, "duetdb-wire", &rewrite, "rewritten_mb");
    let retained = metric(&s, "duetdb-wire", &rewrite, "retained_mb");
    // The held snapshot keeps about the old versions of the rewritten documents.
    assert!(
        retained >= rewritten * 0.5 && retained <= rewritten * 3.0,
        "retained {retained} MiB for {rewritten} MiB rewritten"
    );
    assert!(
        s.find("duetdb-embedded", &create, "fork_ms_median")
            .is_none(),
        "only the wire target was asked for"
    );

    let err = duet_bench::run(parse(&[
        "space",
        "--targets",
        "duet,sqlite",
        "--records",
        "100",
        "--out",
        out,
        "--quiet",
    ]))
    .expect_err("space on sqlite is refused");
    assert!(err.to_string().contains("space runs on duet"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
