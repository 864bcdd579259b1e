//! Parsers for `serve`'s duration flags, and the most connections (a count's range is
//! clap's own `RangedU64ValueParser`, as every count flag of the CLI). A value no operator means — a timeout
//! of centuries (the clock's arithmetic overflows: the server would panic on its first
//! connection), a timeout of zero (every connection closed at once), no connections at
//! all — is refused when the flags are parsed; clap names the flag and the value.

use std::time::Duration;

/// The longest any duration flag may be: a day (the defaults are seconds).
pub(crate) const LONGEST: Duration = Duration::from_secs(24 * 60 * 60);

/// The most connections a listener may be allowed: the usual most open files of a
/// process (each connection holds one, and its waiting room more).
pub(crate) const MOST_CONNECTIONS: usize = 1 << 20;

/// Why a flag's value was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FlagValueError {
    #[error(transparent)]
    Duration(#[from] humantime::DurationError),
    #[error(
        "longer than {}, the most it may be",
        humantime::format_duration(LONGEST)
    )]
    TooLong,
    #[error("zero: a timeout must be more than that")]
    Zero,
}

/// A duration from zero to [`LONGEST`] (`500ms`, `20s`, `1h`).
pub(crate) fn duration(value: &str) -> Result<Duration, FlagValueError> {
    let duration = humantime::parse_duration(value)?;
    if duration > LONGEST {
        return Err(FlagValueError::TooLong);
    }
    Ok(duration)
}

/// A timeout: a [`duration`] of more than zero.
pub(crate) fn timeout(value: &str) -> Result<Duration, FlagValueError> {
    match duration(value)? {
        Duration::ZERO => Err(FlagValueError::Zero),
        timeout => Ok(timeout),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn durations_beyond_a_day_are_refused_not_overflowed() {
        for value in ["500000000000y", "5000y", "25h", "1day 1s"] {
            let err = duration(value).unwrap_err();
            assert!(matches!(err, FlagValueError::TooLong), "{value}: {err}");
            assert!(err.to_string().contains("1day"), "{err}");
        }
        // Too large even for humantime: its own error, not a panic.
        let err = duration("500000000000000000000y").unwrap_err();
        assert!(matches!(err, FlagValueError::Duration(_)), "{err}");
        assert_eq!(duration("24h").unwrap(), LONGEST);
        assert_eq!(duration("0s").unwrap(), Duration::ZERO);
        assert!(matches!(duration("soon"), Err(FlagValueError::Duration(_))));
    }

    #[test]
    fn a_timeout_is_more_than_zero() {
        assert!(matches!(timeout("0s"), Err(FlagValueError::Zero)));
        assert!(matches!(timeout("0ms"), Err(FlagValueError::Zero)));
        assert!(matches!(timeout("9999y"), Err(FlagValueError::TooLong)));
        assert_eq!(timeout("15s").unwrap(), Duration::from_secs(15));
        assert_eq!(timeout("1ms").unwrap(), Duration::from_millis(1));
    }
}
