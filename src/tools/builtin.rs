//! Built-in tools: `calculator`, `current_time`, and `read_file` / `list_dir` / `write_file` confined to a
//! root directory (symlinks and `..` cannot leave it; `write_file` only when enabled).

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};

use super::{Done, FnTool, Need, Tool, ToolError, ToolSpec};
pub(crate) use calculator::calculate;
use calculator::Calculator;
pub(crate) use paths::existing_path_in;
use paths::{paths_named_in, touched, Named, Tree};

mod calculator;
mod paths;
use crate::error::{Error, Result};

/// Which built-ins to create, and where the file tools may look.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BuiltinOptions {
    /// The directory `read_file`, `list_dir` and `write_file` are confined to.
    pub root: PathBuf,
    /// Offer `write_file`.
    pub allow_write: bool,
    /// Largest file `read_file` returns (longer files are cut, saying so).
    pub max_read_bytes: usize,
    /// Let `read_file` read files with more than one hard link (another name of the same file may lie
    /// outside the root). `write_file` never writes through one.
    pub read_hard_links: bool,
}

impl Default for BuiltinOptions {
    fn default() -> Self {
        Self { root: PathBuf::from("."), allow_write: false, max_read_bytes: 64 * 1024, read_hard_links: false }
    }
}

setters!(BuiltinOptions { root: PathBuf, allow_write: bool, max_read_bytes: usize, read_hard_links: bool });

/// The built-in tools.
pub fn builtin_tools(opts: &BuiltinOptions) -> Result<Vec<Arc<dyn Tool>>> {
    let root = opts.root.canonicalize().map_err(|e| Error::io(&opts.root, e))?;
    if !root.is_dir() {
        return Err(Error::InputFile {
            path: root.to_path_buf(),
            problem: "not a directory (the file tools' root)".into(),
        });
    }
    let calculator = ToolSpec::new(
        "calculator",
        "Evaluates an arithmetic expression (+ - * / % ^, parentheses, decimals) and returns the exact number. \
         Use it for every calculation instead of computing in your head.",
        json!({"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 37 * 43 + 12"}}, "required": ["expression"]}),
    )?;
    let mut tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(Calculator { spec: calculator }),
        Arc::new(FnTool::new(
            ToolSpec::new(
                "current_time",
                "Returns the current date and time in UTC (RFC 3339).",
                json!({"type": "object", "properties": {}}),
            )?,
            |_| Ok(Value::String(humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string())),
        )),
    ];
    let file_tool = |kind, spec| FileTool {
        spec,
        kind,
        root: root.clone(),
        max_read_bytes: opts.max_read_bytes,
        read_hard_links: opts.read_hard_links,
        // With a write tool, files may appear mid-run: the paths are left free.
        narrow: !opts.allow_write,
    };
    tools.push(Arc::new(file_tool(
        FileKind::Read,
        ToolSpec::new(
            "read_file",
            "Reads a text file under the working directory.",
            json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        )?,
    )));
    tools.push(Arc::new(file_tool(
        FileKind::List,
        ToolSpec::new(
            "list_dir",
            "Lists a directory under the working directory (directories end with /).",
            json!({"type": "object", "properties": {"path": {"type": "string", "description": "default: ."}}}),
        )?,
    )));
    tools.push(Arc::new(file_tool(
        FileKind::Search,
        ToolSpec::new(
            "search_files",
            "Finds the lines that contain a text (any case) in the files under a directory of the working \
             directory; returns `file:line: text` for each.",
            json!({"type": "object", "properties": {"text": {"type": "string"}, "path": {"type": "string", "description": "default: ."}}, "required": ["text"]}),
        )?,
    )));
    if opts.allow_write {
        let r = root;
        tools.push(Arc::new(FnTool::new(
            ToolSpec::new(
                "write_file",
                "Writes a text file under the working directory, replacing it if it exists.",
                json!({"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]}),
            )?,
            move |args| {
                write_file(&r, args["path"].as_str().unwrap_or_default(), args["content"].as_str().unwrap_or_default())
            },
        )));
    }
    Ok(tools)
}

/// What a file tool does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FileKind {
    Read,
    List,
    Search,
}

/// `read_file`, `list_dir` or `search_files`, confined to `root`.
struct FileTool {
    spec: ToolSpec,
    kind: FileKind,
    root: PathBuf,
    max_read_bytes: usize,
    read_hard_links: bool,
    /// Decode paths as one of those that exist ([`Tool::live_parameters`]).
    narrow: bool,
}

impl Tool for FileTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    fn call(&self, args: &Value) -> std::result::Result<Value, ToolError> {
        let path = args["path"].as_str();
        match self.kind {
            FileKind::Read => {
                read_file(&self.root, path.unwrap_or_default(), self.max_read_bytes, self.read_hard_links)
            }
            FileKind::List => list_dir(&self.root, path.unwrap_or(".")),
            FileKind::Search => {
                search_files(&self.root, path.unwrap_or("."), args["text"].as_str().unwrap_or_default())
            }
        }
    }
    fn read_only(&self) -> bool {
        true
    }
    fn live_parameters(&self) -> Option<Value> {
        if !self.narrow {
            return None;
        }
        let tree = Tree::walk(&self.root)?;
        let paths: Vec<&String> = match self.kind {
            FileKind::Read => tree.files.iter().collect(),
            FileKind::List | FileKind::Search => tree.dirs.iter().collect(),
        };
        if paths.is_empty() {
            return None;
        }
        let mut schema = self.spec.parameters.clone();
        let path = schema.pointer_mut("/properties/path")?.as_object_mut()?;
        path.insert("enum".into(), json!(paths));
        Some(schema)
    }
    fn needed_for(&self, request: &str, done: &[Done]) -> Option<Need> {
        // A file is read by read_file; a folder listed by list_dir or searched by search_files.
        let tree = Tree::walk(&self.root);
        paths_named_in(request, tree.as_ref()).into_iter().find_map(|(at, named)| match named {
            Named::Entry(path, is_dir) if !touched(&path, done) => {
                let fits = match self.kind {
                    FileKind::Read => !is_dir,
                    FileKind::List | FileKind::Search => is_dir,
                };
                let reason = format!("the request names `{path}`");
                fits.then(|| Need { reason, at, calls: vec![self.narrowed(&path)] })
            }
            _ => None,
        })
    }
}

impl FileTool {
    /// The spec with its path fixed to `path`.
    fn narrowed(&self, path: &str) -> ToolSpec {
        let mut spec = self.spec.clone();
        if let Some(p) = spec.parameters.pointer_mut("/properties/path").and_then(Value::as_object_mut) {
            p.insert("enum".into(), json!([path]));
        }
        if let Some(o) = spec.parameters.as_object_mut() {
            let required = o.entry("required").or_insert_with(|| json!([]));
            if let Some(r) = required.as_array_mut().filter(|r| !r.contains(&json!("path"))) {
                r.push(json!("path"));
            }
        }
        spec
    }
}

/// Resolves `rel` under `root`, refusing anything that leaves it: absolute paths, `..`, and symlinks
/// pointing outside (the resolved path must still start with the root).
fn confine(root: &Path, rel: &str, must_exist: bool) -> std::result::Result<PathBuf, ToolError> {
    let p = &paths::unescaped(root, rel);
    if p.is_absolute() || p.components().any(|c| matches!(c, Component::ParentDir | Component::Prefix(_))) {
        return Err(ToolError(format!("`{rel}` is outside the working directory")));
    }
    let joined = root.join(p);
    let resolved = if must_exist {
        joined.canonicalize().map_err(|e| ToolError(format!("{rel}: {e}")))?
    } else {
        let parent = joined.parent().unwrap_or(root);
        let parent = parent.canonicalize().map_err(|e| ToolError(format!("{rel}: {e}")))?;
        parent.join(joined.file_name().ok_or_else(|| ToolError(format!("`{rel}` names no file")))?)
    };
    if !resolved.starts_with(root) {
        return Err(ToolError(format!("`{rel}` is outside the working directory")));
    }
    Ok(resolved)
}

fn read_file(root: &Path, rel: &str, max: usize, links_ok: bool) -> std::result::Result<Value, ToolError> {
    use std::io::Read;
    // A small model guesses paths: a missing file's error names the files it may have meant, and a
    // directory's error lists it, so the next call can be right.
    let path = match confine(root, rel, true) {
        Err(e) if !root.join(rel).exists() && !e.0.contains("outside") => {
            let near = similar_paths(root, rel);
            return match near.as_slice() {
                // One file of that name elsewhere, or of a name a letter or an extension away: read, saying so.
                [only] => {
                    let text = read_file(root, only, max, links_ok)?;
                    let text = text.as_str().unwrap_or_default();
                    Ok(Value::String(format!(
                        "[no file {rel}; this is {only}, the only file of a similar name]\n{text}"
                    )))
                }
                [] => Err(ToolError(format!("{rel}: no such file (list_dir shows what there is)"))),
                _ => Err(ToolError(format!("{rel}: no such file; did you mean {}?", near.join(", ")))),
            };
        }
        r => r?,
    };
    let err = |e: std::io::Error| ToolError(format!("{rel}: {e}"));
    let meta = std::fs::metadata(&path).map_err(err)?;
    if meta.is_dir() {
        let listing = list_dir(root, rel)?;
        let entries = listing.as_str().unwrap_or_default().replace('\n', ", ");
        return Err(ToolError(format!("`{rel}` is a directory; its entries: {entries}")));
    }
    // Checked before opening: a FIFO or a device would block or never end.
    if !meta.is_file() {
        return Err(ToolError(format!("`{rel}` is not a regular file")));
    }
    // A hard link is the same file as one that may lie outside the root.
    if !links_ok && links(&meta) > 1 {
        return Err(ToolError(format!("`{rel}` has other hard links (maybe outside the working directory)")));
    }
    // Never more than `max` bytes in memory, whatever the file's size.
    let mut bytes = Vec::new();
    std::fs::File::open(&path).map_err(err)?.take(max as u64).read_to_end(&mut bytes).map_err(err)?;
    // A NUL in the first KiB: not text (64 KiB of control characters tell the model nothing).
    if bytes[..bytes.len().min(1024)].contains(&0) {
        return Err(ToolError(format!("`{rel}` is a binary file ({} bytes), not text", meta.len())));
    }
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    if meta.len() > max as u64 {
        text.push_str(&format!("\n[... cut: the file has {} bytes, {max} shown]", meta.len()));
    }
    Ok(Value::String(text))
}

/// How many names the file has (1 where the platform does not say).
fn links(meta: &std::fs::Metadata) -> u64 {
    #[cfg(unix)]
    return std::os::unix::fs::MetadataExt::nlink(meta);
    #[cfg(not(unix))]
    {
        let _ = meta;
        1
    }
}

/// Files under `root` that `rel` may have meant: the same file name in another directory, or a name that
/// differs only in its extension or by a letter or two. A bounded walk (depth 4, 2,000 entries), sorted,
/// at most 5. Hidden files and folders (`.git`, `.env`, `.ssh`: a name starting with `.`) are never
/// offered unless `rel` itself names a hidden one.
fn similar_paths(root: &Path, rel: &str) -> Vec<String> {
    let hidden_ok =
        Path::new(rel).components().any(|c| c.as_os_str().to_string_lossy().starts_with('.') && c != Component::CurDir);
    let want = Path::new(rel).file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
    let stem = |n: &str| n.rsplit_once('.').map_or(n, |(s, _)| s).to_string();
    let close = |name: &str| {
        let name = name.to_lowercase();
        name == want || (!stem(&want).is_empty() && stem(&name) == stem(&want)) || edit_distance(&name, &want) <= 2
    };
    let (mut found, mut seen) = (Vec::new(), 0usize);
    let mut stack = vec![(root.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            seen += 1;
            if seen > 2000 {
                break;
            }
            if !hidden_ok && e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            if is_dir && depth < 4 {
                stack.push((e.path(), depth + 1));
            } else if !is_dir && close(&e.file_name().to_string_lossy()) {
                if let Ok(r) = e.path().strip_prefix(root) {
                    found.push(paths::shown(r));
                }
            }
        }
    }
    found.sort();
    found.truncate(5);
    found
}

/// Lines containing `text` (ignoring case) in the regular files under `rel`: a bounded walk (depth 6,
/// 5,000 entries, files up to 1 MiB, binary files skipped, symbolic links not followed), at most 50 lines.
fn search_files(root: &Path, rel: &str, text: &str) -> std::result::Result<Value, ToolError> {
    const MAX_LINES: usize = 50;
    if text.trim().is_empty() {
        return Err(ToolError("give a text to search for".into()));
    }
    let dir = confine(root, if rel.is_empty() { "." } else { rel }, true)?;
    if !dir.is_dir() {
        return Err(ToolError(format!("`{rel}` is not a directory")));
    }
    let needle = text.to_lowercase();
    let (mut hits, mut seen, mut more) = (Vec::new(), 0usize, false);
    // Files not searched, said with the result: a hit could be in them.
    let (mut big, mut binary) = (Vec::new(), Vec::new());
    let rel_name = |p: &Path| p.strip_prefix(root).map(paths::shown).unwrap_or_default();
    let mut stack = vec![(dir, 0usize)];
    while let Some((d, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        let mut entries: Vec<_> = entries.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            seen += 1;
            let Ok(meta) = e.path().symlink_metadata() else { continue };
            if seen > 5000 {
                more = true;
                break;
            }
            if meta.is_dir() && depth < 6 {
                stack.push((e.path(), depth + 1));
                continue;
            }
            if !meta.is_file() {
                continue;
            }
            if meta.len() > 1 << 20 {
                big.push(rel_name(&e.path()));
                continue;
            }
            let Ok(bytes) = std::fs::read(e.path()) else { continue };
            if bytes[..bytes.len().min(1024)].contains(&0) {
                binary.push(rel_name(&e.path()));
                continue;
            }
            let name = rel_name(&e.path());
            for (i, line) in String::from_utf8_lossy(&bytes).lines().enumerate() {
                if line.to_lowercase().contains(&needle) {
                    if hits.len() == MAX_LINES {
                        more = true;
                        break;
                    }
                    let line: String = line.trim().chars().take(200).collect();
                    hits.push(format!("{name}:{}: {line}", i + 1));
                }
            }
        }
    }
    let mut skipped = Vec::new();
    for (files, why) in [(&big, "over 1 MiB"), (&binary, "binary")] {
        if !files.is_empty() {
            let shown: Vec<&str> = files.iter().take(5).map(String::as_str).collect();
            let more = if files.len() > 5 { ", …" } else { "" };
            skipped.push(format!("{} {why} file(s) not searched: {}{more}", files.len(), shown.join(", ")));
        }
    }
    // Nothing found is a failed lookup: an answer that repeats it is no answer.
    if hits.is_empty() {
        let not_searched = if skipped.is_empty() { String::new() } else { format!(" ({})", skipped.join("; ")) };
        return Err(ToolError(format!("no line contains `{text}` in the files under `{rel}`{not_searched}")));
    }
    if more {
        hits.push("[... more not shown]".into());
    }
    hits.extend(skipped.into_iter().map(|s| format!("[{s}]")));
    Ok(Value::String(hits.join("\n")))
}

/// Levenshtein distance over chars (names are short).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

fn list_dir(root: &Path, rel: &str) -> std::result::Result<Value, ToolError> {
    let path = confine(root, if rel.is_empty() { "." } else { rel }, true)?;
    let mut names: Vec<String> = std::fs::read_dir(&path)
        .map_err(|e| ToolError(format!("{rel}: {e}")))?
        .filter_map(|e| e.ok())
        .map(|e| {
            let mut n = paths::shown(Path::new(&e.file_name()));
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                n.push('/');
            }
            n
        })
        .collect();
    names.sort();
    // A folder of 100,000 files is not one observation of them all.
    if names.len() > MAX_LISTED {
        let more = names.len() - MAX_LISTED;
        names.truncate(MAX_LISTED);
        names.push(format!("[... {more} more not shown]"));
    }
    Ok(Value::String(names.join("\n")))
}

/// The most entries `list_dir` shows.
const MAX_LISTED: usize = 200;

fn write_file(root: &Path, rel: &str, content: &str) -> std::result::Result<Value, ToolError> {
    let path = confine(root, rel, false)?;
    if path.is_symlink() {
        return Err(ToolError(format!("`{rel}` is a symbolic link; not writing through it")));
    }
    if let Ok(meta) = std::fs::symlink_metadata(&path) {
        if !meta.is_file() {
            return Err(ToolError(format!("`{rel}` is not a regular file; not writing to it")));
        }
        if links(&meta) > 1 {
            return Err(ToolError(format!("`{rel}` has other hard links (maybe outside the working directory)")));
        }
    }
    std::fs::write(&path, content).map_err(|e| ToolError(format!("{rel}: {e}")))?;
    Ok(Value::String(format!("wrote {} bytes to {rel}", content.len())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calculator_is_arithmetic_only() {
        assert_eq!(calculate("37 * 43 + 12").unwrap(), json!(1603));
        assert_eq!(calculate("7 / 2").unwrap(), json!(3.5));
        assert_eq!(calculate("(1.5 + .5) ^ 3").unwrap(), json!(8));
        assert!(calculate("x = 3").is_err());
        assert!(calculate("1 / 0").is_err());
        assert!(calculate("2 +").is_err());
        // A percent sign after an operand is a hundredth; between operands, the remainder.
        assert_eq!(calculate("15% * 2340").unwrap(), json!(351));
        assert_eq!(calculate("2340 * 15 %").unwrap(), json!(351));
        assert_eq!(calculate("100 / 12.5%").unwrap(), json!(800));
        assert_eq!(calculate("(10 + 10)% * 50").unwrap(), json!(10));
        assert_eq!(calculate("17 % 5").unwrap(), json!(2));
        assert_eq!(calculate("17 %(5)").unwrap(), json!(2));
        // Python's power and a square root, as models write them.
        assert_eq!(calculate("6**3").unwrap(), json!(216));
        assert_eq!(calculate("169 ** 0.5").unwrap(), json!(13));
        assert_eq!(calculate("sqrt(169) + 1").unwrap(), json!(14));
        assert_eq!(calculate("√(2 * 8)").unwrap(), json!(4));
        assert_eq!(calculate("√169").unwrap(), json!(13));
        assert_eq!(calculate("2 * √ 9").unwrap(), json!(6));
        assert!(calculate("sqr(4)").is_err());
        assert!(calculate("sqrt").is_err());
    }

    #[test]
    fn a_missing_file_names_the_files_that_may_have_been_meant() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("docs/old")).unwrap();
        for f in ["docs/travel.md", "docs/old/travel.md", "inventory.csv", "project.txt", "zebra.txt"] {
            std::fs::write(root.join(f), "x").unwrap();
        }
        let err = |p: &str| read_file(&root, p, 100, false).unwrap_err().0;
        assert_eq!(err("travel.md"), "travel.md: no such file; did you mean docs/old/travel.md, docs/travel.md?");
        // A single candidate is read, saying which file it is.
        let read = |p: &str| read_file(&root, p, 100, false).unwrap().as_str().unwrap().to_string();
        assert_eq!(
            read("inventory.txt"),
            "[no file inventory.txt; this is inventory.csv, the only file of a similar name]\nx"
        );
        assert!(read("projects.txt").starts_with("[no file projects.txt; this is project.txt,"));
        assert_eq!(err("nothing/like/this.pdf"), "nothing/like/this.pdf: no such file (list_dir shows what there is)");
        assert!(err("../travel.md").contains("outside"));
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn a_big_folder_is_listed_in_part() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        for i in 0..MAX_LISTED + 5 {
            std::fs::write(root.join(format!("f{i:04}.txt")), "").unwrap();
        }
        let listing = list_dir(&root, ".").unwrap();
        let lines: Vec<&str> = listing.as_str().unwrap().lines().collect();
        assert_eq!(lines.len(), MAX_LISTED + 1);
        assert_eq!(lines[0], "f0000.txt");
        assert_eq!(lines[MAX_LISTED], "[... 5 more not shown]");
    }

    #[test]
    fn search_finds_lines_in_files_under_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("docs/deep")).unwrap();
        std::fs::write(root.join("docs/a.md"), "one\nInvoice 4471 approved\n").unwrap();
        std::fs::write(root.join("docs/deep/b.txt"), "see invoice 4471\n").unwrap();
        std::fs::write(root.join("docs/bin"), b"\0invoice 4471").unwrap();
        std::fs::write(root.join("top.txt"), "invoice 4471").unwrap();
        let found = search_files(&root, "docs", "INVOICE 4471").unwrap();
        // The binary file is said to be left out, as a hit could be in it.
        assert_eq!(
            found,
            json!(
                "docs/a.md:2: Invoice 4471 approved\ndocs/deep/b.txt:1: see invoice 4471\n\
                 [1 binary file(s) not searched: docs/bin]"
            )
        );
        std::fs::write(root.join("docs/big.log"), "x".repeat((1 << 20) + 1)).unwrap();
        assert_eq!(
            search_files(&root, ".", "nowhere").unwrap_err().0,
            "no line contains `nowhere` in the files under `.` (1 over 1 MiB file(s) not searched: docs/big.log; \
             1 binary file(s) not searched: docs/bin)"
        );
        assert!(search_files(&root, "..", "x").unwrap_err().0.contains("outside"));
        assert!(search_files(&root, "top.txt", "x").unwrap_err().0.contains("not a directory"));
        assert!(search_files(&root, ".", " ").is_err());
    }

    #[test]
    fn a_binary_file_is_reported_not_shown() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::write(root.join("image.bin"), [0u8; 3000]).unwrap();
        assert_eq!(
            read_file(&root, "image.bin", 100, false).unwrap_err().0,
            "`image.bin` is a binary file (3000 bytes), not text"
        );
    }

    /// A file name that is not UTF-8 is shown with `\xNN` escapes, and the tools open it by that name.
    #[cfg(target_os = "linux")]
    #[test]
    fn names_that_are_not_utf8_are_shown_in_a_form_the_tools_take_back() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let name = std::ffi::OsStr::from_bytes(b"caf\xe9.txt");
        std::fs::write(root.join(name), "latin-1 name").unwrap();
        let listing = list_dir(&root, ".").unwrap();
        assert_eq!(listing, json!("caf\\xE9.txt"));
        assert_eq!(read_file(&root, "caf\\xE9.txt", 100, false).unwrap(), json!("latin-1 name"));
        assert_eq!(search_files(&root, ".", "latin").unwrap(), json!("caf\\xE9.txt:1: latin-1 name"));
    }

    #[cfg(unix)]
    #[test]
    fn hard_links_fifos_and_devices_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(dir.path().join("outside.txt"), "secret").unwrap();
        std::fs::hard_link(dir.path().join("outside.txt"), root.join("link.txt")).unwrap();
        let fifo = std::ffi::CString::new(root.join("pipe").to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo(3) only creates the file.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        std::os::unix::fs::symlink("/dev/null", root.join("null")).unwrap();
        let root = root.canonicalize().unwrap();
        assert!(read_file(&root, "link.txt", 100, false).unwrap_err().0.contains("hard links"));
        assert_eq!(read_file(&root, "link.txt", 100, true).unwrap(), json!("secret"), "allowed by the option");
        assert!(write_file(&root, "link.txt", "x").unwrap_err().0.contains("hard links"));
        assert_eq!(std::fs::read_to_string(dir.path().join("outside.txt")).unwrap(), "secret");
        assert!(read_file(&root, "pipe", 100, false).unwrap_err().0.contains("not a regular file"));
        assert!(write_file(&root, "pipe", "x").unwrap_err().0.contains("not a regular file"));
        assert!(read_file(&root, "null", 100, false).is_err(), "a link to a device outside the root");
    }

    #[test]
    fn file_tools_stay_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a.txt"), "hello").unwrap();
        std::fs::write(dir.path().join("secret.txt"), "secret").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(dir.path().join("secret.txt"), root.join("link.txt")).unwrap();
        let root = root.canonicalize().unwrap();
        assert_eq!(read_file(&root, "sub/a.txt", 100, false).unwrap(), json!("hello"));
        assert_eq!(list_dir(&root, ".").unwrap().as_str().unwrap().lines().next(), Some("link.txt"));
        for bad in ["../secret.txt", "/etc/passwd", "sub/../../secret.txt", "link.txt"] {
            let err = read_file(&root, bad, 100, false).unwrap_err().0;
            assert!(err.contains("outside"), "{bad}: {err}");
        }
        assert!(write_file(&root, "../x.txt", "no").is_err());
        assert!(write_file(&root, "link.txt", "no").is_err());
        write_file(&root, "sub/b.txt", "new").unwrap();
        assert_eq!(std::fs::read_to_string(root.join("sub/b.txt")).unwrap(), "new");
        assert_eq!(std::fs::read_to_string(dir.path().join("secret.txt")).unwrap(), "secret");
        assert_eq!(
            read_file(&root, "sub", 100, false).unwrap_err().0,
            "`sub` is a directory; its entries: a.txt, b.txt"
        );
        let cut = read_file(&root, "sub/a.txt", 2, false).unwrap();
        assert!(cut.as_str().unwrap().starts_with("he\n[... cut"));
    }
}
