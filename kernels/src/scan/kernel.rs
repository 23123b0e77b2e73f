//! Portable single-threaded building blocks of the scan ([`RowKernel::Portable`](super::RowKernel::Portable)):
//! safe, allocation-free `f32` code shaped so that independent recurrences
//! overlap in the CPU's pipeline. (On x86-64 the 4 x 4 transposes are SSE
//! intrinsics from `simd.rs`, see [`tile`].)
//!
//! A lone recurrence `s = a[t] * s + u[t]` is latency-bound: each step waits
//! for the previous multiply and add (6-8 cycles on current cores), while
//! its loads, store and arithmetic take about one cycle of throughput.
//! Independent recurrences are stepped together instead, `W = 4` to a
//! vector: their `a`, `u` and `y` pass through small stack tiles transposed
//! to time-major order (`[step][sequence]`), so that one vector multiply
//! and one add advance four recurrences by one step.
//!
//! * [`scan_rows`]: groups of [`ROWS_JOINT`] rows step through time
//!   together. Each row is computed exactly as the plain loop computes it,
//!   so the result is bit-identical to [`scan_plain`].
//! * [`scan_row`]: one row, cut into chunks of `CHUNK` contiguous
//!   elements, each split into `LANES` consecutive lanes. Pass 1
//!   transposes a chunk into tiles and runs every lane from a zero state at
//!   once, giving each lane's affine map `s -> mul * s + add`; chaining the
//!   maps gives every lane's true start state; pass 2 rescans the lanes
//!   from those states out of the same tiles, writing `y`. Memory traffic
//!   stays one read of `a` and `u` and one write of `y`, in order. Pass 2 is
//!   the plain recurrence from a start state that differs from the
//!   sequential one only by rounding, so the result matches the sequential
//!   scan within f32 rounding (not bit for bit).
//! * [`aggregate`]: pass 1 alone over a long stretch, for the chunked
//!   parallel scan.
//!
//! Plain `a * s + u`, never `mul_add`: without a hardware FMA target feature
//! `mul_add` is a slow libm call, and two roundings match PyTorch's eager
//! loop.

/// Width of the vectors the joint kernels are shaped for (SSE, NEON).
const W: usize = 4;

/// Vector groups of rows stepped jointly by [`scan_rows`]. One group (4
/// rows, 12 memory streams) measured fastest once data comes from L3 or
/// DRAM, where the scan spends its time at sizes that matter; more rows
/// win in L2 but lose to the prefetchers beyond.
const ROW_GROUPS: usize = 1;

/// Rows stepped jointly by [`scan_rows`].
pub(super) const ROWS_JOINT: usize = ROW_GROUPS * W;

/// Vector groups of lanes in a chunk of [`scan_row`]: 16 lanes, four
/// independent vector chains.
const LANE_GROUPS: usize = 4;

/// Lanes per chunk of [`scan_row`].
#[cfg(test)]
pub(super) const LANES: usize = LANE_GROUPS * W;

/// Time steps staged per tile, and per lane of a full chunk.
const STEP: usize = 32;

/// Elements per full chunk of [`scan_row`]: `LANES` lanes of [`STEP`]
/// steps, contiguous, so that the scan reads and writes memory in order.
#[cfg(test)]
pub(super) const CHUNK: usize = LANES * STEP;

/// A last, partial chunk needs lanes of at least this many steps; shorter
/// stretches run as the plain loop.
pub(super) const MIN_LANE_LEN: usize = 16;

/// `STEP` steps of `W` sequences, time-major: `tile[t][i]` is step `t` of
/// sequence `i`.
type Tile = [[f32; W]; STEP];

/// A zeroed [`Tile`].
const ZERO_TILE: Tile = [[0.0; W]; STEP];

/// States of `G * W` sequences, as vectors.
type States<const G: usize> = [[f32; W]; G];

/// The affine map `s -> mul * s + add` that a stretch of the recurrence
/// applies to its initial state, kept in `f64`: chaining maps then adds no
/// `f32` rounding, and the product of many `a` does not underflow while it
/// can still matter to an `f32` state.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Affine {
    pub(super) mul: f64,
    pub(super) add: f64,
}

impl Affine {
    pub(super) const IDENTITY: Affine = Affine { mul: 1.0, add: 0.0 };

    /// The map of one step.
    #[inline]
    pub(super) fn step(a: f32, u: f32) -> Affine {
        Affine {
            mul: f64::from(a),
            add: f64::from(u),
        }
    }

    /// The map's value at `s`.
    #[inline]
    pub(super) fn apply(self, s: f64) -> f64 {
        self.mul * s + self.add
    }

    /// `self` followed by `next`.
    #[inline]
    pub(super) fn then(self, next: Affine) -> Affine {
        Affine {
            mul: next.mul * self.mul,
            add: next.mul * self.add + next.add,
        }
    }

    /// Whether [`apply`](Self::apply) can be trusted to equal stepping
    /// through the stretch. A product of `a` that overflowed (then
    /// `inf * 0` may give NaN where the plain loop gives 0) or an `add` that
    /// did is not; callers then step through the stretch instead. Once a map
    /// is not finite, composing more maps onto it keeps it not finite.
    #[inline]
    pub(super) fn is_finite(self) -> bool {
        self.mul.is_finite() && self.add.is_finite()
    }
}

/// The plain recurrence from `s`; returns the final state (`s` if empty).
pub(super) fn scan_plain(mut s: f32, a: &[f32], u: &[f32], y: &mut [f32]) -> f32 {
    for ((yt, &at), &ut) in y.iter_mut().zip(a).zip(u) {
        s = at * s + ut;
        *yt = s;
    }
    s
}

/// The plain recurrence from `s` without writing `y`; returns the final
/// state. Latency-bound; used only where a stretch's affine map overflowed.
pub(super) fn state_plain(mut s: f32, a: &[f32], u: &[f32]) -> f32 {
    for (&at, &ut) in a.iter().zip(u) {
        s = at * s + ut;
    }
    s
}

/// Loads steps `0..m` (at most [`STEP`]) of the `W` sequences starting at
/// `src[at + i * stride]` into `tile`; steps from `m` on get `pad`.
#[inline(always)]
fn load_tile(tile: &mut Tile, src: &[f32], at: usize, stride: usize, m: usize, pad: f32) {
    if m == STEP {
        let rows: [&[f32; STEP]; W] =
            std::array::from_fn(|i| src[at + i * stride..].first_chunk().expect("in bounds"));
        transpose_in(rows, tile);
    } else {
        let mut rows = [[pad; STEP]; W];
        for (i, row) in rows.iter_mut().enumerate() {
            row[..m].copy_from_slice(&src[at + i * stride..][..m]);
        }
        transpose_in(rows.each_ref(), tile);
    }
}

/// Stores steps `0..m` of `tile` back to the `W` sequences starting at
/// `dst[at + i * stride]`.
#[inline(always)]
fn store_tile(tile: &Tile, dst: &mut [f32], at: usize, stride: usize, m: usize) {
    let mut it = dst[at..].chunks_mut(stride);
    let mut rows: [&mut [f32]; W] = std::array::from_fn(|_| it.next().expect("in bounds"));
    if m == STEP {
        let rows = rows
            .each_mut()
            .map(|r| r.first_chunk_mut().expect("in bounds"));
        transpose_out(tile, rows);
    } else {
        let mut tmp = [[0.0; STEP]; W];
        transpose_out(tile, tmp.each_mut());
        for (row, tmp) in rows.iter_mut().zip(&tmp) {
            row[..m].copy_from_slice(&tmp[..m]);
        }
    }
}

/// Transposes `W` sequences of `STEP` steps into a time-major tile.
#[inline(always)]
fn transpose_in(rows: [&[f32; STEP]; W], tile: &mut Tile) {
    for (t, out) in tile.chunks_exact_mut(W).enumerate() {
        let out: &mut [[f32; W]; W] = out.try_into().expect("W steps");
        let t = t * W;
        tile::transpose(
            rows.map(|r| r[t..t + W].try_into().expect("W steps")),
            out.each_mut(),
        );
    }
}

/// Transposes a time-major tile back into `W` sequences of `STEP` steps.
#[inline(always)]
fn transpose_out(tile: &Tile, mut rows: [&mut [f32; STEP]; W]) {
    for (t, tile_in) in tile.chunks_exact(W).enumerate() {
        let tile_in: &[[f32; W]; W] = tile_in.try_into().expect("W steps");
        let t = t * W;
        let out = rows
            .each_mut()
            .map(|r| <&mut [f32; W]>::try_from(&mut r[t..t + W]).expect("W steps"));
        tile::transpose(tile_in.each_ref(), out);
    }
}

/// Advances `G * W` states through one tile of steps each, writing every
/// state into `y`. Exactly the plain loop's arithmetic per sequence.
#[inline(always)]
fn scan_tiles<const G: usize>(st: &mut States<G>, a: &[Tile; G], u: &[Tile; G], y: &mut [Tile; G]) {
    for t in 0..STEP {
        for g in 0..G {
            for i in 0..W {
                let v = a[g][t][i] * st[g][i] + u[g][t][i];
                st[g][i] = v;
                y[g][t][i] = v;
            }
        }
    }
}

/// Steps `G * W` recurrences together: sequence `k` is `a`, `u` and `y` at
/// `k * stride .. k * stride + n`; `s` holds their states on entry and on
/// return. Bit-identical to [`scan_plain`] per sequence.
fn scan_joint<const G: usize>(
    s: &mut States<G>,
    a: &[f32],
    u: &[f32],
    y: &mut [f32],
    stride: usize,
    n: usize,
) {
    let mut ta = [ZERO_TILE; G];
    let mut tu = [ZERO_TILE; G];
    let mut ty = [ZERO_TILE; G];
    for t0 in (0..n).step_by(STEP) {
        let m = STEP.min(n - t0);
        for g in 0..G {
            let at = g * W * stride + t0;
            // Padding steps (a = 1, u = 0) leave the state as it is.
            load_tile(&mut ta[g], a, at, stride, m, 1.0);
            load_tile(&mut tu[g], u, at, stride, m, 0.0);
        }
        scan_tiles(s, &ta, &tu, &mut ty);
        for (g, ty) in ty.iter().enumerate() {
            store_tile(ty, y, g * W * stride + t0, stride, m);
        }
    }
}

/// Steps between rescalings of the running products in [`Reducer`].
const RESCALE_EVERY: usize = 16;

/// A running product in [`Reducer`] below `2^-RESCALE_AT` in size is
/// multiplied by `2^RESCALE_BY`, one above `2^RESCALE_AT` by
/// `2^-RESCALE_BY`, and the power of two is tracked on the side. After a
/// check, a decaying product is at least `2^-30`, so the next 16 steps
/// cannot make it subnormal (subnormal arithmetic costs ~100 cycles per
/// operation on some cores) unless `|a| < 2^-6`, and then it soon
/// underflows to 0, which stays put; products of `|a| > 1` are kept from
/// overflowing alike.
const RESCALE_AT: i32 = 32;
const RESCALE_BY: i32 = 96;

// (Not `is_multiple_of`, which is newer than some supported compilers.)
const _: () = assert!(STEP / RESCALE_EVERY * RESCALE_EVERY == STEP);

/// Pass 1 for `G * W` sequences: runs each from a zero state, keeping the
/// product of its `a` (rescaled, see [`RESCALE_AT`]) and its state.
struct Reducer<const G: usize> {
    mul: States<G>,
    /// Rescalings of `mul`, in units of `2^RESCALE_BY` (small integers,
    /// exact in `f32`).
    exp: States<G>,
    add: States<G>,
}

impl<const G: usize> Reducer<G> {
    fn new() -> Self {
        Reducer {
            mul: [[1.0; W]; G],
            exp: [[0.0; W]; G],
            add: [[0.0; W]; G],
        }
    }

    /// Runs every sequence through one tile of steps.
    #[inline(always)]
    fn step(&mut self, a: [&Tile; G], u: [&Tile; G]) {
        let (small_below, big_above) = (2f32.powi(-RESCALE_AT), 2f32.powi(RESCALE_AT));
        let (up, down) = (2f32.powi(RESCALE_BY), 2f32.powi(-RESCALE_BY));
        let Reducer { mul, exp, add } = self;
        for t0 in (0..STEP).step_by(RESCALE_EVERY) {
            for t in t0..t0 + RESCALE_EVERY {
                for g in 0..G {
                    for i in 0..W {
                        let at = a[g][t][i];
                        mul[g][i] *= at;
                        add[g][i] = at * add[g][i] + u[g][t][i];
                    }
                }
            }
            // Branch-free (bit selects), so that it vectorizes. Zero keeps
            // scaling up (harmlessly), NaN compares false and stays,
            // infinity stays infinite.
            for g in 0..G {
                for i in 0..W {
                    let size = mul[g][i].abs();
                    let small = 0u32.wrapping_sub(u32::from(size < small_below));
                    let big = 0u32.wrapping_sub(u32::from(size > big_above));
                    let keep = !(small | big);
                    mul[g][i] *= f32::from_bits(
                        (small & up.to_bits()) | (big & down.to_bits()) | (keep & 1f32.to_bits()),
                    );
                    exp[g][i] +=
                        f32::from_bits((small & (-1f32).to_bits()) | (big & 1f32.to_bits()));
                }
            }
        }
    }

    /// The sequences' maps, in order.
    fn maps(&self) -> [[Affine; W]; G] {
        std::array::from_fn(|g| {
            std::array::from_fn(|i| Affine {
                // Exact while the product is an f64 normal number; beyond
                // that it is far below anything an f32 state could show.
                mul: f64::from(self.mul[g][i]) * 2f64.powi(self.exp[g][i] as i32 * RESCALE_BY),
                add: f64::from(self.add[g][i]),
            })
        })
    }
}

/// Scans the rows of a contiguous `[rows, len]` block (`rows = x0.len()`):
/// groups of [`ROWS_JOINT`] rows jointly (exact), the remaining
/// `rows % ROWS_JOINT` rows one by one with [`scan_row`].
pub(super) fn scan_rows(x0: &[f32], a: &[f32], u: &[f32], y: &mut [f32]) {
    scan_rows_with::<ROW_GROUPS>(x0, a, u, y);
}

/// [`scan_rows`] with groups of `G * W` rows.
pub(super) fn scan_rows_with<const G: usize>(x0: &[f32], a: &[f32], u: &[f32], y: &mut [f32]) {
    let joint = G * W;
    let rows = x0.len();
    if rows == 0 {
        return;
    }
    let len = y.len() / rows;
    let grouped = rows / joint * joint;
    let g = grouped * len;
    let (y_joint, y_rest) = y.split_at_mut(g);
    for (((y, a), u), x0) in y_joint
        .chunks_exact_mut(joint * len)
        .zip(a[..g].chunks_exact(joint * len))
        .zip(u[..g].chunks_exact(joint * len))
        .zip(x0.chunks_exact(joint))
    {
        let mut s: States<G> = [[0.0; W]; G];
        s.as_flattened_mut().copy_from_slice(x0);
        scan_joint(&mut s, a, u, y, len, len);
    }
    if len == 0 {
        return;
    }
    for (((y, a), u), &init) in y_rest
        .chunks_exact_mut(len)
        .zip(a[g..].chunks_exact(len))
        .zip(u[g..].chunks_exact(len))
        .zip(&x0[grouped..])
    {
        scan_row(init, a, u, y);
    }
}

/// One recurrence from `s`, in chunks of lanes (see the module docs);
/// returns the final state.
pub(super) fn scan_row(s: f32, a: &[f32], u: &[f32], y: &mut [f32]) -> f32 {
    scan_row_with::<LANE_GROUPS>(s, a, u, y)
}

/// Where a chunk starts and how long its lanes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Chunk {
    at: usize,
    lane_len: usize,
}

/// Cuts `len` elements into chunks of `G * W` lanes: full ones of [`STEP`]
/// steps per lane, then maybe one with shorter lanes (at least
/// [`MIN_LANE_LEN`] steps), then a tail of the fewer elements left (less
/// than `G * W * MIN_LANE_LEN`), which the plain loop takes. Returns the
/// number of chunks and the start of the tail.
fn chunk_count<const G: usize>(len: usize) -> (usize, usize) {
    let full = len / (G * W * STEP);
    let covered = full * G * W * STEP;
    let last_lane = (len - covered) / (G * W);
    if last_lane >= MIN_LANE_LEN {
        (full + 1, covered + last_lane * G * W)
    } else {
        (full, covered)
    }
}

/// Chunk `c` of `len` elements cut as in [`chunk_count`].
fn chunk_at<const G: usize>(len: usize, c: usize) -> Chunk {
    let full = G * W * STEP;
    let at = c * full;
    Chunk {
        at,
        lane_len: STEP.min((len - at) / (G * W)),
    }
}

/// [`scan_row`] with `G * W` lanes per chunk.
///
/// Software-pipelined: pass 1 of the next chunk runs interleaved with pass
/// 2 of the current one (both work out of L1), so that loads of `a` and
/// `u` are spread between the arithmetic and the memory streams stay busy.
/// Done one after the other over larger blocks, the passes measured at
/// half the speed once data comes from DRAM. Start states chain through
/// the lane maps in `f64`, so they do not wait for pass 2.
pub(super) fn scan_row_with<const G: usize>(s: f32, a: &[f32], u: &[f32], y: &mut [f32]) -> f32 {
    let len = y.len();
    let (chunks, covered) = chunk_count::<G>(len);
    // Two chunks' transposed `a` and `u` and lane maps: those pass 2 reads
    // and those pass 1 fills.
    let mut ta = [[ZERO_TILE; G]; 2];
    let mut tu = [[ZERO_TILE; G]; 2];
    let mut maps = [[[Affine::IDENTITY; W]; G]; 2];
    if chunks > 0 {
        maps[0] = pass1_chunk(chunk_at::<G>(len, 0), a, u, &mut ta[0], &mut tu[0]);
    }
    let mut cur = f64::from(s);
    let mut last = s;
    for c in 0..chunks {
        let [ta0, ta1] = &mut ta;
        let [tu0, tu1] = &mut tu;
        let [maps0, maps1] = &mut maps;
        let (ta_now, ta_next, tu_now, tu_next, maps_now, maps_next) = if c % 2 == 0 {
            (&*ta0, ta1, &*tu0, tu1, &*maps0, maps1)
        } else {
            (&*ta1, ta0, &*tu1, tu0, &*maps1, maps0)
        };
        let chunk = chunk_at::<G>(len, c);
        let span = chunk.at..chunk.at + chunk.lane_len * G * W;
        if maps_now.as_flattened().iter().all(|m| m.is_finite()) {
            // Chain the lane maps into start states.
            let mut st: States<G> = [[0.0; W]; G];
            for (start, map) in st
                .as_flattened_mut()
                .iter_mut()
                .zip(maps_now.as_flattened())
            {
                *start = cur as f32;
                cur = map.apply(cur);
            }
            if c + 1 < chunks {
                let next = chunk_at::<G>(len, c + 1);
                *maps_next = pass1_chunk(next, a, u, ta_next, tu_next);
            }
            pass2_chunk(chunk, &mut st, ta_now, tu_now, y);
            last = st[G - 1][W - 1];
        } else {
            // An overflowed map: step through this chunk instead.
            let span = span.clone();
            last = scan_plain(cur as f32, &a[span.clone()], &u[span.clone()], &mut y[span]);
            cur = f64::from(last);
            if c + 1 < chunks {
                let next = chunk_at::<G>(len, c + 1);
                *maps_next = pass1_chunk(next, a, u, ta_next, tu_next);
            }
        }
        debug_assert!(span.end <= covered);
    }
    scan_plain(last, &a[covered..], &u[covered..], &mut y[covered..])
}

/// Pass 1 of one chunk: loads it into transposed tiles, one per group of
/// `W` lanes, and reduces every lane to its map.
#[inline(always)]
fn pass1_chunk<const G: usize>(
    chunk: Chunk,
    a: &[f32],
    u: &[f32],
    ta: &mut [Tile; G],
    tu: &mut [Tile; G],
) -> [[Affine; W]; G] {
    let Chunk { at, lane_len } = chunk;
    for g in 0..G {
        let at = at + g * W * lane_len;
        // Padding steps (a = 1, u = 0) are the identity map and leave
        // states as they are.
        load_tile(&mut ta[g], a, at, lane_len, lane_len, 1.0);
        load_tile(&mut tu[g], u, at, lane_len, lane_len, 0.0);
    }
    let mut reducer = Reducer::<G>::new();
    reducer.step(ta.each_ref(), tu.each_ref());
    reducer.maps()
}

/// Pass 2 of one chunk: the true recurrence of every lane from its start
/// state `st`, out of the tiles, stored to `y`.
#[inline(always)]
fn pass2_chunk<const G: usize>(
    chunk: Chunk,
    st: &mut States<G>,
    ta: &[Tile; G],
    tu: &[Tile; G],
    y: &mut [f32],
) {
    let Chunk { at, lane_len } = chunk;
    let mut ty = [ZERO_TILE; G];
    scan_tiles(st, ta, tu, &mut ty);
    for (g, ty) in ty.iter().enumerate() {
        store_tile(ty, y, at + g * W * lane_len, lane_len, lane_len);
    }
}

/// The composition of `maps` in order, as a balanced tree (short
/// dependency chains).
fn compose(maps: &[Affine]) -> Affine {
    match maps {
        [] => Affine::IDENTITY,
        [m] => *m,
        _ => {
            let (first, second) = maps.split_at(maps.len() / 2);
            compose(first).then(compose(second))
        }
    }
}

/// The affine map of a whole stretch, computed chunk by chunk as in pass 1
/// of [`scan_row`] (reads `a` and `u` once, in order; writes nothing).
pub(super) fn aggregate(a: &[f32], u: &[f32]) -> Affine {
    let len = a.len();
    let (chunks, covered) = chunk_count::<LANE_GROUPS>(len);
    let mut ta = [ZERO_TILE; LANE_GROUPS];
    let mut tu = [ZERO_TILE; LANE_GROUPS];
    let mut total = Affine::IDENTITY;
    for c in 0..chunks {
        let maps = pass1_chunk(chunk_at::<LANE_GROUPS>(len, c), a, u, &mut ta, &mut tu);
        total = total.then(compose(maps.as_flattened()));
    }
    for (&at, &ut) in a[covered..].iter().zip(&u[covered..]) {
        total = total.then(Affine::step(at, ut));
    }
    total
}

/// 4 x 4 transposes: SSE shuffles on x86-64 (part of its baseline, see
/// `simd.rs`), plain element moves elsewhere (AArch64 compilers turn those
/// into vector permutes on their own).
#[cfg(target_arch = "x86_64")]
mod tile {
    pub(super) use super::super::simd::transpose4 as transpose;
}

#[cfg(not(target_arch = "x86_64"))]
mod tile {
    /// `out[j][i] = rows[i][j]`.
    #[inline(always)]
    pub(super) fn transpose(rows: [&[f32; 4]; 4], out: [&mut [f32; 4]; 4]) {
        for (j, o) in out.into_iter().enumerate() {
            *o = [rows[0][j], rows[1][j], rows[2][j], rows[3][j]];
        }
    }
}
