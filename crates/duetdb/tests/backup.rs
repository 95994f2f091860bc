//! Hot backup (`Engine::backup_to`): a copy taken while a write stream runs
//! opens as a data directory holding exactly each database's state at the
//! csn the backup reports.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use duetdb::bson::doc;
use duetdb::Engine;

#[test]
fn backup_under_a_write_stream_restores_the_state_at_its_csn() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let to = tmp.path().join("backup");
    let engine = Engine::open(&data).expect("open");
    let shop = engine.database("shop").expect("shop");
    let other = engine.database("other").expect("other");
    other
        .collection("o")
        .insert_one(doc! {"_id": 1})
        .expect("insert");
    // One update_many sets both documents: a torn copy would show.
    let acc = shop.collection("acc");
    acc.insert_one(doc! {"_id": "a", "v": 0}).expect("insert");
    acc.insert_one(doc! {"_id": "b", "v": 0}).expect("insert");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (shop, stop) = (shop.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0i64;
            while !stop.load(Ordering::Relaxed) {
                shop.collection("log")
                    .insert_one(doc! {"_id": i})
                    .expect("insert");
                shop.collection("acc")
                    .update_many(doc! {}, doc! {"$set": {"last": i}})
                    .expect("update");
                i += 1;
            }
            i
        })
    };
    while shop.collection("log").count(doc! {}).expect("count") < 50 {
        std::thread::yield_now();
    }
    let info = engine.backup_to(&to, |_, _| {}).expect("backup");
    std::thread::sleep(std::time::Duration::from_millis(20));
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().expect("writer");
    let live_logs = shop.collection("log").count(doc! {}).expect("count");
    assert_eq!(live_logs, written as u64);
    drop((shop, other, acc));
    drop(engine);

    assert_eq!(
        info.databases
            .iter()
            .map(|b| b.name.as_str())
            .collect::<Vec<_>>(),
        ["other", "shop"]
    );
    let listing = std::fs::read_to_string(to.join("BACKUP")).expect("BACKUP");
    assert_eq!(listing.lines().count(), 2);

    let restored = Engine::open(&to).expect("open the backup");
    let shop = restored.get("shop").expect("get").expect("shop restored");
    let csn = info.databases[1].csn;
    assert_eq!(shop.stats().csn, csn);
    // Each log insert and each update is one commit: the copy is a prefix
    // of the stream with no gap, and both accounts saw the same last update.
    let logs = shop.collection("log").count(doc! {}).expect("count");
    assert!(logs >= 50 && logs < live_logs, "{logs} of {live_logs}");
    let ids = shop
        .collection("log")
        .distinct("_id", doc! {})
        .expect("distinct");
    assert_eq!(ids.len() as u64, logs);
    assert_eq!(
        shop.collection("log")
            .count(doc! {"_id": {"$gte": logs as i64}})
            .expect("count"),
        0
    );
    let accs = shop.collection("acc").find(doc! {}).run().expect("find");
    assert_eq!(accs.len(), 2);
    assert_eq!(accs[0].get("last"), accs[1].get("last"));
    assert_eq!(
        restored
            .get("other")
            .expect("get")
            .expect("other")
            .collection("o")
            .count(doc! {})
            .expect("count"),
        1
    );
    // The restored directory is a normal data directory: it takes writes.
    shop.collection("log")
        .insert_one(doc! {"_id": -1})
        .expect("write after restore");
}

#[test]
fn backup_refuses_a_non_empty_directory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let engine = Engine::open(tmp.path().join("data")).expect("open");
    engine
        .database("d")
        .expect("d")
        .collection("c")
        .insert_one(doc! {})
        .expect("insert");
    let to = tmp.path().join("b");
    std::fs::create_dir(&to).expect("mkdir");
    std::fs::write(to.join("x"), b"keep").expect("write");
    assert!(engine.backup_to(&to, |_, _| {}).is_err());
    assert_eq!(std::fs::read(to.join("x")).expect("read"), b"keep");
}
