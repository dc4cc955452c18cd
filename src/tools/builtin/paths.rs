//! What exists under a file tool's root and what a request names of it: the bounded walk the paths are
//! decoded from ([`Tree`]), the paths a request names or that are shaped like paths, and whether a call
//! has already read or listed one.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::tools::Done;

/// Whether a call so far has read or listed `path`: a call names it, an output names it (a search hit), or
/// a listing of its folder shows its name.
pub(super) fn touched(path: &str, done: &[Done]) -> bool {
    let (dir, name) = path.rsplit_once('/').unwrap_or((".", path));
    done.iter().any(|d| {
        let arg = |v: &Value| v.as_str().map(|s| s.trim_start_matches("./").trim_end_matches('/').to_string());
        let args: Vec<String> = d.call.args.as_object().into_iter().flat_map(|o| o.values().filter_map(arg)).collect();
        args.iter().any(|a| a == path)
            || d.output.contains(path)
            || (args.iter().any(|a| a == dir) || (dir == "." && args.is_empty()))
                && d.output.lines().any(|l| l.trim_end_matches('/') == name)
    })
}

/// A bounded look at what is under a root: the regular files' and directories' paths relative to it
/// (directories with `.` first), hidden entries (a component starting with `.`), symbolic links and
/// cache directories (tagged by a `CACHEDIR.TAG` file, as cargo's `target/` is) left out. `None` when
/// the tree is bigger than the bound (depth 4, 1,000 entries) or cannot be read.
pub(super) struct Tree {
    pub(super) files: Vec<String>,
    pub(super) dirs: Vec<String>,
}

impl Tree {
    const MAX_ENTRIES: usize = 1000;
    const MAX_DEPTH: usize = 4;

    pub(super) fn walk(root: &Path) -> Option<Tree> {
        let (mut files, mut dirs) = (Vec::new(), vec![".".to_string()]);
        let mut stack = vec![(root.to_path_buf(), 0usize)];
        let mut seen = 0usize;
        while let Some((dir, depth)) = stack.pop() {
            for e in std::fs::read_dir(&dir).ok()?.flatten() {
                seen += 1;
                if seen > Self::MAX_ENTRIES {
                    return None;
                }
                let name = e.file_name();
                if name.as_encoded_bytes().starts_with(b".") {
                    continue;
                }
                let Ok(t) = e.file_type() else { continue };
                let Ok(rel) = e.path().strip_prefix(root).map(shown) else { continue };
                if t.is_dir() {
                    if e.path().join("CACHEDIR.TAG").is_file() {
                        continue;
                    }
                    dirs.push(rel);
                    if depth + 1 < Self::MAX_DEPTH {
                        stack.push((e.path(), depth + 1));
                    }
                } else if t.is_file() {
                    files.push(rel);
                }
            }
        }
        files.sort();
        dirs[1..].sort();
        Some(Tree { files, dirs })
    }
}

/// The words of a request that may be paths, with where they start (`./` and a trailing full stop off).
fn path_words(request: &str) -> Vec<(usize, &str)> {
    static WORD: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let word = WORD.get_or_init(|| regex::Regex::new(r"[\w./~-]+").expect("a valid regex"));
    word.find_iter(request)
        .map(|m| (m.start(), m.as_str().trim_end_matches(['.', '-', '/']).trim_start_matches("./")))
        .filter(|(_, w)| !w.is_empty())
        .collect()
}

/// Whether a word is shaped like a path: letters and a `/`, or a name with a text file's extension.
fn is_path_shaped(w: &str) -> bool {
    const TEXT: [&str; 16] = [
        "txt", "md", "csv", "tsv", "json", "ini", "log", "toml", "yaml", "yml", "cfg", "conf", "xml", "html", "py",
        "rs",
    ];
    let has_letter = w.chars().any(|c| c.is_alphabetic());
    let ext = w.rsplit_once('.').map(|(stem, ext)| (stem, ext.to_ascii_lowercase()));
    has_letter
        && (w.contains('/') && w.len() > 2
            || ext.is_some_and(|(stem, ext)| !stem.is_empty() && TEXT.contains(&ext.as_str())))
}

/// The first word of `request` that is a path to something that exists, absolute or from the working
/// directory (where a server started by this process resolves a relative path), with where it starts: a
/// tool that takes a path is then needed ([`Tool::needed_for`] of tools outside the built-ins, an MCP
/// server's file tools).
pub(crate) fn existing_path_in(request: &str) -> Option<(usize, &str)> {
    path_words(request).into_iter().find(|(_, w)| is_path_shaped(w) && Path::new(w).exists())
}

/// What a word of a request names.
pub(super) enum Named {
    /// A file or folder (`true`) under the root.
    Entry(String, bool),
}

/// The paths the request names, in order, with where: words that are a path or a file or directory name
/// under the root (any case). Only what exists: a word shaped like a file name that names nothing here
/// ("What is a package.json file for?"), or a file's name without its extension, forces nothing.
pub(super) fn paths_named_in(request: &str, tree: Option<&Tree>) -> Vec<(usize, Named)> {
    // (name as the request may write it, path, a folder)
    let mut names: Vec<(String, &str, bool)> = Vec::new();
    if let Some(t) = tree {
        for (p, is_dir) in t.files.iter().map(|p| (p, false)).chain(t.dirs[1..].iter().map(|p| (p, true))) {
            let name = p.rsplit('/').next().unwrap_or(p);
            names.push((p.to_lowercase(), p, is_dir));
            names.push((name.to_lowercase(), p, is_dir));
        }
        names.retain(|(n, ..)| n.chars().count() >= 3);
    }
    let mut found = Vec::new();
    for (at, w) in path_words(request) {
        let lower = w.to_lowercase();
        if let Some((_, path, is_dir)) = names.iter().find(|(n, ..)| *n == lower) {
            found.push((at, Named::Entry(path.to_string(), *is_dir)));
        }
    }
    found
}

/// A path as the file tools show it: as it is when it is UTF-8, else with each byte that is not part of
/// UTF-8 written `\xNN`, a form the tools take back ([`unescaped`]). `to_string_lossy` would show `�`,
/// a name no call can open.
pub(super) fn shown(path: &Path) -> String {
    if let Some(s) = path.to_str() {
        return s.to_string();
    }
    let bytes = path.as_os_str().as_encoded_bytes();
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02X}"));
        }
    }
    out
}

/// The path a tool argument names: `rel` itself, or, where `rel` does not exist under `root` and writes
/// `\xNN` escapes ([`shown`]), the path with those bytes (Unix; elsewhere `rel` itself).
pub(super) fn unescaped(root: &Path, rel: &str) -> PathBuf {
    let plain = PathBuf::from(rel);
    if !rel.contains("\\x") || root.join(&plain).exists() {
        return plain;
    }
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStringExt;
        let (src, mut bytes) = (rel.as_bytes(), Vec::with_capacity(rel.len()));
        let mut i = 0;
        while i < src.len() {
            let hex = src.get(i + 2..i + 4).and_then(|h| std::str::from_utf8(h).ok());
            match (src[i], src.get(i + 1), hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
                (b'\\', Some(b'x'), Some(b)) => {
                    bytes.push(b);
                    i += 4;
                }
                (c, _, _) => {
                    bytes.push(c);
                    i += 1;
                }
            }
        }
        PathBuf::from(std::ffi::OsString::from_vec(bytes))
    }
    #[cfg(not(unix))]
    plain
}

#[cfg(test)]
mod tests {
    use super::Tree;

    #[test]
    fn cache_directories_are_not_part_of_the_tree() {
        let root = tempfile::tempdir().unwrap();
        let p = root.path();
        std::fs::create_dir_all(p.join("src")).unwrap();
        std::fs::write(p.join("src/main.rs"), "").unwrap();
        std::fs::create_dir_all(p.join("target/release")).unwrap();
        std::fs::write(p.join("target/CACHEDIR.TAG"), "Signature: 8a477f597d28d172789f06886806bc55").unwrap();
        for i in 0..1200 {
            std::fs::write(p.join(format!("target/release/{i}.o")), "").unwrap();
        }
        let tree = Tree::walk(p).expect("the cache's 1,200 files are not counted");
        assert_eq!(
            (tree.files, tree.dirs),
            (vec!["src/main.rs".to_string()], vec![".".to_string(), "src".to_string()])
        );
    }
}
