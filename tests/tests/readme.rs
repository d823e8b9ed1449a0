//! The root README's Rust examples are the factory README's, which run as doctests
//! (`collective_factory::ReadmeDoctests`): the examples a newcomer copies compile and pass.
#[test]
fn readme_examples_are_the_doctested_ones() {
    let root = include_str!("../../README.md");
    let factory = include_str!("../../crates/collective-factory/README.md");
    let blocks = |s: &str| -> Vec<String> {
        s.split("```rust")
            .skip(1)
            .map(|b| b.split_once('\n').map_or("", |x| x.1).split("```").next().unwrap_or("").to_string())
            .collect()
    };
    let (r, f) = (blocks(root), blocks(factory));
    assert!(r.len() >= 2, "the README shows the CPU and the GPU example");
    for b in &r {
        assert!(f.contains(b), "README example not doctested in crates/collective-factory/README.md:\n{b}");
    }
}
