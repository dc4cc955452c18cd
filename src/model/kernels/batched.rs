//! The batched product (prompt prefill) on 8-bit integer kernels: [`matmul`].

#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};
use super::{matvec_on, quantize_row_q8_for, BlockType, Q8Block, Tier, QK};

/// Whether [`matmul`] multiplies prompt-sized batches of a matrix of type `t` on 8-bit integer kernels on
/// the best tier here, rather than the caller dequantizing the weights for an f32 GEMM.
pub fn int_matmul_supports(t: BlockType) -> bool {
    int_matmul_on(Tier::best(), t)
}

/// The batch from which [`matmul`]'s tiles beat a short batch's mat-vec ([`super::matvec_tokens`]) on the
/// best tier here. The tiles read each weight block once per tile of tokens after packing the weights once
/// per call (on AVX-512 and AVX2 16 or 8 rows into a register's lanes, which costs more than the older
/// groups did); the short batch reads each row once for all its tokens and (on AVX-512) unpacks each block
/// once for them all, but the 256-bit tiers run the row's mat-vec again per token. Measured on Qwen 1.5B,
/// 2 threads, Zen 5 (ms a forward): AVX-512 mat-vec 12 tokens 181, 14 tokens 212, tiles 10 tokens 212, 16
/// tokens 233–258; AVX2 mat-vec 6 tokens 166, 7 tokens 190, tiles 4 tokens 183, 6 tokens 200, 8 tokens 234.
/// AVX-VNNI keeps the 2 × 2 group tiles (not measured here: no AVX-VNNI on the development machine). The
/// AVX-512 figures are from its 16 × 8 tiles, before the 32 × 4 ones (about 5% faster at 512 tokens).
pub fn int_matmul_min_rows() -> usize {
    match Tier::best() {
        Tier::Avx512 => 16,
        Tier::Avx2 => 8,
        _ => 4,
    }
}

/// The name of the integer prefill on the best tier here, if it has one.
pub fn int_matmul_name() -> Option<&'static str> {
    match Tier::best() {
        Tier::Avx512 => Some("int8_avx512"),
        Tier::AvxVnni => Some("int8_vnni"),
        Tier::Avx2 => Some("int8_avx2"),
        Tier::Scalar => None,
    }
}

/// Whether `tier` has a batched integer kernel for `t`: AVX-512 and AVX-VNNI for every type, AVX2 for all
/// but Q8_0 (whose unsigned weights reach 255, where `maddubs` pairs saturate).
fn int_matmul_on(tier: Tier, t: BlockType) -> bool {
    match tier {
        Tier::Avx512 | Tier::AvxVnni => true,
        Tier::Avx2 => t != BlockType::Q8_0,
        Tier::Scalar => false,
    }
}

/// `X · Wᵀ` as `m × n` f32, row-major, for `x` of `m × k` (f32, row-major) and `w` the `n × k` matrix of
/// type `t` in GGUF block layout: the integer prefill. Each row of `x` is quantized to 8 bits as for
/// decode; tiles of weight rows × tokens use each unpacked weight block for every token of the tile (16 or 8
/// rows in a register's lanes on AVX-512 and AVX2, `matmul_rows16` and `matmul_rows8`; else groups of
/// 8 blocks, 4 × 3 on AVX-512 and 2 × 2 on AVX-VNNI), with the tokens taken a pass at a time so that their
/// activations stay in L2 while a worker's rows go over them. The scalar tier, and Q8_0 on plain AVX2,
/// run one mat-vec per token (the reference the tests compare against).
pub fn matmul(t: BlockType, w: &[u8], n: usize, k: usize, x: &[f32]) -> Vec<f32> {
    matmul_on(Tier::best(), t, w, n, k, x)
}

/// [`matmul`] on a given tier, which must be one of [`Tier::supported`].
pub fn matmul_on(tier: Tier, t: BlockType, w: &[u8], n: usize, k: usize, x: &[f32]) -> Vec<f32> {
    assert!(Tier::supported().contains(&tier), "{tier:?} kernels are not supported on this CPU");
    assert!(k > 0 && k.is_multiple_of(t.block_elems()), "{k} columns are not whole {t:?} blocks");
    let row_bytes = t.row_bytes(k);
    assert_eq!(w.len(), n * row_bytes, "weight bytes do not match {n} rows of {k} columns");
    assert!(x.len().is_multiple_of(k), "activations are not whole rows of {k}");
    let (m, blocks) = (x.len() / k, k / QK);
    let mut xq = vec![Q8Block::default(); m * blocks];
    for (xr, q) in x.chunks_exact(k).zip(xq.chunks_exact_mut(blocks)) {
        quantize_row_q8_for(t, xr, q);
    }
    let mut y = vec![0f32; m * n];
    if !int_matmul_on(tier, t) {
        for (q, yr) in xq.chunks_exact(blocks).zip(y.chunks_exact_mut(n)) {
            matvec_on(tier, t, w, n, q, yr);
        }
        return y;
    }
    #[cfg(target_arch = "x86_64")]
    // Q4_1 stays on the group tiles: on SmolLM2 (576 and 1536 columns) the lanes tiles measured faster
    // alone (98-152 against 57-143 G multiply-adds/s) but the whole prefill 8-10% slower (alternating
    // pairs: 588/600/576 against 676/669/587 tok/s), which was not tracked down.
    if tier == Tier::Avx512 && !matches!(t, BlockType::Q5K | BlockType::Q4_1) {
        match t {
            BlockType::Q4K => matmul_rows16::<{ avx2::Q4K }>(w, n, row_bytes, &xq, blocks, &mut y),
            BlockType::Q6K => matmul_rows16::<{ avx2::Q6K }>(w, n, row_bytes, &xq, blocks, &mut y),
            BlockType::Q4_0 => matmul_rows16::<{ avx2::Q4_0 }>(w, n, row_bytes, &xq, blocks, &mut y),
            BlockType::Q5_0 => matmul_rows16::<{ avx2::Q5_0 }>(w, n, row_bytes, &xq, blocks, &mut y),
            BlockType::Q8_0 => matmul_rows16::<{ avx2::Q8_0 }>(w, n, row_bytes, &xq, blocks, &mut y),
            _ => unreachable!("{t:?} is not on the lanes tiles"),
        }
        return y;
    }
    #[cfg(target_arch = "x86_64")]
    if tier == Tier::Avx2 && !matches!(t, BlockType::Q5K | BlockType::Q8_0) {
        match t {
            BlockType::Q4K => matmul_rows8::<{ avx2::Q4K }>(w, n, row_bytes, &xq, blocks, &mut y),
            BlockType::Q6K => matmul_rows8::<{ avx2::Q6K }>(w, n, row_bytes, &xq, blocks, &mut y),
            BlockType::Q4_0 => matmul_rows8::<{ avx2::Q4_0 }>(w, n, row_bytes, &xq, blocks, &mut y),
            BlockType::Q4_1 => matmul_rows8::<{ avx2::Q4_1 }>(w, n, row_bytes, &xq, blocks, &mut y),
            BlockType::Q5_0 => matmul_rows8::<{ avx2::Q5_0 }>(w, n, row_bytes, &xq, blocks, &mut y),
            _ => unreachable!("{t:?} is not on the lanes tiles"),
        }
        return y;
    }
    #[cfg(target_arch = "x86_64")]
    matmul_groups(tier, t, w, n, row_bytes, &xq, blocks, &mut y);
    y
}

/// The batched product of a type `T` (Q4_K, Q6_K, Q4_0, Q4_1, Q5_0) on AVX2 with 8 rows in a register's
/// lanes (`avx2::tile_rows8`): each work item of 16 rows packed as two groups of 8, then tiles of 8 rows ×
/// 4 tokens, tokens in passes that stay in L2.
#[cfg(target_arch = "x86_64")]
fn matmul_rows8<const T: u8>(w: &[u8], n: usize, row_bytes: usize, xq: &[Q8Block], blocks: usize, y: &mut [f32]) {
    let supers = blocks.div_ceil(8);
    let m = xq.len() / blocks;
    let y_ptr = y.as_mut_ptr() as usize;
    let per_pass = (PASS_BYTES / (blocks * std::mem::size_of::<Q8Block>())).clamp(8, 128) / 4 * 4;
    crate::model::pool::pool().for_chunks(n.div_ceil(ROWS_PER_ITEM), |items| {
        let mut wp = Vec::new();
        for item in items {
            let first = item * ROWS_PER_ITEM;
            let last = n.min(first + ROWS_PER_ITEM);
            // SAFETY: AVX2 is present (the caller's tier); the rows lie inside `w`.
            unsafe {
                avx2::pack_rows8::<T>(&w[first * row_bytes..last * row_bytes], row_bytes, last - first, blocks, &mut wp)
            };
            for c0 in (0..m).step_by(per_pass) {
                let c1 = m.min(c0 + per_pass);
                for g in 0..(last - first).div_ceil(8) {
                    let rows = (last - first - 8 * g).min(8);
                    let r = first + 8 * g;
                    let mut c = c0;
                    while c < c1 {
                        let cc = (c1 - c).min(4);
                        let x = |j: usize| xq[(c + j.min(cc - 1)) * blocks..].as_ptr();
                        let mut out = [[0f32; 8]; 4];
                        // SAFETY: AVX2 is present; the group's packed super-blocks and the tokens' blocks
                        // exist; work items write disjoint rows of `y`, only this group's `rows` rows.
                        unsafe {
                            let wg = wp.as_ptr().add(g * supers);
                            match cc {
                                4 => {
                                    out.copy_from_slice(&avx2::tile_rows8::<T, 4>(wg, [x(0), x(1), x(2), x(3)], blocks))
                                }
                                3 => {
                                    out[..3].copy_from_slice(&avx2::tile_rows8::<T, 3>(wg, [x(0), x(1), x(2)], blocks))
                                }
                                2 => out[..2].copy_from_slice(&avx2::tile_rows8::<T, 2>(wg, [x(0), x(1)], blocks)),
                                _ => out[..1].copy_from_slice(&avx2::tile_rows8::<T, 1>(wg, [x(0)], blocks)),
                            }
                            for (j, o) in out.iter().enumerate().take(cc) {
                                let dst = (y_ptr as *mut f32).add((c + j) * n + r);
                                std::ptr::copy_nonoverlapping(o.as_ptr(), dst, rows);
                            }
                        }
                        c += cc;
                    }
                }
            }
        }
    });
}

/// The batched product of a type `T` (all but Q5_K and Q4_1) on AVX-512 with 16 rows in a register's lanes
/// (`avx512::tile_rows16`): each work item packs its 32 rows as two groups of 16, then runs tiles of 32
/// rows × 4 tokens (two weight vectors per broadcast activation word: 6 loads per 8 `vpdpbusd`, where
/// 16 rows × 8 tokens took 9; Qwen 1.5B prefill 135–141 → 143–150 tok/s, Gemma3 1037–1070 → 1117–1142),
/// tokens in passes that stay in L2.
#[cfg(target_arch = "x86_64")]
fn matmul_rows16<const T: u8>(w: &[u8], n: usize, row_bytes: usize, xq: &[Q8Block], blocks: usize, y: &mut [f32]) {
    const TOKENS: usize = 4;
    let m = xq.len() / blocks;
    // Q6_K: each block's two 16-element sums, for its offset.
    let hs: Vec<[i32; 2]> = if T == avx2::Q6K {
        xq.iter()
            .map(|b| {
                let half = |h: usize| b.qs[16 * h..16 * h + 16].iter().map(|&q| q as i32).sum::<i32>();
                [half(0), half(1)]
            })
            .collect()
    } else {
        Vec::new()
    };
    let y_ptr = y.as_mut_ptr() as usize;
    let per_pass = (PASS_BYTES / (blocks * std::mem::size_of::<Q8Block>())).clamp(TOKENS, 128) / TOKENS * TOKENS;
    let supers = blocks.div_ceil(8);
    // Work items of 32 rows: two packed groups of 16 per tile, each broadcast activation word serving both.
    crate::model::pool::pool().for_chunks(n.div_ceil(ROWS16_PER_ITEM), |items| {
        let mut wp = Vec::new();
        for g in items {
            let (first, last) = (ROWS16_PER_ITEM * g, n.min(ROWS16_PER_ITEM * (g + 1)));
            // SAFETY: AVX-512 is present (the caller's tier); the rows lie inside `w`.
            unsafe {
                avx512::pack_rows16::<T>(
                    &w[first * row_bytes..last * row_bytes],
                    row_bytes,
                    last - first,
                    blocks,
                    &mut wp,
                )
            };
            let groups = (last - first).div_ceil(16);
            for c0 in (0..m).step_by(per_pass) {
                let c1 = m.min(c0 + per_pass);
                let mut c = c0;
                while c < c1 {
                    let cc = (c1 - c).min(TOKENS);
                    let x = |j: usize| xq[(c + j.min(cc - 1)) * blocks..].as_ptr();
                    // (Read for Q6_K only; empty, and never read, for the other types.)
                    let h = |j: usize| hs.as_ptr().wrapping_add((c + j.min(cc - 1)) * blocks);
                    let mut out = [[[0f32; 16]; TOKENS]; 2];
                    // SAFETY: AVX-512 is present; the item's packed super-blocks and the tokens' blocks and
                    // half sums exist; work items write disjoint rows of `y`, only this item's rows.
                    unsafe {
                        let w0 = wp.as_ptr();
                        macro_rules! tile {
                            ($c:literal) => {{
                                if groups == 2 {
                                    let v = avx512::tile_rows16::<T, 2, $c>(
                                        [w0, w0.add(supers)],
                                        std::array::from_fn(&x),
                                        std::array::from_fn(&h),
                                        blocks,
                                    );
                                    out[0][..$c].copy_from_slice(&v[0]);
                                    out[1][..$c].copy_from_slice(&v[1]);
                                } else {
                                    let v = avx512::tile_rows16::<T, 1, $c>(
                                        [w0],
                                        std::array::from_fn(&x),
                                        std::array::from_fn(&h),
                                        blocks,
                                    );
                                    out[0][..$c].copy_from_slice(&v[0]);
                                }
                            }};
                        }
                        match cc {
                            4 => tile!(4),
                            3 => tile!(3),
                            2 => tile!(2),
                            _ => tile!(1),
                        }
                        for (gi, out) in out.iter().enumerate().take(groups) {
                            let (r0, r1) = (first + 16 * gi, last.min(first + 16 * gi + 16));
                            for (j, o) in out.iter().enumerate().take(cc) {
                                let dst = (y_ptr as *mut f32).add((c + j) * n + r0);
                                std::ptr::copy_nonoverlapping(o.as_ptr(), dst, r1 - r0);
                            }
                        }
                    }
                    c += cc;
                }
            }
        }
    });
}

/// Rows per work item of the batched products (the AVX-512 lanes tiles: [`ROWS16_PER_ITEM`]), and the bytes
/// of packed activations per pass over a work item's rows: the tokens of a pass stay in L2 (with the item's
/// packed rows) while the rows pass over them, so a wide matrix takes fewer tokens per pass (Qwen 1.5B's
/// 8960-wide down projection: 16).
#[cfg(target_arch = "x86_64")]
const ROWS_PER_ITEM: usize = 16;
/// Rows per work item of [`matmul_rows16`]: two packed groups of 16, one tile's rows.
#[cfg(target_arch = "x86_64")]
const ROWS16_PER_ITEM: usize = 32;
#[cfg(target_arch = "x86_64")]
const PASS_BYTES: usize = 256 * 1024;
/// Rows and tokens of a tile: AVX-512 (32 registers: 12 sums, 12 accumulators, 4 weight vectors; 4 × 3
/// measured 10-12% faster than 4 × 2 on 8960-wide rows, 3 × 4 slower: 16-row work items leave a 1-row tail)
/// and AVX2 (16).
#[cfg(target_arch = "x86_64")]
const TILE_512: (usize, usize) = (4, 3);
#[cfg(target_arch = "x86_64")]
const TILE_256: (usize, usize) = (2, 2);

/// Runs `cell(r, c, rr, cc)` over the `rr × cc` tiles (the given size; 1-row tails, and token tails as wide
/// as the tokens left) covering rows
/// `first..last` and all `m` tokens, `per_pass` tokens at a time.
#[cfg(target_arch = "x86_64")]
fn for_tiles(
    first: usize,
    last: usize,
    m: usize,
    (tile_rows, tile_tokens): (usize, usize),
    per_pass: usize,
    mut cell: impl FnMut(usize, usize, usize, usize),
) {
    for c0 in (0..m).step_by(per_pass) {
        let c1 = m.min(c0 + per_pass);
        let mut r = first;
        while r < last {
            let rr = if last - r >= tile_rows { tile_rows } else { 1 };
            let mut c = c0;
            while c < c1 {
                let cc = (c1 - c).min(tile_tokens);
                cell(r, c, rr, cc);
                c += cc;
            }
            r += rr;
        }
    }
}

/// Writes an `R × C` tile of results at rows `r..`, tokens `c..` of the `m × n` output.
///
/// # Safety
/// The tile lies inside the output at `y`.
#[cfg(target_arch = "x86_64")]
unsafe fn store_tile<const R: usize, const C: usize>(v: [[f32; C]; R], y: *mut f32, n: usize, r: usize, c: usize) {
    for (i, vr) in v.iter().enumerate() {
        for (j, &vc) in vr.iter().enumerate() {
            *y.add((c + j) * n + r + i) = vc;
        }
    }
}

/// One tile of the batched product on `tier`'s kernels.
///
/// # Safety
/// The CPU has `tier`, [`int_matmul_on`] holds for `tier` and `t`, and the tile's `R` packed rows (`groups`
/// apart) and `C` packed tokens (`groups` apart) exist.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn group_tile<const R: usize, const C: usize>(
    tier: Tier,
    t: BlockType,
    w: *const super::groups::WGroup,
    x: *const super::groups::XGroup,
    groups: usize,
) -> [[f32; C]; R] {
    let min = t.has_minimum();
    let g = groups;
    match (tier, t) {
        (Tier::Avx512, _) if min => avx512::tile_groups::<true, R, C>(w, g, x, g, g),
        (Tier::Avx512, _) => avx512::tile_groups::<false, R, C>(w, g, x, g, g),
        (Tier::AvxVnni, _) if min => avx2::tile_groups_vnni::<true, R, C>(w, g, x, g, g),
        (Tier::AvxVnni, _) => avx2::tile_groups_vnni::<false, R, C>(w, g, x, g, g),
        _ if int_scales(tier, t) => avx2::tile_groups::<true, true, true, R, C>(w, g, x, g, g),
        _ if min => avx2::tile_groups::<true, true, false, R, C>(w, g, x, g, g),
        // Q6_K's weights reach 63: its `maddubs` sums fit i16 only in pairs.
        (_, BlockType::Q6K) => avx2::tile_groups::<false, false, false, R, C>(w, g, x, g, g),
        _ => avx2::tile_groups::<true, false, false, R, C>(w, g, x, g, g),
    }
}

/// Whether `tier`'s tile takes `t` with integer sub-block scales (`avx2::pack_weight_groups`): Q4_K and Q5_K
/// on AVX2, whose `madd` applies them for free (measured +5–10% on Qwen 1.5B's up projection). The VNNI
/// tiers' byte dot products give i32 sums that would need a multiply each; Q6_K measured 5–14% slower
/// that way (its offset then takes a float FMA per half where the integer start was an add).
#[cfg(target_arch = "x86_64")]
fn int_scales(tier: Tier, t: BlockType) -> bool {
    tier == Tier::Avx2 && matches!(t, BlockType::Q4K | BlockType::Q5K)
}

/// The batched product on the integer kernels: tokens packed once into groups of 8 blocks
/// ([`groups::XGroup`](super::groups::XGroup)), each work item's rows packed once the same way (a K-quant super-block as 8 blocks
/// with float scales and minimums), then tiles of a few rows × a few tokens.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn matmul_groups(
    tier: Tier,
    t: BlockType,
    w: &[u8],
    n: usize,
    row_bytes: usize,
    xq: &[Q8Block],
    blocks: usize,
    y: &mut [f32],
) {
    use super::groups::{XGroup, GROUP};
    let code = avx2::code(t);
    let groups = blocks.div_ceil(GROUP);
    let m = xq.len() / blocks;
    let mut xg: Vec<XGroup> = vec![XGroup::ZERO; m * groups];
    for (q, g) in xq.chunks_exact(blocks).zip(xg.chunks_exact_mut(groups)) {
        avx512::pack_groups(code, q, g);
    }
    let y_ptr = y.as_mut_ptr() as usize;
    let tile = if tier == Tier::Avx512 { TILE_512 } else { TILE_256 };
    let per_pass = (PASS_BYTES / (groups * std::mem::size_of::<XGroup>())).clamp(8, 128) / tile.1 * tile.1;
    crate::model::pool::pool().for_chunks(n.div_ceil(ROWS_PER_ITEM), |items| {
        let first = items.start * ROWS_PER_ITEM;
        let last = n.min(items.end * ROWS_PER_ITEM);
        let mut wg = Vec::new();
        let rows = &w[first * row_bytes..last * row_bytes];
        if tier == Tier::Avx512 {
            // SAFETY: AVX-512 is present (the caller's tier); `rows` holds `last - first` rows.
            unsafe { avx512::pack_weight_groups(code, rows.as_ptr(), row_bytes, last - first, blocks, &mut wg) };
        } else {
            // SAFETY: AVX2 is present (every tier with a batched kernel has it); `rows` holds the rows.
            unsafe { avx2::pack_weight_groups(t, rows, row_bytes, last - first, blocks, int_scales(tier, t), &mut wg) };
        }
        for_tiles(first, last, m, tile, per_pass, |r, c, rr, cc| {
            // SAFETY: the tier is present and takes `t` (the caller checks); the tile's packed rows and tokens
            // exist, and work items write disjoint rows of `y`.
            unsafe {
                let (wp, xp, y) =
                    (wg.as_ptr().add((r - first) * groups), xg.as_ptr().add(c * groups), y_ptr as *mut f32);
                // Every shape `for_tiles` can hand out for TILE_512 and TILE_256 (a new tile size needs its
                // arms: the batched tests then fail loudly rather than skip rows or tokens).
                match (rr, cc) {
                    (4, 3) => store_tile(group_tile::<4, 3>(tier, t, wp, xp, groups), y, n, r, c),
                    (1, 3) => store_tile(group_tile::<1, 3>(tier, t, wp, xp, groups), y, n, r, c),
                    (4, 2) => store_tile(group_tile::<4, 2>(tier, t, wp, xp, groups), y, n, r, c),
                    (4, 1) => store_tile(group_tile::<4, 1>(tier, t, wp, xp, groups), y, n, r, c),
                    (2, 2) => store_tile(group_tile::<2, 2>(tier, t, wp, xp, groups), y, n, r, c),
                    (2, 1) => store_tile(group_tile::<2, 1>(tier, t, wp, xp, groups), y, n, r, c),
                    (1, 2) => store_tile(group_tile::<1, 2>(tier, t, wp, xp, groups), y, n, r, c),
                    (1, 1) => store_tile(group_tile::<1, 1>(tier, t, wp, xp, groups), y, n, r, c),
                    _ => unreachable!("no kernel for a {rr} × {cc} tile"),
                }
            }
        });
    });
}
