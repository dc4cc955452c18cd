//! The KV cache and grouped-query attention: host buffers a decode step reads in place on the CPU
//! (`model::host`), tensors for batches and other devices.

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};

/// Keys and values of one layer, grown in chunks and truncatable to any earlier length.
///
/// On the CPU they are host buffers, per KV head `len × head_dim`, which a decode step extends and attends
/// over in place ([`Self::attend_host`]); the batched path gets them as `[1, kv_heads, len, head_dim]`
/// tensors (a copy, as its attention made before). On other devices, tensors of that layout with room to
/// grow. Truncation moves `len`, so rolling back a rejected decision costs nothing.
pub(crate) struct KvCache {
    store: KvStore,
    len: usize,
    max: usize,
}

enum KvStore {
    /// Per KV head, `len × d` values (the buffers hold exactly `len` positions).
    Host {
        k: Vec<Vec<f32>>,
        v: Vec<Vec<f32>>,
        d: usize,
    },
    Device {
        k: Option<Tensor>,
        v: Option<Tensor>,
    },
}

/// One layer's cached keys and values for `len` positions: per KV head, `len × d` values each.
#[derive(Debug, Clone, PartialEq)]
pub struct KvBlock {
    pub d: usize,
    pub len: usize,
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
}

/// Positions added to a KV buffer when it grows (at the least).
const KV_CHUNK: usize = 128;

/// The capacity a buffer grows to for `needed` positions: whole chunks, and at least a quarter more than
/// before so long contexts grow geometrically (the copies stay linear in the final length) while short ones
/// waste at most a chunk; never past `max`.
fn grown(cap: usize, needed: usize, max: usize) -> usize {
    needed.div_ceil(KV_CHUNK).saturating_mul(KV_CHUNK).max(cap + cap / 4).min(max).max(needed)
}

/// Appends `positions` positions of keys and values (per KV head, `positions × d` consecutive values) to
/// host buffers holding `len` positions, creating one buffer per head on first use and growing each by
/// [`grown`] (at most `max` positions).
fn extend_heads(
    (k, v, d): (&mut Vec<Vec<f32>>, &mut Vec<Vec<f32>>, &mut usize),
    (keys, values): (&[f32], &[f32]),
    kv_heads: usize,
    positions: usize,
    (len, max): (usize, usize),
) {
    let per_head = keys.len() / kv_heads;
    if k.is_empty() {
        *k = vec![Vec::new(); kv_heads];
        *v = vec![Vec::new(); kv_heads];
        *d = per_head / positions;
    }
    let hd = *d;
    for (buf, src) in
        k.iter_mut().zip(keys.chunks_exact(per_head)).chain(v.iter_mut().zip(values.chunks_exact(per_head)))
    {
        if buf.capacity() < (len + positions) * hd {
            buf.reserve_exact(grown(buf.capacity() / hd.max(1), len + positions, max) * hd - buf.len());
        }
        buf.extend_from_slice(src);
    }
}

impl KvCache {
    pub(crate) fn new(max: usize, dev: &Device) -> Self {
        let store = match dev.is_cpu() {
            true => KvStore::Host { k: Vec::new(), v: Vec::new(), d: 0 },
            false => KvStore::Device { k: None, v: None },
        };
        Self { store, len: 0, max }
    }

    pub(crate) fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        if let KvStore::Host { k, v, d } = &mut self.store {
            let keep = self.len * *d;
            k.iter_mut().chain(v.iter_mut()).for_each(|b| b.truncate(keep));
        }
    }

    /// The first `len` positions' keys and values, per KV head (host buffers only; `None` on another
    /// device or when fewer positions are cached).
    pub(crate) fn export(&self, len: usize) -> Option<KvBlock> {
        let KvStore::Host { k, v, d } = &self.store else { return None };
        if len > self.len || (len > 0 && *d == 0) {
            return None;
        }
        let cut = |bufs: &Vec<Vec<f32>>| bufs.iter().map(|b| b[..len * *d].to_vec()).collect();
        Some(KvBlock { d: *d, len, k: cut(k), v: cut(v) })
    }

    /// Replaces the cache with `block`'s positions (host buffers only).
    pub(crate) fn import(&mut self, block: &KvBlock) -> Result<()> {
        let KvStore::Host { k, v, d } = &mut self.store else {
            return Err(Error::param("cache", "a saved prefix loads into host buffers only"));
        };
        if block.len > self.max {
            return Err(Error::ContextOverflow { needed: block.len, capacity: self.max });
        }
        *d = block.d;
        let fill = |to: &mut Vec<Vec<f32>>, from: &Vec<Vec<f32>>| {
            *to = from
                .iter()
                .map(|b| {
                    let mut buf = Vec::with_capacity(grown(0, block.len, self.max) * block.d);
                    buf.extend_from_slice(b);
                    buf
                })
                .collect()
        };
        fill(k, &block.k);
        fill(v, &block.v);
        self.len = block.len;
        Ok(())
    }

    /// The live keys and values on the host (CPU only).
    fn host(&self) -> Option<super::host::KvView<'_>> {
        match &self.store {
            KvStore::Host { k, v, d } => Some(super::host::KvView { k, v, len: self.len, d: *d }),
            KvStore::Device { .. } => None,
        }
    }

    /// Appends one position's keys and values (`kv_heads × d` each) and writes the attention of `q` (`heads
    /// × d`, already scaled) over the cache, seeing the last `window` positions, into `out` (host buffers;
    /// CPU only).
    pub(crate) fn attend_host(
        &mut self,
        q: &[f32],
        (keys, values): (&[f32], &[f32]),
        kv_heads: usize,
        window: Option<usize>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.push_host(keys, values, kv_heads)?;
        out.resize(q.len(), 0.0);
        let view = self.host().expect("pushed to host buffers above");
        super::host::attend_one(q, &view, window, out);
        Ok(())
    }

    /// Appends one position's keys and values (`kv_heads × d` each, host buffers; CPU only).
    fn push_host(&mut self, keys: &[f32], values: &[f32], kv_heads: usize) -> Result<()> {
        if self.len >= self.max {
            return Err(Error::ContextOverflow { needed: self.len + 1, capacity: self.max });
        }
        let KvStore::Host { k, v, d } = &mut self.store else {
            return Err(Error::param("cache", "host buffers are for the CPU"));
        };
        extend_heads((k, v, d), (keys, values), kv_heads, 1, (self.len, self.max));
        self.len += 1;
        Ok(())
    }

    fn grow(buf: &Option<Tensor>, like: &Tensor, needed: usize, max: usize) -> Result<Tensor> {
        let (b, h, _, d) = like.dims4()?;
        let cap = buf.as_ref().map(|t| t.dim(2)).transpose()?.unwrap_or(0);
        if cap >= needed {
            return Ok(buf.clone().expect("capacity implies a buffer"));
        }
        let fresh = Tensor::zeros((b, h, grown(cap, needed, max), d), like.dtype(), like.device())?;
        if let Some(old) = buf {
            fresh.slice_set(old, 2, 0)?;
        }
        Ok(fresh)
    }

    /// Appends `k`, `v` (`[1, kv_heads, seq, head_dim]`) and returns all live keys and values.
    pub(crate) fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let (_, kv_heads, seq, hd) = k.dims4()?;
        let needed = self.len + seq;
        match &mut self.store {
            KvStore::Host { k: kh, v: vh, d } => {
                let keys = k.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                let values = v.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                extend_heads((kh, vh, d), (&keys, &values), kv_heads, seq, (self.len, self.max));
                let live = |bufs: &Vec<Vec<f32>>| -> Result<Tensor> {
                    let mut all = Vec::with_capacity(kv_heads * needed * hd);
                    bufs.iter().for_each(|b| all.extend_from_slice(b));
                    Ok(Tensor::from_vec(all, (1, kv_heads, needed, hd), k.device())?)
                };
                let (ks, vs) = (live(kh)?, live(vh)?);
                self.len = needed;
                Ok((ks, vs))
            }
            KvStore::Device { k: kb, v: vb } => {
                let kt = Self::grow(kb, k, needed, self.max)?;
                let vt = Self::grow(vb, v, needed, self.max)?;
                kt.slice_set(&k.contiguous()?, 2, self.len)?;
                vt.slice_set(&v.contiguous()?, 2, self.len)?;
                self.len = needed;
                let ks = kt.narrow(2, 0, needed)?;
                let vs = vt.narrow(2, 0, needed)?;
                *kb = Some(kt);
                *vb = Some(vt);
                Ok((ks, vs))
            }
        }
    }
}

/// Every layer's first `len` positions (`None` off the CPU or past what is cached).
pub(crate) fn export_layers<'a>(caches: impl Iterator<Item = &'a KvCache>, len: usize) -> Option<Vec<KvBlock>> {
    caches.map(|c| c.export(len)).collect()
}

/// Replaces each layer's cache with its saved block, after checking that every block has the model's
/// shape (`kv_heads` heads of `head_dim` values per position, one block per layer, one length); the
/// positions now cached.
pub(crate) fn import_layers(
    caches: Vec<&mut KvCache>,
    blocks: &[KvBlock],
    kv_heads: usize,
    head_dim: usize,
) -> Result<usize> {
    let len = blocks.first().map_or(0, |b| b.len);
    let fits = |b: &KvBlock| {
        b.len == len
            && b.d == head_dim
            && b.k.len() == kv_heads
            && b.v.len() == kv_heads
            && b.k.iter().chain(&b.v).all(|x| x.len() == len * head_dim)
    };
    if blocks.len() != caches.len() || !blocks.iter().all(fits) {
        return Err(Error::param("cache", "a saved prefix of another shape"));
    }
    for (cache, block) in caches.into_iter().zip(blocks) {
        cache.import(block)?;
    }
    Ok(len)
}

/// Queries per attention chunk on long prompts.
const ATTENTION_CHUNK: usize = 128;

/// Scaled dot-product attention with grouped KV heads and a causal (optionally sliding-window) mask.
///
/// `q`: `[1, heads, seq, d]` (already scaled), `k`/`v`: `[1, kv_heads, len, d]` where the queries sit at
/// positions `len-seq .. len`. Returns `[1, seq, heads*d]`.
pub(crate) fn attention(q: &Tensor, k: &Tensor, v: &Tensor, window: Option<usize>) -> Result<Tensor> {
    let (b, heads, seq, d) = q.dims4()?;
    let (_, kv_heads, len, _) = k.dims4()?;
    if seq > ATTENTION_CHUNK {
        // Long prompts a chunk of queries at a time, each against only the keys up to its last position:
        // the score matrices stay a few MB instead of `seq × len` per head (tens of MB on a 512-token
        // prompt), and the fully masked upper triangle is never computed.
        let mut outs = Vec::with_capacity(seq.div_ceil(ATTENTION_CHUNK));
        for s in (0..seq).step_by(ATTENTION_CHUNK) {
            let c = ATTENTION_CHUNK.min(seq - s);
            let visible = len - seq + s + c;
            outs.push(attention(&q.narrow(2, s, c)?, &k.narrow(2, 0, visible)?, &v.narrow(2, 0, visible)?, window)?);
        }
        return Ok(Tensor::cat(&outs, 1)?);
    }
    let rep = heads / kv_heads;
    // Fold the query heads that share a KV head into the row dimension: no KV copy per head.
    let q = q.contiguous()?.reshape((b, kv_heads, rep * seq, d))?;
    let k = k.contiguous()?;
    let v = v.contiguous()?;
    let scores = q.matmul(&k.t()?)?; // [b, kv, rep*seq, len]
    let start = len - seq;
    let needs_mask = seq > 1 || window.is_some_and(|w| len > w);
    let scores = if needs_mask {
        let mask: Vec<f32> = (0..seq)
            .flat_map(|i| {
                let qpos = start + i;
                (0..len).map(move |j| {
                    let future = j > qpos;
                    let too_old = window.is_some_and(|w| qpos - j.min(qpos) >= w);
                    if future || too_old {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (seq, len), q.device())?;
        scores.reshape((b, kv_heads, rep, seq, len))?.broadcast_add(&mask)?.reshape((b, kv_heads, rep * seq, len))?
    } else {
        scores
    };
    let probs = candle_nn::ops::softmax_last_dim(&scores)?;
    let out = probs.matmul(&v)?; // [b, kv, rep*seq, d]
    Ok(out.reshape((b, heads, seq, d))?.transpose(1, 2)?.reshape((b, seq, heads * d))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    /// Attention written out with loops: query `i` of `seq` sits at position `len − seq + i` and sees keys
    /// `j ≤` its position (and within `window` of it).
    fn naive(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        dims: (usize, usize, usize, usize, usize),
        window: Option<usize>,
    ) -> Vec<f32> {
        let (heads, kv_heads, seq, len, d) = dims;
        let rep = heads / kv_heads;
        let mut out = vec![0f32; seq * heads * d];
        for h in 0..heads {
            let kh = h / rep;
            for i in 0..seq {
                let pos = len - seq + i;
                let qi = &q[(h * seq + i) * d..][..d];
                let visible: Vec<usize> = (0..=pos).filter(|&j| window.is_none_or(|w| pos - j < w)).collect();
                let scores: Vec<f32> = visible
                    .iter()
                    .map(|&j| qi.iter().zip(&k[(kh * len + j) * d..][..d]).map(|(a, b)| a * b).sum())
                    .collect();
                let max = scores.iter().copied().fold(f32::MIN, f32::max);
                let e: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let z: f32 = e.iter().sum();
                for (&j, w) in visible.iter().zip(&e) {
                    for c in 0..d {
                        out[(i * heads + h) * d + c] += w / z * v[(kh * len + j) * d + c];
                    }
                }
            }
        }
        out
    }

    /// Short and chunked (longer than one chunk, with a ragged last chunk and cached positions before the
    /// prompt) attention against the loops, with and without a sliding window.
    #[test]
    fn attention_matches_the_definition_in_one_piece_and_in_chunks() {
        let dev = Device::Cpu;
        let (heads, kv_heads, d) = (4, 2, 8);
        for (seq, len) in [(5, 5), (1, 40), (300, 310), (ATTENTION_CHUNK + 1, ATTENTION_CHUNK + 1)] {
            for window in [None, Some(50)] {
                let q = random(heads * seq * d, seq as u64);
                let k = random(kv_heads * len * d, len as u64 + 1);
                let v = random(kv_heads * len * d, len as u64 + 2);
                let t = |x: &[f32], h, n| Tensor::from_vec(x.to_vec(), (1, h, n, d), &dev).unwrap();
                let got = attention(&t(&q, heads, seq), &t(&k, kv_heads, len), &t(&v, kv_heads, len), window).unwrap();
                assert_eq!(got.dims(), &[1, seq, heads * d]);
                let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                let want = naive(&q, &k, &v, (heads, kv_heads, seq, len, d), window);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!((a - b).abs() < 1e-4, "seq {seq}, len {len}, window {window:?}: [{i}] {a} vs {b}");
                }
            }
        }
    }
}
