//! Kubernetes quantity strings ("500", "2k", "1.5Gi", "100m"), parsed just
//! far enough to check that an autoscaling target is a positive quantity, as
//! CEL's `isQuantity` / `quantity(...)` do at admission.

/// The approximate value of a Kubernetes quantity, or `None` when `s` is not one.
///
/// Grammar (from apimachinery's resource.Quantity):
/// `<sign?><digits>[.<digits>]<suffix>` where suffix is a binary SI suffix
/// (Ki Mi Gi Ti Pi Ei), a decimal SI suffix (n u m "" k M G T P E) or a
/// decimal exponent (e/E followed by a signed integer).
pub fn parse_quantity(s: &str) -> Option<f64> {
    let split = s
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || c == '.' || (i == 0 && (c == '+' || c == '-'))))
        .map_or(s.len(), |(i, _)| i);
    let (number, suffix) = s.split_at(split);
    let digits = number.trim_start_matches(['+', '-']);
    let (whole, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty() && frac.is_empty() || frac.contains('.') {
        return None;
    }
    let value: f64 = digits.parse().ok()?;
    let value = if number.starts_with('-') { -value } else { value };
    Some(value * multiplier(suffix)?)
}

/// The factor a suffix stands for, or `None` for an unknown suffix.
fn multiplier(suffix: &str) -> Option<f64> {
    let binary = |power: i32| Some(1024f64.powi(power));
    let decimal = |power: i32| Some(10f64.powi(power));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(1),
        "Mi" => binary(2),
        "Gi" => binary(3),
        "Ti" => binary(4),
        "Pi" => binary(5),
        "Ei" => binary(6),
        _ => {
            let exponent = suffix.strip_prefix(['e', 'E'])?;
            let digits = exponent.trim_start_matches(['+', '-']);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            decimal(exponent.parse().ok()?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_quantity;

    #[test]
    fn parses_the_forms_kubernetes_accepts() {
        assert_eq!(parse_quantity("500"), Some(500.0));
        assert_eq!(parse_quantity("2k"), Some(2000.0));
        assert_eq!(parse_quantity("1.5"), Some(1.5));
        assert_eq!(parse_quantity(".5"), Some(0.5));
        assert_eq!(parse_quantity("100m"), Some(0.1));
        assert_eq!(parse_quantity("1Ki"), Some(1024.0));
        assert_eq!(parse_quantity("1e3"), Some(1000.0));
        assert_eq!(parse_quantity("-1"), Some(-1.0));
        assert_eq!(parse_quantity("+2"), Some(2.0));
    }

    #[test]
    fn rejects_what_is_not_a_quantity() {
        for bad in ["", "k", "1.2.3", "abc", "2 k", "1x", "1e", "1Kb", "--1", "."] {
            assert_eq!(parse_quantity(bad), None, "{bad:?}");
        }
    }
}
