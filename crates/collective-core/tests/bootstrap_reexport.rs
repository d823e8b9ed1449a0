//! The bootstrap lives in its own crate (`detcoll-bootstrap`): `collective_core::bootstrap` is
//! that crate (the same types, every path users name), a `BootstrapError` converts into
//! `collective_core::Error` keeping its `source()` chain, and both crates bound timeouts by the
//! same day.

use std::error::Error as _;
use std::time::Duration;

use collective_core::bootstrap::{BootstrapError, LocalBootstrap, MAX_BOOTSTRAP_TIMEOUT, TcpBootstrap, TcpConfig};
use collective_core::{Error, MAX_TIMEOUT};

#[test]
fn collective_core_bootstrap_is_the_bootstrap_crate() {
    let theirs: Vec<detcoll_bootstrap::LocalBootstrap> = LocalBootstrap::group(1);
    assert_eq!(theirs.len(), 1);
    let e: detcoll_bootstrap::BootstrapError = BootstrapError::DuplicateRank { rank: 1 };
    assert_eq!(e.culprit(), Some(1));
    assert_eq!(MAX_BOOTSTRAP_TIMEOUT, MAX_TIMEOUT);
}

#[test]
fn bootstrap_errors_convert_keeping_their_source() {
    // No rank 0 on this port: rank 1 fails with ConnectTimeout, whose source is the last
    // connection error.
    let port = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap().local_addr().unwrap().port();
    let cfg = TcpConfig::single_host(1, 2, "127.0.0.1", port).with_timeout(Duration::from_millis(100));
    let e = TcpBootstrap::new(cfg).unwrap_err();
    let text = e.to_string();
    let io = e.source().expect("the connection error").to_string();
    assert!(matches!(e, BootstrapError::ConnectTimeout { .. }), "{e}");
    let e = Error::from(e);
    assert!(e.poisons());
    assert!(matches!(e, Error::Bootstrap(BootstrapError::ConnectTimeout { .. })), "{e}");
    // Transparent: the same message, and the same source below it.
    assert_eq!(e.to_string(), text);
    assert_eq!(e.source().map(ToString::to_string), Some(io));
}
