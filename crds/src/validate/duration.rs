//! Go duration strings ("5m", "1h30m", "90s", "1.5s"), as CEL's
//! `duration()` reads them at admission: the scale-to-zero settings are
//! written this way, as Knative's and KEDA's users write theirs.

use std::time::Duration;

/// The duration `s` spells, or `None` when it is not one: one or more
/// `<digits>[.<digits>]<unit>` with a unit of ns, us, ms, s, m or h, no
/// sign, no spaces (the rule's regex in [`crate::rules`]).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let mut rest = s;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_end);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, "0"));
        if whole.is_empty() || fraction.is_empty() || fraction.contains('.') {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        let unit_end = tail.find(|c: char| c.is_ascii_digit()).unwrap_or(tail.len());
        let (unit, after) = tail.split_at(unit_end);
        let seconds = match unit {
            "ns" => 1e-9,
            "us" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += value * seconds;
        rest = after;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// `d` as the same syntax spells it, whole seconds and up ("5m", "1m30s",
/// "1h"): how status messages name a window.
pub fn format_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        return format!("{}ms", d.as_millis());
    }
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    for (value, unit) in [(h, "h"), (m, "m"), (s, "s")] {
        if value > 0 {
            out.push_str(&format!("{value}{unit}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_read_as_cel_reads_them() {
        let secs = Duration::from_secs;
        assert_eq!(parse_duration("5m"), Some(secs(300)));
        assert_eq!(parse_duration("90s"), Some(secs(90)));
        assert_eq!(parse_duration("1h30m"), Some(secs(5400)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("0s"), Some(Duration::ZERO));
        assert_eq!(format_duration(secs(300)), "5m");
        assert_eq!(format_duration(secs(5400)), "1h30m");
        assert_eq!(format_duration(secs(61)), "1m1s");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        for bad in ["", "5", "m", "-5m", "5 m", "1.s", ".5s", "5d", "1.2.3s", "5mm"] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
    }
}
