//! A GGUF file opened for loading: header, metadata accessors and tensor reads that name the file and the
//! tensor in every error.
//!
//! Parsing is candle's (`gguf_file::Content`), which already bounds-checks every length against the file
//! size; this wrapper adds the path to errors, checks up front that every tensor's bytes lie inside the file
//! (so a truncated download fails at open time, naming the first tensor cut off), and offers typed metadata
//! getters that say which key is missing or mistyped.
//!
//! The file is memory-mapped: weights in the types reagent's own kernels read ([`MappedTensor`]) are used
//! in place, so loading copies nothing and the weights count once in memory (as page cache), unless the
//! file is first read onto huge pages ([`GgufFile::copy_to_huge_pages`], the CPU default); other tensors are
//! copied into candle `QTensor`s from the map.

use std::fs::File;
use std::io::{Cursor, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::Device;

use crate::error::{Error, Result};

/// An open GGUF file.
pub struct GgufFile {
    path: PathBuf,
    content: gguf_file::Content,
    map: Arc<memmap2::Mmap>,
    /// Layers built from this file compute every product in f32 on dequantized weights.
    pub(crate) f32_reference: bool,
}

/// A tensor's bytes inside the memory-mapped file, in GGUF's own layout.
#[derive(Clone)]
pub struct MappedTensor {
    map: Arc<memmap2::Mmap>,
    offset: usize,
    len: usize,
    /// Shape, outermost dimension first.
    pub dims: Vec<usize>,
    pub dtype: GgmlDType,
}

impl MappedTensor {
    /// The tensor's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.offset..self.offset + self.len]
    }

    /// Rows `start..start + count` of a matrix (one part of a fused one), in place; `None` past its end.
    pub fn rows(&self, start: usize, count: usize) -> Option<MappedTensor> {
        let rows = *self.dims.first()?;
        let end = start.checked_add(count).filter(|&e| e <= rows && rows > 0 && self.len.is_multiple_of(rows))?;
        let row_bytes = self.len / rows;
        let mut dims = self.dims.clone();
        dims[0] = end - start;
        Some(MappedTensor {
            map: self.map.clone(),
            offset: self.offset + start * row_bytes,
            len: (end - start) * row_bytes,
            dims,
            dtype: self.dtype,
        })
    }
}

/// The process's anonymous memory on huge pages, in bytes (Linux; `None` elsewhere or when unreadable).
fn anon_huge_bytes() -> Option<usize> {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let line = rollup.lines().find(|l| l.starts_with("AnonHugePages:"))?;
    line.split_whitespace().nth(1)?.parse::<usize>().ok().map(|kb| kb * 1024)
}

/// Bytes of a tensor's data in the file: whole blocks of its type.
fn tensor_bytes(info: &gguf_file::TensorInfo) -> usize {
    info.shape.elem_count() / info.ggml_dtype.block_size() * info.ggml_dtype.type_size()
}

/// ggml type ids that candle does not know, so errors can name them.
fn ggml_type_name(id: u32) -> &'static str {
    match id {
        4 | 5 => "Q4_2/Q4_3 (removed from ggml)",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => "unknown",
    }
}

/// The value of `general.alignment` as the header declares it, before candle reads (and divides by) it:
/// a walk over the metadata entries only (the header, not the tensor data), skipping each value by its
/// type. `None` when absent, or when the header cannot be walked (candle then reports the damage);
/// `Some(None)` when its value is not an integer.
fn declared_alignment(bytes: &[u8]) -> Option<Option<u64>> {
    struct Walk<'a>(&'a [u8]);
    impl<'a> Walk<'a> {
        fn take(&mut self, n: u64) -> Option<&'a [u8]> {
            let n = usize::try_from(n).ok().filter(|&n| n <= self.0.len())?;
            let (head, rest) = self.0.split_at(n);
            self.0 = rest;
            Some(head)
        }
        fn uint(&mut self, n: u64) -> Option<u64> {
            Some(self.take(n)?.iter().rev().fold(0, |v, &b| v << 8 | b as u64))
        }
        /// Skips one value of GGUF type `ty` (arrays nest at most a few levels deep in practice).
        fn skip(&mut self, ty: u64, depth: usize) -> Option<()> {
            match ty {
                0 | 1 | 7 => self.take(1).map(drop),
                2 | 3 => self.take(2).map(drop),
                4..=6 => self.take(4).map(drop),
                10..=12 => self.take(8).map(drop),
                8 => {
                    let len = self.uint(8)?;
                    self.take(len).map(drop)
                }
                9 if depth < 8 => {
                    let (elem, count) = (self.uint(4)?, self.uint(8)?);
                    match elem {
                        0 | 1 | 7 => self.take(count).map(drop),
                        2 | 3 => self.take(count.checked_mul(2)?).map(drop),
                        4..=6 => self.take(count.checked_mul(4)?).map(drop),
                        10..=12 => self.take(count.checked_mul(8)?).map(drop),
                        // Each element takes at least one byte, so this ends with the data.
                        _ => (0..count).try_for_each(|_| self.skip(elem, depth + 1)),
                    }
                }
                _ => None,
            }
        }
    }
    let mut w = Walk(bytes);
    if w.take(4)? != b"GGUF" || w.uint(4)? < 2 {
        return None;
    }
    let (_tensors, entries) = (w.uint(8)?, w.uint(8)?);
    for _ in 0..entries {
        let key_len = w.uint(8)?;
        let key = w.take(key_len)?;
        let ty = w.uint(4)?;
        if key == b"general.alignment" {
            return Some(match ty {
                0 | 1 => w.uint(1),   // u8, i8
                2 | 3 => w.uint(2),   // u16, i16
                4 | 5 => w.uint(4),   // u32, i32
                10 | 11 => w.uint(8), // u64, i64
                _ => None,
            });
        }
        w.skip(ty, 0)?;
    }
    None
}

impl GgufFile {
    /// Opens `path`, reads its header and checks that all tensor data lies within the file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
        let file_len = file.metadata().map_err(|e| Error::io(&path, e))?.len();
        let invalid = |reason: String| Error::InvalidGguf { path: path.clone(), reason };
        if file_len < 4 {
            return Err(invalid(format!("file is only {file_len} bytes long")));
        }
        // SAFETY: the map is read-only. Another process truncating or rewriting the file while it is in use
        // is outside what reagent can guard against (as with every mmap-based loader); the catalogue writes
        // model files once, under a temporary name, and renames them into place.
        let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?);
        let mut reader = Cursor::new(&map[..]);
        let mut magic = [0u8; 4];
        reader.read_exact(&mut magic).map_err(|e| Error::io(&path, e))?;
        if &magic != b"GGUF" {
            return Err(invalid(format!("bad magic {:?} (expected \"GGUF\")", String::from_utf8_lossy(&magic))));
        }
        // candle divides by the file's alignment (and ignores one of another type): a value that is not a
        // power of two up to 64 KiB is refused here first.
        match declared_alignment(&map) {
            Some(None) => return Err(invalid("`general.alignment` is not an integer".into())),
            Some(Some(a)) if !a.is_power_of_two() || a > 1 << 16 => {
                return Err(invalid(format!("`general.alignment` is {a}, not a power of two up to 65536")))
            }
            _ => {}
        }
        reader.seek(SeekFrom::Start(0)).map_err(|e| Error::io(&path, e))?;
        let content = gguf_file::Content::read(&mut reader).map_err(|e| {
            let msg = e.to_string();
            // candle says "unknown dtype for tensor 23"; name the ggml type instead.
            match msg.strip_prefix("unknown dtype for tensor ").and_then(|s| s.trim().parse::<u32>().ok()) {
                Some(id) => invalid(format!(
                    "a tensor uses unsupported quantization type {} (ggml type id {id})",
                    ggml_type_name(id)
                )),
                None => invalid(format!("header is damaged or truncated: {msg}")),
            }
        })?;
        // Check every tensor's extent against the file length so truncation is reported at open time.
        let mut infos: Vec<_> = content.tensor_infos.iter().collect();
        infos.sort_by_key(|(_, info)| info.offset);
        for (name, info) in infos {
            let elems = info.shape.elem_count();
            let block = info.ggml_dtype.block_size();
            if elems % block != 0 {
                return Err(Error::Tensor {
                    path,
                    tensor: name.clone(),
                    reason: format!("{elems} elements is not a multiple of the {block}-element block"),
                });
            }
            let size = (elems / block * info.ggml_dtype.type_size()) as u64;
            let end = content.tensor_data_offset.saturating_add(info.offset).saturating_add(size);
            if end > file_len {
                return Err(invalid(format!(
                    "file is truncated: tensor `{name}` ends at byte {end} but the file has {file_len} bytes"
                )));
            }
        }
        Ok(Self { path, content, map, f32_reference: false })
    }

    /// Reads the file's bytes into anonymous memory that the kernel is asked to back with 2 MiB pages
    /// (Linux `MADV_HUGEPAGE`), and reads tensors from there from now on; says whether huge pages were
    /// granted (the process's huge anonymous pages grew by at least half the file). Nothing is copied
    /// where transparent huge pages are turned off (`never`) or the file's length has changed.
    ///
    /// Decoding streams every weight once a token. From the file's map, on 4 KiB pages, that is a TLB miss
    /// every 4 KiB, and the hardware prefetchers stop at each page's end: on the development machine (Zen 5,
    /// a VM) the 1.5B decoded 3% to 26% faster from huge pages, by sitting. The bytes come with `pread`, not
    /// from the map: the map's pages are never touched, so the process holds the weights once (the page
    /// cache it reads from can be dropped by the kernel) and no 4 KiB page faults are taken, and the reads
    /// run on every core (finding and clearing the huge pages is most of the time).
    pub fn copy_to_huge_pages(&mut self) -> Result<bool> {
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::fs::FileExt;
            // Transparent huge pages turned off system-wide: a copy would only cost memory.
            let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
            if thp.contains("[never]") {
                return Ok(false);
            }
            let len = self.map.len();
            let file = File::open(&self.path).map_err(|e| Error::io(&self.path, e))?;
            // The map is what was checked: a file since rewritten to another length is not read.
            if file.metadata().map_err(|e| Error::io(&self.path, e))?.len() != len as u64 {
                return Ok(false);
            }
            let before = anon_huge_bytes();
            let mut copy = memmap2::MmapMut::map_anon(len).map_err(|e| Error::io(&self.path, e))?;
            let _ = copy.advise(memmap2::Advice::HugePage);
            let threads = std::thread::available_parallelism().map_or(1, usize::from).min(8);
            let chunk = len.div_ceil(threads).next_multiple_of(2 << 20).max(1);
            let read = |i: usize, to: &mut [u8]| file.read_exact_at(to, (i * chunk) as u64);
            // `None`: a reader thread could not start (the file's map stays in use).
            let results: Option<Vec<std::io::Result<()>>> = std::thread::scope(|s| {
                let spawned: Vec<_> = copy
                    .chunks_mut(chunk)
                    .enumerate()
                    .map(|(i, to)| std::thread::Builder::new().spawn_scoped(s, move || read(i, to)).ok())
                    .collect();
                spawned
                    .into_iter()
                    .map(|h| Some(h?.join().unwrap_or_else(|_| Err(std::io::Error::other("reader thread panicked")))))
                    .collect()
            });
            let Some(results) = results else { return Ok(false) };
            if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
                return Err(Error::io(&self.path, e));
            }
            self.map = Arc::new(copy.make_read_only().map_err(|e| Error::io(&self.path, e))?);
            Ok(matches!((before, anon_huge_bytes()), (Some(b), Some(a)) if a >= b + len / 2))
        }
        #[cfg(not(target_os = "linux"))]
        Ok(false)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The parsed header.
    pub fn content(&self) -> &gguf_file::Content {
        &self.content
    }

    fn meta_err(&self, key: &str, problem: impl Into<String>) -> Error {
        Error::Metadata { path: self.path.clone(), key: key.to_string(), problem: problem.into() }
    }

    /// The raw metadata value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&gguf_file::Value> {
        self.content.metadata.get(key)
    }

    fn require(&self, key: &str) -> Result<&gguf_file::Value> {
        self.get(key).ok_or_else(|| self.meta_err(key, "is missing"))
    }

    /// An unsigned integer value of any width.
    pub fn u64(&self, key: &str) -> Result<u64> {
        use gguf_file::Value::*;
        let v = self.require(key)?;
        let n = match v {
            U8(x) => Some(*x as u64),
            U16(x) => Some(*x as u64),
            U32(x) => Some(*x as u64),
            U64(x) => Some(*x),
            I8(x) => u64::try_from(*x).ok(),
            I16(x) => u64::try_from(*x).ok(),
            I32(x) => u64::try_from(*x).ok(),
            I64(x) => u64::try_from(*x).ok(),
            _ => None,
        };
        n.ok_or_else(|| self.meta_err(key, format!("should be a non-negative integer, found {v:?}")))
    }

    /// An integer that must fit in `usize`.
    pub fn usize(&self, key: &str) -> Result<usize> {
        let n = self.u64(key)?;
        usize::try_from(n).map_err(|_| self.meta_err(key, format!("value {n} is too large")))
    }

    /// `usize` value or a default when the key is absent.
    pub fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        if self.get(key).is_some() {
            self.usize(key)
        } else {
            Ok(default)
        }
    }

    /// A float value (f32 or f64).
    pub fn f32(&self, key: &str) -> Result<f32> {
        match self.require(key)? {
            gguf_file::Value::F32(x) => Ok(*x),
            gguf_file::Value::F64(x) => Ok(*x as f32),
            v => Err(self.meta_err(key, format!("should be a float, found {v:?}"))),
        }
    }

    /// Float value or a default when the key is absent.
    pub fn f32_or(&self, key: &str, default: f32) -> Result<f32> {
        if self.get(key).is_some() {
            self.f32(key)
        } else {
            Ok(default)
        }
    }

    /// A boolean, or `default` when absent.
    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(gguf_file::Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.meta_err(key, format!("should be a boolean, found {v:?}"))),
        }
    }

    /// A string value.
    pub fn str(&self, key: &str) -> Result<&str> {
        match self.require(key)? {
            gguf_file::Value::String(s) => Ok(s),
            v => Err(self.meta_err(key, format!("should be a string, found {:?}", v.value_type()))),
        }
    }

    /// An optional string value.
    pub fn str_opt(&self, key: &str) -> Result<Option<&str>> {
        if self.get(key).is_some() {
            self.str(key).map(Some)
        } else {
            Ok(None)
        }
    }

    fn array(&self, key: &str) -> Result<&Vec<gguf_file::Value>> {
        match self.require(key)? {
            gguf_file::Value::Array(a) => Ok(a),
            v => Err(self.meta_err(key, format!("should be an array, found {:?}", v.value_type()))),
        }
    }

    /// An array of strings.
    pub fn str_array(&self, key: &str) -> Result<Vec<&str>> {
        self.array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                gguf_file::Value::String(s) => Ok(s.as_str()),
                _ => Err(self.meta_err(key, format!("element {i} is not a string"))),
            })
            .collect()
    }

    /// An array of integers.
    pub fn i64_array(&self, key: &str) -> Result<Vec<i64>> {
        use gguf_file::Value::*;
        self.array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                U8(x) => Ok(*x as i64),
                I8(x) => Ok(*x as i64),
                U16(x) => Ok(*x as i64),
                I16(x) => Ok(*x as i64),
                U32(x) => Ok(*x as i64),
                I32(x) => Ok(*x as i64),
                I64(x) => Ok(*x),
                U64(x) => Ok(*x as i64),
                _ => Err(self.meta_err(key, format!("element {i} is not an integer"))),
            })
            .collect()
    }

    /// An array of floats.
    pub fn f32_array(&self, key: &str) -> Result<Vec<f32>> {
        self.array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                gguf_file::Value::F32(x) => Ok(*x),
                gguf_file::Value::F64(x) => Ok(*x as f32),
                _ => Err(self.meta_err(key, format!("element {i} is not a float"))),
            })
            .collect()
    }

    /// Whether a tensor of that name exists.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Number of tensors in the file.
    pub fn tensor_count(&self) -> usize {
        self.content.tensor_infos.len()
    }

    /// Bytes of weights one decode step reads: every tensor but the token embedding, of which a step
    /// reads one row, and the embedding too where the output layer shares it (no `output.weight`).
    pub fn decode_bytes_per_token(&self) -> u64 {
        let tied = !self.has_tensor("output.weight");
        self.content
            .tensor_infos
            .iter()
            .filter(|(name, _)| tied || name.as_str() != "token_embd.weight")
            .map(|(_, info)| tensor_bytes(info) as u64)
            .sum()
    }

    /// Shape (outermost first) and type of a tensor.
    pub fn tensor_info(&self, name: &str) -> Result<(Vec<usize>, GgmlDType)> {
        let info = self.content.tensor_infos.get(name).ok_or_else(|| Error::Tensor {
            path: self.path.clone(),
            tensor: name.to_string(),
            reason: "missing from the file".into(),
        })?;
        Ok((info.shape.dims().to_vec(), info.ggml_dtype))
    }

    fn check_shape(&self, name: &str, dims: &[usize], expected: Option<&[usize]>) -> Result<()> {
        match expected {
            Some(exp) if dims != exp => Err(Error::Tensor {
                path: self.path.clone(),
                tensor: name.to_string(),
                reason: format!("shape {dims:?}, expected {exp:?}"),
            }),
            _ => Ok(()),
        }
    }

    /// Reads a tensor onto `device`, checking its shape when `expected` is given (outermost dimension first).
    pub fn tensor(&self, name: &str, expected: Option<&[usize]>, device: &Device) -> Result<QTensor> {
        let (dims, _) = self.tensor_info(name)?;
        self.check_shape(name, &dims, expected)?;
        let mut reader = Cursor::new(&self.map[..]);
        self.content.tensor(&mut reader, name, device).map_err(|e| Error::Tensor {
            path: self.path.clone(),
            tensor: name.to_string(),
            reason: e.to_string(),
        })
    }

    /// A tensor's bytes in place in the mapped file, checking its shape when `expected` is given.
    pub fn mapped(&self, name: &str, expected: Option<&[usize]>) -> Result<MappedTensor> {
        let (dims, dtype) = self.tensor_info(name)?;
        self.check_shape(name, &dims, expected)?;
        let info = &self.content.tensor_infos[name];
        let len = tensor_bytes(info);
        // `open` checked that every tensor lies inside the file.
        let offset = (self.content.tensor_data_offset + info.offset) as usize;
        Ok(MappedTensor { map: self.map.clone(), offset, len, dims, dtype })
    }

    /// How many tensors the file has of each type, for summaries.
    pub fn tensor_type_counts(&self) -> Vec<(String, usize)> {
        let mut counts = std::collections::BTreeMap::<String, usize>::new();
        for info in self.content.tensor_infos.values() {
            *counts.entry(format!("{:?}", info.ggml_dtype)).or_default() += 1;
        }
        counts.into_iter().collect()
    }
}
