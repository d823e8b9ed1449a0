//! Running a case with every rank in its own process.
//!
//! The parent re-executes the running test binary once per rank (`<test> --exact`) under the
//! launcher, with torchrun's variables and [`CHILD_ENV`] set; in each child the same test
//! reaches [`run_processes`] again, joins through [`TcpBootstrap::from_env`], builds its rank
//! and runs the case. A rank that fails exits nonzero and the launcher stops the others.
use crate::bootstrap::{Bootstrap, TcpBootstrap};
use detcoll_launch::{LaunchSpec, launch_captured};

/// Set in the environment of a rank process started by [`run_processes`].
pub const CHILD_ENV: &str = "DETCOLL_CONFORMANCE_CHILD";

/// Runs `case` on `world` ranks, one process each. `make` builds this rank's environment from
/// its bootstrap (in the child). `test` is the full libtest name of the running test.
pub fn run_processes<R>(
    world: usize,
    test: &str,
    make: impl FnOnce(Box<dyn Bootstrap>) -> Result<R, String>,
    case: &(dyn Fn(&mut R) -> Result<(), String> + Sync),
    finish: impl FnOnce(R) -> Result<(), String>,
) -> Result<(), String> {
    if std::env::var_os(CHILD_ENV).is_some() {
        let boot = TcpBootstrap::from_env().map_err(|e| format!("bootstrap: {e}"))?;
        let mut rank = make(Box::new(boot))?;
        let result = case(&mut rank);
        let closed = finish(rank);
        return result.and(closed);
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let spec =
        LaunchSpec::new(world, exe).args([test, "--exact", "--nocapture", "--test-threads=1"]).env(CHILD_ENV, "1");
    let (outcome, outputs) = launch_captured(&spec).map_err(|e| format!("launch: {e}"))?;
    if outcome.success() {
        // A child whose filter matched nothing also exits 0: demand proof that each ran the test.
        return match outputs.iter().position(|o| !o.contains("1 passed")) {
            None => Ok(()),
            Some(r) => Err(format!("rank {r} did not run `{test}` (its output: {:?})", outputs[r])),
        };
    }
    let mut msg = format!("rank processes failed: {:?}\n", outcome.first_failure);
    for (r, out) in outputs.iter().enumerate() {
        let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
        // The panic's message first (with RUST_BACKTRACE set, the tail is only the backtrace),
        // up to the backtrace, then the tail.
        if let Some(at) = lines.iter().position(|l| l.contains("panicked at")) {
            let panic: Vec<&str> =
                lines[at..].iter().take(12).take_while(|l| !l.starts_with("stack backtrace:")).copied().collect();
            msg.push_str(&format!("--- rank {r} panic ---\n{}\n", panic.join("\n")));
        }
        let tail = &lines[lines.len().saturating_sub(15)..];
        msg.push_str(&format!("--- rank {r} output (tail) ---\n{}\n", tail.join("\n")));
    }
    Err(msg)
}
