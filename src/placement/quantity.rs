//! Kubernetes resource quantities, parsed exactly (no floats) into fixed-point units.
//!
//! GPU amounts are small integers or simple decimals (`"2"`, `"1.5"`, `"500m"`); we parse
//! the full quantity grammar so that odd-but-valid spellings (`"1k"`, `"2e2"`, `"1Ki"`) work,
//! and refuse what the API server itself would refuse or what cannot fit our units.

use std::fmt;

/// Why a quantity string was refused. The message names the offending text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("{0:?} is not a Kubernetes quantity")]
    Syntax(String),
    #[error("{0:?} is negative")]
    Negative(String),
    #[error("{0:?} is out of range")]
    OutOfRange(String),
    #[error("{0:?} is not a whole number")]
    Fractional(String),
}

/// A non-negative quantity held in thousandths ("milli" units), the finest unit
/// Kubernetes quantities commonly carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Milli(pub u64);

/// Largest value we accept: 2^53 milli-units, far above any GPU count or memory unit.
const MAX_MILLI: u128 = 1 << 53;

impl Milli {
    /// Parse a quantity string such as `"2"`, `"1.5"`, `"500m"`, `"1Ki"`, `"2e2"`.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        parse_milli(text.trim())
            .map(Milli)
            .map_err(|kind| kind.with(text))
    }

    /// Whole units (e.g. a count of vcuda-core), refusing fractions like `"1.5"`.
    pub fn parse_whole(text: &str) -> Result<u64, QuantityError> {
        let milli = Self::parse(text)?;
        if milli.0 % 1000 != 0 {
            return Err(QuantityError::Fractional(text.to_string()));
        }
        Ok(milli.0 / 1000)
    }

    #[cfg(test)]
    pub(crate) fn from_units(units: u64) -> Self {
        Milli(units.saturating_mul(1000))
    }
}

impl fmt::Display for Milli {
    /// Canonical short form: `"2"`, `"1.5"`, `"0.25"`, `"0.001"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, frac) = (self.0 / 1000, self.0 % 1000);
        if frac == 0 {
            return write!(f, "{whole}");
        }
        let digits = format!("{frac:03}");
        write!(f, "{whole}.{}", digits.trim_end_matches('0'))
    }
}

#[derive(Debug)]
enum Kind {
    Syntax,
    Negative,
    Range,
}

impl Kind {
    fn with(self, text: &str) -> QuantityError {
        let text = text.to_string();
        match self {
            Kind::Syntax => QuantityError::Syntax(text),
            Kind::Negative => QuantityError::Negative(text),
            Kind::Range => QuantityError::OutOfRange(text),
        }
    }
}

fn parse_milli(text: &str) -> Result<u64, Kind> {
    let (number, suffix) = split_suffix(text);
    let (mantissa_digits, frac_digits) = split_number(number)?;
    let scale = suffix_scale(suffix)?;
    // value = digits * 10^-frac_len * scale, computed in milli as an exact rational.
    let digits: String = format!("{mantissa_digits}{frac_digits}");
    let digits: u128 = digits.parse().map_err(|_| Kind::Range)?;
    let denominator = pow10(frac_digits.len() as u32)?;
    let numerator = match scale {
        Scale::Binary(mult) => mul(mul(digits, mult)?, 1000)?,
        Scale::Decimal(exp) => apply_exp(mul(digits, 1000)?, exp)?,
    };
    // Kubernetes rounds sub-milli values up; so do we.
    let value = numerator.div_ceil(denominator);
    if value > MAX_MILLI {
        return Err(Kind::Range);
    }
    Ok(value as u64)
}

enum Scale {
    Binary(u128),
    Decimal(i32),
}

fn split_suffix(text: &str) -> (&str, &str) {
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    text.split_at(end)
}

/// Split `"12.50"` into (`"12"`, `"50"`), rejecting signs other than a leading `+`.
fn split_number(number: &str) -> Result<(&str, &str), Kind> {
    let number = number.strip_prefix('+').unwrap_or(number);
    if number.starts_with('-') {
        return Err(Kind::Negative);
    }
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    let all_digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
    if (whole.is_empty() && frac.is_empty()) || !all_digits(whole) || !all_digits(frac) {
        return Err(Kind::Syntax);
    }
    if whole.len() + frac.len() > 30 {
        return Err(Kind::Range);
    }
    Ok((whole, frac))
}

fn suffix_scale(suffix: &str) -> Result<Scale, Kind> {
    let binary = |p: u32| Ok(Scale::Binary(1u128 << (10 * p)));
    match suffix {
        "" => Ok(Scale::Decimal(0)),
        "n" => Ok(Scale::Decimal(-9)),
        "u" => Ok(Scale::Decimal(-6)),
        "m" => Ok(Scale::Decimal(-3)),
        "k" => Ok(Scale::Decimal(3)),
        "M" => Ok(Scale::Decimal(6)),
        "G" => Ok(Scale::Decimal(9)),
        "T" => Ok(Scale::Decimal(12)),
        "P" => Ok(Scale::Decimal(15)),
        "E" => Ok(Scale::Decimal(18)),
        "Ki" => binary(1),
        "Mi" => binary(2),
        "Gi" => binary(3),
        "Ti" => binary(4),
        "Pi" => binary(5),
        "Ei" => binary(6),
        exp if exp.starts_with(['e', 'E']) => {
            let exp: i32 = exp[1..].parse().map_err(|_| Kind::Syntax)?;
            // unsigned_abs: `abs` of i32::MIN overflows (found by fuzzing).
            if exp.unsigned_abs() > 30 {
                return Err(Kind::Range);
            }
            Ok(Scale::Decimal(exp))
        }
        _ => Err(Kind::Syntax),
    }
}

fn pow10(exp: u32) -> Result<u128, Kind> {
    10u128.checked_pow(exp).ok_or(Kind::Range)
}

fn mul(a: u128, b: u128) -> Result<u128, Kind> {
    a.checked_mul(b).ok_or(Kind::Range)
}

fn apply_exp(value: u128, exp: i32) -> Result<u128, Kind> {
    if exp >= 0 {
        mul(value, pow10(exp as u32)?)
    } else {
        let div = pow10(exp.unsigned_abs())?;
        Ok(value.div_ceil(div))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_spellings() {
        let cases = [
            ("2", 2000),
            ("1.5", 1500),
            ("500m", 500),
            ("0.25", 250),
            ("1k", 1_000_000),
            ("2e2", 200_000),
            ("1Ki", 1_024_000),
            ("+3", 3000),
            (".5", 500),
            ("1n", 1),
        ];
        for (text, milli) in cases {
            assert_eq!(Milli::parse(text), Ok(Milli(milli)), "{text}");
        }
    }

    #[test]
    fn refuses_bad_quantities_by_name() {
        assert_eq!(
            Milli::parse("-3"),
            Err(QuantityError::Negative("-3".into()))
        );
        assert_eq!(
            Milli::parse("abc"),
            Err(QuantityError::Syntax("abc".into()))
        );
        assert_eq!(
            Milli::parse("1e100"),
            Err(QuantityError::OutOfRange("1e100".into()))
        );
        assert_eq!(Milli::parse(""), Err(QuantityError::Syntax("".into())));
        assert_eq!(
            Milli::parse("1.2.3"),
            Err(QuantityError::Syntax("1.2.3".into()))
        );
        assert_eq!(
            Milli::parse("10Zi"),
            Err(QuantityError::Syntax("10Zi".into()))
        );
        assert!(Milli::parse("99999999999999999999999999").is_err());
    }

    #[test]
    fn the_smallest_exponent_is_out_of_range_not_a_panic() {
        // Found by fuzzing: `abs()` of i32::MIN overflowed (a panic with overflow checks).
        for text in ["1e-2147483648", "1E-2147483648", "1e2147483647"] {
            assert!(Milli::parse(text).is_err(), "{text}");
        }
    }

    #[test]
    fn whole_numbers_refuse_fractions() {
        assert_eq!(Milli::parse_whole("200"), Ok(200));
        assert_eq!(
            Milli::parse_whole("1.5"),
            Err(QuantityError::Fractional("1.5".into()))
        );
    }

    #[test]
    fn displays_canonically() {
        assert_eq!(Milli(2000).to_string(), "2");
        assert_eq!(Milli(2500).to_string(), "2.5");
        assert_eq!(Milli(250).to_string(), "0.25");
        assert_eq!(Milli(1).to_string(), "0.001");
    }
}
