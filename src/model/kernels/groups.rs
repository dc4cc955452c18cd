//! The layout of the batched products' packed groups, shared by the AVX2 and AVX-512 tiers (portable
//! types: each tier fills and reads them with its own intrinsics).

/// Eight 32-element blocks of one weight row, laid out for the batched kernels (`avx512::tile_groups`, `avx2::tiles`): 32-bit lane
/// `2b + h` of `u[j]` holds elements `16h + 4j .. 16h + 4j + 4` of block `b` as unsigned bytes, so four
/// `vpdpbusd` leave each lane with the sum over one half-block and a whole group costs one conversion to
/// f32 per tile cell (instead of one per pair of blocks); `d` and `c` hold each block's scale and Q4_1's
/// minimum in the block's two lanes. Blocks past the row's end are zero.
///
/// The AVX2 tier packs Q4_K and Q5_K super-blocks with integer sub-block scales instead
/// (`avx2::pack_weight_groups` with `int_scales`): `k` holds each lane's 6-bit scale twice (as the two
/// 16-bit halves of the lane, for `madd`), `d` the super-block's scale in every lane, and `c` the minimum
/// as above.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct WGroup {
    pub(super) u: [[u32; 16]; 4],
    pub(super) d: [f32; 16],
    pub(super) c: [f32; 16],
    pub(super) k: [i16; 32],
}

impl WGroup {
    pub(crate) const ZERO: WGroup = WGroup { u: [[0; 16]; 4], d: [0.0; 16], c: [0.0; 16], k: [0; 32] };

    /// Puts block `b` (0..8) in its two lanes: its 32 unsigned bytes as 8 little-endian words (word `i`
    /// holds elements `4i .. 4i + 4`), the scales of its two 16-element halves, and its minimum.
    #[inline(always)]
    #[cfg(test)]
    pub(super) fn set_block(&mut self, b: usize, words: &[u32], d: [f32; 2], c: f32) {
        for h in 0..2 {
            for j in 0..4 {
                self.u[j][2 * b + h] = words[4 * h + j];
            }
            self.d[2 * b + h] = d[h];
            self.c[2 * b + h] = c;
        }
    }
}

/// The matching eight blocks of one token's activations: `q` interleaved as the weights; `init` the
/// offset types' correction as each lane's starting value (−offset × the lane's 16 activations' sum, so
/// the lane ends with `Σ (u − offset)·qx`); `d` each block's scale in its two lanes; `s` = `d·Σ qx` in the
/// block's first lane (for the minimums).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct XGroup {
    pub(super) q: [[i32; 16]; 4],
    pub(super) init: [i32; 16],
    pub(super) d: [f32; 16],
    pub(super) s: [f32; 16],
}

impl XGroup {
    pub(crate) const ZERO: XGroup = XGroup { q: [[0; 16]; 4], init: [0; 16], d: [0.0; 16], s: [0.0; 16] };
}

/// Blocks per group.
pub(crate) const GROUP: usize = 8;
