//! The crate's layering (DESIGN §8), checked: no module imports a module
//! of a layer above its own, and no modules import each other in a
//! circle.
//!
//! Imports are read from the source as `/work/shared/tools/layers.py` reads
//! them: every `crate::a::b` path (and `crate::{a, b}` group) names the
//! longest module it starts with, every `super::x` the sibling `x`; doc
//! comments count too. A module's own `#[cfg(test)] mod tests` and the
//! test-only files (a `test` in the name) do not, nor do the programs in
//! `bin/`; a module and the modules inside it are one for this check.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, top to bottom: a module may import a module of its own
/// layer or of a layer below, never of a layer above. A module's layer is
/// that of its first path segment (`backend::connect`: `backend`).
const LAYERS: &[&[&str]] = &[
    // The exported C functions: argument decoding, errno, the process's
    // life (start, fork, exit).
    &["abi"],
    // SDP and its fallback over sdp-core and the port mapper client.
    &["backend"],
    // The state export read by `sdp-stat`: it reads the table.
    &["stat", "stat_format"],
    // Per-fd state; tells the export and epoll by callback.
    &["table"],
    // The interface the table stores and the backend implements.
    &["sdp"],
    // Rules, configuration and logging.
    &["config", "rules", "log"],
    // The C library's real functions, sockaddr, sockopt, the thread guard.
    &["sys"],
];

/// The crate root, which only declares the modules.
const ROOT: &str = "lib";

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The modules of `src` (name → source), as layers.py names them.
fn modules(src: &Path) -> BTreeMap<String, String> {
    fn walk(dir: &Path, src: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).expect("read the source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, src, out);
                continue;
            }
            let file = path.file_name().unwrap().to_string_lossy().into_owned();
            let rel = path
                .strip_prefix(src)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if !file.ends_with(".rs") || rel.starts_with("bin/") || file.contains("test") {
                continue;
            }
            let name = rel[..rel.len() - 3].replace("/mod", "").replace('/', "::");
            out.insert(
                name,
                std::fs::read_to_string(&path).expect("read a source file"),
            );
        }
    }
    let mut out = BTreeMap::new();
    walk(src, src, &mut out);
    out
}

/// `src` without its `#[cfg(test)] mod tests { ... }` and what follows.
fn without_tests(src: &str) -> &str {
    let mut from = 0;
    while let Some(i) = src[from..].find("#[cfg(test)]") {
        let at = from + i;
        let rest = src[at + "#[cfg(test)]".len()..].trim_start();
        if let Some(rest) = rest.strip_prefix("mod tests") {
            if rest.trim_start().starts_with('{') {
                return &src[..at];
            }
        }
        from = at + 1;
    }
    src
}

/// The runs of `[A-Za-z0-9_]` (with `::` too when `colons`) that follow
/// each `prefix`, scanning on after each match as a regex `findall` does.
fn after(src: &str, prefix: &str, colons: bool) -> Vec<String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '_' || (colons && c == ':');
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(i) = src[from..].find(prefix) {
        let start = from + i + prefix.len();
        let len = src[start..].find(|c| !ok(c)).unwrap_or(src.len() - start);
        if len == 0 {
            from = from + i + 1;
            continue;
        }
        found.push(src[start..start + len].to_string());
        from = start + len;
    }
    found
}

/// The paths of `crate::{a::b, c}` groups: `a::b`, `c`.
fn groups(src: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(i) = src[from..].find("crate::{") {
        let start = from + i + "crate::{".len();
        let Some(len) = src[start..].find('}') else {
            break;
        };
        found.extend(
            src[start..start + len]
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(String::from),
        );
        from = start + len + 1;
    }
    found
}

/// Who imports whom.
fn graph(mods: &BTreeMap<String, String>) -> Graph {
    let mut names: Vec<&String> = mods.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    let mut edges = Graph::new();
    for (m, src) in mods {
        let out = edges.entry(m.clone()).or_default();
        let src = without_tests(src);
        let paths = after(src, "crate::", true).into_iter().chain(groups(src));
        for path in paths {
            let hit = names
                .iter()
                .find(|n| path == ***n || path.starts_with(&format!("{n}::")));
            if let Some(n) = hit {
                let related = m.starts_with(&format!("{n}::")) || n.starts_with(&format!("{m}::"));
                if *n != m && !related {
                    out.insert((*n).clone());
                }
            }
        }
        if let Some((parent, _)) = m.rsplit_once("::") {
            for x in after(src, "super::", false) {
                let t = format!("{parent}::{x}");
                if mods.contains_key(&t) && t != *m {
                    out.insert(t);
                }
            }
        }
    }
    edges
}

/// The layer of `module` (an index into [`LAYERS`], 0 the top).
fn layer(module: &str) -> Option<usize> {
    let top = module.split("::").next().unwrap_or(module);
    LAYERS.iter().position(|l| l.contains(&top))
}

/// The import circles: groups of two or more modules that import each
/// other (Tarjan's strongly connected components).
fn circles(g: &Graph) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a Graph,
        next: usize,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> T<'a> {
        fn visit(&mut self, v: &'a str) {
            self.index.insert(v, self.next);
            self.low.insert(v, self.next);
            self.next += 1;
            self.stack.push(v);
            self.on.insert(v);
            for w in self.g.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.on.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on.remove(w);
                    group.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    self.out.push(group);
                }
            }
        }
    }
    let mut t = T {
        g,
        next: 0,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

/// What is wrong with the import graph `g` (nothing: empty).
fn faults(g: &Graph) -> Vec<String> {
    let mut faults = Vec::new();
    for m in g.keys().filter(|m| *m != ROOT) {
        if layer(m).is_none() {
            faults.push(format!("{m} is in no layer: add it to LAYERS"));
        }
    }
    for (m, targets) in g {
        for n in targets {
            if let (Some(lm), Some(ln)) = (layer(m), layer(n)) {
                if ln < lm {
                    faults.push(format!(
                        "upward import: {m} -> {n} ({n} is in a layer above {m}'s)"
                    ));
                }
            }
        }
    }
    for c in circles(g) {
        let inside: Vec<String> = c
            .iter()
            .flat_map(|m| {
                g[m].iter()
                    .filter(|n| c.contains(n))
                    .map(move |n| format!("{m} -> {n}"))
            })
            .collect();
        faults.push(format!(
            "circle: {} (edges: {})",
            c.join(" "),
            inside.join(", ")
        ));
    }
    faults
}

fn crate_graph() -> Graph {
    graph(&modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src")))
}

#[test]
fn no_module_imports_one_above_it_and_no_circle() {
    let g = crate_graph();
    assert!(g.contains_key("abi::socket") && g.contains_key("sys::real"));
    let faults = faults(&g);
    assert!(faults.is_empty(), "layering broken:\n{}", faults.join("\n"));
}

/// The check itself: an upward import and a circle are both caught.
#[test]
fn an_upward_import_and_a_circle_are_caught() {
    let mut g = crate_graph();
    g.get_mut("table").unwrap().insert("abi::epoll".into());
    let faults = faults(&g);
    assert!(
        faults
            .iter()
            .any(|f| f.contains("upward import: table -> abi::epoll")),
        "{faults:?}"
    );
    assert!(
        faults
            .iter()
            .any(|f| f.starts_with("circle:") && f.contains("table -> abi::epoll")),
        "{faults:?}"
    );
}

#[test]
fn imports_are_read_as_layers_py_reads_them() {
    let mut mods = BTreeMap::new();
    let src = |s: &str| s.to_string();
    mods.insert(
        src("a"),
        src("use crate::{b::x, c};\n/// [`crate::d::e::f`]\n#[cfg(test)]\nmod tests {\n    use crate::e;\n}\n"),
    );
    mods.insert(src("b"), src("use super::c;\n"));
    mods.insert(src("c"), src(""));
    mods.insert(src("d"), src("pub mod e;\n"));
    mods.insert(
        src("d::e"),
        src("use super::f; use super::super::c; use crate::d::g;\n"),
    );
    mods.insert(src("d::f"), src(""));
    mods.insert(src("e"), src(""));
    let g = graph(&mods);
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    // `crate::d::e::f` names the longest module, `d::e`; the tests' `e` is
    // not read.
    assert_eq!(g["a"], set(&["b", "c", "d::e"]));
    // A top-level module has no siblings by `super`.
    assert_eq!(g["b"], set(&[]));
    // `super::super::c` is not followed; `d` is `d::e`'s own parent.
    assert_eq!(g["d::e"], set(&["d::f"]));
}
