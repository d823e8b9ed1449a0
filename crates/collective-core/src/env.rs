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

/// The contents of the regular file at `path`, which variable `name` names (e.g.
/// `DETCOLL_ROUTING_TABLE`), if it holds at most `max_bytes` bytes.
///
/// Bounded in time and memory whatever `path` names: the file is opened without blocking (a
/// FIFO without a writer does not hang the open), the opened file must be a regular file (its
/// own `fstat`, so nothing can be swapped in between the check and the read: a FIFO, a device
/// such as `/dev/zero`, a directory or a socket is refused), and at most `max_bytes + 1` bytes
/// are read (a larger file, or one that grows while it is read, is refused). Every failure is
/// [`Error::InvalidConfig`] naming `name` and `path`.
pub fn read_regular_file(name: &str, path: &std::path::Path, max_bytes: usize) -> Result<Vec<u8>, Error> {
    use std::io::Read;
    let fail = |why: String| Error::InvalidConfig {
        detail: format!(
            "environment variable {name}={path:?} is invalid: {why}; expected a regular file of at most {max_bytes} bytes"
        ),
    };
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Opening a FIFO for reading blocks until a writer opens it; O_NONBLOCK does not. On a
        // regular file it changes nothing.
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(|e| fail(format!("it cannot be opened ({e})")))?;
    let meta = file.metadata().map_err(|e| fail(format!("it cannot be examined ({e})")))?;
    if !meta.file_type().is_file() {
        return Err(fail(format!("it names {}, not a regular file", file_kind(&meta.file_type()))));
    }
    let cap = u64::try_from(max_bytes).unwrap_or(u64::MAX);
    if meta.len() > cap {
        return Err(fail(format!("it is {} bytes long", meta.len())));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(cap.saturating_add(1)).read_to_end(&mut bytes).map_err(|e| fail(format!("it cannot be read ({e})")))?;
    if bytes.len() > max_bytes {
        return Err(fail(format!("it holds more than {max_bytes} bytes")));
    }
    Ok(bytes)
}

/// "a FIFO", "a character device"... for messages.
fn file_kind(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() { "a directory" } else { "something else" }
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

    #[test]
    fn files_are_read_bounded_and_only_when_regular() {
        use std::path::Path;
        let dir = std::env::temp_dir().join(format!("detcoll-env-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let small = dir.join("small.json");
        std::fs::write(&small, b"0123456789").unwrap();
        assert_eq!(read_regular_file("DETCOLL_F", &small, 10).unwrap(), b"0123456789");
        let d = detail(read_regular_file("DETCOLL_F", &small, 9).unwrap_err());
        assert!(d.contains("DETCOLL_F") && d.contains("10 bytes long"), "{d}");
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let cases: [(&Path, &str); 4] = [
            (&fifo, "a FIFO"),
            (Path::new("/dev/zero"), "a character device"),
            (&dir, "a directory"),
            (Path::new("/nonexistent/detcoll"), "cannot be opened"),
        ];
        for (path, why) in cases {
            let t = std::time::Instant::now();
            let d = detail(read_regular_file("DETCOLL_F", path, 1 << 20).unwrap_err());
            assert!(d.contains("DETCOLL_F") && d.contains(why), "{}: {d}", path.display());
            assert!(t.elapsed() < std::time::Duration::from_secs(1), "{}", path.display());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
