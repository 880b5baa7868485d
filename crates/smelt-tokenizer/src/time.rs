//! `strftime_now` for chat templates (Llama 3.x templates print today's date), in UTC.

use std::time::{SystemTime, UNIX_EPOCH};

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
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Civil date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Formats `secs` since the epoch with the common `strftime` directives.
pub(crate) fn strftime(fmt: &str, secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil(days);
    let (hh, mm, ss) = (sod / 3600, sod / 60 % 60, sod % 60);
    let wd = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - {
        // days from the epoch to January 1st of year y
        let (mut dd, mut yy) = (days, y);
        while civil(dd).0 == yy && yy == y {
            dd -= 1;
            yy = civil(dd).0;
        }
        dd + 1
    } + 1;
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = it.next();
        let no_pad = spec == Some('-');
        if no_pad {
            spec = it.next();
        }
        let num = |v: i64, w: usize| {
            if no_pad {
                v.to_string()
            } else {
                format!("{v:0w$}")
            }
        };
        match spec {
            Some('Y') => out += &y.to_string(),
            Some('y') => out += &num(y.rem_euclid(100), 2),
            Some('m') => out += &num(m.into(), 2),
            Some('d') => out += &num(d.into(), 2),
            Some('e') => out += &format!("{d:2}"),
            Some('H') => out += &num(hh, 2),
            Some('I') => out += &num((hh + 11) % 12 + 1, 2),
            Some('p') => out += if hh < 12 { "AM" } else { "PM" },
            Some('M') => out += &num(mm, 2),
            Some('S') => out += &num(ss, 2),
            Some('j') => out += &num(yday, 3),
            Some('b') | Some('h') => out += &month[..3],
            Some('B') => out += month,
            Some('a') => out += &DAYS[wd][..3],
            Some('A') => out += DAYS[wd],
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

pub(crate) fn strftime_now(fmt: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime(fmt, i64::try_from(secs).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::strftime;

    #[test]
    fn formats_a_known_date() {
        // 2024-07-23 14:05:09 UTC, a Tuesday, day 205
        let t = 1_721_743_509;
        assert_eq!(strftime("%d %b %Y", t), "23 Jul 2024");
        assert_eq!(
            strftime("%A %B %-d, %y %H:%M:%S %j %p %%", t),
            "Tuesday July 23, 24 14:05:09 205 PM %"
        );
        assert_eq!(strftime("%Y-%m-%d", 0), "1970-01-01");
    }
}
