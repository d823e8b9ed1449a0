//! `DETCOLL_ROUTING_TABLE` is read as a bounded read of a regular file (issue 25): a FIFO hung
//! construction, `/dev/zero` ran it out of memory. Those, a directory, a file above
//! `Routing::MAX_FILE_BYTES`, a table of another platform, one with an unknown field and one
//! with a route the world cannot take are each `InvalidConfig` on every rank at once.
//!
//! One test in this binary: it sets process environment variables, which no other test may
//! observe.
#![cfg(feature = "cpu")]
use collective_core::Error;
use collective_core::bootstrap::LocalBootstrap;
use collective_factory::{Config, Platform, Routing, cpu};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

const VAR: &str = "DETCOLL_ROUTING_TABLE";

/// Every rank's construction result of a CPU world of `world` threads, or `None` when it did not
/// finish within `bound` (the rank threads are left behind: a hang fails the test, it does not
/// hang it).
fn build(world: usize, bound: Duration) -> Option<Vec<Result<(), Error>>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let boots = LocalBootstrap::group_with_timeout(world, Duration::from_secs(10));
        let got: Vec<Result<(), Error>> = std::thread::scope(|s| {
            let hs: Vec<_> = boots
                .iter()
                .map(|b| {
                    s.spawn(move || {
                        cpu::with_transport(
                            b,
                            &Config::new().with_capacity(1 << 16),
                            None::<fn() -> Result<collective_factory::NoTransport<()>, Error>>,
                        )
                        .map(drop)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank panicked")).collect()
        });
        let _ = tx.send(got);
    });
    rx.recv_timeout(bound).ok()
}

fn table(platform: &str, all_reduce_route: &str, extra: &str) -> String {
    format!(
        r#"{{"platform":"{platform}","source":"test"{extra},"rules":[
  {{"op":"all_reduce","min_bytes":0,"max_bytes":null,"route":"{all_reduce_route}"}},
  {{"op":"all_gather","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}},
  {{"op":"reduce_scatter","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}},
  {{"op":"reduce_scatter_many","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}}]}}"#
    )
}

#[test]
fn routing_table_files_are_read_bounded_and_checked_at_construction() {
    let dir = std::env::temp_dir().join(format!("detcoll-routing-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str, contents: &[u8]| -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, contents).unwrap();
        p
    };
    let fifo = dir.join("table.fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success(), "mkfifo {}", fifo.display());
    // A valid table padded past the size cap: only the size is wrong.
    let mut big = table("cpu", "ipc_one_shot", "").into_bytes();
    big.resize(Routing::MAX_FILE_BYTES + 1, b' ');
    let cases: Vec<(PathBuf, &[usize], &str)> = vec![
        // (the FIFO first: without the fix it hangs, and the bound below fails the test)
        (fifo.clone(), &[1, 2], "a FIFO"),
        (file("big.json", &big), &[1, 2], "bytes long"),
        (dir.clone(), &[1, 2], "a directory"),
        (Path::new("/dev/zero").to_path_buf(), &[1, 2], "a character device"),
        (
            file("nvidia.json", Routing::default_for(Platform::Nvidia).canonical_json().as_bytes()),
            &[1, 2],
            "platform `nvidia`",
        ),
        (file("extra.json", table("cpu", "ipc_one_shot", r#","comment":"x""#).as_bytes()), &[1, 2], "comment"),
        (file("local.json", table("cpu", "local", "").as_bytes()), &[2, 4], "`local`"),
        (file("latin1.json", b"{\"platform\":\"cpu\",\"source\":\"\xe9\"}"), &[1, 2], "UTF-8"),
    ];
    for (path, worlds, why) in &cases {
        // SAFETY: the only test of this binary; no other thread reads the environment now.
        unsafe { std::env::set_var(VAR, path) };
        for &world in *worlds {
            let got = build(world, Duration::from_secs(10))
                .unwrap_or_else(|| panic!("{VAR}={}: construction did not finish within 10 s", path.display()));
            for (rank, r) in got.iter().enumerate() {
                match r {
                    Err(Error::InvalidConfig { detail }) if detail.contains(why) => {
                        // Where the table came from is named, except for the world check, which
                        // applies to every table alike.
                        assert!(*why == "`local`" || detail.contains(VAR), "{detail}");
                    }
                    other => panic!(
                        "{VAR}={}, world {world}, rank {rank}: expected InvalidConfig saying {why}, got {other:?}",
                        path.display()
                    ),
                }
            }
        }
    }
    // The same table at a size within the cap, and a `local` table at world 1, are accepted.
    let ok = file("ok.json", table("cpu", "ipc_one_shot", "").as_bytes());
    for (path, world) in [(&ok, 2), (&cases[6].0, 1)] {
        // SAFETY: as above.
        unsafe { std::env::set_var(VAR, path) };
        let got = build(world, Duration::from_secs(10)).expect("finished");
        assert!(got.iter().all(Result::is_ok), "{}: {got:?}", path.display());
    }
    // SAFETY: as above.
    unsafe { std::env::remove_var(VAR) };
    std::fs::remove_dir_all(&dir).unwrap();
}
