//! Values of the process environment that are not one line of UTF-8 text are typed errors
//! naming the variable (issue 25): a `DETCOLL_JOB_TOKEN` (or `TORCHELASTIC_RUN_ID`) that is not
//! UTF-8 is refused instead of converted lossily (`\xff` and `\xfe` both became U+FFFD: two jobs
//! with different tokens had the same one), and a `DETCOLL_HOST_ID` with a newline is refused.
//!
//! One test in this binary: it sets process environment variables, which no other test may
//! observe.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use collective_core::bootstrap::{BootstrapError, TorchrunEnv, env};
use collective_core::{Error, host_identity};

fn set(var: &str, value: &OsStr) {
    // SAFETY: the only test of this binary; no other thread reads the environment now.
    unsafe { std::env::set_var(var, value) };
}

fn unset(var: &str) {
    // SAFETY: as in `set`.
    unsafe { std::env::remove_var(var) };
}

#[test]
fn values_that_are_not_one_line_of_utf8_are_refused_naming_the_variable() {
    for (var, value) in [
        (env::RANK, "0"),
        (env::WORLD_SIZE, "2"),
        (env::LOCAL_RANK, "0"),
        (env::LOCAL_WORLD_SIZE, "2"),
        (env::MASTER_ADDR, "127.0.0.1"),
        (env::MASTER_PORT, "29500"),
    ] {
        set(var, OsStr::new(value));
    }
    unset(env::TORCHELASTIC_RUN_ID);
    set(env::JOB_TOKEN, OsStr::new("token-a"));
    assert_eq!(TorchrunEnv::from_env().unwrap().job_token.as_deref(), Some("token-a"));

    // Two tokens that differ in a byte that is not UTF-8: neither may become a token (before,
    // both became "\u{fffd}" and proved each other's job).
    for raw in [&b"\xff"[..], b"\xfe", b"job-\xc3\x28-token"] {
        set(env::JOB_TOKEN, OsStr::from_bytes(raw));
        match TorchrunEnv::from_env() {
            Err(BootstrapError::BadEnv { var, value, expected }) => {
                assert_eq!(var, env::JOB_TOKEN);
                // The token is a secret: only its length is shown.
                assert!(value.contains(&format!("{} bytes", raw.len())) && !value.contains('\u{fffd}'), "{value}");
                assert!(expected.contains("UTF-8"), "{expected}");
            }
            other => panic!("{raw:?}: expected BadEnv, got {other:?}"),
        }
    }
    unset(env::JOB_TOKEN);

    // A run id the token would be derived from: the same.
    set(env::TORCHELASTIC_RUN_ID, OsStr::from_bytes(b"run-\xff"));
    match TorchrunEnv::from_env() {
        Err(BootstrapError::BadEnv { var, .. }) => assert_eq!(var, env::TORCHELASTIC_RUN_ID),
        other => panic!("run id: expected BadEnv, got {other:?}"),
    }
    set(env::TORCHELASTIC_RUN_ID, OsStr::new("run-a"));
    assert!(TorchrunEnv::from_env().unwrap().job_token.is_some());
    unset(env::TORCHELASTIC_RUN_ID);

    // A host identity is one line of text.
    set("DETCOLL_HOST_ID", OsStr::new("node-a"));
    assert_eq!(host_identity().unwrap(), "node-a");
    for bad in [&b"node-a\nnode-b"[..], b"node-a\r", b"\tnode", b"node-\xff", b"", b"  "] {
        set("DETCOLL_HOST_ID", OsStr::from_bytes(bad));
        match host_identity() {
            Err(Error::InvalidConfig { detail }) => assert!(detail.contains("DETCOLL_HOST_ID"), "{detail}"),
            other => panic!("DETCOLL_HOST_ID={bad:?}: expected InvalidConfig, got {other:?}"),
        }
    }
    unset("DETCOLL_HOST_ID");
    assert!(host_identity().is_ok());
}
