//! Small helpers shared by the commands.
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether `program` can be run (found on `PATH`, or a path that exists).
pub fn which(program: &str) -> Option<PathBuf> {
    let p = Path::new(program);
    if p.components().count() > 1 {
        return p.is_file().then(|| p.to_path_buf());
    }
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).map(|d| d.join(program)).find(|c| c.is_file()))
        .unwrap_or(None)
}

/// `cargo`, as cargo itself tells subprocesses (`$CARGO`), else from `PATH`.
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// The workspace root: `cargo locate-project --workspace`, else the parent of this crate.
pub fn workspace_root() -> anyhow::Result<PathBuf> {
    let out = cargo()
        .args(["locate-project", "--workspace", "--message-format", "plain"])
        .output()
        .context("running cargo locate-project")?;
    if out.status.success() {
        let manifest = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if let Some(dir) = manifest.parent() {
            return Ok(dir.to_path_buf());
        }
    }
    Ok(Path::new(env!("CARGO_MANIFEST_DIR")).parent().context("xtask has no parent directory")?.to_path_buf())
}

/// A command line as text, for messages.
pub fn show(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| {
            let s = a.to_string_lossy();
            if s.contains(' ') { format!("'{s}'") } else { s.into_owned() }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_finds_sh() {
        assert!(which("sh").is_some());
        assert!(which("definitely-not-a-program-detcoll").is_none());
    }
}
