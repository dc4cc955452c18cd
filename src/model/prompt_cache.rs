//! A prompt cache that outlives the process: the KV cache of a prompt prefix (the system prompt and the
//! tool definitions, the same run after run) saved to disk and loaded instead of computed again.
//!
//! Each entry is one file under the cache directory's `prompts/` folder, named by the model's key and a
//! hash of its tokens. The model's key is the file's sha256 (from the catalog for catalog files, else of
//! the file's path, size and modification time) with the kernel tier and prefill path that computed the
//! values, so a prefix is only loaded into the computation that made it. A file holds a header (format
//! version, model key, the token ids), every layer's keys and values as little-endian `f32`, and the
//! sha256 of all that: it is written to a temporary file and renamed into place (a crash never leaves a
//! file that is loaded), and checked in full before it is used (a damaged or foreign file is removed
//! with a warning, never loaded). The folder is kept under a size bound, the least recently used entries
//! removed first.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::attention::KvBlock;
use super::{KvPrefix, ModelInfo};
use crate::error::{Error, Result};

/// The file format's version: a file of another version is not read.
const VERSION: u32 = 1;
const MAGIC: &[u8; 4] = b"RKVC";
/// The default bound on the folder's size.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;
/// The largest header read while looking for a prefix (its token ids): 1 MiB, 256 Ki tokens.
const MAX_HEADER_BYTES: u64 = 1 << 20;

/// The saved prefixes of one model, computed one way.
#[derive(Debug, Clone)]
pub struct PromptCache {
    dir: PathBuf,
    /// The model file's sha256 (or fingerprint) and the kernels that computed the values.
    key: String,
    max_bytes: u64,
}

/// A saved prefix that matches the start of a prompt.
#[derive(Debug, Clone)]
pub struct Hit {
    pub path: PathBuf,
    /// Tokens of the prompt the entry holds (their common prefix).
    pub len: usize,
}

/// One entry, as `reagent cache list` shows it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub path: PathBuf,
    pub bytes: u64,
    pub tokens: usize,
    /// The model key the entry belongs to.
    pub key: String,
}

impl PromptCache {
    /// The folder of saved prefixes: `$REAGENT_PROMPT_CACHE_DIR`, else `prompts/` in the model cache.
    pub fn default_dir() -> PathBuf {
        match std::env::var_os("REAGENT_PROMPT_CACHE_DIR").filter(|d| !d.is_empty()) {
            Some(d) => PathBuf::from(d),
            None => crate::catalog::cache_dir().join("prompts"),
        }
    }

    /// The cache of the model `info` describes, in `dir`.
    pub fn for_model(dir: impl Into<PathBuf>, info: &ModelInfo) -> Self {
        let file = match crate::catalog::entry_of_file(&info.path, info.file_bytes) {
            Some(entry) => entry.sha256,
            None => {
                let modified = std::fs::metadata(&info.path).and_then(|m| m.modified()).ok();
                let stamp = format!("{}|{}|{modified:?}", info.path.display(), info.file_bytes);
                hex(&Sha256::digest(stamp.as_bytes()))
            }
        };
        let compute = match info.f32_reference {
            true => "f32".to_string(),
            false => format!("{}-{}", super::kernels::Tier::best().name(), info.prefill_path()),
        };
        let key = format!("{}-{compute}", &file[..16.min(file.len())]);
        Self { dir: dir.into(), key, max_bytes: DEFAULT_MAX_BYTES }
    }

    /// Bounds the folder's size (at least one entry is always kept).
    #[must_use]
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = bytes;
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry holding the longest prefix of `tokens`, of more than `more_than` tokens.
    pub fn lookup(&self, tokens: &[u32], more_than: usize) -> Option<Hit> {
        let mut best: Option<Hit> = None;
        for path in self.files_of_this_model() {
            let Ok(saved) = read_header(&path, &self.key) else { continue };
            let len = saved.iter().zip(tokens).take_while(|(a, b)| a == b).count();
            if len > more_than && best.as_ref().is_none_or(|b| len > b.len) {
                best = Some(Hit { path, len });
            }
        }
        best
    }

    /// Reads `hit`'s entry, checked in full, cut to the prefix it matched. A damaged entry is removed and
    /// reported as an error.
    pub fn load(&self, hit: &Hit) -> Result<KvPrefix> {
        let bad = |problem: String| Error::InputFile { path: hit.path.clone(), problem };
        let loaded = read_entry(&hit.path, &self.key);
        let (_, mut prefix) = loaded.map_err(|e| {
            let _ = std::fs::remove_file(&hit.path);
            bad(format!("a damaged saved prompt, removed: {e}"))
        })?;
        if prefix.len < hit.len {
            return Err(bad("holds fewer tokens than its header says".into()));
        }
        prefix.truncate(hit.len);
        // Used now: the last to be evicted.
        if let Ok(f) = std::fs::File::options().append(true).open(&hit.path) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
        Ok(prefix)
    }

    /// Saves `prefix`, the KV of `tokens` (its first `prefix.len`), then trims the folder to its bound.
    /// Written to a temporary file and renamed, so a reader never sees part of an entry.
    pub fn store(&self, tokens: &[u32], prefix: &KvPrefix) -> Result<PathBuf> {
        let tokens = &tokens[..prefix.len.min(tokens.len())];
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
        let name = {
            let mut h = Sha256::new();
            tokens.iter().for_each(|t| h.update(t.to_le_bytes()));
            format!("{}-{}.kv", self.key, &hex(&h.finalize())[..16])
        };
        let path = self.dir.join(name);
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
        {
            let mut out = HashingWriter { inner: std::io::BufWriter::new(tmp.as_file_mut()), hash: Sha256::new() };
            write_entry(&mut out, &self.key, tokens, prefix).map_err(|e| Error::io(&path, e))?;
            let digest = out.hash.finalize();
            out.inner.write_all(&digest).and_then(|_| out.inner.flush()).map_err(|e| Error::io(&path, e))?;
        }
        tmp.persist(&path).map_err(|e| Error::io(&path, e.error))?;
        self.evict(&path);
        Ok(path)
    }

    /// Removes the least recently used entries while the folder is over its bound, never `keep`.
    fn evict(&self, keep: &Path) {
        let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = entries_in(&self.dir)
            .into_iter()
            .filter_map(|p| {
                let m = std::fs::metadata(&p).ok()?;
                Some((m.modified().ok()?, m.len(), p))
            })
            .collect();
        entries.sort();
        let mut total: u64 = entries.iter().map(|(_, b, _)| b).sum();
        for (_, bytes, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            if path != keep && std::fs::remove_file(&path).is_ok() {
                total -= bytes;
            }
        }
    }

    fn files_of_this_model(&self) -> Vec<PathBuf> {
        let prefix = format!("{}-", self.key);
        entries_in(&self.dir)
            .into_iter()
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix)))
            .collect()
    }
}

/// Every entry in `dir` (any model), for `reagent cache list`.
pub fn list(dir: &Path) -> Vec<Entry> {
    let mut out: Vec<Entry> = entries_in(dir)
        .into_iter()
        .filter_map(|path| {
            let bytes = std::fs::metadata(&path).ok()?.len();
            let (key, tokens) = read_header_any(&path).ok()?;
            Some(Entry { path, bytes, tokens: tokens.len(), key })
        })
        .collect();
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// Removes every entry in `dir`; how many were removed.
pub fn clear(dir: &Path) -> Result<usize> {
    let mut n = 0;
    for path in entries_in(dir) {
        std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
        n += 1;
    }
    Ok(n)
}

fn entries_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "kv") && p.is_file()).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

struct HashingWriter<W: Write> {
    inner: W,
    hash: Sha256,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn write_entry(out: &mut impl Write, key: &str, tokens: &[u32], prefix: &KvPrefix) -> std::io::Result<()> {
    let u32s = |out: &mut dyn Write, xs: &[u32]| xs.iter().try_for_each(|x| out.write_all(&x.to_le_bytes()));
    out.write_all(MAGIC)?;
    u32s(out, &[VERSION, key.len() as u32])?;
    out.write_all(key.as_bytes())?;
    u32s(out, &[tokens.len() as u32])?;
    u32s(out, tokens)?;
    u32s(out, &[prefix.layers.len() as u32, prefix.len as u32])?;
    let mut bytes = Vec::new();
    for layer in &prefix.layers {
        u32s(out, &[layer.k.len() as u32, layer.d as u32])?;
        for buf in layer.k.iter().chain(&layer.v) {
            bytes.clear();
            bytes.extend(buf.iter().flat_map(|x| x.to_le_bytes()));
            out.write_all(&bytes)?;
        }
    }
    Ok(())
}

/// A little-endian reader over a byte slice that fails (never panics) past its end.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn take(&mut self, n: usize) -> std::result::Result<&[u8], String> {
        if self.0.len() < n {
            return Err("cut short".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
}

/// The key and token ids of an entry's header.
fn parse_header(b: &mut Bytes) -> std::result::Result<(String, Vec<u32>), String> {
    if b.take(4)? != MAGIC {
        return Err("not a saved prompt".into());
    }
    let version = b.u32()?;
    if version != VERSION {
        return Err(format!("format version {version}, not {VERSION}"));
    }
    let key_len = b.u32()? as usize;
    let key = String::from_utf8(b.take(key_len.min(256))?.to_vec()).map_err(|_| "a key that is not text")?;
    let n = b.u32()? as usize;
    let tokens = b.take(n.checked_mul(4).ok_or("too many tokens")?)?;
    Ok((key, tokens.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()))
}

fn read_header_any(path: &Path) -> std::result::Result<(String, Vec<u32>), String> {
    // Read piece by piece: only the header, not the values after it.
    let mut f = std::io::BufReader::new(std::fs::File::open(path).map_err(|e| e.to_string())?);
    let mut head = vec![0u8; 12];
    f.read_exact(&mut head).map_err(|e| e.to_string())?;
    let key_len = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes")) as usize;
    let mut more = vec![0u8; key_len.min(256) + 4];
    f.read_exact(&mut more).map_err(|e| e.to_string())?;
    head.extend_from_slice(&more);
    let n = u32::from_le_bytes(more[more.len() - 4..].try_into().expect("4 bytes")) as u64;
    if n * 4 > MAX_HEADER_BYTES {
        return Err("too many tokens".into());
    }
    let mut tokens = vec![0u8; n as usize * 4];
    f.read_exact(&mut tokens).map_err(|e| e.to_string())?;
    head.extend_from_slice(&tokens);
    parse_header(&mut Bytes(&head))
}

/// The token ids of an entry of the model `key`.
fn read_header(path: &Path, key: &str) -> std::result::Result<Vec<u32>, String> {
    let (found, tokens) = read_header_any(path)?;
    if found != key {
        return Err(format!("another model's entry ({found})"));
    }
    Ok(tokens)
}

/// A whole entry of the model `key`, its checksum verified before anything in it is used.
fn read_entry(path: &Path, key: &str) -> std::result::Result<(Vec<u32>, KvPrefix), String> {
    let data = std::fs::read(path).map_err(|e| e.to_string())?;
    if data.len() < 32 {
        return Err("cut short".into());
    }
    let (body, digest) = data.split_at(data.len() - 32);
    if Sha256::digest(body).as_slice() != digest {
        return Err("its checksum does not match".into());
    }
    let mut b = Bytes(body);
    let (found, tokens) = parse_header(&mut b)?;
    if found != key {
        return Err(format!("another model's entry ({found})"));
    }
    let layers = b.u32()? as usize;
    let len = b.u32()? as usize;
    if len != tokens.len() {
        return Err("its token count and its positions differ".into());
    }
    let mut out = Vec::with_capacity(layers.min(1024));
    for _ in 0..layers {
        let heads = b.u32()? as usize;
        let d = b.u32()? as usize;
        let per = len.checked_mul(d).and_then(|x| x.checked_mul(4)).ok_or("sizes overflow")?;
        // Each head's keys and values must be in the bytes left (a crafted count allocates nothing).
        if heads == 0 || d == 0 || heads.checked_mul(per).and_then(|x| x.checked_mul(2)).is_none_or(|n| n > b.0.len()) {
            return Err("layer sizes that do not fit the file".into());
        }
        let read = |b: &mut Bytes| -> std::result::Result<Vec<Vec<f32>>, String> {
            (0..heads)
                .map(|_| {
                    let raw = b.take(per)?;
                    Ok(raw.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
                })
                .collect()
        };
        let k = read(&mut b)?;
        let v = read(&mut b)?;
        out.push(KvBlock { d, len, k, v });
    }
    if !b.0.is_empty() {
        return Err("bytes after the last layer".into());
    }
    Ok((tokens, KvPrefix { len, layers: out }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(len: usize) -> KvPrefix {
        let block = || KvBlock { d: 4, len, k: vec![vec![0.5; len * 4]; 2], v: vec![vec![-1.5; len * 4]; 2] };
        KvPrefix { len, layers: vec![block(), block()] }
    }

    fn cache(dir: &Path, key: &str) -> PromptCache {
        PromptCache { dir: dir.to_path_buf(), key: key.into(), max_bytes: DEFAULT_MAX_BYTES }
    }

    #[test]
    fn entries_round_trip_and_belong_to_their_model() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path(), "model-a");
        let tokens: Vec<u32> = (0..100).collect();
        c.store(&tokens, &prefix(100)).unwrap();
        let hit = c.lookup(&tokens, 0).unwrap();
        assert_eq!(hit.len, 100);
        assert_eq!(c.load(&hit).unwrap(), prefix(100));
        // Another model (or kernel tier) never sees it.
        assert!(cache(dir.path(), "model-b").lookup(&tokens, 0).is_none());
        // A file that is cut short is refused and removed.
        let bytes = std::fs::read(&hit.path).unwrap();
        std::fs::write(&hit.path, &bytes[..bytes.len() - 10]).unwrap();
        assert!(c.load(&hit).is_err());
        assert!(!hit.path.exists());
    }

    /// An entry with a valid checksum but crafted sizes (a million heads of zero width) is refused
    /// without allocating by its counts.
    #[test]
    fn crafted_layer_sizes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path(), "m");
        let crafted =
            KvPrefix { len: 3, layers: vec![KvBlock { d: 0, len: 3, k: vec![Vec::new(); 1_000_000], v: vec![] }] };
        c.store(&[1, 2, 3], &crafted).unwrap();
        let hit = c.lookup(&[1, 2, 3], 0).unwrap();
        assert!(c.load(&hit).unwrap_err().to_string().contains("layer sizes"));
    }

    #[test]
    fn the_least_recently_used_entries_go_first() {
        let dir = tempfile::tempdir().unwrap();
        let one = std::fs::metadata(cache(dir.path(), "m").store(&[1; 50], &prefix(50)).unwrap()).unwrap().len();
        clear(dir.path()).unwrap();
        let c = cache(dir.path(), "m").max_bytes(2 * one + one / 2);
        let a = c.store(&[1; 50], &prefix(50)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = c.store(&[2; 50], &prefix(50)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        // `a` is used again: `b` is now the least recently used.
        c.load(&c.lookup(&[1; 50], 0).unwrap()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let third = c.store(&[3; 50], &prefix(50)).unwrap();
        assert!(a.exists() && third.exists() && !b.exists());
        assert_eq!(list(dir.path()).len(), 2);
    }

    /// The cache shared by processes: two stores of the same entry at once leave one whole entry; an
    /// entry of another model renamed into this model's name is never loaded; an entry removed between
    /// its lookup and its load is an error to the caller (who computes instead), not a panic; a folder
    /// that cannot be written to fails the store alone.
    #[test]
    fn a_shared_folder_never_gives_a_wrong_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let tokens: Vec<u32> = (0..64).collect();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| cache(dir.path(), "m").store(&tokens, &prefix(64)).unwrap());
            }
        });
        let c = cache(dir.path(), "m");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "one entry, no temporary files left");
        assert_eq!(c.load(&c.lookup(&tokens, 0).unwrap()).unwrap(), prefix(64));

        // Another model's entry under this model's file name: its header says whose it is.
        let other = cache(dir.path(), "other").store(&[7; 64], &prefix(64)).unwrap();
        let renamed = dir.path().join(format!("m-{}", "0".repeat(16)) + ".kv");
        std::fs::rename(&other, &renamed).unwrap();
        assert!(c.lookup(&[7; 64], 0).is_none());

        // Evicted by another process after the lookup.
        let hit = c.lookup(&tokens, 0).unwrap();
        std::fs::remove_file(&hit.path).unwrap();
        assert!(c.load(&hit).is_err());

        // A folder that cannot be made (a file stands in its place).
        let blocked = dir.path().join("file");
        std::fs::write(&blocked, "x").unwrap();
        assert!(cache(&blocked.join("prompts"), "m").store(&tokens, &prefix(64)).is_err());
        assert!(cache(&blocked.join("prompts"), "m").lookup(&tokens, 0).is_none());
    }
}
