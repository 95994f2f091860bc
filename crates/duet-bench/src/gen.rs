//! YCSB's request generators, ported faithfully from YCSB's `core.generator`
//! package: `ZipfianGenerator` (Gray et al., "Quickly generating billion-record
//! synthetic databases", with incremental zeta), `ScrambledZipfianGenerator`
//! (zipfian over 10^10 items with the precomputed zeta, FNV-hashed into the key
//! space so popular items are spread out), `SkewedLatestGenerator` (zipfian
//! distance back from the newest inserted key), uniform, and the FNV-1a 64-bit
//! hash YCSB uses for key names.

use std::sync::atomic::{AtomicU64, Ordering};

use rand::Rng;

/// YCSB's default zipfian constant.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;
/// Items of the scrambled zipfian's underlying generator (YCSB's `ITEM_COUNT`).
pub const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;
/// zeta(10^10, 0.99), precomputed by YCSB (`ScrambledZipfianGenerator.ZETAN`).
pub const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

const FNV_OFFSET_BASIS_64: u64 = 0xCBF2_9CE4_8422_2325;
const FNV_PRIME_64: u64 = 1_099_511_628_211;

/// YCSB's `Utils.fnvhash64`: FNV over the 8 little-end octets, then `Math.abs`.
pub fn fnvhash64(mut val: u64) -> u64 {
    let mut hash = FNV_OFFSET_BASIS_64;
    for _ in 0..8 {
        let octet = val & 0xff;
        val >>= 8;
        hash ^= octet;
        hash = hash.wrapping_mul(FNV_PRIME_64);
    }
    (hash as i64).wrapping_abs() as u64
}

/// YCSB's `CoreWorkload.buildKeyName` with `insertorder=hashed`, zero padding 1.
pub fn key_name(keynum: u64) -> String {
    format!("user{}", fnvhash64(keynum))
}

fn zeta(start: u64, n: u64, theta: f64, initial: f64) -> f64 {
    let mut sum = initial;
    for i in start..n {
        sum += 1.0 / ((i + 1) as f64).powf(theta);
    }
    sum
}

/// Zipfian over `[base, base + items)`; item `base` is the most popular.
#[derive(Debug, Clone)]
pub struct Zipfian {
    items: u64,
    base: u64,
    theta: f64,
    zeta2theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    count_for_zeta: u64,
}

impl Zipfian {
    pub fn new(min: u64, max: u64) -> Zipfian {
        let items = max - min + 1;
        let zetan = zeta(0, items, ZIPFIAN_CONSTANT, 0.0);
        Zipfian::with_zetan(min, max, ZIPFIAN_CONSTANT, zetan)
    }

    pub fn with_zetan(min: u64, max: u64, constant: f64, zetan: f64) -> Zipfian {
        let items = max - min + 1;
        let theta = constant;
        let zeta2theta = zeta(0, 2, theta, 0.0);
        let alpha = 1.0 / (1.0 - theta);
        let eta = (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2theta / zetan);
        Zipfian {
            items,
            base: min,
            theta,
            zeta2theta,
            alpha,
            zetan,
            eta,
            count_for_zeta: items,
        }
    }

    /// YCSB's `nextLong(itemcount)`: grows zeta incrementally when the item
    /// count grew (used by the latest distribution). Shrinking recomputes.
    pub fn next_of(&mut self, items: u64, rng: &mut impl Rng) -> u64 {
        if items != self.count_for_zeta {
            self.zetan = if items > self.count_for_zeta {
                zeta(self.count_for_zeta, items, self.theta, self.zetan)
            } else {
                zeta(0, items, self.theta, 0.0)
            };
            self.count_for_zeta = items;
            self.eta = (1.0 - (2.0 / items as f64).powf(1.0 - self.theta))
                / (1.0 - self.zeta2theta / self.zetan);
        }
        let u: f64 = rng.gen();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return self.base + 1;
        }
        self.base + (items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64
    }

    pub fn next(&mut self, rng: &mut impl Rng) -> u64 {
        self.next_of(self.items, rng)
    }
}

/// Zipfian popularity scattered over `[min, max]` by FNV hashing.
#[derive(Debug, Clone)]
pub struct ScrambledZipfian {
    min: u64,
    items: u64,
    gen: Zipfian,
}

impl ScrambledZipfian {
    pub fn new(min: u64, max: u64) -> ScrambledZipfian {
        ScrambledZipfian {
            min,
            items: max - min + 1,
            gen: Zipfian::with_zetan(0, SCRAMBLED_ITEM_COUNT, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN),
        }
    }

    pub fn next(&mut self, rng: &mut impl Rng) -> u64 {
        self.min + fnvhash64(self.gen.next(rng)) % self.items
    }
}

/// The insert key sequence shared by all client threads. YCSB uses an
/// acknowledged counter so readers never choose a key still being inserted;
/// here `acknowledged` is the highest finished insert (fetch_max), which can run
/// ahead of a slower thread's insert by a few keys: such a read may miss and is
/// counted as `read_not_found`, never as an error.
#[derive(Debug)]
pub struct KeySequence {
    next: AtomicU64,
    acknowledged: AtomicU64,
}

impl KeySequence {
    /// Keys `0..records` are loaded.
    pub fn new(records: u64) -> KeySequence {
        KeySequence {
            next: AtomicU64::new(records),
            acknowledged: AtomicU64::new(records.saturating_sub(1)),
        }
    }
    pub fn next_insert(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
    pub fn acknowledge(&self, keynum: u64) {
        self.acknowledged.fetch_max(keynum, Ordering::Relaxed);
    }
    pub fn last(&self) -> u64 {
        self.acknowledged.load(Ordering::Relaxed)
    }
}

/// How request keys are chosen (YCSB's `requestdistribution`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Distribution {
    Uniform,
    Zipfian,
    Latest,
}

/// One thread's key chooser (YCSB's `CoreWorkload.nextKeynum`).
pub enum KeyChooser {
    Uniform { records: u64 },
    Zipfian(ScrambledZipfian),
    Latest(Zipfian),
}

impl KeyChooser {
    /// `expected_new_keys` widens the zipfian range as YCSB does
    /// (`operationcount * insertproportion * 2`).
    pub fn new(dist: Distribution, records: u64, expected_new_keys: u64) -> KeyChooser {
        match dist {
            Distribution::Uniform => KeyChooser::Uniform { records },
            Distribution::Zipfian => KeyChooser::Zipfian(ScrambledZipfian::new(
                0,
                (records + expected_new_keys).max(1) - 1,
            )),
            Distribution::Latest => KeyChooser::Latest(Zipfian::new(0, records.max(1) - 1)),
        }
    }

    pub fn next(&mut self, seq: &KeySequence, rng: &mut impl Rng) -> u64 {
        let last = seq.last();
        match self {
            KeyChooser::Uniform { .. } => rng.gen_range(0..=last),
            KeyChooser::Zipfian(z) => loop {
                let k = z.next(rng);
                if k <= last {
                    return k;
                }
            },
            KeyChooser::Latest(z) => {
                let back = z.next_of(last + 1, rng);
                last.saturating_sub(back)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn fnv_matches_ycsb() {
        // Value of the same algorithm as YCSB's Utils.fnvhash64 (Java long arithmetic) in Python.
        assert_eq!(fnvhash64(0), 6_284_781_860_667_377_211);
        assert_eq!(key_name(0), "user6284781860667377211");
    }

    #[test]
    fn zipfian_is_skewed_and_in_range() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut z = Zipfian::new(0, 999);
        let mut hits = [0u32; 1000];
        for _ in 0..100_000 {
            let k = z.next(&mut rng);
            assert!(k < 1000);
            hits[k as usize] += 1;
        }
        // Item 0 is the most popular by far; the tail is thin.
        assert!(hits[0] > 10 * hits[500].max(1), "{} {}", hits[0], hits[500]);
        let mut s = ScrambledZipfian::new(10, 19);
        for _ in 0..1000 {
            assert!((10..=19).contains(&s.next(&mut rng)));
        }
    }

    #[test]
    fn latest_prefers_recent_keys() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let seq = KeySequence::new(1000);
        let mut c = KeyChooser::new(Distribution::Latest, 1000, 0);
        let recent = (0..10_000)
            .filter(|_| c.next(&seq, &mut rng) >= 990)
            .count();
        assert!(recent > 3000, "{recent}");
    }
}
