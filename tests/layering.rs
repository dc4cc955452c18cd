//! Module dependencies run one way (see ARCHITECTURE.md): every `crate::<module>` path in `src/` names the
//! module itself or one in a lower layer, and modules of one layer do not use each other. Paths through
//! the crate root's re-exports (`crate::Model`) are refused too, so they cannot hide a dependency.

use std::fs;
use std::path::{Path, PathBuf};

/// Layers from the bottom. lib.rs (re-exports) and main.rs sit above all; `cli` is the binary's own
/// module tree (its `crate::` is the binary), which reaches the library only through `reagent::`.
const LAYERS: &[&[&str]] = &[
    &["setters", "error"],
    &["limits"],
    &["catalog"],
    &["gguf"],
    &["model"],
    &["text"],
    &["decode"],
    &["tools"],
    &["agent"],
    &["eval", "bench", "serve"],
    &["cli"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            rs_files(&p, out)
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p)
        }
    }
}

/// The module(s) a path after `crate::` names: one name, or each item's first name in a `{…}` group.
fn targets(rest: &str) -> Vec<String> {
    let ident = |s: &str| s.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let Some(group) = rest.strip_prefix('{') else { return vec![ident(rest)] };
    let (mut depth, mut start, mut out) = (0, 0, Vec::new());
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                out.push(ident(&group[start..i]));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(ident(&group[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

/// Every path in `code` (of module `from`) that breaks the order, as `line: from → crate::to`.
fn violations(from: &str, code: &str) -> Vec<String> {
    let Some(from_layer) = layer(from) else { return vec![format!("module `{from}` is not in LAYERS")] };
    // Comment lines (doc links included) are blanked, keeping line numbers.
    let code: String = code
        .lines()
        .map(|l| if l.trim_start().starts_with("//") { "\n".to_string() } else { format!("{l}\n") })
        .collect();
    let mut bad = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        if code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue; // part of a longer name
        }
        let line = code[..i].matches('\n').count() + 1;
        for to in targets(&code[i + "crate::".len()..]) {
            if to != from && layer(&to).is_none_or(|l| l >= from_layer) {
                bad.push(format!("{line}: {from} → crate::{to}"));
            }
        }
    }
    bad
}

#[test]
fn module_dependencies_run_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let mut bad = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let from = rel.components().next().unwrap().as_os_str().to_str().unwrap().trim_end_matches(".rs");
        if from == "lib" || from == "main" {
            continue;
        }
        for v in violations(from, &fs::read_to_string(f).unwrap()) {
            bad.push(format!("src/{}:{v}", rel.display()));
        }
    }
    assert!(files.len() > 20, "the scan found the sources");
    assert!(bad.is_empty(), "paths against the layer order {LAYERS:?}:\n{}", bad.join("\n"));
}

/// The scanner itself: it sees grouped and inline paths, ignores comments, and refuses root re-exports.
#[test]
fn the_scanner_finds_what_breaks_the_order() {
    let code = "use crate::error::Result;\n// [`crate::agent::Agent`] in a doc comment\n\
                use crate::{gguf::GgufFile, text::{chat, tokenizer}};\nfn f() { crate::agent::run(); }\n\
                fn g() -> crate::Model { todo!() }\n";
    assert_eq!(
        violations("model", code),
        ["3: model → crate::text", "4: model → crate::agent", "5: model → crate::Model"]
    );
    assert!(violations("agent", "use crate::tools::ToolCall;\nuse crate::agent::x;").is_empty());
    assert_eq!(violations("eval", "use crate::bench::x;"), ["1: eval → crate::bench"], "same layer");
    assert_eq!(violations("nowhere", ""), ["module `nowhere` is not in LAYERS"]);
    let code = "use super::avx512::{WGroup, XGroup};\n// super::doc::x\nfn f() { super::super::tiles::g(); super::{blocks, groups}; }";
    assert_eq!(sibling_uses(code, false), ["avx512", "blocks", "groups"]);
    assert_eq!(sibling_uses(code, true), ["tiles"]);
}

/// The sibling modules a file's code names through `super::` (comments left out): `use super::x::…`,
/// `super::{x, y}`, `super::super::x` from a child's file (the siblings of its parent).
fn sibling_uses(code: &str, nested: bool) -> Vec<String> {
    let code: String = code.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let prefix = if nested { "super::super::" } else { "super::" };
    let mut out = Vec::new();
    for (i, _) in code.match_indices(prefix) {
        if code[..i].ends_with("super::") || code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue;
        }
        out.extend(targets(&code[i + prefix.len()..]).into_iter().filter(|t| t != "super" && t != "self"));
    }
    out.sort();
    out.dedup();
    out
}

/// No two source files import each other: where `a.rs` uses its sibling `b`, `b.rs` (and the files of `b/`)
/// do not use `a` (the two kernel tiers once did: their shared layout is now `kernels/groups.rs`).
#[test]
fn no_two_files_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    // (directory, module) → the sibling modules it uses
    let mut uses: std::collections::BTreeMap<(PathBuf, String), Vec<String>> = Default::default();
    for f in &files {
        let code = fs::read_to_string(f).unwrap();
        let stem = f.file_stem().unwrap().to_str().unwrap().to_string();
        let dir = f.parent().unwrap().to_path_buf();
        if stem != "mod" {
            uses.entry((dir.clone(), stem.clone())).or_default().extend(sibling_uses(&code, false));
        }
        // A file inside `dir/x/` speaks for module `x` among `dir`'s files.
        let parent = dir.file_name().unwrap().to_str().unwrap().to_string();
        let grand = dir.parent().unwrap().to_path_buf();
        let nested = if stem == "mod" { sibling_uses(&code, false) } else { sibling_uses(&code, true) };
        if dir != src {
            uses.entry((grand, parent)).or_default().extend(nested);
        }
    }
    let mut both = Vec::new();
    for ((dir, a), used) in &uses {
        for b in used {
            let back = uses.get(&(dir.clone(), b.clone())).is_some_and(|u| u.contains(a));
            if back && a < b {
                both.push(format!("{}: {a} ⇄ {b}", dir.strip_prefix(&src).unwrap_or(dir).display()));
            }
        }
    }
    assert!(uses.len() > 20, "the scan found the sources");
    assert!(both.is_empty(), "files that import each other:\n{}", both.join("\n"));
}
