//! Date operators: `$year`, `$month`, `$dayOfMonth`, in either form
//! (`{$year: <date>}` or `{$year: {date: <date>, timezone: "UTC"}}`).
//!
//! Invariants: dates are read as UTC in the proleptic Gregorian calendar
//! (timestamps and ObjectIds by their embedded time); any timezone other than
//! UTC is refused at parse time rather than silently ignored (documented gap).

use bson::{Bson, Document};

use crate::error::{Error, Result};
use crate::query::expr::eval::{arg, null};
use crate::query::expr::{type_name, Op, Value};

/// Check the options of the object form (`date` is required by the caller;
/// only a UTC `timezone` is accepted).
pub(super) fn check_options(op: Op, d: &Document) -> Result<()> {
    for (k, v) in d {
        match (k.as_str(), v) {
            ("date", _) => {}
            ("timezone", Bson::String(tz))
                if matches!(
                    tz.as_str(),
                    "UTC" | "GMT" | "Z" | "+00:00" | "+0000" | "Etc/UTC"
                ) => {}
            ("timezone", _) => {
                return Err(Error::bad_value(format!(
                    "{}: only the UTC timezone is supported by duetdb",
                    op.name()
                )))
            }
            (other, _) => {
                return Err(Error::bad_value(format!(
                    "unrecognized option to {}: \"{other}\"",
                    op.name()
                )))
            }
        }
    }
    Ok(())
}

/// Apply a date operator to its evaluated argument.
pub(super) fn apply(op: Op, vals: &[Value]) -> Result<Value> {
    let ms = match arg(op, vals, 0)? {
        None | Some(Bson::Null) | Some(Bson::Undefined) => return null(),
        Some(Bson::DateTime(d)) => d.timestamp_millis(),
        Some(Bson::Timestamp(t)) => i64::from(t.time) * 1000,
        Some(Bson::ObjectId(o)) => o.timestamp().timestamp_millis(),
        other => {
            return Err(Error::type_mismatch(format!(
                "can't convert from BSON type {} to Date",
                type_name(other)
            )))
        }
    };
    let (y, m, d) = civil_from_days(ms.div_euclid(86_400_000));
    let out = match op {
        Op::Year => y,
        Op::Month => i64::from(m),
        Op::DayOfMonth => i64::from(d),
        other => {
            return Err(Error::Internal(format!(
                "{} is not a date operator",
                other.name()
            )))
        }
    };
    Ok(Some(Bson::Int32(i32::try_from(out).unwrap_or(i32::MAX))))
}

/// Days since 1970-01-01 → (year, month, day) in the proleptic Gregorian
/// calendar (Howard Hinnant's `civil_from_days`).
pub(super) fn civil_from_days(z: i64) -> (i64, u32, u32) {
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
