//! Calendar arithmetic for the date operators: time zones (Olson names
//! through `chrono-tz`, and fixed `±hh[:mm]` offsets), the parts of a date in
//! a zone, `%`-format printing and parsing.
//!
//! Invariants: a date is milliseconds since the epoch (UTC), proleptic
//! Gregorian; a zone only shifts it to local time (`local = utc + offset at
//! that instant`), so every part is computed from the shifted milliseconds
//! with plain integer arithmetic (no range limit beyond i64); converting a
//! local time back to UTC takes the earlier instant of an ambiguous local
//! time and the offset before a gap for a skipped one, as MongoDB's timelib
//! does. Nothing here panics on any i64.

use chrono::{Offset, TimeZone};

/// Milliseconds per day.
pub(super) const DAY_MS: i64 = 86_400_000;

/// `days * DAY_MS + in_day_ms`, computed in i128 and clamped to the i64
/// range, so a calendar computation at the ends of the date range never
/// overflows.
pub(crate) fn at_day(days: i64, in_day_ms: i64) -> i64 {
    let v = i128::from(days) * i128::from(DAY_MS) + i128::from(in_day_ms);
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

/// A time zone.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Tz {
    Utc,
    /// Fixed offset east of UTC, in seconds.
    Fixed(i32),
    Named(chrono_tz::Tz),
}

impl Tz {
    /// MongoDB's accepted forms: an Olson name, `Z`/`UTC`/`GMT`, or an offset
    /// `+hh`, `+hhmm`, `+hh:mm` (either sign).
    pub(crate) fn parse(s: &str) -> Option<Tz> {
        match s {
            "UTC" | "GMT" | "Z" | "utc" => return Some(Tz::Utc),
            _ => {}
        }
        if let Some(rest) = s.strip_prefix('+').or_else(|| s.strip_prefix('-')) {
            let neg = s.starts_with('-');
            let digits: String = rest.chars().filter(|c| *c != ':').collect();
            if !digits.chars().all(|c| c.is_ascii_digit())
                || !(digits.len() == 2 || digits.len() == 4)
                || (rest.contains(':') && rest.len() != 5)
            {
                return None;
            }
            let h: i32 = digits.get(..2)?.parse().ok()?;
            let m: i32 = digits
                .get(2..)
                .filter(|x| !x.is_empty())
                .map_or(Some(0), |x| x.parse().ok())?;
            if m >= 60 {
                return None;
            }
            let secs = h * 3600 + m * 60;
            return Some(Tz::Fixed(if neg { -secs } else { secs }));
        }
        s.parse::<chrono_tz::Tz>().ok().map(Tz::Named)
    }

    /// The offset from UTC in milliseconds at the UTC instant `ms`.
    pub(crate) fn offset_ms(self, ms: i64) -> i64 {
        match self {
            Tz::Utc => 0,
            Tz::Fixed(s) => i64::from(s) * 1000,
            Tz::Named(z) => {
                // chrono's range is ±262,000 years; clamp to it (zone rules
                // are constant that far out anyway).
                let clamped = ms.clamp(-8_000_000_000_000_000, 8_000_000_000_000_000);
                match chrono::DateTime::from_timestamp_millis(clamped) {
                    Some(t) => {
                        i64::from(
                            z.offset_from_utc_datetime(&t.naive_utc())
                                .fix()
                                .local_minus_utc(),
                        ) * 1000
                    }
                    None => 0,
                }
            }
        }
    }

    /// UTC milliseconds → local milliseconds.
    pub(crate) fn to_local(self, ms: i64) -> i64 {
        ms.saturating_add(self.offset_ms(ms))
    }

    /// Local milliseconds → UTC milliseconds (the earlier instant when the
    /// local time is ambiguous; a skipped local time moves forward by the gap).
    pub(crate) fn to_utc(self, local: i64) -> i64 {
        match self {
            Tz::Utc => local,
            Tz::Fixed(s) => local.saturating_sub(i64::from(s) * 1000),
            Tz::Named(_) => {
                // Try the offsets in force a day either side: the first
                // candidate that maps back to `local` is the earlier instant.
                let before = self.offset_ms(local.saturating_sub(DAY_MS));
                let after = self.offset_ms(local.saturating_add(DAY_MS));
                let mut cands = [local.saturating_sub(before), local.saturating_sub(after)];
                cands.sort_unstable();
                for c in cands {
                    if self.to_local(c) == local {
                        return c;
                    }
                }
                local.saturating_sub(before)
            }
        }
    }
}

/// Days since 1970-01-01 → (year, month, day) in the proleptic Gregorian
/// calendar (Howard Hinnant's `civil_from_days`).
pub(crate) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// (year, month 1-12, day 1-31) → days since 1970-01-01.
pub(crate) fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The parts of a local time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Parts {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: i64,
    pub minute: i64,
    pub second: i64,
    pub millis: i64,
    /// 1-366.
    pub day_of_year: i64,
    /// 1 (Sunday) – 7 (Saturday).
    pub day_of_week: i64,
}

impl Parts {
    pub(crate) fn of_local(local: i64) -> Parts {
        let days = local.div_euclid(DAY_MS);
        let in_day = local.rem_euclid(DAY_MS);
        let (year, month, day) = civil_from_days(days);
        Parts {
            year,
            month,
            day,
            hour: in_day / 3_600_000,
            minute: in_day / 60_000 % 60,
            second: in_day / 1000 % 60,
            millis: in_day % 1000,
            day_of_year: days - days_from_civil(year, 1, 1) + 1,
            // 1970-01-01 was a Thursday (5 in 1=Sunday numbering).
            day_of_week: (days + 4).rem_euclid(7) + 1,
        }
    }

    /// ISO day of week: 1 (Monday) – 7 (Sunday).
    pub(crate) fn iso_day_of_week(&self) -> i64 {
        (self.day_of_week + 5) % 7 + 1
    }

    /// Week of the year, weeks starting on Sunday (0-53), as `%U`.
    pub(crate) fn week(&self) -> i64 {
        (self.day_of_year - 1 + 7 - (self.day_of_week - 1)) / 7
    }

    /// (ISO week-numbering year, ISO week 1-53).
    pub(crate) fn iso_week(&self) -> (i64, i64) {
        let wd = self.iso_day_of_week();
        let w = (self.day_of_year - wd + 10) / 7;
        if w < 1 {
            let py = self.year - 1;
            (py, iso_weeks_in(py))
        } else if w > iso_weeks_in(self.year) {
            (self.year + 1, 1)
        } else {
            (self.year, w)
        }
    }
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn iso_weeks_in(y: i64) -> i64 {
    let p = |y: i64| (y + y.div_euclid(4) - y.div_euclid(100) + y.div_euclid(400)).rem_euclid(7);
    if p(y) == 4 || p(y - 1) == 3 {
        53
    } else {
        52
    }
}

/// Days in month `m` of year `y`.
pub(crate) fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if is_leap(y) => 29,
        _ => 28,
    }
}

/// Days since the epoch of the Monday starting ISO week 1 of `iso_year`.
pub(crate) fn iso_year_start(iso_year: i64) -> i64 {
    let jan4 = days_from_civil(iso_year, 1, 4);
    let wd = (jan4 + 3).rem_euclid(7); // 0 = Monday
    jan4 - wd
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Print `ms` (UTC) in `tz` with MongoDB's `%` specifiers. Errors are
/// `(code, message)` of MongoDB's.
pub(crate) fn format_date(ms: i64, format: &str, tz: Option<Tz>) -> Result<String, (i32, String)> {
    let tz = tz.unwrap_or(Tz::Utc);
    let offset_min = tz.offset_ms(ms) / 60_000;
    let p = Parts::of_local(tz.to_local(ms));
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(spec) = chars.next() else {
            return Err((18535, "Unmatched '%' at end of format string".into()));
        };
        let year_range = |y: i64| -> Result<(), (i32, String)> {
            if (0..=9999).contains(&y) {
                Ok(())
            } else {
                Err((
                    18537,
                    format!("Could not convert date to string: date component was outside the supported range of 0-9999: {y}"),
                ))
            }
        };
        match spec {
            'Y' => {
                year_range(p.year)?;
                out.push_str(&format!("{:04}", p.year));
            }
            'G' => {
                let (iy, _) = p.iso_week();
                year_range(iy)?;
                out.push_str(&format!("{iy:04}"));
            }
            'm' => out.push_str(&format!("{:02}", p.month)),
            'd' => out.push_str(&format!("{:02}", p.day)),
            'H' => out.push_str(&format!("{:02}", p.hour)),
            'M' => out.push_str(&format!("{:02}", p.minute)),
            'S' => out.push_str(&format!("{:02}", p.second)),
            'L' => out.push_str(&format!("{:03}", p.millis)),
            'j' => out.push_str(&format!("{:03}", p.day_of_year)),
            'w' => out.push_str(&p.day_of_week.to_string()),
            'u' => out.push_str(&p.iso_day_of_week().to_string()),
            'U' => out.push_str(&format!("{:02}", p.week())),
            'V' => out.push_str(&format!("{:02}", p.iso_week().1)),
            'z' => {
                let sign = if offset_min < 0 { '-' } else { '+' };
                let a = offset_min.abs();
                out.push_str(&format!("{sign}{:02}{:02}", a / 60, a % 60));
            }
            'Z' => out.push_str(&offset_min.to_string()),
            'b' => out.push_str(
                MONTHS
                    .get(p.month as usize - 1)
                    .map_or("", |m| m.get(..3).unwrap_or(m)),
            ),
            'B' => out.push_str(MONTHS.get(p.month as usize - 1).copied().unwrap_or("")),
            '%' => out.push('%'),
            other => {
                return Err((
                    18536,
                    format!("Invalid format character '%{other}' in format string"),
                ))
            }
        }
    }
    Ok(out)
}

/// Fields read while parsing a date string.
#[derive(Default)]
struct Scanned {
    year: Option<i64>,
    month: Option<i64>,
    day: Option<i64>,
    hour: i64,
    minute: i64,
    second: i64,
    millis: i64,
    day_of_year: Option<i64>,
    iso_year: Option<i64>,
    iso_week: Option<i64>,
    iso_dow: Option<i64>,
    offset_ms: Option<i64>,
    zone: Option<Tz>,
}

struct Cursor<'s> {
    s: &'s [u8],
    i: usize,
}

impl Cursor<'_> {
    fn digits(&mut self, min: usize, max: usize) -> Result<i64, String> {
        let start = self.i;
        while self.i < self.s.len() && self.i - start < max && self.s[self.i].is_ascii_digit() {
            self.i += 1;
        }
        if self.i - start < min {
            return Err("Not enough digits".into());
        }
        std::str::from_utf8(&self.s[start..self.i])
            .ok()
            .and_then(|x| x.parse().ok())
            .ok_or_else(|| "Invalid number".to_string())
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn done(&self) -> bool {
        self.i >= self.s.len()
    }

    /// `Z`, `±hh[:]mm`, `±hh`, or an Olson name to the end.
    fn zone(&mut self, sc: &mut Scanned) -> Result<(), String> {
        if self.eat(b'Z') {
            sc.offset_ms = Some(0);
            return Ok(());
        }
        let rest = std::str::from_utf8(&self.s[self.i..]).map_err(|_| "bad zone")?;
        if rest.starts_with('+') || rest.starts_with('-') {
            let neg = rest.starts_with('-');
            self.i += 1;
            let h = self.digits(2, 2)?;
            self.eat(b':');
            let m = if self.done() {
                0
            } else {
                self.digits(2, 2).unwrap_or(0)
            };
            let off = (h * 3600 + m * 60) * 1000;
            sc.offset_ms = Some(if neg { -off } else { off });
            return Ok(());
        }
        let end = rest.find(' ').unwrap_or(rest.len());
        let name = rest.get(..end).unwrap_or("");
        let z = Tz::parse(name).ok_or_else(|| format!("Unknown time zone '{name}'"))?;
        sc.zone = Some(z);
        self.i += end;
        Ok(())
    }
}

/// Parse `s` with a `%` format (or, without one, the ISO-8601 forms MongoDB
/// accepts by default: `2017-02-08`, `2017-02-08T12:10:40.787Z`, with `T` or
/// a space, optional seconds/milliseconds, and an optional zone). `tz` is
/// the zone of a string that names none. Answers UTC milliseconds.
pub(crate) fn parse_date(s: &str, format: Option<&str>, tz: Option<Tz>) -> Result<i64, String> {
    let mut sc = Scanned::default();
    let mut cur = Cursor {
        s: s.as_bytes(),
        i: 0,
    };
    match format {
        Some(f) => scan_format(&mut cur, f, &mut sc)?,
        None => scan_iso(&mut cur, &mut sc)?,
    }
    if !cur.done() {
        return Err("Trailing data".into());
    }
    let days = if let (Some(iy), Some(iw)) = (sc.iso_year, sc.iso_week) {
        iso_year_start(iy) + (iw - 1) * 7 + (sc.iso_dow.unwrap_or(1) - 1)
    } else {
        let year = sc.year.ok_or("Missing year")?;
        if let Some(doy) = sc.day_of_year {
            days_from_civil(year, 1, 1) + doy - 1
        } else {
            let month = sc.month.unwrap_or(1);
            let day = sc.day.unwrap_or(1);
            if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
                return Err("The parsed date was invalid".into());
            }
            days_from_civil(year, month, day)
        }
    };
    if sc.hour > 24 || sc.minute > 59 || sc.second > 60 {
        return Err("The parsed time was invalid".into());
    }
    let local = at_day(
        days,
        sc.hour * 3_600_000 + sc.minute * 60_000 + sc.second * 1000 + sc.millis,
    );
    if (sc.offset_ms.is_some() || sc.zone.is_some()) && tz.is_some() {
        return Err(
                "you cannot pass in a date/time string with time zone information together with a second time zone argument"
                    .into(),
            );
    }
    Ok(match (sc.offset_ms, sc.zone, tz) {
        (Some(off), _, _) => local - off,
        (None, Some(z), _) => z.to_utc(local),
        (None, None, Some(z)) => z.to_utc(local),
        (None, None, None) => local,
    })
}

fn scan_iso(cur: &mut Cursor<'_>, sc: &mut Scanned) -> Result<(), String> {
    let neg = cur.eat(b'-');
    let y = cur.digits(4, 4)?;
    sc.year = Some(if neg { -y } else { y });
    if !cur.eat(b'-') {
        return Err("Missing month".into());
    }
    sc.month = Some(cur.digits(1, 2)?);
    if !cur.eat(b'-') {
        return Err("Missing day".into());
    }
    sc.day = Some(cur.digits(1, 2)?);
    if cur.done() {
        return Ok(());
    }
    if !(cur.eat(b'T') || cur.eat(b' ')) {
        return cur.zone(sc);
    }
    sc.hour = cur.digits(1, 2)?;
    if !cur.eat(b':') {
        return Err("Missing minutes".into());
    }
    sc.minute = cur.digits(2, 2)?;
    if cur.eat(b':') {
        sc.second = cur.digits(2, 2)?;
        if cur.eat(b'.') {
            let start = cur.i;
            let frac = cur.digits(1, 9)?;
            let n = cur.i - start;
            sc.millis = match n {
                1 => frac * 100,
                2 => frac * 10,
                3 => frac,
                _ => frac / 10i64.pow(u32::try_from(n - 3).unwrap_or(0)),
            };
        }
    }
    if cur.done() {
        return Ok(());
    }
    cur.eat(b' ');
    cur.zone(sc)
}

fn scan_format(cur: &mut Cursor<'_>, format: &str, sc: &mut Scanned) -> Result<(), String> {
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                if !cur.eat(b) {
                    return Err(format!("Error parsing date string; expected '{c}'"));
                }
            }
            continue;
        }
        match chars.next() {
            Some('Y') => sc.year = Some(cur.digits(4, 4)?),
            Some('G') => sc.iso_year = Some(cur.digits(4, 4)?),
            Some('m') => sc.month = Some(cur.digits(1, 2)?),
            Some('d') => sc.day = Some(cur.digits(1, 2)?),
            Some('H') => sc.hour = cur.digits(1, 2)?,
            Some('M') => sc.minute = cur.digits(1, 2)?,
            Some('S') => sc.second = cur.digits(1, 2)?,
            Some('L') => sc.millis = cur.digits(1, 3)?,
            Some('j') => sc.day_of_year = Some(cur.digits(1, 3)?),
            Some('V') => sc.iso_week = Some(cur.digits(1, 2)?),
            Some('u') => sc.iso_dow = Some(cur.digits(1, 1)?),
            Some('z') | Some('Z') => cur.zone(sc)?,
            Some('%') => {
                if !cur.eat(b'%') {
                    return Err("expected '%'".into());
                }
            }
            Some(other) => {
                return Err(format!(
                    "Invalid format character '%{other}' in format string"
                ))
            }
            None => return Err("Unmatched '%' at end of format string".into()),
        }
    }
    Ok(())
}
