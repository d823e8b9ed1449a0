//! `detcoll-run --nproc N [--master-port P] -- program args...`: starts N ranks of `program`
//! on this host with the torchrun variables set (like `torchrun --standalone`), prefixes their
//! output with `[rank N] `, stops every rank when one fails, and exits non-zero naming the rank
//! that failed first for a reason of its own (ranks stopped by the launcher are reported as
//! such). Every rank gets a fresh random `DETCOLL_JOB_TOKEN`, and dies with the launcher (on
//! Linux even when it is `SIGKILL`ed; what a rank started itself is stopped with it when the
//! launcher stops the ranks, after a failure or a signal, but not when the launcher is
//! `SIGKILL`ed). Ranks read no stdin (`/dev/null`). The launcher's own messages go to stderr; a
//! closed stderr changes nothing (not even the exit status).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{ExitCode, ExitStatus};

use anyhow::Context as _;
use clap::Parser;
use detcoll_launch::{LaunchError, LaunchOutcome, LaunchSpec, launch};

#[derive(Debug, Parser)]
#[command(
    name = "detcoll-run",
    version,
    about = "Start N ranks of a program on this host with RANK, WORLD_SIZE, LOCAL_RANK, \
             LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (like torchrun --standalone)"
)]
struct Cli {
    /// Number of ranks to start.
    #[arg(long, visible_alias = "nproc-per-node", value_parser = parse_nproc)]
    nproc: usize,
    /// MASTER_ADDR given to the ranks.
    #[arg(long, default_value = "127.0.0.1")]
    master_addr: String,
    /// MASTER_PORT given to the ranks (default, or 0: a free port).
    #[arg(long)]
    master_port: Option<u16>,
    /// Do not prefix output lines with `[rank N] `; ranks write straight to the terminal.
    #[arg(long)]
    no_prefix: bool,
    /// Simulate N hosts on this one (tests, benchmarks): rank r of L = nproc/N per node gets
    /// DETCOLL_HOST_ID=virtual-node-{r/L}, LOCAL_RANK=r%L, LOCAL_WORLD_SIZE=L, GROUP_RANK=r/L.
    #[arg(long, value_parser = parse_nproc)]
    virtual_nodes: Option<usize>,
    /// The program and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, num_args = 1..)]
    command: Vec<OsString>,
}

fn parse_nproc(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("expected an integer >= 1, got {s:?}")),
    }
}

/// The exit code that reports `status` (a signal n becomes 128 + n, as shells do).
fn exit_code_of(status: ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        return u8::try_from(code).ok().filter(|&c| c != 0).unwrap_or(1);
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return u8::try_from(128 + sig).unwrap_or(1);
        }
    }
    1
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            say(&format!("detcoll-run: {}\n", messages(&e)));
            ExitCode::FAILURE
        }
    }
}

/// Writes the launcher's own message to stderr. A closed stderr (`2>&1 | head -1`) is not an
/// error of the launch: the message is dropped, and the exit status stays the ranks' (`eprint!`
/// would panic, status 101).
fn say(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// The messages of `e` and its causes, joined with ": ", leaving out a cause that the message
/// before it already ends with: the library's errors put their cause in their own message
/// and also return it as `source()`, so printing every link would say it twice.
fn messages(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let m = cause.to_string();
        if out.ends_with(&m) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&m);
    }
    out
}

fn run() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    let mut command = cli.command.into_iter();
    let program = PathBuf::from(command.next().context("no program given")?);
    if program.as_os_str().as_encoded_bytes().starts_with(b"-") {
        // A mistyped option before `--` (the program's name would start with `-`).
        use clap::CommandFactory as _;
        Cli::command()
            .error(
                clap::error::ErrorKind::UnknownArgument,
                format!("unknown option {:?}: the program and its arguments follow `--`", program.as_os_str()),
            )
            .exit();
    }
    let spec = LaunchSpec {
        nproc: cli.nproc,
        program,
        args: command.collect(),
        env: Vec::new(),
        master_addr: cli.master_addr,
        master_port: cli.master_port,
        prefix_output: !cli.no_prefix,
        stop_on_failure: true,
        virtual_nodes: cli.virtual_nodes,
    };
    let outcome = match launch(&spec) {
        Ok(o) => o,
        Err(LaunchError::Interrupted { signal, .. }) => {
            say(&format!("detcoll-run: interrupted by signal {signal}; all ranks were stopped\n"));
            return Ok(ExitCode::from(u8::try_from(128 + signal).unwrap_or(1)));
        }
        Err(e) => {
            return Err(e).with_context(|| format!("launching {}", spec.program.display()));
        }
    };
    if outcome.success() {
        return Ok(ExitCode::SUCCESS);
    }
    say(&failure_report(&outcome));
    let code = outcome.first_failure.map_or(1, |(_, status)| exit_code_of(status));
    Ok(ExitCode::from(code))
}

/// Whether the rank was ended by a signal (the launcher's, once it is stopping ranks).
#[cfg(unix)]
fn by_signal(status: &ExitStatus) -> bool {
    std::os::unix::process::ExitStatusExt::signal(status).is_some()
}

#[cfg(not(unix))]
fn by_signal(_status: &ExitStatus) -> bool {
    false
}

/// The lines that explain a failed launch: the rank that failed first for a reason of its own,
/// then what became of the others.
fn failure_report(outcome: &LaunchOutcome) -> String {
    let mut out = String::new();
    match outcome.first_failure {
        Some((rank, status)) => out.push_str(&format!("detcoll-run: rank {rank} failed first ({status})\n")),
        // Not every status is success, yet no rank failed before the launcher started stopping
        // them (cannot normally happen).
        None => out.push_str("detcoll-run: the launch failed\n"),
    }
    for (rank, status) in outcome.statuses.iter().enumerate() {
        if outcome.first_failure.is_some_and(|(r, _)| r == rank) {
            continue;
        }
        if outcome.stopped_by_launcher.get(rank).copied().unwrap_or(false) {
            // A rank that exited with a status of its own once the stopping began may have
            // failed by itself at about the same moment: say only what is known.
            let line = if by_signal(status) {
                format!("detcoll-run: rank {rank} was stopped by the launcher ({status})\n")
            } else {
                format!("detcoll-run: rank {rank} exited after the launcher began stopping the ranks ({status})\n")
            };
            out.push_str(&line);
        } else if !status.success() {
            out.push_str(&format!("detcoll-run: rank {rank} failed later ({status})\n"));
        } else {
            // Gone before the others were stopped: a rank that leaves while its peers still
            // make collectives is often why they failed.
            out.push_str(&format!(
                "detcoll-run: rank {rank} had already exited ({status}) while other ranks were running\n"
            ));
        }
    }
    out
}
