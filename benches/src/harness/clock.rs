//! The time and host name a report is stamped with. Public because xtask's GPU bundle stamps its
//! manifest the same way (one implementation of the UTC formatting).
use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `secs` since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (UTC).
pub fn utc_string(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

/// This host's name (`/proc/sys/kernel/hostname`, `$HOSTNAME`, or `unknown`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The commit the running binary was built from when it runs from a GPU bundle (the bundle's
/// `manifest.json` beside `bin/` records it: the working directory there is not the source
/// tree), else `git rev-parse --short HEAD` of the working directory with `-dirty` appended
/// when tracked files changed; `unknown` without either, so a plot always says which code it
/// measured when it can.
pub fn git_commit() -> String {
    if let Some(c) = bundle_commit() {
        return c;
    }
    let git = |args: &[&str]| std::process::Command::new("git").args(args).stderr(std::process::Stdio::null()).output();
    let Ok(out) = git(&["rev-parse", "--short", "HEAD"]) else { return "unknown".to_owned() };
    let rev = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || rev.is_empty() {
        return "unknown".to_owned();
    }
    let dirty = git(&["diff", "--quiet", "HEAD"]).is_ok_and(|o| o.status.code() == Some(1));
    if dirty { format!("{rev}-dirty") } else { rev }
}

/// `git_commit` of the bundle manifest one directory above the running executable, shortened.
fn bundle_commit() -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    let manifest = std::fs::read_to_string(exe.parent()?.parent()?.join("manifest.json")).ok()?;
    commit_of_manifest(&manifest)
}

fn commit_of_manifest(manifest: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(manifest).ok()?;
    let c = v.get("git_commit")?.as_str()?;
    (!c.is_empty()).then(|| format!("{} (bundle)", &c[..c.len().min(7)]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundle_manifests_name_their_commit() {
        assert_eq!(
            commit_of_manifest(r#"{"git_commit":"d658aa264dc77c1f","x":1}"#).as_deref(),
            Some("d658aa2 (bundle)")
        );
        assert_eq!(commit_of_manifest(r#"{"git_commit":""}"#), None);
        assert_eq!(commit_of_manifest("not json"), None);
    }

    #[test]
    fn utc_formatting() {
        assert_eq!(utc_string(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_string(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_string(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(utc_string(4_102_444_799), "2099-12-31T23:59:59Z");
    }
}
