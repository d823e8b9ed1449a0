//! The root README's examples build as written in a crate of their own: `tests/external/readme`
//! holds them verbatim (its `cpu` and `nvidia` binaries, built and run by `.ci/external-crates`
//! outside this workspace) and depends on collective-factory alone, as the README's
//! `[dependencies]` snippet does. This test keeps the copies equal to the README.
use std::path::Path;

const README: &str = include_str!("../../README.md");

/// The code of every fenced block whose info string starts with `lang`, in order, with the
/// info string.
fn blocks<'a>(text: &'a str, lang: &str) -> Vec<(&'a str, &'a str)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("```") {
        let after = &rest[i + 3..];
        let Some((info, body)) = after.split_once('\n') else { break };
        let Some(end) = body.find("```") else { break };
        if info.starts_with(lang) {
            out.push((info, &body[..end]));
        }
        rest = &body[end + 3..];
    }
    out
}

fn external(path: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("external/readme").join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn the_readme_examples_are_the_external_crates_sources_verbatim() {
    let rust = blocks(README, "rust");
    assert_eq!(rust.len(), 2, "the README shows the CPU and the NVIDIA example: {rust:#?}");
    let (cpu, nvidia) = (rust[0], rust[1]);
    assert_eq!(cpu.0, "rust", "the CPU example runs (a plain `rust` block)");
    assert_eq!(nvidia.0, "rust,no_run", "the NVIDIA example needs a GPU to run");
    for ((_, code), file) in [(cpu, "src/bin/cpu.rs"), (nvidia, "src/bin/nvidia.rs")] {
        assert!(code.contains("fn main()"), "a README example is a whole program (it is copied as is)");
        assert_eq!(
            external(file),
            *code,
            "tests/external/readme/{file} is not the README's example verbatim: copy the block there"
        );
    }
    // Only the factory: what the examples import must come from it.
    for (_, code) in [cpu, nvidia] {
        for line in code.lines().filter(|l| l.starts_with("use ")) {
            assert!(
                line.starts_with("use collective_factory::") || line.starts_with("use std::"),
                "README example imports from outside collective-factory: {line}"
            );
        }
    }
}

#[test]
fn the_readme_dependencies_are_the_factory_alone() {
    let toml = blocks(README, "toml");
    let deps = toml.iter().find(|(_, b)| b.contains("[dependencies]")).expect("the README's [dependencies] snippet").1;
    let active: Vec<&str> = deps
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && *l != "[dependencies]")
        .collect();
    assert_eq!(active.len(), 1, "one dependency: {active:?}");
    assert!(active[0].starts_with("collective-factory = { git = "), "{}", active[0]);
    // The external crate depends on the same crate alone (a path instead of the git URL).
    let manifest = external("Cargo.toml");
    let section = manifest.split("\n[dependencies]\n").nth(1).expect("[dependencies]");
    let section = section.split("\n[").next().unwrap_or(section);
    let names: Vec<&str> = section
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('=').map(|(n, _)| n.trim()))
        .collect();
    assert_eq!(names, ["collective-factory"], "tests/external/readme depends on the factory alone");
    // The commented feature lines name features the factory has, and the crate forwards `cuda`.
    for f in ["cuda", "rocm"] {
        assert!(deps.contains(&format!("features = [\"{f}\"]")), "the README shows feature {f}");
    }
    assert!(manifest.contains("cuda = [\"collective-factory/cuda\"]"), "{manifest}");
}
