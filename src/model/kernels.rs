//! CPU mat-vec kernels for the quantizations of the catalogue's files: the 32-element block types (Q4_0,
//! Q4_1, Q5_0, Q8_0), which candle 0.11 runs through a scalar path (Q4_1, Q5_0) or that we want on the same
//! fast path (Q4_0, Q8_0), and the 256-element K-quant super-blocks Q4_K and Q6_K.
//!
//! Decode multiplies each weight matrix by one activation row. As in llama.cpp, the row is first quantized
//! to 8 bits per 32-element block ([`Q8Block`]: an f32 scale, the block's integer sum, 32 × i8), so the
//! inner loop is an integer dot product of weight nibbles/bytes with activation bytes; the block scales are
//! applied once per block. The weight bytes are read in place, in GGUF's own block layout.
//!
//! Every kernel has a portable scalar version and SIMD versions chosen at run time ([`Tier`]: AVX-512 VNNI,
//! AVX-VNNI, AVX2); tests check that every tier the CPU has agrees with the scalar code, and the scalar
//! code with dequantize-then-f32. Rows are split across the kernels' own worker pool (`model::pool`),
//! which costs a few microseconds per call rather than rayon's tens, and yields its cores under contention.
//!
//! Prompt-sized batches ([`matmul`]) use the same 8-bit activations: on the SIMD tiers the weights and
//! the tokens are packed into groups of 8 blocks whose lanes interleave the blocks, and tiles of a few
//! rows × a few tokens reuse every packed block across tokens.

/// Elements per block.
pub const QK: usize = 32;

/// A 32-element block of an activation row quantized to 8 bits.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(8))]
pub struct Q8Block {
    /// Scale: element ≈ `d * qs[i]`.
    pub d: f32,
    /// `Σ qs[i]`, for the weight types with an offset (Q4_0, Q5_0) or a minimum (Q4_1).
    pub sum: i32,
    pub qs: [i8; QK],
}

impl Default for Q8Block {
    fn default() -> Self {
        Self { d: 0.0, sum: 0, qs: [0; QK] }
    }
}

/// Quantizes `x` (a multiple of 32 long) into `out`: a scale per 32-element block, each element rounded to
/// the nearest step (ties to even, as the SIMD conversion does, so every tier gives the same bits).
pub fn quantize_row_q8(x: &[f32], out: &mut [Q8Block]) {
    quantize_groups(x, out, 1)
}

/// Quantizes `x` for a matrix of type `t`: the K-quant kernels need the 8 blocks of each 256-element
/// super-block to share one scale (so sub-block scales can be applied to integer sums); the others get a
/// scale per 32-element block.
pub fn quantize_row_q8_for(t: BlockType, x: &[f32], out: &mut [Q8Block]) {
    quantize_groups(x, out, t.block_elems() / QK)
}

/// Quantizes `x` with one scale per `group` blocks.
fn quantize_groups(x: &[f32], out: &mut [Q8Block], group: usize) {
    assert_eq!(x.len(), out.len() * QK, "{} activations for {} blocks", x.len(), out.len());
    assert!(out.len().is_multiple_of(group));
    #[cfg(target_arch = "x86_64")]
    if Tier::best() >= Tier::Avx2 {
        // SAFETY: AVX2/FMA/F16C are present (every tier above scalar has them); lengths asserted above.
        unsafe { avx2::quantize_groups(x, out, group) };
        return;
    }
    quantize_groups_scalar(x, out, group)
}

fn quantize_groups_scalar(x: &[f32], out: &mut [Q8Block], group: usize) {
    for (xg, bg) in x.chunks_exact(group * QK).zip(out.chunks_exact_mut(group)) {
        let amax = xg.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        for (xb, b) in xg.chunks_exact(QK).zip(bg.iter_mut()) {
            let mut sum = 0i32;
            for (q, &v) in b.qs.iter_mut().zip(xb) {
                *q = (v * inv).round_ties_even() as i8;
                sum += *q as i32;
            }
            b.d = d;
            b.sum = sum;
        }
    }
}

mod blocks;
use blocks::q4k_scale_min;
#[cfg(test)]
use blocks::unsigned_block;
pub(crate) use blocks::{block_scales, q4k_scales_mins};
pub use blocks::{dequantize_block, row_dot_scalar, BlockType, KERNEL_TYPES};

/// A whole `rows × cols` matrix in GGUF block layout dequantized to f32 (row-major), rows split across
/// threads.
pub fn dequantize(t: BlockType, w: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    dequantize_on(Tier::best(), t, w, rows, cols)
}

/// [`dequantize`] on a given tier, which must be one of [`Tier::supported`].
pub fn dequantize_on(tier: Tier, t: BlockType, w: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    assert!(Tier::supported().contains(&tier), "{tier:?} kernels are not supported on this CPU");
    let row_bytes = t.row_bytes(cols);
    assert_eq!(w.len(), rows * row_bytes, "weight bytes do not match {rows} rows of {cols} columns");
    // Every element is written below; skipping the zero fill saves a pass over the whole matrix.
    let mut out: Vec<f32> = Vec::with_capacity(rows * cols);
    const ROWS_PER_ITEM: usize = 64;
    let out_ptr = out.as_mut_ptr() as usize;
    crate::model::pool::pool().for_chunks(rows.div_ceil(ROWS_PER_ITEM), |items| {
        let first = items.start * ROWS_PER_ITEM;
        let last = rows.min(items.end * ROWS_PER_ITEM);
        let src = &w[first * row_bytes..last * row_bytes];
        let blocks = src.len() / t.block_bytes();
        let o = (out_ptr as *mut f32).wrapping_add(first * cols);
        #[cfg(target_arch = "x86_64")]
        if tier != Tier::Scalar {
            // SAFETY: AVX2/FMA/F16C are present (checked above); `src` holds `blocks` whole blocks and the
            // work items write disjoint ranges of `out`'s allocation (`last <= rows`).
            unsafe { avx2::dequantize_blocks_of(t, src.as_ptr(), blocks, o) };
            return;
        }
        // SAFETY: as above; the range is zeroed before it is viewed as floats.
        let o = unsafe {
            std::ptr::write_bytes(o, 0, (last - first) * cols);
            std::slice::from_raw_parts_mut(o, (last - first) * cols)
        };
        for (b, ob) in src.chunks_exact(t.block_bytes()).zip(o.chunks_exact_mut(t.block_elems())) {
            dequantize_block(t, b, ob);
        }
    });
    // SAFETY: the work items covered rows 0..rows, and each wrote all of its rows' elements.
    unsafe { out.set_len(rows * cols) };
    out
}

/// Dequantizes one row (`row`: whole blocks of type `t`) into `out` on a given tier, on this thread.
pub fn dequantize_row_on(tier: Tier, t: BlockType, row: &[u8], out: &mut [f32]) {
    let blocks = row.len() / t.block_bytes();
    assert_eq!(row.len(), blocks * t.block_bytes(), "a row of whole {t:?} blocks");
    assert_eq!(out.len(), blocks * t.block_elems());
    #[cfg(target_arch = "x86_64")]
    if tier != Tier::Scalar && Tier::supported().contains(&tier) {
        // SAFETY: AVX2/FMA/F16C are present (the tier is supported); `row` holds `blocks` whole blocks and
        // `out` their elements (asserted).
        unsafe { avx2::dequantize_blocks_of(t, row.as_ptr(), blocks, out.as_mut_ptr()) };
        return;
    }
    for (b, ob) in row.chunks_exact(t.block_bytes()).zip(out.chunks_exact_mut(t.block_elems())) {
        dequantize_block(t, b, ob);
    }
}

/// Which implementation of the kernels runs. Ordered: a CPU runs every tier it supports, and
/// `REAGENT_KERNELS` caps the choice (Zen 4 has AVX-512 but not AVX-VNNI, so a cap at `vnni` gives AVX2
/// there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// Portable Rust.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 with AVX-VNNI byte dot products (Intel client chips since Alder Lake).
    AvxVnni,
    /// AVX-512 F/BW/VL/VNNI, 512-bit byte dot products (AMD Zen 4/5, Intel Xeons since Ice Lake): also runs
    /// prefill on 8-bit integers ([`matmul`]).
    Avx512,
}

impl Tier {
    /// Every tier, lowest first.
    pub const ALL: [Tier; 4] = [Tier::Scalar, Tier::Avx2, Tier::AvxVnni, Tier::Avx512];

    /// The name `REAGENT_KERNELS` and `reagent bench` use.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Scalar => "scalar",
            Tier::Avx2 => "avx2",
            Tier::AvxVnni => "vnni",
            Tier::Avx512 => "avx512",
        }
    }

    /// The best tier this CPU supports, capped by `REAGENT_KERNELS` ([`kernel_cap`]; a value it refuses
    /// caps nothing here: [`check_kernel_cap`] reports it when a model loads).
    pub fn best() -> Tier {
        static BEST: std::sync::OnceLock<Tier> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            let cap = kernel_cap().ok().flatten().unwrap_or(Tier::Avx512);
            Tier::supported().into_iter().filter(|&t| t <= cap).max().unwrap_or(Tier::Scalar)
        })
    }

    /// Every tier this CPU can run.
    pub fn supported() -> Vec<Tier> {
        let mut tiers = vec![Tier::Scalar];
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
            tiers.push(Tier::Avx2);
            if is_x86_feature_detected!("avxvnni") {
                tiers.push(Tier::AvxVnni);
            }
            if avx512::detected() {
                tiers.push(Tier::Avx512);
            }
        }
        tiers
    }
}

/// `REAGENT_KERNELS`, read once: a tier to cap the kernels at (`scalar`, `avx2`, `vnni`, `avx512`), or
/// none (unset, empty, or `amx`: every tier the CPU has, AMX prefill included); any other value is an error
/// naming the allowed ones (a typo must not silently mean "no cap").
pub fn kernel_cap() -> std::result::Result<Option<Tier>, String> {
    static CAP: std::sync::OnceLock<std::result::Result<Option<Tier>, String>> = std::sync::OnceLock::new();
    CAP.get_or_init(|| {
        let v = std::env::var("REAGENT_KERNELS").unwrap_or_default();
        match v.trim() {
            "" | "amx" => Ok(None),
            v => Tier::ALL.into_iter().find(|t| t.name() == v).map(Some).ok_or_else(|| {
                format!("`{v}` is not a kernel tier (scalar, avx2, vnni, avx512, amx; unset for the best)")
            }),
        }
    })
    .clone()
}

/// [`kernel_cap`] as this crate's error, for loading a model.
pub fn check_kernel_cap() -> crate::error::Result<()> {
    kernel_cap().map(drop).map_err(|e| crate::error::Error::param("REAGENT_KERNELS", e))
}

/// `y[r] = W[r] · x` for a `rows × (x.len()*32)` matrix in GGUF block layout, rows split across threads.
pub fn matvec(t: BlockType, w: &[u8], rows: usize, x: &[Q8Block], y: &mut [f32]) {
    matvec_on(Tier::best(), t, w, rows, x, y)
}

/// [`matvec`] on a given tier, which must be one of [`Tier::supported`].
pub fn matvec_on(tier: Tier, t: BlockType, w: &[u8], rows: usize, x: &[Q8Block], y: &mut [f32]) {
    matvec_jobs_on(tier, &mut [MatVecJob { t, w, rows, x, y }]);
}

/// One product of a fused mat-vec: `y[r] = W[r] · x` for a `rows × (x.len()*32)` matrix `w` of type `t`.
pub struct MatVecJob<'a> {
    pub t: BlockType,
    pub w: &'a [u8],
    pub rows: usize,
    pub x: &'a [Q8Block],
    pub y: &'a mut [f32],
}

/// Several mat-vec products in one dispatch to the workers (a decode step's q/k/v, or gate/up): one wake-up
/// and one barrier instead of one per matrix, which on small models is a visible share of a token.
pub fn matvec_jobs(jobs: &mut [MatVecJob]) {
    matvec_jobs_on(Tier::best(), jobs)
}

/// [`matvec_jobs`] on a given tier, which must be one of [`Tier::supported`].
pub fn matvec_jobs_on(tier: Tier, jobs: &mut [MatVecJob]) {
    assert!(Tier::supported().contains(&tier), "{tier:?} kernels are not supported on this CPU");
    const ROWS_PER_ITEM: usize = 16;
    let mut bytes = 0;
    // Per job: row bytes, the output's address, the first work item, and the activations packed for the
    // tier's kernels ([`pack`]).
    let mut plan = Vec::with_capacity(jobs.len());
    let mut items = 0;
    for j in jobs.iter_mut() {
        let cols = j.x.len() * QK;
        assert_eq!(cols % j.t.block_elems(), 0, "{cols} columns are not whole {:?} blocks", j.t);
        let row_bytes = j.t.row_bytes(cols);
        assert_eq!(j.w.len(), j.rows * row_bytes, "weight bytes do not match {} rows of {cols} columns", j.rows);
        assert_eq!(j.y.len(), j.rows);
        bytes += j.w.len();
        plan.push((row_bytes, j.y.as_mut_ptr() as usize, items, pack(tier, j.t, j.x)));
        items += j.rows.div_ceil(ROWS_PER_ITEM);
    }
    // Small products are not worth waking the workers for.
    if bytes < 64 * 1024 {
        for (j, (row_bytes, .., packed)) in jobs.iter_mut().zip(&plan) {
            rows_dot_into(tier, j.t, j.w, *row_bytes, 0, j.x, packed, j.y);
        }
        return;
    }
    let jobs = &*jobs;
    crate::model::pool::pool().for_chunks(items, |range| {
        // The range may span jobs: one contiguous run of rows per job it touches.
        let mut item = range.start;
        while item < range.end {
            let k = plan.partition_point(|p| p.2 <= item) - 1;
            let (j, (row_bytes, y_ptr, first_item, packed)) = (&jobs[k], &plan[k]);
            let end = plan.get(k + 1).map_or(range.end, |p| p.2.min(range.end));
            let first = (item - first_item) * ROWS_PER_ITEM;
            let last = j.rows.min((end - first_item) * ROWS_PER_ITEM);
            // SAFETY: work items are disjoint row ranges of one job's `y` (`last <= rows == y.len()`), and the
            // jobs' outputs are distinct `&mut` slices.
            let out = unsafe { std::slice::from_raw_parts_mut((*y_ptr as *mut f32).add(first), last - first) };
            rows_dot_into(tier, j.t, j.w, *row_bytes, first, j.x, packed, out);
            item = end;
        }
    });
}

/// `y[c·rows + r] = W[r] · x_c` for the `m` activation rows of `x` (`m` × blocks, token after token): a
/// short batch (forced tokens, a few tokens of a prompt) with each weight row read from memory once for all
/// the tokens, where one mat-vec per token would read the whole matrix `m` times. Rows go four at a time
/// with every token before the next four: on AVX-512 each unpacked block serves up to 4 tokens; the other
/// tiers run the rows' mat-vec kernel once per token while the rows are in L1. One token is [`matvec`].
pub fn matvec_tokens(t: BlockType, w: &[u8], rows: usize, x: &[Q8Block], m: usize, y: &mut [f32]) {
    matvec_tokens_on(Tier::best(), t, w, rows, x, m, y)
}

/// [`matvec_tokens`] on a given tier, which must be one of [`Tier::supported`].
pub fn matvec_tokens_on(tier: Tier, t: BlockType, w: &[u8], rows: usize, x: &[Q8Block], m: usize, y: &mut [f32]) {
    assert!(Tier::supported().contains(&tier), "{tier:?} kernels are not supported on this CPU");
    assert!(m > 0 && !x.is_empty() && x.len().is_multiple_of(m), "{} activation blocks are not {m} rows", x.len());
    if m == 1 {
        return matvec_on(tier, t, w, rows, x, y);
    }
    let blocks = x.len() / m;
    let cols = blocks * QK;
    assert_eq!(cols % t.block_elems(), 0, "{cols} columns are not whole {t:?} blocks");
    let row_bytes = t.row_bytes(cols);
    assert_eq!(w.len(), rows * row_bytes, "weight bytes do not match {rows} rows of {cols} columns");
    assert_eq!(y.len(), m * rows, "the output is not {m} rows of {rows}");
    // Each token's activations packed for `tier`; on AVX-512 all of them one after another instead.
    #[allow(unused_mut)]
    let mut tokens: Vec<Packed> = x.chunks_exact(blocks).map(|xc| pack(tier, t, xc)).collect();
    let mut packed = Packed::default();
    #[cfg(target_arch = "x86_64")]
    if tier == Tier::Avx512 {
        for p in tokens.drain(..) {
            packed.supers.extend_from_slice(&p.supers);
            packed.pairs.extend_from_slice(&p.pairs);
        }
    }
    const ROWS_PER_ITEM: usize = 16;
    let y_ptr = y.as_mut_ptr() as usize;
    let run = |items: std::ops::Range<usize>| {
        let first = items.start * ROWS_PER_ITEM;
        let last = rows.min(items.end * ROWS_PER_ITEM);
        // SAFETY: work items are disjoint row ranges, and every token's output row holds all `rows`.
        unsafe {
            rows_tokens_into(tier, t, w, row_bytes, first..last, x, m, &packed, &tokens, y_ptr as *mut f32, rows)
        };
    };
    if w.len() * m < 64 * 1024 {
        run(0..rows.div_ceil(ROWS_PER_ITEM));
    } else {
        crate::model::pool::pool().for_chunks(rows.div_ceil(ROWS_PER_ITEM), run);
    }
}

/// Rows `rows` of [`matvec_tokens_on`]'s product: `y[c·n + r]` for every token `c`, four rows at a time;
/// `packed` holds every token's activations packed for AVX-512, `tokens` each token's packing for the
/// other tiers.
///
/// # Safety
/// `y` holds `m · n` floats, `rows` lie inside both `w` and `0..n`, and no other thread writes these rows.
#[allow(clippy::too_many_arguments)]
unsafe fn rows_tokens_into(
    tier: Tier,
    t: BlockType,
    w: &[u8],
    row_bytes: usize,
    rows: std::ops::Range<usize>,
    x: &[Q8Block],
    m: usize,
    packed: &Packed,
    tokens: &[Packed],
    y: *mut f32,
    n: usize,
) {
    assert!(rows.end * row_bytes <= w.len() && rows.end <= n);
    let blocks = x.len() / m;
    #[cfg(target_arch = "x86_64")]
    if tier == Tier::Avx512 {
        use avx2::*;
        let k_quant = t.block_elems() > QK;
        let xstride = if k_quant { blocks / 8 } else { blocks.div_ceil(2) };
        let whole = if k_quant { packed.supers.len() } else { packed.pairs.len() } == m * xstride;
        assert!(whole, "the activations are packed for {t:?}");
        // Where the mat-vec takes rows four at a time, so do these, reducing as it does: each token gets
        // bit for bit what its own mat-vec gives (speculative decoding's drafts are checked on these).
        let fours = !one_row_at_a_time(tier, t, row_bytes);
        // One of `avx512`'s kernels instantiated for `t`'s block type and `$c` tokens.
        macro_rules! for_type {
            ($kernel:ident, $c:literal) => {
                match code(t) {
                    Q4_0 => avx512::$kernel::<Q4_0, $c>,
                    Q4_1 => avx512::$kernel::<Q4_1, $c>,
                    Q5_0 => avx512::$kernel::<Q5_0, $c>,
                    Q8_0 => avx512::$kernel::<Q8_0, $c>,
                    Q4K => avx512::$kernel::<Q4K, $c>,
                    Q5K => avx512::$kernel::<Q5K, $c>,
                    _ => avx512::$kernel::<Q6K, $c>,
                }
            };
        }
        // Tokens go in groups, every row of the range before the next group: a group's activations stay
        // in L2 while the rows (in L1 after the first group) go by. Rows one at a time take eight tokens
        // per unpacked block; four rows at a time keep to four (their 32 accumulators). Which tokens share
        // a pass changes no bit: each token's sums are its own.
        let mut c = 0;
        while c < m {
            let take = match m - c {
                8.. if !fours => 8,
                left => left.min(4),
            };
            // Only the packing of `t`'s kind is filled; the other pointer is passed along unread.
            let (xp, xs) =
                (packed.pairs.as_ptr().wrapping_add(c * xstride), packed.supers.as_ptr().wrapping_add(c * xstride));
            for r in rows.clone().step_by(4) {
                let count = (rows.end - r).min(4);
                let (row, yc) = (w.as_ptr().add(r * row_bytes), y.add(c * n + r));
                macro_rules! run {
                    ($c:literal) => {{
                        if fours && count == 4 {
                            for_type!(rows4_tokens, $c)(row, row_bytes, xp, xs, xstride, blocks, yc, n);
                        } else {
                            for_type!(rows_run, $c)(row, row_bytes, count, xp, xs, xstride, blocks, yc, n);
                        }
                    }};
                }
                match take {
                    1 => run!(1),
                    2 => run!(2),
                    3 => run!(3),
                    4 => run!(4),
                    _ => for_type!(rows_run, 8)(row, row_bytes, count, xp, xs, xstride, blocks, yc, n),
                }
            }
            c += take;
        }
        return;
    }
    let _ = packed;
    // The 256-bit tiers: each row once for up to four tokens, each block or super-block unpacked once for
    // them all, every token's sums in its own mat-vec's order.
    #[cfg(target_arch = "x86_64")]
    if matches!(tier, Tier::Avx2 | Tier::AvxVnni) {
        use avx2::*;
        let vnni = tier == Tier::AvxVnni;
        if t.block_elems() > QK {
            // Each token's blocks and block sums taken where they lie: this runs once per work item.
            assert!(
                tokens.iter().all(|p| p.bsums.len() * 8 == blocks),
                "the activations' block sums are packed for {t:?}"
            );
        }
        // Tokens `$at..$at + $c` through row `$r`, their results stored: a 32-element type's kernel, and
        // a K-quant's with the tokens' block sums.
        macro_rules! blocks_group {
            ($code:expr, $c:literal, $at:expr, $row:expr, $r:expr) => {{
                let xg: [&[Q8Block]; $c] = std::array::from_fn(|i| &x[($at + i) * blocks..][..blocks]);
                let out = match vnni {
                    true => row_tokens_vnni::<{ $code }, $c>($row, &xg),
                    false => row_tokens::<{ $code }, $c>($row, &xg),
                };
                for (i, v) in out.into_iter().enumerate() {
                    *y.add(($at + i) * n + $r) = v;
                }
            }};
        }
        macro_rules! supers_group {
            ($code:expr, $c:literal, $at:expr, $row:expr, $r:expr) => {{
                let xg: [&[Q8Block]; $c] = std::array::from_fn(|i| &x[($at + i) * blocks..][..blocks]);
                let sg: [&[[i16; 16]]; $c] = std::array::from_fn(|i| tokens[$at + i].bsums.as_slice());
                let out = row_tokens_k::<{ $code }, $c>($row, &xg, &sg);
                for (i, v) in out.into_iter().enumerate() {
                    *y.add(($at + i) * n + $r) = v;
                }
            }};
        }
        macro_rules! rows_of {
            ($group:ident, $code:expr) => {{
                for r in rows.clone() {
                    let row = w.as_ptr().add(r * row_bytes);
                    let mut c = 0;
                    while c < m {
                        match m - c {
                            1 => $group!($code, 1, c, row, r),
                            2 => $group!($code, 2, c, row, r),
                            3 => $group!($code, 3, c, row, r),
                            _ => $group!($code, 4, c, row, r),
                        }
                        c += (m - c).min(4);
                    }
                }
            }};
        }
        match code(t) {
            Q4_0 => rows_of!(blocks_group, Q4_0),
            Q4_1 => rows_of!(blocks_group, Q4_1),
            Q5_0 => rows_of!(blocks_group, Q5_0),
            Q8_0 => rows_of!(blocks_group, Q8_0),
            Q4K => rows_of!(supers_group, Q4K),
            Q5K => rows_of!(supers_group, Q5K),
            _ => rows_of!(supers_group, Q6K),
        }
        return;
    }
    // The other tiers: each run of four rows (in L1 after the first token) through the mat-vec's own row
    // kernels, one token at a time: short rows four at a time, long rows one at a time.
    for r in rows.clone().step_by(4) {
        let count = (rows.end - r).min(4);
        for (c, (xc, packed)) in x.chunks_exact(blocks).zip(tokens).enumerate() {
            let out = std::slice::from_raw_parts_mut(y.add(c * n + r), count);
            rows_dot_into(tier, t, w, row_bytes, r, xc, packed, out);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod groups;

/// Activations packed for a tier's kernels: for AVX-512 super-blocks for the K-quants, pairs of blocks
/// for the 32-element types; for the 256-bit tiers' K-quants each super-block's activation sums.
#[derive(Default)]
struct Packed {
    #[cfg(target_arch = "x86_64")]
    supers: Vec<avx512::XSuper>,
    #[cfg(target_arch = "x86_64")]
    pairs: Vec<avx512::XPair>,
    /// The 256-bit tiers' K-quant kernels: each super-block's activation sums ([`avx2::block_sums`]).
    #[cfg(target_arch = "x86_64")]
    bsums: Vec<[i16; 16]>,
}

/// `x` packed for weights of type `t` where the tier's kernels want it so (AVX-512; the 256-bit tiers'
/// K-quants), else empty.
fn pack(tier: Tier, t: BlockType, x: &[Q8Block]) -> Packed {
    let mut out = Packed::default();
    #[cfg(target_arch = "x86_64")]
    match tier {
        Tier::Avx512 => match t.block_elems() > QK {
            true => avx512::pack_supers(avx2::code(t), x, &mut out.supers),
            false => avx512::pack_pairs(avx2::code(t), x, &mut out.pairs),
        },
        Tier::Avx2 | Tier::AvxVnni if t.block_elems() > QK => avx2::block_sums(avx2::code(t), x, &mut out.bsums),
        _ => {}
    }
    let _ = (tier, t, x);
    out
}

/// `R` consecutive weight rows from `w` (`row_bytes` apart) times one activation row on the AVX-512
/// kernels, `blocks` blocks long: `xp` the packed pairs for the 32-element block types, `xs` the packed
/// super-blocks for the K-quants.
///
/// # Safety
/// The CPU has the AVX-512 tier; the `R` rows lie inside their buffer, and the packing for `t` holds the
/// whole activation row.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn avx512_rows_dot<const R: usize>(
    t: BlockType,
    w: *const u8,
    row_bytes: usize,
    xp: *const avx512::XPair,
    xs: *const avx512::XSuper,
    blocks: usize,
) -> [f32; R] {
    use avx2::*;
    use avx512::{rows_dot, rows_dot_k};
    match code(t) {
        Q4_0 => rows_dot::<Q4_0, R>(w, row_bytes, xp, blocks),
        Q4_1 => rows_dot::<Q4_1, R>(w, row_bytes, xp, blocks),
        Q5_0 => rows_dot::<Q5_0, R>(w, row_bytes, xp, blocks),
        Q8_0 => rows_dot::<Q8_0, R>(w, row_bytes, xp, blocks),
        Q4K => rows_dot_k::<Q4K, R>(w, row_bytes, xs, blocks / 8),
        Q5K => rows_dot_k::<Q5K, R>(w, row_bytes, xs, blocks / 8),
        _ => rows_dot_k::<Q6K, R>(w, row_bytes, xs, blocks / 8),
    }
}

/// Row length (bytes) from which the SIMD mat-vecs take rows one at a time.
const LONG_ROW: usize = 768;

/// Whether rows of type `t` and `row_bytes` bytes go one at a time on `tier`: long rows; Q8_0 rows of any
/// length; on AVX-512, whose 32-element kernels take their activations packed once per token ([`pack`]),
/// every type but Q4_1. Measured from memory, 2 threads, Zen 5 (GB/s of weights, one at a time against four
/// at a time): AVX-512 Q8_0 at 640 columns 34 against 19, Q5_0 and Q4_0 at 896 columns 28 against 21–23,
/// Q4_1 at 576 columns 19 against 20; AVX2 Q8_0 26 against 19.5, Q5_0 13 against 23, Q4_1 15 against 22.
fn one_row_at_a_time(tier: Tier, t: BlockType, row_bytes: usize) -> bool {
    row_bytes >= LONG_ROW || t == BlockType::Q8_0 || (tier == Tier::Avx512 && t != BlockType::Q4_1)
}

/// `out[i] = W[first + i] · x` for consecutive rows, on the best kernel available.
#[allow(clippy::too_many_arguments)]
fn rows_dot_into(
    tier: Tier,
    t: BlockType,
    w: &[u8],
    row_bytes: usize,
    first: usize,
    x: &[Q8Block],
    packed: &Packed,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if tier == Tier::Avx512 {
        let n = out.len();
        assert!((first + n) * row_bytes <= w.len());
        let whole = match t.block_elems() > QK {
            true => packed.supers.len() * 8 == x.len(),
            false => packed.pairs.len() == x.len().div_ceil(2),
        };
        assert!(whole, "the activations are packed for {t:?}");
        let mut r = 0;
        // SAFETY: the tier's CPU features are present (`matvec_on` checks), every row read lies inside `w`
        // (asserted), and the packed activations are whole rows of `x.len()` blocks (asserted).
        unsafe {
            let base = w.as_ptr().add(first * row_bytes);
            let (xp, xs) = (packed.pairs.as_ptr(), packed.supers.as_ptr());
            // Short rows go four at a time, sharing each activation load, with the next four prefetched;
            // long rows one at a time, a sequential stream the hardware prefetcher follows (measured on
            // Qwen 1.5B, 864 to 5040-byte K-quant rows: 28 tok/s against 19.6 four at a time).
            let long = one_row_at_a_time(tier, t, row_bytes);
            while r + 4 <= n && !long {
                let y = avx512_rows_dot::<4>(t, base.add(r * row_bytes), row_bytes, xp, xs, x.len());
                out[r..r + 4].copy_from_slice(&y);
                r += 4;
            }
            if r < n {
                let (row, count, blocks, y) = (base.add(r * row_bytes), n - r, x.len(), out.as_mut_ptr().add(r));
                use avx2::*;
                match code(t) {
                    Q4_0 => avx512::rows_run::<Q4_0, 1>(row, row_bytes, count, xp, xs, 0, blocks, y, 0),
                    Q4_1 => avx512::rows_run::<Q4_1, 1>(row, row_bytes, count, xp, xs, 0, blocks, y, 0),
                    Q5_0 => avx512::rows_run::<Q5_0, 1>(row, row_bytes, count, xp, xs, 0, blocks, y, 0),
                    Q8_0 => avx512::rows_run::<Q8_0, 1>(row, row_bytes, count, xp, xs, 0, blocks, y, 0),
                    Q4K => avx512::rows_run::<Q4K, 1>(row, row_bytes, count, xp, xs, 0, blocks, y, 0),
                    Q5K => avx512::rows_run::<Q5K, 1>(row, row_bytes, count, xp, xs, 0, blocks, y, 0),
                    _ => avx512::rows_run::<Q6K, 1>(row, row_bytes, count, xp, xs, 0, blocks, y, 0),
                }
            }
        }
        return;
    }
    let _ = packed;
    #[cfg(target_arch = "x86_64")]
    if tier != Tier::Scalar {
        use avx2::*;
        let n = out.len();
        assert!((first + n) * row_bytes <= w.len());
        let bsums = &packed.bsums;
        assert!(
            t.block_elems() == QK || bsums.len() * 8 == x.len(),
            "the activations' block sums are packed for {t:?}"
        );
        let mut r = 0;
        // SAFETY: the tier's CPU features are present (`matvec_on` checks) and every row read lies inside
        // `w` (asserted).
        unsafe {
            let base = w.as_ptr().add(first * row_bytes);
            let long = one_row_at_a_time(tier, t, row_bytes);
            macro_rules! run {
                ($f:ident, $code:expr $(, $extra:expr)?) => {{
                    while r + 4 <= n && !long {
                        let y = $f::<{ $code }, 4>(base.add(r * row_bytes), row_bytes, x $(, $extra)?);
                        out[r..r + 4].copy_from_slice(&y);
                        r += 4;
                    }
                    while r < n {
                        out[r] = $f::<{ $code }, 1>(base.add(r * row_bytes), row_bytes, x $(, $extra)?)[0];
                        r += 1;
                    }
                }};
            }
            match (code(t), tier == Tier::AvxVnni) {
                (Q4_0, false) => run!(rows_dot, Q4_0),
                (Q4_1, false) => run!(rows_dot, Q4_1),
                (Q5_0, false) => run!(rows_dot, Q5_0),
                (Q8_0, false) => run!(rows_dot, Q8_0),
                (Q4K, false) => run!(rows_dot_k, Q4K, bsums),
                (Q5K, false) => run!(rows_dot_k, Q5K, bsums),
                (_, false) => run!(rows_dot_k, Q6K, bsums),
                (Q4_0, true) => run!(rows_dot_vnni, Q4_0),
                (Q4_1, true) => run!(rows_dot_vnni, Q4_1),
                (Q5_0, true) => run!(rows_dot_vnni, Q5_0),
                (Q8_0, true) => run!(rows_dot_vnni, Q8_0),
                // The K-quant kernels scale in the integer domain with `madd`, which VNNI has no form of.
                (Q4K, true) => run!(rows_dot_k, Q4K, bsums),
                (Q5K, true) => run!(rows_dot_k, Q5K, bsums),
                (_, true) => run!(rows_dot_k, Q6K, bsums),
            }
        }
        return;
    }
    for (i, o) in out.iter_mut().enumerate() {
        let r = first + i;
        *o = row_dot_scalar(t, &w[r * row_bytes..(r + 1) * row_bytes], x);
    }
}

mod batched;
pub use batched::{int_matmul_min_rows, int_matmul_name, int_matmul_supports, matmul, matmul_on};

#[cfg(test)]
mod tests;
