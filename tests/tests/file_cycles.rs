//! No import cycles between the files of a crate: a file that names `crate::a` depends on the
//! top-level module `a`, and those dependencies form no cycle in any library crate, so each
//! crate reads in one direction (docs/architecture.md). Found by reading the sources, as a
//! reviewer would: paths after `crate::` (also inside `use crate::{...}` lists), comments
//! skipped.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file of `src` belongs to (`""` for the crate root).
fn top_module(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next().map(|c| c.as_os_str().to_string_lossy().into_owned()).unwrap_or_default();
    let first = first.trim_end_matches(".rs").to_string();
    if first == "lib" || first == "main" { String::new() } else { first }
}

/// The top-level modules `code` names through `crate::` paths.
fn named(code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (i, _) in line.match_indices("crate::") {
            let rest = &line[i + "crate::".len()..];
            if let Some(list) = rest.strip_prefix('{') {
                for item in list.split('}').next().unwrap_or("").split(',') {
                    out.insert(ident(item.trim()));
                }
            } else {
                out.insert(ident(rest));
            }
        }
    }
    out.retain(|m| modules.contains(m));
    out
}

/// A cycle in `graph`, if any (depth-first search).
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        v: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(v.to_string(), 1);
        path.push(v.to_string());
        for w in g.get(v).into_iter().flatten() {
            match state.get(w.as_str()) {
                Some(1) => {
                    let start = path.iter().position(|p| p == w).unwrap_or(0);
                    let mut c = path[start..].to_vec();
                    c.push(w.clone());
                    return Some(c);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(w, g, state, path) {
                        return Some(c);
                    }
                }
            }
        }
        path.pop();
        state.insert(v.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for v in graph.keys() {
        if !state.contains_key(v.as_str())
            && let Some(c) = visit(v, graph, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

#[test]
fn no_crate_has_an_import_cycle_between_its_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut crates: Vec<PathBuf> =
        std::fs::read_dir(root.join("crates")).expect("crates/").flatten().map(|e| e.path()).collect();
    crates.push(root.join("kernels"));
    crates.sort();
    let mut checked = 0;
    let mut cycles = Vec::new();
    for krate in crates {
        let src = krate.join("src");
        if !src.is_dir() {
            continue;
        }
        let mut fs = Vec::new();
        files(&src, &mut fs);
        let modules: BTreeSet<String> = fs.iter().map(|f| top_module(&src, f)).filter(|m| !m.is_empty()).collect();
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for f in &fs {
            let from = top_module(&src, f);
            if from.is_empty() {
                continue; // the crate root declares and re-exports every module
            }
            let code = std::fs::read_to_string(f).expect("read source");
            let to: Vec<String> = named(&code, &modules).into_iter().filter(|m| *m != from).collect();
            graph.entry(from).or_default().extend(to);
        }
        checked += 1;
        if let Some(c) = cycle(&graph) {
            cycles.push(format!("{}: {}", krate.file_name().unwrap_or_default().to_string_lossy(), c.join(" -> ")));
        }
    }
    assert!(checked >= 10, "only {checked} crates found under crates/");
    assert!(cycles.is_empty(), "import cycles between files:\n{}", cycles.join("\n"));
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("op".to_string(), BTreeSet::from(["route".to_string()])),
        ("route".to_string(), BTreeSet::from(["collective".to_string()])),
        ("collective".to_string(), BTreeSet::from(["op".to_string()])),
    ]
    .into_iter()
    .collect();
    assert_eq!(cycle(&g).map(|c| c.len()), Some(4));
    let modules = BTreeSet::from(["op".to_string(), "view".to_string()]);
    let found = named("use crate::{op::Op, view::Io};\n// crate::dtype\nlet x = crate::op::x;", &modules);
    assert_eq!(found, modules);
}
