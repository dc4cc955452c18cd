//! The weight block formats the kernels read (GGUF's own layouts) and their portable scalar code:
//! dequantization (the reference every kernel is tested against), the unpacking of scales and quants, and
//! the scalar dot product of a weight row with 8-bit activations.

use candle_core::quantized::GgmlDType;

use super::{Q8Block, QK};

/// The ggml types reagent's kernels handle (each maps to a [`BlockType`]).
pub const KERNEL_TYPES: [GgmlDType; 7] = [
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q8_0,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

/// The weight types these kernels handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockType {
    Q4_0,
    Q4_1,
    Q5_0,
    Q8_0,
    /// 256-element super-blocks: 8 sub-blocks of 32 with 6-bit scales and minimums, 4-bit quants.
    Q4K,
    /// Q4_K's layout plus a fifth bit per quant (`qh`, 32 bytes): 5-bit quants.
    Q5K,
    /// 256-element super-blocks: 16 sub-blocks of 16 with 8-bit scales, 6-bit quants.
    Q6K,
}

impl BlockType {
    /// The kernel type for a ggml type, if there is one.
    pub fn of(t: GgmlDType) -> Option<Self> {
        match t {
            GgmlDType::Q4_0 => Some(Self::Q4_0),
            GgmlDType::Q4_1 => Some(Self::Q4_1),
            GgmlDType::Q5_0 => Some(Self::Q5_0),
            GgmlDType::Q8_0 => Some(Self::Q8_0),
            GgmlDType::Q4K => Some(Self::Q4K),
            GgmlDType::Q5K => Some(Self::Q5K),
            GgmlDType::Q6K => Some(Self::Q6K),
            _ => None,
        }
    }

    /// Elements per block (super-block for the K-quants).
    pub fn block_elems(self) -> usize {
        match self {
            Self::Q4K | Self::Q5K | Self::Q6K => 256,
            _ => QK,
        }
    }

    /// Whether a block's weights are `d·q + min` (Q4_1, Q4_K, Q5_K) rather than `d·(q − offset)`.
    pub fn has_minimum(self) -> bool {
        matches!(self, Self::Q4_1 | Self::Q4K | Self::Q5K)
    }

    /// Bytes of a row of `cols` elements.
    pub fn row_bytes(self, cols: usize) -> usize {
        cols / self.block_elems() * self.block_bytes()
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q8_0 => 34,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
        }
    }
}

pub(super) fn f16(b: &[u8]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// Dequantizes one block into 32 floats (the reference the kernels are tested against).
pub fn dequantize_block(t: BlockType, b: &[u8], out: &mut [f32]) {
    match t {
        BlockType::Q4_0 | BlockType::Q4_1 => {
            let d = f16(b);
            let (m, qs) = match t {
                BlockType::Q4_1 => (f16(&b[2..]), &b[4..20]),
                _ => (-8.0 * d, &b[2..18]),
            };
            for j in 0..16 {
                out[j] = d * (qs[j] & 0xF) as f32 + m;
                out[j + 16] = d * (qs[j] >> 4) as f32 + m;
            }
        }
        BlockType::Q5_0 => {
            let d = f16(b);
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            let qs = &b[6..22];
            for j in 0..16 {
                let h0 = ((qh >> j) & 1) << 4;
                let h1 = ((qh >> (j + 16)) & 1) << 4;
                out[j] = d * (((qs[j] & 0xF) as u32 | h0) as f32 - 16.0);
                out[j + 16] = d * (((qs[j] >> 4) as u32 | h1) as f32 - 16.0);
            }
        }
        BlockType::Q8_0 => {
            let d = f16(b);
            for j in 0..QK {
                out[j] = d * (b[2 + j] as i8) as f32;
            }
        }
        BlockType::Q4K => {
            let (d, dmin) = (f16(b), f16(&b[2..]));
            let scales: &[u8; 12] = b[4..16].try_into().expect("12 bytes");
            for j in 0..4 {
                let qs = &b[16 + 32 * j..48 + 32 * j];
                let (s0, m0) = q4k_scale_min(2 * j, scales);
                let (s1, m1) = q4k_scale_min(2 * j + 1, scales);
                for l in 0..32 {
                    out[64 * j + l] = d * s0 as f32 * (qs[l] & 0xF) as f32 - dmin * m0 as f32;
                    out[64 * j + 32 + l] = d * s1 as f32 * (qs[l] >> 4) as f32 - dmin * m1 as f32;
                }
            }
        }
        BlockType::Q5K => {
            let (d, dmin) = (f16(b), f16(&b[2..]));
            let scales: &[u8; 12] = b[4..16].try_into().expect("12 bytes");
            let qh = &b[16..48];
            for j in 0..4 {
                let qs = &b[48 + 32 * j..80 + 32 * j];
                let (s0, m0) = q4k_scale_min(2 * j, scales);
                let (s1, m1) = q4k_scale_min(2 * j + 1, scales);
                for l in 0..32 {
                    let lo = (qs[l] & 0xF) | ((qh[l] >> (2 * j)) & 1) << 4;
                    let hi = (qs[l] >> 4) | ((qh[l] >> (2 * j + 1)) & 1) << 4;
                    out[64 * j + l] = d * s0 as f32 * lo as f32 - dmin * m0 as f32;
                    out[64 * j + 32 + l] = d * s1 as f32 * hi as f32 - dmin * m1 as f32;
                }
            }
        }
        BlockType::Q6K => {
            let d = f16(&b[208..]);
            for (i, o) in out[..256].iter_mut().enumerate() {
                *o = d * (b[192 + i / 16] as i8) as f32 * (q6k_quant(b, i) as i32 - 32) as f32;
            }
        }
    }
}

/// Q4_K's 6-bit scale and minimum of sub-block `j` (0..8), packed in 12 bytes.
pub(super) fn q4k_scale_min(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Q4_K's 8 scales and 8 minimums of 6 bits, unpacked from their 12 bytes all at once (as
/// [`q4k_scale_min`] does one at a time): bytes 0..4 hold scales 0..4 and the top bits of scales 4..8,
/// bytes 4..8 minimums 0..4 and the top bits of minimums 4..8, bytes 8..12 the low nibbles of scales 4..8
/// (low) and minimums 4..8 (high).
pub(crate) fn q4k_scales_mins(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let word = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (a, b, c) = (word(0), word(1), word(2));
    let (low6, low4, top2) = (0x3F3F_3F3Fu32, 0x0F0F_0F0Fu32, 0x0303_0303u32);
    let scales_hi = (c & low4) | (((a >> 6) & top2) << 4);
    let mins_hi = ((c >> 4) & low4) | (((b >> 6) & top2) << 4);
    let join = |lo: u32, hi: u32| (lo as u64 | (hi as u64) << 32).to_le_bytes();
    (join(a & low6, scales_hi), join(b & low6, mins_hi))
}

/// Q6_K's unsigned 6-bit quant (0..63, offset 32) of element `i` of a super-block: the low 4 bits in `ql`
/// (bytes 0..128), the high 2 in `qh` (bytes 128..192). Each 128-element half takes 64 `ql` bytes (low
/// nibbles: elements 0..64, high nibbles: 64..128) and 32 `qh` bytes (2 bits for each of 4 elements 32 apart).
pub(super) fn q6k_quant(b: &[u8], i: usize) -> u8 {
    let (half, e) = (i / 128, i % 128);
    let (quarter, l) = (e / 32, e % 32);
    let ql = b[64 * half + 32 * (quarter % 2) + l];
    let low = if quarter < 2 { ql & 0xF } else { ql >> 4 };
    let high = (b[128 + 32 * half + l] >> (2 * quarter)) & 3;
    low | (high << 4)
}

/// The scales of block `i`'s two halves and its minimum, as [`unsigned_block`] gives them.
pub(crate) fn block_scales(t: BlockType, row: &[u8], i: usize) -> ([f32; 2], f32) {
    if t.block_elems() == QK {
        let b = &row[i * t.block_bytes()..];
        let d = f16(b);
        return ([d, d], if t == BlockType::Q4_1 { f16(&b[2..]) } else { 0.0 });
    }
    let (b, s) = (&row[i / 8 * t.block_bytes()..(i / 8 + 1) * t.block_bytes()], i % 8);
    if t == BlockType::Q6K {
        let d = f16(&b[208..]);
        return ([d * (b[192 + 2 * s] as i8) as f32, d * (b[193 + 2 * s] as i8) as f32], 0.0);
    }
    let (d, dmin) = (f16(b), f16(&b[2..]));
    let (sc, mn) = q4k_scales_mins(b[4..16].try_into().expect("12 bytes"));
    ([d * sc[s] as f32; 2], -dmin * mn[s] as f32)
}

/// Block `i` (a 32-element block, or a K-quant's 32-element sub-block) of a weight row as unsigned bytes
/// `u` with the scales `d` of its two 16-element halves and its minimum `c`, such that element `e` is
/// `d[e / 16]·(u[e] − offset) + c`, where the offset is 8 (Q4_0), 16 (Q5_0), 128 (Q8_0), 32 (Q6_K) or 0:
/// the portable reference for the SIMD weight packers.
#[cfg(test)]
pub(crate) fn unsigned_block(t: BlockType, row: &[u8], i: usize) -> ([u8; QK], [f32; 2], f32) {
    let mut u = [0u8; QK];
    let (d, c) = block_scales(t, row, i);
    if t.block_elems() == QK {
        let b = &row[i * t.block_bytes()..(i + 1) * t.block_bytes()];
        if t == BlockType::Q8_0 {
            u.iter_mut().zip(&b[2..34]).for_each(|(u, &w)| *u = w ^ 0x80);
            return (u, d, c);
        }
        let at = match t {
            BlockType::Q4_1 => 4,
            BlockType::Q5_0 => 6,
            _ => 2,
        };
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for j in 0..16 {
            u[j] = b[at + j] & 0xF;
            u[j + 16] = b[at + j] >> 4;
            if t == BlockType::Q5_0 {
                u[j] |= (((qh >> j) & 1) << 4) as u8;
                u[j + 16] |= (((qh >> (j + 16)) & 1) << 4) as u8;
            }
        }
        return (u, d, c);
    }
    let (b, s) = (&row[i / 8 * t.block_bytes()..(i / 8 + 1) * t.block_bytes()], i % 8);
    for (l, v) in u.iter_mut().enumerate() {
        *v = match t {
            BlockType::Q6K => q6k_quant(b, QK * s + l),
            _ => {
                let qs = if t == BlockType::Q5K { 48 } else { 16 };
                let q = b[qs + 32 * (s / 2) + l];
                let q = if s % 2 == 1 { q >> 4 } else { q & 0xF };
                if t == BlockType::Q5K {
                    q | ((b[16 + l] >> s) & 1) << 4
                } else {
                    q
                }
            }
        };
    }
    (u, d, c)
}

/// Unsigned weight quants of one block (Q4 nibbles 0..15, Q5 values 0..31, Q8 signed) and how the block
/// turns `Σ w·x` into a float: `d_w·d_x·(Σ q·qx − offset·Σ qx) + min·d_x·Σ qx`. K-quant super-blocks take
/// 8 activation blocks and apply a scale (and Q4_K's minimum) per sub-block.
pub(super) fn block_dot_scalar(t: BlockType, b: &[u8], xs: &[Q8Block]) -> f32 {
    let dot = |q: &[i32], x: &[i8]| -> i32 { q.iter().zip(x).map(|(&a, &b)| a * b as i32).sum() };
    let mut q = [0i32; QK];
    let x = &xs[0];
    let (d, offset, min) = match t {
        BlockType::Q4_0 | BlockType::Q4_1 => {
            let qs = if t == BlockType::Q4_1 { &b[4..20] } else { &b[2..18] };
            for j in 0..16 {
                q[j] = (qs[j] & 0xF) as i32;
                q[j + 16] = (qs[j] >> 4) as i32;
            }
            if t == BlockType::Q4_1 {
                (f16(b), 0, f16(&b[2..]))
            } else {
                (f16(b), 8, 0.0)
            }
        }
        BlockType::Q5_0 => {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            for j in 0..16 {
                q[j] = ((b[6 + j] & 0xF) as u32 | (((qh >> j) & 1) << 4)) as i32;
                q[j + 16] = ((b[6 + j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4)) as i32;
            }
            (f16(b), 16, 0.0)
        }
        BlockType::Q8_0 => {
            for j in 0..QK {
                q[j] = (b[2 + j] as i8) as i32;
            }
            (f16(b), 0, 0.0)
        }
        BlockType::Q4K | BlockType::Q5K => {
            let (d, dmin) = (f16(b), f16(&b[2..]));
            let scales: &[u8; 12] = b[4..16].try_into().expect("12 bytes");
            let five = t == BlockType::Q5K;
            let qs = if five { 48 } else { 16 };
            let mut total = 0f32;
            for (s, x) in xs[..8].iter().enumerate() {
                let (j, high) = (s / 2, s % 2 == 1);
                for l in 0..QK {
                    let v = b[qs + 32 * j + l];
                    let fifth = if five { ((b[16 + l] >> s) & 1) << 4 } else { 0 };
                    q[l] = (if high { v >> 4 } else { v & 0xF } | fifth) as i32;
                }
                let (sc, m) = q4k_scale_min(s, scales);
                total += d * sc as f32 * x.d * dot(&q, &x.qs) as f32 - dmin * m as f32 * x.d * x.sum as f32;
            }
            return total;
        }
        BlockType::Q6K => {
            let d = f16(&b[208..]);
            let mut total = 0f32;
            for (blk, x) in xs[..8].iter().enumerate() {
                for (l, v) in q.iter_mut().enumerate() {
                    *v = q6k_quant(b, QK * blk + l) as i32 - 32;
                }
                for h in 0..2 {
                    let sc = b[192 + 2 * blk + h] as i8;
                    total += d * sc as f32 * x.d * dot(&q[16 * h..16 * h + 16], &x.qs[16 * h..16 * h + 16]) as f32;
                }
            }
            return total;
        }
    };
    d * x.d * (dot(&q, &x.qs) - offset * x.sum) as f32 + min * x.d * x.sum as f32
}

/// Scalar dot product of one weight row (GGUF blocks) with a quantized activation row.
pub fn row_dot_scalar(t: BlockType, row: &[u8], x: &[Q8Block]) -> f32 {
    let per = t.block_elems() / QK;
    row.chunks_exact(t.block_bytes()).zip(x.chunks_exact(per)).map(|(b, xs)| block_dot_scalar(t, b, xs)).sum()
}
