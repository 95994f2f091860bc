//! TPC-CH: the TPC-C transactions keep TPC-C's consistency conditions and do
//! what they say (NewOrder takes the next order number, Payment moves money),
//! the consistency check catches a broken condition, every query under every
//! strategy equals the reference on a quiesced database after concurrent
//! transactions, and `duet bench tpcch` runs tiny (checking all of that
//! itself) with `report` rendering its section; the same against the
//! PostgreSQL peer where `scripts/peers/postgres.sh` can start a server
//! (skipped, with the reason printed, where it cannot), and an unreachable
//! server skips the `postgres` target without failing the run.

mod common;
use common::{report, result, temp_dir};

use bson::{doc, Bson};
use duet_bench::chbench::{
    self, DeliveryInput, NewOrderInput, OrderStatusInput, PaymentInput, Scale, StockLevelInput,
    TpccRand, TxnEnd, CUSTOMER, DISTRICT, NEW_ORDER, ORDERS, ORDER_LINE, WAREHOUSE,
};
use duet_bench::tpch::{self, Query};
use duetdb::{Database, Strategy, TxnOptions};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn loaded(sf: f64) -> (Database, Scale) {
    let db = Database::in_memory();
    let scale = Scale::new(sf).expect("scale");
    chbench::load(&db, &scale, 5).expect("load");
    (db, scale)
}

fn field(db: &Database, coll: &str, id: i64, f: &str) -> i64 {
    let d = db
        .collection(coll)
        .find_one(doc! {"_id": id})
        .expect("read")
        .expect("document");
    d.get_i64(f).expect("integer field")
}

#[test]
fn transactions_keep_the_consistency_conditions() {
    let (db, scale) = loaded(0.01);
    assert_eq!(
        chbench::check_consistency(&db.snapshot(), &scale).expect("check"),
        Vec::<String>::new()
    );
    let mut rng = StdRng::seed_from_u64(3);
    let k = TpccRand::new(&scale, &mut rng);
    let (mut new_orders, mut rollbacks, mut paid) = (0, 0, 0i64);
    for _ in 0..60 {
        let no = NewOrderInput::random(&scale, &k, &mut rng);
        let next = field(&db, DISTRICT, no.dk as i64, "d_next_o_id");
        let mut tx = db.begin(TxnOptions::default());
        match chbench::new_order(&mut tx, &scale, &no).expect("new order") {
            TxnEnd::Commit => {
                tx.commit().expect("commit");
                new_orders += 1;
                let key = scale.order_key(no.dk, next as u64) as i64;
                assert_eq!(field(&db, DISTRICT, no.dk as i64, "d_next_o_id"), next + 1);
                assert_eq!(field(&db, ORDERS, key, "o_id"), next);
                assert_eq!(field(&db, NEW_ORDER, key, "no_o_id"), next);
            }
            TxnEnd::Rollback => {
                tx.abort();
                rollbacks += 1;
                assert_eq!(field(&db, DISTRICT, no.dk as i64, "d_next_o_id"), next);
            }
        }
        let pay = PaymentInput::random(&scale, &k, &mut rng);
        let before = field(&db, WAREHOUSE, pay.w as i64, "w_ytd_cents");
        db.transaction(|tx| chbench::payment(tx, &pay))
            .expect("payment");
        paid += pay.amount_cents;
        assert_eq!(
            field(&db, WAREHOUSE, pay.w as i64, "w_ytd_cents"),
            before + pay.amount_cents
        );
        let os = OrderStatusInput::random(&scale, &k, &mut rng);
        db.transaction(|tx| chbench::order_status(tx, &os))
            .expect("order status");
        let sl = StockLevelInput::random(&scale, &mut rng);
        let low = db
            .transaction(|tx| chbench::stock_level(tx, &scale, &sl))
            .expect("stock level");
        assert!(
            low <= 20 * 15,
            "{low} distinct items from at most 20 orders"
        );
    }
    assert!(new_orders > 0 && new_orders + rollbacks == 60);
    assert!(paid > 0);

    // Delivery: in each district the oldest undelivered order leaves
    // new_order, gets its carrier and dates, and bills its customer.
    let oldest = |dk: i64| -> i64 {
        let rows = db
            .collection(NEW_ORDER)
            .find(doc! {"no_d_key": dk})
            .run()
            .expect("new_order");
        rows.iter()
            .map(|r| r.get_i64("_id").expect("key"))
            .min_by_key(|k| field(&db, NEW_ORDER, *k, "no_o_id"))
            .expect("an undelivered order")
    };
    let dk0 = scale.district_key(0, 0) as i64;
    let o_key = oldest(dk0);
    let c_key = field(&db, ORDERS, o_key, "o_c_key");
    let balance = field(&db, CUSTOMER, c_key, "c_balance_cents");
    let inp = DeliveryInput { w: 0, carrier: 7 };
    let n = db
        .transaction(|tx| chbench::delivery(tx, &scale, &inp))
        .expect("delivery");
    assert_eq!(n, scale.districts_per_warehouse);
    assert!(db
        .collection(NEW_ORDER)
        .find_one(doc! {"_id": o_key})
        .expect("read")
        .is_none());
    assert_eq!(field(&db, ORDERS, o_key, "o_carrier_id"), 7);
    let amount = field(&db, ORDERS, o_key, "o_delivered_cents");
    assert!(amount > 0);
    assert_eq!(
        field(&db, CUSTOMER, c_key, "c_balance_cents"),
        balance + amount
    );
    let lines = db
        .collection(ORDER_LINE)
        .find(doc! {"ol_o_key": o_key})
        .run()
        .expect("lines");
    assert!(!lines.is_empty() && lines.iter().all(|l| l.get_i64("ol_delivery_day").is_ok()));
    for _ in 0..5 {
        let d = DeliveryInput::random(&scale, &mut rng);
        db.transaction(|tx| chbench::delivery(tx, &scale, &d))
            .expect("delivery");
    }
    assert_eq!(
        chbench::check_consistency(&db.snapshot(), &scale).expect("check"),
        Vec::<String>::new()
    );

    // The check is not vacuous: a district's ytd moved alone breaks condition 1.
    db.collection(DISTRICT)
        .update_one(doc! {"_id": 0i64}, doc! {"$inc": {"d_ytd_cents": 1i64}})
        .expect("tamper");
    let bad = chbench::check_consistency(&db.snapshot(), &scale).expect("check");
    assert!(bad.iter().any(|v| v.contains("w_ytd")), "{bad:?}");
    // … and an order number taken without an order breaks condition 2.
    db.collection(DISTRICT)
        .update_one(doc! {"_id": 1i64}, doc! {"$inc": {"d_next_o_id": 1i64}})
        .expect("tamper");
    let bad = chbench::check_consistency(&db.snapshot(), &scale).expect("check");
    assert!(bad.iter().any(|v| v.contains("d_next_o_id")), "{bad:?}");
    // … and a delivered amount that reached no balance breaks condition 5.
    db.collection(ORDERS)
        .update_one(
            doc! {"_id": o_key},
            doc! {"$inc": {"o_delivered_cents": 1i64}},
        )
        .expect("tamper");
    let bad = chbench::check_consistency(&db.snapshot(), &scale).expect("check");
    assert!(bad.iter().any(|v| v.contains("delivered")), "{bad:?}");
}

#[test]
fn queries_under_every_strategy_equal_the_reference_after_transactions() {
    let (db, scale) = loaded(0.01);
    let q17 = tpch::q17_params_for(&db).expect("q17 params");
    let mut rng = StdRng::seed_from_u64(9);
    let k = TpccRand::new(&scale, &mut rng);
    let q1_at_load = tpch::run_query(&db, Query::Q1, Strategy::Cow, &q17, 1).expect("q1");
    // NewOrders change Q1's and Q17's answers; run them while queries run.
    std::thread::scope(|s| {
        let db = &db;
        let writer = s.spawn(move || {
            let mut rng = StdRng::seed_from_u64(10);
            for _ in 0..40 {
                let no = NewOrderInput::random(&scale, &k, &mut rng);
                let mut tx = db.begin(TxnOptions::default());
                if chbench::new_order(&mut tx, &scale, &no).expect("new order") == TxnEnd::Commit {
                    tx.commit().expect("commit");
                }
            }
        });
        for q in Query::ALL {
            for st in [Strategy::None, Strategy::Vls, Strategy::Olcp, Strategy::Cow] {
                tpch::run_query(db, q, st, &q17, 2).expect("query during updates");
            }
        }
        writer.join().expect("writer");
    });
    let snap = db.snapshot();
    let (items, orders, lines) = tpch::static_copy(&snap).expect("copy");
    let mut q1_changed = false;
    for q in Query::ALL {
        let want = tpch::reference(q, &items, &orders, &lines, &q17);
        for st in [Strategy::None, Strategy::Vls, Strategy::Olcp, Strategy::Cow] {
            let got = tpch::run_query(&db, q, st, &q17, 2).expect("query");
            assert_eq!(got, want, "{} under {st}", q.name());
        }
        if q == Query::Q1 {
            // New lines entered Q1's range: the comparison is not vacuous.
            q1_changed = want != q1_at_load;
        }
    }
    assert!(q1_changed, "NewOrders did not change Q1");
    assert_eq!(
        chbench::check_consistency(&snap, &scale).expect("check"),
        Vec::<String>::new()
    );
    // New orders are entered after the loaded ones.
    let newest = db
        .collection(ORDERS)
        .find(doc! {"o_entry_day": chbench::NEW_ORDER_DAY})
        .run()
        .expect("new orders");
    assert!(!newest.is_empty());
    assert!(newest
        .iter()
        .all(|o| matches!(o.get("o_comment"), Some(Bson::String(s)) if s == "new")));
}

#[test]
fn tpcch_runs_tiny_and_report_renders() {
    let dir = temp_dir("tpcch");
    let out = dir.to_str().expect("utf-8 temp dir");
    let r = result(&[
        "tpcch",
        "--scale",
        "0.01",
        "--seconds",
        "0.3",
        "--threads",
        "2",
        "--analytics",
        "0,1",
        "--strategy",
        "none,vls,olcp,cow",
        "--mix",
        "45,43,4",
        "--verify",
        "--repeat",
        "1",
        "--out",
        out,
        "--quiet",
    ]);
    let t = "duetdb-embedded";
    let base = [("isolation", "si"), ("strategy", "-"), ("analytics", "0")];
    assert!(r.find(t, &base, "tpmC").expect("tpmC").median > 0.0);
    let mut with_txn = base.to_vec();
    with_txn.push(("txn", "payment"));
    assert!(
        r.find(t, &with_txn, "commits_per_s")
            .expect("payment")
            .median
            > 0.0
    );
    for s in ["none", "vls", "olcp", "cow"] {
        let c = [("isolation", "si"), ("strategy", s), ("analytics", "1")];
        assert_eq!(
            r.find(t, &c, "q4_wrong").expect("q4_wrong").median,
            0.0,
            "{s}"
        );
        let mut q = c.to_vec();
        q.push(("query", "Q1"));
        assert!(r.find(t, &q, "queries_completed").expect("Q1 ran").median >= 1.0);
    }
    let text = report(&dir);
    assert!(text.contains("<!-- BEGIN bench:tpcch -->") && text.contains("tpmC"));
    assert!(dir.join("charts/tpcch/tpcch-tpmc.png").exists());
    assert!(dir.join("charts/tpcch/tpcch-query-latency.png").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unreachable_postgres_is_skipped_with_a_note() {
    let dir = temp_dir("tpcch-no-pg");
    let out = dir.to_str().expect("utf-8 temp dir");
    // Port 1 on loopback: nothing listens there, the connection is refused.
    let r = result(&[
        "tpcch",
        "--targets",
        "duet,postgres",
        "--pg",
        "host=127.0.0.1 port=1 user=postgres dbname=postgres connect_timeout=2",
        "--scale",
        "0.01",
        "--seconds",
        "0.1",
        "--analytics",
        "0",
        "--out",
        out,
        "--quiet",
    ]);
    assert!(r
        .find("duetdb-embedded", &[("analytics", "0")], "tpmC")
        .is_some());
    assert!(r.find("postgres", &[], "tpmC").is_none());
    assert!(
        r.notes.iter().any(|n| n.starts_with("postgres: skipped")),
        "{:?}",
        r.notes
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A throw-away PostgreSQL cluster from `scripts/peers/postgres.sh` on a
/// free loopback port and its own data directory, stopped on drop.
#[cfg(feature = "postgres")]
struct PgServer {
    port: u16,
    data: std::path::PathBuf,
}

#[cfg(feature = "postgres")]
impl PgServer {
    fn script() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/peers/postgres.sh")
    }

    fn command(&self, what: &str) -> std::process::Command {
        let mut c = std::process::Command::new("bash");
        c.arg(Self::script())
            .arg(what)
            .env("DUET_PG_PORT", self.port.to_string())
            .env("DUET_PG_DATA", &self.data);
        c
    }

    /// Start one, or the reason it cannot be started here. The script would
    /// install PostgreSQL with apt-get when it is missing; a test does not.
    fn start() -> Result<PgServer, String> {
        let installed = std::fs::read_dir("/usr/lib/postgresql")
            .map(|d| d.flatten().any(|v| v.path().join("bin/initdb").exists()))
            .unwrap_or(false);
        if !installed {
            return Err(
                "PostgreSQL is not installed (scripts/peers/postgres.sh start installs it)".into(),
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let server = PgServer {
            port,
            data: std::env::temp_dir().join(format!("duet-bench-pg-test-{}", std::process::id())),
        };
        let out = server
            .command("start")
            .output()
            .map_err(|e| format!("cannot run the script: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "scripts/peers/postgres.sh start failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(server)
    }

    fn conn(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }
}

#[cfg(feature = "postgres")]
impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = self.command("stop").output();
    }
}

#[cfg(feature = "postgres")]
#[test]
fn tpcch_runs_tiny_against_postgres_and_keeps_its_consistency_conditions() {
    use duet_bench::peers::postgres_tpcch;
    let server = match PgServer::start() {
        Ok(s) => s,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let conn = server.conn();
    let dir = temp_dir("tpcch-pg");
    let out = dir.to_str().expect("utf-8 temp dir");
    let r = result(&[
        "tpcch",
        "--targets",
        "duet,postgres",
        "--pg",
        &conn,
        "--scale",
        "0.01",
        "--seconds",
        "1",
        "--threads",
        "2",
        "--analytics",
        "0,1",
        "--strategy",
        "olcp,cow",
        "--verify",
        "--repeat",
        "1",
        "--out",
        out,
        "--quiet",
    ]);
    // Side by side: both targets have every cell; PostgreSQL one per K.
    // (How many transactions a cell commits depends on the machine's load:
    // only "some" is asserted, over both cells.)
    let base = [("isolation", "si"), ("strategy", "-"), ("analytics", "0")];
    for t in ["duetdb-embedded", "postgres"] {
        assert!(r.find(t, &base, "tpmC").is_some(), "{t}");
        assert!(r.find(t, &base, "aborts").is_some(), "{t}");
        let committed: f64 = r
            .figures
            .iter()
            .filter(|f| f.target == t && f.metric == "txn_per_s")
            .map(|f| f.median)
            .sum();
        assert!(committed > 0.0, "{t} committed nothing");
    }
    let native = [
        ("isolation", "si"),
        ("strategy", "native"),
        ("analytics", "1"),
    ];
    assert_eq!(
        r.find("postgres", &native, "q4_wrong")
            .expect("q4_wrong")
            .median,
        0.0
    );
    let mut q1 = native.to_vec();
    q1.push(("query", "Q1"));
    assert!(
        r.find("postgres", &q1, "queries_completed")
            .expect("Q1 ran")
            .median
            >= 1.0
    );
    assert!(r.find("postgres", &q1, "query_ms_p99").is_some());
    assert!(r
        .find("postgres", &[("strategy", "olcp")], "tpmC")
        .is_none());
    let text = report(&dir);
    assert!(text.contains("| postgres |"), "{text}");

    // The run checked the conditions itself; they hold on what it left …
    let scale = Scale::new(0.01).expect("scale");
    let mut c = postgres_tpcch::connect(&conn).expect("connect");
    assert_eq!(
        postgres_tpcch::check_consistency(&mut c, &scale).expect("check"),
        Vec::<String>::new()
    );
    let written: i64 = c
        .query_one(
            "SELECT (SELECT count(*) FROM history) \
             + (SELECT count(*) FROM orders WHERE o_comment = 'new') \
             + (SELECT count(*) FROM orders WHERE o_delivered_cents IS NOT NULL)",
            &[],
        )
        .expect("written")
        .get(0);
    assert!(written > 0, "no Payment, NewOrder or Delivery committed");
    // … and the SQL check is not vacuous: a district's ytd moved alone
    // breaks condition 1, an order number taken without an order condition
    // 2, and an amount delivered to nobody condition 5.
    c.batch_execute("UPDATE district SET d_ytd_cents = d_ytd_cents + 1 WHERE id = 0")
        .expect("tamper");
    let bad = postgres_tpcch::check_consistency(&mut c, &scale).expect("check");
    assert!(bad.iter().any(|v| v.contains("w_ytd")), "{bad:?}");
    c.batch_execute("UPDATE district SET d_next_o_id = d_next_o_id + 1 WHERE id = 1")
        .expect("tamper");
    let bad = postgres_tpcch::check_consistency(&mut c, &scale).expect("check");
    assert!(bad.iter().any(|v| v.contains("d_next_o_id")), "{bad:?}");
    c.batch_execute(
        "UPDATE orders SET o_delivered_cents = 1 WHERE id = (SELECT min(id) FROM new_order)",
    )
    .expect("tamper");
    let bad = postgres_tpcch::check_consistency(&mut c, &scale).expect("check");
    assert!(bad.iter().any(|v| v.contains("delivered")), "{bad:?}");
    drop(c);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
