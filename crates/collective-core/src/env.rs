//! Reading `DETCOLL_*` environment variables, fail closed.
//!
//! Every variable detcoll reads goes through these helpers, so a value that does not parse or
//! is out of range is [`Error::InvalidConfig`] naming the variable, its value and what was
//! expected — never a silent fallback to the default (a typo in a timeout or a platform name
//! must not change what runs without saying so). Unset means "use the default"; a set but
//! empty value is invalid.
use crate::Error;

/// The variable's value, `None` when unset. A value that is not valid UTF-8 is invalid.
pub fn var(name: &str) -> Result<Option<String>, Error> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(invalid(name, &v.to_string_lossy(), "valid UTF-8")),
    }
}

/// The error for `name=value` when `expected` was expected.
pub fn invalid(name: &str, value: &str, expected: &str) -> Error {
    Error::InvalidConfig { detail: format!("environment variable {name}={value:?} is invalid: expected {expected}") }
}

/// Parses an unsigned integer in `min..=max` (surrounding whitespace allowed).
pub fn parse_u64_in(name: &str, value: &str, min: u64, max: u64, unit: &str) -> Result<u64, Error> {
    match value.trim().parse::<u64>() {
        Ok(v) if (min..=max).contains(&v) => Ok(v),
        _ => Err(invalid(name, value, &format!("an integer in {min}..={max} ({unit})"))),
    }
}

/// Parses a boolean: `1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off` (any case).
pub fn parse_bool(name: &str, value: &str) -> Result<bool, Error> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(invalid(name, value, "1, true, yes, on, 0, false, no or off")),
    }
}

/// Parses one of `choices` (exact, case-insensitive); returns its index.
pub fn parse_choice(name: &str, value: &str, choices: &[&str]) -> Result<usize, Error> {
    let v = value.trim();
    choices
        .iter()
        .position(|c| c.eq_ignore_ascii_case(v))
        .ok_or_else(|| invalid(name, value, &format!("one of {}", choices.join(", "))))
}

/// `var(name)` parsed by `parse`, `None` when unset.
pub fn read<T>(name: &str, parse: impl FnOnce(&str, &str) -> Result<T, Error>) -> Result<Option<T>, Error> {
    var(name)?.map(|v| parse(name, &v)).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail(e: Error) -> String {
        match e {
            Error::InvalidConfig { detail } => detail,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn integers_bools_and_choices_fail_closed() {
        assert_eq!(parse_u64_in("X", " 5 ", 1, 9, "ms").unwrap(), 5);
        for bad in ["", "0", "10", "abc", "-1", "5x"] {
            let d = detail(parse_u64_in("DETCOLL_X", bad, 1, 9, "ms").unwrap_err());
            assert!(d.contains("DETCOLL_X") && d.contains("1..=9"), "{d}");
        }
        assert!(parse_bool("B", "On").unwrap());
        assert!(!parse_bool("B", "0").unwrap());
        assert!(detail(parse_bool("DETCOLL_B", "maybe").unwrap_err()).contains("DETCOLL_B"));
        assert_eq!(parse_choice("P", "CPU", &["nvidia", "cpu"]).unwrap(), 1);
        assert!(detail(parse_choice("DETCOLL_P", "foo", &["nvidia", "cpu"]).unwrap_err()).contains("nvidia, cpu"));
    }
}
