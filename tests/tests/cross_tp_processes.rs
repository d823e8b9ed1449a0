//! End to end across crates and processes: the same eight TP=8 leaves reduced by TP=8, 4, 2 and 1
//! groups of real processes through the factory give the same bits, equal to `fixed-tree`.
use collective_core::bootstrap::{Bootstrap, TcpBootstrap};
use collective_core::conformance::data::finite_values;
use collective_core::{Collective, DType, Io};
use collective_factory::{Config, cpu};
use detcoll_launch::{LaunchSpec, launch_captured};
use half::bf16;

const CHILD: &str = "DETCOLL_CROSS_TP_CHILD";
const N: usize = 4099;

fn leaves() -> Vec<Vec<bf16>> {
    (0..8)
        .map(|l| {
            finite_values(DType::BF16, N, 0xC0FFEE + l).chunks(2).map(|b| bf16::from_le_bytes([b[0], b[1]])).collect()
        })
        .collect()
}

fn bits(v: &[bf16]) -> String {
    v.iter().map(|x| format!("{:04x}", x.to_bits())).collect()
}

#[test]
fn every_tp_size_gives_the_tp8_bits() {
    let leaves = leaves();
    if std::env::var_os(CHILD).is_some() {
        let boot = TcpBootstrap::from_env().expect("bootstrap");
        let (rank, world) = (boot.rank(), boot.world_size());
        let refs: Vec<&[bf16]> = leaves.iter().map(|l| l.as_slice()).collect();
        let inputs = fixed_tree::cross_tp_leaves(&refs, world).expect("tp split");
        let comm =
            cpu::from_bootstrap(std::sync::Arc::new(boot), &Config::new().with_capacity(N * 2)).expect("factory");
        let mut out = vec![bf16::ZERO; N];
        comm.all_reduce(Io::host(&inputs[rank], &mut out), &()).expect("all_reduce");
        comm.close().expect("close");
        println!("BITS {world} {rank} {}", bits(&out));
        return;
    }
    let refs: Vec<&[bf16]> = leaves.iter().map(|l| l.as_slice()).collect();
    let mut want = vec![bf16::ZERO; N];
    fixed_tree::reduce(&refs, &mut want).unwrap();
    let want = bits(&want);
    for world in [8, 4, 2, 1] {
        let exe = std::env::current_exe().unwrap();
        let spec = LaunchSpec::new(world, exe)
            .args(["every_tp_size_gives_the_tp8_bits", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1");
        let (outcome, outputs) = launch_captured(&spec).expect("launch");
        assert!(outcome.success(), "TP={world} failed: {outputs:?}");
        for (rank, out) in outputs.iter().enumerate() {
            // libtest may print its own "test ... " prefix on the same line.
            let line = out.lines().find_map(|l| l.split_once("BITS ").map(|(_, r)| r));
            let line = line.unwrap_or_else(|| panic!("TP={world} rank {rank} printed no result"));
            let got = line.splitn(3, ' ').nth(2).unwrap_or_default().trim_end_matches("ok").trim();
            assert!(got == want, "TP={world} rank {rank} differs from the TP=8 tree");
        }
    }
}
