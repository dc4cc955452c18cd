//! Built-in tools: `calculator`, `current_time`, and `read_file` / `list_dir` / `write_file` confined to a
//! root directory (symlinks and `..` cannot leave it; `write_file` only when enabled).

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};

use super::{FnTool, Tool, ToolError, ToolSpec};
use crate::error::{Error, Result};

/// Which built-ins to create, and where the file tools may look.
#[derive(Debug, Clone)]
pub struct BuiltinOptions {
    /// The directory `read_file`, `list_dir` and `write_file` are confined to.
    pub root: PathBuf,
    /// Offer `write_file`.
    pub allow_write: bool,
    /// Largest file `read_file` returns (longer files are cut, saying so).
    pub max_read_bytes: usize,
}

impl Default for BuiltinOptions {
    fn default() -> Self {
        Self { root: PathBuf::from("."), allow_write: false, max_read_bytes: 64 * 1024 }
    }
}

/// The built-in tools.
pub fn builtin_tools(opts: &BuiltinOptions) -> Result<Vec<Arc<dyn Tool>>> {
    let root = opts.root.canonicalize().map_err(|e| Error::io(&opts.root, e))?;
    if !root.is_dir() {
        return Err(Error::InvalidArgument(format!("--root {} is not a directory", root.display())));
    }
    let mut tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(FnTool::new(
            ToolSpec::new(
                "calculator",
                "Evaluates an arithmetic expression (+ - * / % ^, parentheses, decimals) and returns the exact number. \
                 Use it for every calculation instead of computing in your head.",
                json!({"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 37 * 43 + 12"}}, "required": ["expression"]}),
            )?,
            |args| calculate(args["expression"].as_str().unwrap_or_default()),
        )),
        Arc::new(FnTool::new(
            ToolSpec::new(
                "current_time",
                "Returns the current date and time in UTC (RFC 3339).",
                json!({"type": "object", "properties": {}}),
            )?,
            |_| Ok(Value::String(humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string())),
        )),
    ];
    let (r, max) = (root.clone(), opts.max_read_bytes);
    tools.push(Arc::new(FnTool::new(
        ToolSpec::new(
            "read_file",
            "Reads a text file under the working directory.",
            json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        )?,
        move |args| read_file(&r, args["path"].as_str().unwrap_or_default(), max),
    )));
    let r = root.clone();
    tools.push(Arc::new(FnTool::new(
        ToolSpec::new(
            "list_dir",
            "Lists a directory under the working directory (directories end with /).",
            json!({"type": "object", "properties": {"path": {"type": "string", "description": "default: ."}}}),
        )?,
        move |args| list_dir(&r, args["path"].as_str().unwrap_or(".")),
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

/// Arithmetic only: evalexpr on an empty context, so no variables, assignments or user functions.
fn calculate(expr: &str) -> std::result::Result<Value, ToolError> {
    if expr.len() > 1000 {
        return Err(ToolError("expression too long".into()));
    }
    let ok = |c: char| c.is_ascii_digit() || c.is_whitespace() || "+-*/%^().eE".contains(c);
    if let Some(bad) = expr.chars().find(|&c| !ok(c)) {
        return Err(ToolError(format!("only numbers and + - * / % ^ ( ) are allowed, found `{bad}`")));
    }
    // Integers would divide as integers (7/2 = 3): evaluate in floating point.
    let v = evalexpr::eval_number(&float_literals(expr)).map_err(|e| ToolError(format!("cannot evaluate: {e}")))?;
    if !v.is_finite() {
        return Err(ToolError("the result is not a finite number".into()));
    }
    Ok(if v.fract() == 0.0 && v.abs() < 9.0e15 { json!(v as i64) } else { json!(v) })
}

/// Writes every integer literal as a float (`7` → `7.0`).
fn float_literals(expr: &str) -> String {
    let mut out = String::with_capacity(expr.len() + 8);
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].is_ascii_digit() || (chars[i] == '.' && chars.get(i + 1).is_some_and(|c| c.is_ascii_digit())) {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            let lit: String = chars[start..i].iter().collect();
            out.push_str(if lit.starts_with('.') { "0" } else { "" });
            out.push_str(&lit);
            if !lit.contains('.') {
                out.push_str(".0");
            } else if lit.ends_with('.') {
                out.push('0');
            }
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

/// Resolves `rel` under `root`, refusing anything that leaves it: absolute paths, `..`, and symlinks
/// pointing outside (the resolved path must still start with the root).
fn confine(root: &Path, rel: &str, must_exist: bool) -> std::result::Result<PathBuf, ToolError> {
    let p = Path::new(rel);
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

fn read_file(root: &Path, rel: &str, max: usize) -> std::result::Result<Value, ToolError> {
    use std::io::Read;
    let path = confine(root, rel, true)?;
    let err = |e: std::io::Error| ToolError(format!("{rel}: {e}"));
    let meta = std::fs::metadata(&path).map_err(err)?;
    if !meta.is_file() {
        return Err(ToolError(format!("`{rel}` is not a regular file")));
    }
    // Never more than `max` bytes in memory, whatever the file's size.
    let mut bytes = Vec::new();
    std::fs::File::open(&path).map_err(err)?.take(max as u64).read_to_end(&mut bytes).map_err(err)?;
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    if meta.len() > max as u64 {
        text.push_str(&format!("\n[... cut: the file has {} bytes, {max} shown]", meta.len()));
    }
    Ok(Value::String(text))
}

fn list_dir(root: &Path, rel: &str) -> std::result::Result<Value, ToolError> {
    let path = confine(root, if rel.is_empty() { "." } else { rel }, true)?;
    let mut names: Vec<String> = std::fs::read_dir(&path)
        .map_err(|e| ToolError(format!("{rel}: {e}")))?
        .filter_map(|e| e.ok())
        .map(|e| {
            let mut n = e.file_name().to_string_lossy().into_owned();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                n.push('/');
            }
            n
        })
        .collect();
    names.sort();
    Ok(Value::String(names.join("\n")))
}

fn write_file(root: &Path, rel: &str, content: &str) -> std::result::Result<Value, ToolError> {
    let path = confine(root, rel, false)?;
    if path.is_symlink() {
        return Err(ToolError(format!("`{rel}` is a symbolic link; not writing through it")));
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
        assert_eq!(read_file(&root, "sub/a.txt", 100).unwrap(), json!("hello"));
        assert_eq!(list_dir(&root, ".").unwrap().as_str().unwrap().lines().next(), Some("link.txt"));
        for bad in ["../secret.txt", "/etc/passwd", "sub/../../secret.txt", "link.txt"] {
            let err = read_file(&root, bad, 100).unwrap_err().0;
            assert!(err.contains("outside"), "{bad}: {err}");
        }
        assert!(write_file(&root, "../x.txt", "no").is_err());
        assert!(write_file(&root, "link.txt", "no").is_err());
        write_file(&root, "sub/b.txt", "new").unwrap();
        assert_eq!(std::fs::read_to_string(root.join("sub/b.txt")).unwrap(), "new");
        assert_eq!(std::fs::read_to_string(dir.path().join("secret.txt")).unwrap(), "secret");
        assert!(read_file(&root, "sub", 100).unwrap_err().0.contains("not a regular file"));
        let cut = read_file(&root, "sub/a.txt", 2).unwrap();
        assert!(cut.as_str().unwrap().starts_with("he\n[... cut"));
    }
}
