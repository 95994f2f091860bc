//! Date operators: the parts (`$year` ... `$isoDayOfWeek`, either
//! `{$year: <date>}` or `{$year: {date, timezone}}`), `$dateToString`,
//! `$dateFromString`, `$dateToParts`, `$dateFromParts`, `$dateTrunc`,
//! `$dateAdd`, `$dateSubtract`, `$dateDiff`.
//!
//! Invariants: a date argument may be a date, a timestamp or an ObjectId (by
//! its embedded time), anything else is 16006 (the named ones: their own
//! codes); a null or missing argument (date, timezone, unit, amount) gives
//! null; a `timezone` is an Olson name or a UTC offset (40485 otherwise), and
//! every calendar computation happens in local time (`datefmt.rs`), so
//! `$dateTrunc` to a day, `$dateAdd` of days and `$dateDiff` in days follow
//! the zone's midnights across DST changes.

use bson::{doc, Bson};

use crate::error::{Error, Result};
use crate::query::expr::datefmt::{
    at_day, days_from_civil, days_in_month, format_date, iso_year_start, parse_date, Parts, Tz,
    DAY_MS,
};
use crate::query::expr::eval::{null, Args};
use crate::query::expr::{is_nullish, num_of, type_name, Named, Num, Value};

/// The milliseconds of a date-like value, or `None` for another type.
fn millis_of(b: &Bson) -> Option<i64> {
    match b {
        Bson::DateTime(d) => Some(d.timestamp_millis()),
        Bson::Timestamp(t) => Some(i64::from(t.time) * 1000),
        Bson::ObjectId(o) => Some(o.timestamp().timestamp_millis()),
        _ => None,
    }
}

/// The `timezone` argument: `Ok(None)` when it evaluates to null (the answer
/// is then null); UTC when not given.
fn timezone(a: &Args<'_, '_>) -> Result<Option<Tz>> {
    if !a.given("timezone") {
        return Ok(Some(Tz::Utc));
    }
    match a.get("timezone")? {
        v if is_nullish(&v) => Ok(None),
        Some(Bson::String(s)) => Tz::parse(&s)
            .map(Some)
            .ok_or_else(|| loc!(40485, "unrecognized time zone identifier: \"{s}\"")),
        other => Err(loc!(
            40517,
            "timezone must evaluate to a string, found {}",
            type_name(&other)
        )),
    }
}

/// Parse a date string in MongoDB's default forms (for `$toDate`).
pub(crate) fn parse_date_string(
    s: &str,
    format: Option<&str>,
    tz: Option<Tz>,
) -> std::result::Result<i64, String> {
    parse_date(s, format, tz)
}

fn int(v: i64) -> Bson {
    Bson::Int32(i32::try_from(v).unwrap_or(i32::MAX))
}

fn date(ms: i64) -> Value {
    Some(Bson::DateTime(bson::DateTime::from_millis(ms)))
}

/// Evaluate a named-argument date operator.
pub(super) fn named(a: &Args<'_, '_>) -> Result<Value> {
    use Named::*;
    match a.n {
        DateToString => date_to_string(a),
        DateFromString => date_from_string(a),
        DateToParts => date_to_parts(a),
        DateFromParts => date_from_parts(a),
        DateTrunc => date_trunc(a),
        DateAdd | DateSubtract => date_add(a),
        DateDiff => date_diff(a),
        _ => date_part(a),
    }
}

fn date_part(a: &Args<'_, '_>) -> Result<Value> {
    use Named::*;
    let d = a.get("date")?;
    if is_nullish(&d) {
        return null();
    }
    let Some(ms) = d.as_ref().and_then(millis_of) else {
        return Err(loc!(
            16006,
            "can't convert from BSON type {} to Date",
            type_name(&d)
        ));
    };
    let Some(tz) = timezone(a)? else {
        return null();
    };
    let p = Parts::of_local(tz.to_local(ms));
    let v = match a.n {
        Year => p.year,
        Month => i64::from(p.month),
        DayOfMonth => i64::from(p.day),
        DayOfWeek => p.day_of_week,
        DayOfYear => p.day_of_year,
        Hour => p.hour,
        Minute => p.minute,
        Second => p.second,
        Millisecond => p.millis,
        Week => p.week(),
        IsoWeek => p.iso_week().1,
        IsoWeekYear => p.iso_week().0,
        IsoDayOfWeek => p.iso_day_of_week(),
        other => {
            return Err(Error::Internal(format!(
                "{} is not a date part",
                other.name()
            )))
        }
    };
    Ok(Some(if a.n == IsoWeekYear {
        Bson::Int64(v)
    } else {
        int(v)
    }))
}

fn date_to_string(a: &Args<'_, '_>) -> Result<Value> {
    let format = if a.given("format") {
        match a.get("format")? {
            v if is_nullish(&v) => return null(),
            Some(Bson::String(f)) => Some(f),
            other => {
                return Err(loc!(
                    18533,
                    "$dateToString requires that 'format' be a string, found: {} with value {}",
                    type_name(&other),
                    crate::error::render(other.as_ref().unwrap_or(&Bson::Null))
                ))
            }
        }
    } else {
        None
    };
    let Some(tz) = timezone(a)? else {
        return null();
    };
    let d = a.get("date")?;
    if is_nullish(&d) {
        return if a.given("onNull") {
            a.get("onNull")
        } else {
            null()
        };
    }
    let Some(ms) = d.as_ref().and_then(millis_of) else {
        return Err(loc!(
            16006,
            "can't convert from BSON type {} to Date",
            type_name(&d)
        ));
    };
    let format = format.unwrap_or_else(|| {
        if a.given("timezone") {
            "%Y-%m-%dT%H:%M:%S.%L".into()
        } else {
            "%Y-%m-%dT%H:%M:%S.%LZ".into()
        }
    });
    match format_date(ms, &format, Some(tz)) {
        Ok(s) => Ok(Some(Bson::String(s))),
        Err((code, msg)) => Err(coded(code, msg)),
    }
}

fn coded(code: i32, msg: String) -> Error {
    match code {
        18535 => loc!(18535, "{msg}"),
        18536 => loc!(18536, "{msg}"),
        18537 => loc!(18537, "{msg}"),
        _ => Error::bad_value(msg),
    }
}

fn date_from_string(a: &Args<'_, '_>) -> Result<Value> {
    let s = a.get("dateString")?;
    let format = match a.get("format")? {
        v if is_nullish(&v) && a.given("format") => return null(),
        None => None,
        Some(Bson::String(f)) => Some(f),
        Some(other) => {
            return Err(loc!(
                40684,
                "$dateFromString requires that 'format' be a string, found: {} with value {}",
                crate::doc::types::type_name(&other),
                crate::error::render(&other)
            ))
        }
    };
    let tz = if a.given("timezone") {
        match timezone(a)? {
            Some(z) => Some(z),
            None => return null(),
        }
    } else {
        None
    };
    if is_nullish(&s) {
        return if a.given("onNull") {
            a.get("onNull")
        } else {
            null()
        };
    }
    let fail = |msg: String| -> Result<Value> {
        if a.given("onError") {
            a.get("onError")
        } else {
            Err(Error::Coded {
                code: 241,
                name: "ConversionFailure",
                msg,
            })
        }
    };
    let Some(Bson::String(s)) = s else {
        return fail(format!(
            "$dateFromString requires that 'dateString' be a string, found: {} with value {}",
            type_name(&s),
            crate::error::render(s.as_ref().unwrap_or(&Bson::Null))
        ));
    };
    match parse_date(&s, format.as_deref(), tz) {
        Ok(ms) => Ok(date(ms)),
        Err(e) => fail(format!("Error parsing date string '{s}'; {e}")),
    }
}

fn date_to_parts(a: &Args<'_, '_>) -> Result<Value> {
    let d = a.get("date")?;
    let Some(tz) = timezone(a)? else {
        return null();
    };
    let iso = match a.get("iso8601")? {
        None => false,
        Some(Bson::Boolean(b)) => b,
        v if is_nullish(&v) => return null(),
        Some(other) => {
            return Err(loc!(
                40521,
                "iso8601 must evaluate to a bool, found {}",
                crate::doc::types::type_name(&other)
            ))
        }
    };
    if is_nullish(&d) {
        return null();
    }
    let Some(ms) = d.as_ref().and_then(millis_of) else {
        return Err(loc!(
            16006,
            "can't convert from BSON type {} to Date",
            type_name(&d)
        ));
    };
    let p = Parts::of_local(tz.to_local(ms));
    Ok(Some(Bson::Document(if iso {
        let (iy, iw) = p.iso_week();
        doc! {
            "isoWeekYear": int(iy), "isoWeek": int(iw), "isoDayOfWeek": int(p.iso_day_of_week()),
            "hour": int(p.hour), "minute": int(p.minute), "second": int(p.second),
            "millisecond": int(p.millis),
        }
    } else {
        doc! {
            "year": int(p.year), "month": int(i64::from(p.month)), "day": int(i64::from(p.day)),
            "hour": int(p.hour), "minute": int(p.minute), "second": int(p.second),
            "millisecond": int(p.millis),
        }
    })))
}

fn date_from_parts(a: &Args<'_, '_>) -> Result<Value> {
    let iso = a.given("isoWeekYear");
    if iso && (a.given("year") || a.given("month") || a.given("day")) {
        return Err(loc!(
            40489,
            "$dateFromParts does not allow mixing natural dates with ISO dates"
        ));
    }
    if !iso && !a.given("year") {
        return Err(loc!(
            40516,
            "$dateFromParts requires either 'year' or 'isoWeekYear' to be present"
        ));
    }
    if !iso && (a.given("isoWeek") || a.given("isoDayOfWeek")) {
        return Err(loc!(
            40525,
            "$dateFromParts does not allow mixing natural dates with ISO dates"
        ));
    }
    // Each part: `None` when null (the answer is then null).
    let part = |key: &str, dflt: i64, lo: i64, hi: i64| -> Result<Option<i64>> {
        if !a.given(key) {
            return Ok(Some(dflt));
        }
        let v = a.get(key)?;
        if is_nullish(&v) {
            return Ok(None);
        }
        let n = match v.as_ref().and_then(num_of) {
            Some(Num::I32(i)) => i64::from(i),
            Some(Num::I64(i)) => i,
            Some(Num::F64(f)) if f.fract() == 0.0 && f.abs() < 9e15 => f as i64,
            _ => match &v {
                Some(Bson::Decimal128(d)) => {
                    let f = crate::doc::value::decimal_to_f64(*d);
                    if f.fract() == 0.0 && f.abs() < 9e15 {
                        f as i64
                    } else {
                        return Err(loc!(
                            40515,
                            "'{key}' must evaluate to an integer, found {}",
                            type_name(&v)
                        ));
                    }
                }
                _ => {
                    return Err(loc!(
                        40515,
                        "'{key}' must evaluate to an integer, found {} with value {}",
                        type_name(&v),
                        crate::error::render(v.as_ref().unwrap_or(&Bson::Null))
                    ))
                }
            },
        };
        if n < lo || n > hi {
            return Err(if lo == 1 {
                loc!(
                    40523,
                    "'{key}' must evaluate to an integer in the range {lo} to {hi}, found {n}"
                )
            } else {
                loc!(31034, "'{key}' must evaluate to a value in the range [{lo}, {hi}]; value {n} is not in range")
            });
        }
        Ok(Some(n))
    };
    let small = (-32_768, 32_767);
    let hour = part("hour", 0, small.0, small.1)?;
    let minute = part("minute", 0, small.0, small.1)?;
    let second = part("second", 0, small.0, small.1)?;
    let millis = part("millisecond", 0, small.0, small.1)?;
    let days = if iso {
        let y = part("isoWeekYear", 1970, 1, 9999)?;
        let w = part("isoWeek", 1, small.0, small.1)?;
        let d = part("isoDayOfWeek", 1, small.0, small.1)?;
        match (y, w, d) {
            (Some(y), Some(w), Some(d)) => Some(iso_year_start(y) + (w - 1) * 7 + (d - 1)),
            _ => None,
        }
    } else {
        let y = part("year", 1970, 1, 9999)?;
        let m = part("month", 1, small.0, small.1)?;
        let d = part("day", 1, small.0, small.1)?;
        match (y, m, d) {
            (Some(y), Some(m), Some(d)) => {
                let months = y * 12 + (m - 1);
                let (yy, mm) = (months.div_euclid(12), months.rem_euclid(12) + 1);
                Some(days_from_civil(yy, mm, 1) + (d - 1))
            }
            _ => None,
        }
    };
    let Some(tz) = timezone(a)? else {
        return null();
    };
    let (Some(days), Some(h), Some(mi), Some(s), Some(ms)) = (days, hour, minute, second, millis)
    else {
        return null();
    };
    let local = at_day(days, h * 3_600_000 + mi * 60_000 + s * 1000 + ms);
    Ok(date(tz.to_utc(local)))
}

/// A time unit of `$dateTrunc`/`$dateAdd`/`$dateDiff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Year,
    Quarter,
    Month,
    Week,
    Day,
    Hour,
    Minute,
    Second,
    Millisecond,
}

impl Unit {
    fn fixed_ms(self) -> Option<i64> {
        match self {
            Unit::Hour => Some(3_600_000),
            Unit::Minute => Some(60_000),
            Unit::Second => Some(1000),
            Unit::Millisecond => Some(1),
            _ => None,
        }
    }
}

/// The `unit` argument; `Ok(None)` for null.
fn unit(a: &Args<'_, '_>) -> Result<Option<Unit>> {
    let v = a.get("unit")?;
    if is_nullish(&v) {
        return Ok(None);
    }
    let Some(Bson::String(s)) = &v else {
        return Err(loc!(
            5439013,
            "{} requires 'unit' to be a string, but got {}",
            a.name(),
            type_name(&v)
        ));
    };
    Ok(Some(match s.as_str() {
        "year" => Unit::Year,
        "quarter" => Unit::Quarter,
        "month" => Unit::Month,
        "week" => Unit::Week,
        "day" => Unit::Day,
        "hour" => Unit::Hour,
        "minute" => Unit::Minute,
        "second" => Unit::Second,
        "millisecond" => Unit::Millisecond,
        other => {
            return Err(loc!(
                5439014,
                "{} parameter 'unit' value cannot be recognized as a time unit: {other}",
                a.name()
            ))
        }
    }))
}

/// `startOfWeek` as days after Sunday (0 = Sunday); `Ok(None)` for null.
fn start_of_week(a: &Args<'_, '_>) -> Result<Option<i64>> {
    if !a.given("startOfWeek") {
        return Ok(Some(0));
    }
    let v = a.get("startOfWeek")?;
    if is_nullish(&v) {
        return Ok(None);
    }
    let Some(Bson::String(s)) = &v else {
        return Err(loc!(
            5439015,
            "{} requires 'startOfWeek' to be a string, but got {}",
            a.name(),
            type_name(&v)
        ));
    };
    let days = [
        ("sunday", "sun"),
        ("monday", "mon"),
        ("tuesday", "tue"),
        ("wednesday", "wed"),
        ("thursday", "thu"),
        ("friday", "fri"),
        ("saturday", "sat"),
    ];
    let l = s.to_ascii_lowercase();
    days.iter()
        .position(|(long, short)| l == *long || l == *short)
        .map(|i| Some(i as i64))
        .ok_or_else(|| {
            loc!(
                5439016,
                "{} parameter 'startOfWeek' value cannot be recognized as a day of a week: {s}",
                a.name()
            )
        })
}

fn date_arg(a: &Args<'_, '_>, key: &str) -> Result<Option<i64>> {
    let v = a.get(key)?;
    if is_nullish(&v) {
        return Ok(None);
    }
    v.as_ref().and_then(millis_of).map(Some).ok_or_else(|| {
        loc!(
            5439012,
            "{} requires '{key}' to be a date, but got {}",
            a.name(),
            type_name(&v)
        )
    })
}

fn date_trunc(a: &Args<'_, '_>) -> Result<Value> {
    let ms = date_arg(a, "date")?;
    let u = unit(a)?;
    let bin = if a.given("binSize") {
        let v = a.get("binSize")?;
        if is_nullish(&v) {
            return null();
        }
        match v.as_ref().and_then(crate::query::expr::array::int32_of) {
            Some(n) if n > 0 => Some(n),
            _ => {
                return Err(loc!(
                    5439017,
                    "$dateTrunc requires 'binSize' to be a positive 64-bit integer, but got value '{}' of type {}",
                    crate::error::render(v.as_ref().unwrap_or(&Bson::Null)),
                    type_name(&v)
                ))
            }
        }
    } else {
        Some(1)
    };
    let tz = timezone(a)?;
    let sow = start_of_week(a)?;
    let (Some(ms), Some(u), Some(bin), Some(tz), Some(sow)) = (ms, u, bin, tz, sow) else {
        return null();
    };
    // Bins count from 2000-01-01T00:00 local (a Saturday; weeks from the
    // first `startOfWeek` day on or after it), as MongoDB's.
    let epoch2000 = days_from_civil(2000, 1, 1);
    let local = tz.to_local(ms);
    let out_local = match u {
        Unit::Year | Unit::Quarter | Unit::Month => {
            let p = Parts::of_local(local);
            let months = (p.year - 2000) * 12 + i64::from(p.month) - 1;
            let per = bin
                * match u {
                    Unit::Year => 12,
                    Unit::Quarter => 3,
                    _ => 1,
                };
            let m = months.div_euclid(per) * per;
            at_day(
                days_from_civil(2000 + m.div_euclid(12), m.rem_euclid(12) + 1, 1),
                0,
            )
        }
        Unit::Week | Unit::Day => {
            let day = local.div_euclid(DAY_MS);
            let (origin, per) = if u == Unit::Week {
                // 2000-01-01 is a Saturday (6 days after Sunday).
                (epoch2000 + (sow - 6).rem_euclid(7), 7 * bin)
            } else {
                (epoch2000, bin)
            };
            at_day(origin + (day - origin).div_euclid(per) * per, 0)
        }
        _ => {
            // In i128: a date near the ends of the i64 range is still binned
            // without overflow (and clamped back into range).
            let per = i128::from(u.fixed_ms().unwrap_or(1)) * i128::from(bin);
            let origin = i128::from(epoch2000) * i128::from(DAY_MS);
            let out = origin + (i128::from(local) - origin).div_euclid(per) * per;
            i64::try_from(out).unwrap_or(if out < 0 { i64::MIN } else { i64::MAX })
        }
    };
    Ok(date(tz.to_utc(out_local)))
}

fn amount(a: &Args<'_, '_>) -> Result<Option<i64>> {
    let v = a.get("amount")?;
    if is_nullish(&v) {
        return Ok(None);
    }
    let n = match v.as_ref().and_then(num_of) {
        Some(Num::I32(i)) => Some(i64::from(i)),
        Some(Num::I64(i)) => Some(i),
        Some(Num::F64(f)) if f.fract() == 0.0 && f.abs() < 9.2e18 => Some(f as i64),
        _ => None,
    };
    n.map(Some)
        .ok_or_else(|| loc!(5166402, "{} expects integer amount of time units", a.name()))
}

fn date_add(a: &Args<'_, '_>) -> Result<Value> {
    let start = {
        let v = a.get("startDate")?;
        if is_nullish(&v) {
            None
        } else {
            Some(v.as_ref().and_then(millis_of).ok_or_else(|| {
                loc!(
                    5166403,
                    "{} requires startDate to be convertible to a date",
                    a.name()
                )
            })?)
        }
    };
    let u = unit(a)?;
    let n = amount(a)?;
    let tz = timezone(a)?;
    let (Some(ms), Some(u), Some(n), Some(tz)) = (start, u, n, tz) else {
        return null();
    };
    let n = if a.n == Named::DateSubtract {
        n.checked_neg()
            .ok_or_else(|| loc!(6045000, "invalid $dateSubtract 'amount' parameter value"))?
    } else {
        n
    };
    let overflow = || loc!(5166406, "{} overflowed", a.name());
    let out = match u {
        Unit::Year | Unit::Quarter | Unit::Month => {
            let local = tz.to_local(ms);
            let p = Parts::of_local(local);
            let per = match u {
                Unit::Year => 12,
                Unit::Quarter => 3,
                _ => 1,
            };
            let months = (p.year * 12 + i64::from(p.month) - 1)
                .checked_add(n.checked_mul(per).ok_or_else(overflow)?)
                .ok_or_else(overflow)?;
            let (y, m) = (months.div_euclid(12), months.rem_euclid(12) + 1);
            if !(-300_000..=300_000).contains(&y) {
                return Err(overflow());
            }
            let d = i64::from(p.day).min(days_in_month(y, m));
            let in_day = local.rem_euclid(DAY_MS);
            tz.to_utc(at_day(days_from_civil(y, m, d), in_day))
        }
        Unit::Week | Unit::Day => {
            let days = if u == Unit::Week {
                n.checked_mul(7).ok_or_else(overflow)?
            } else {
                n
            };
            let local = tz
                .to_local(ms)
                .checked_add(days.checked_mul(DAY_MS).ok_or_else(overflow)?)
                .ok_or_else(overflow)?;
            tz.to_utc(local)
        }
        _ => ms
            .checked_add(
                n.checked_mul(u.fixed_ms().unwrap_or(1))
                    .ok_or_else(overflow)?,
            )
            .ok_or_else(overflow)?,
    };
    Ok(date(out))
}

fn date_diff(a: &Args<'_, '_>) -> Result<Value> {
    let s = date_arg(a, "startDate")?;
    let e = date_arg(a, "endDate")?;
    let u = unit(a)?;
    let tz = timezone(a)?;
    let sow = start_of_week(a)?;
    let (Some(s), Some(e), Some(u), Some(tz), Some(sow)) = (s, e, u, tz, sow) else {
        return null();
    };
    let (ls, le) = (tz.to_local(s), tz.to_local(e));
    let months = |l: i64| {
        let p = Parts::of_local(l);
        p.year * 12 + i64::from(p.month) - 1
    };
    let diff = match u {
        Unit::Year => Parts::of_local(le).year - Parts::of_local(ls).year,
        Unit::Quarter => months(le).div_euclid(3) - months(ls).div_euclid(3),
        Unit::Month => months(le) - months(ls),
        Unit::Week => {
            // Weeks start on `sow`; 1970-01-01 was a Thursday (4 after Sunday).
            let wk = |l: i64| (l.div_euclid(DAY_MS) + 4 - sow).div_euclid(7);
            wk(le) - wk(ls)
        }
        Unit::Day => le.div_euclid(DAY_MS) - ls.div_euclid(DAY_MS),
        Unit::Millisecond => e.saturating_sub(s),
        _ => {
            let per = u.fixed_ms().unwrap_or(1);
            le.div_euclid(per) - ls.div_euclid(per)
        }
    };
    Ok(Some(Bson::Int64(diff)))
}
