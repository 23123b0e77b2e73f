//! The FFT-GEMM conv's tile loop and its two register-blocked
//! micro-kernels (real and complex), generic over the crate's SIMD layer
//! ([`Simd`]); the only unsafe code of the algorithm.
//!
//! A tile is one (batch item, group, run of `NJ` blocks, run of output
//! channel panels); `NJ = NR · LANES` blocks are one register row of the
//! micro-kernels, so every product below is a sequence of whole
//! micro-kernel calls (`mod.rs` has the maths):
//!
//! 1. **Forward.** Per input channel, the `L` samples each block reads are
//!    gathered into a `L × NJ` window (padding as zeros), and the real DFT
//!    matrix `F` (`L × L`, packed in panels of `MR` planes) times it gives
//!    the channel's `L` spectral planes for the tile's blocks.
//! 2. **Channel mixing.** Per panel of `MR` output channels and per bin,
//!    the packed weight spectra times the input spectra: a real product on
//!    the two real bins, a complex one (four multiply-adds per term) on the
//!    others, into the panel's `L × MR × NJ` output spectra.
//! 3. **Inverse.** Per output channel of the panel, the inverse matrix `G`
//!    (`M × L`) times its `L × NJ` spectra gives `M` outputs of each block,
//!    transposed into one contiguous row of `NJ · M` positions, bias added,
//!    and handed to the caller (stored or passed to an epilogue) while in
//!    cache.
//!
//! Every value is computed the same way whatever the tile, so results
//! depend neither on the tiling nor on the number of threads.

#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

use crate::simd::{per_backend, Backend, Isa, Simd};

/// A micro-kernel's register block: `mr` rows by `nr` vectors of `lanes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Block {
    pub mr: usize,
    pub nr: usize,
    pub lanes: usize,
}

impl Block {
    /// Blocks per tile: one register row of the micro-kernels.
    pub(crate) fn nj(self) -> usize {
        self.nr * self.lanes
    }
}

/// The block of `backend`. The complex kernel keeps `2 · mr · nr`
/// accumulators, `2 · nr` loaded vectors and two broadcasts in registers:
/// 30 of AVX-512's and NEON's 32 at 6 × 2, 14 of AVX2's 16 at 2 × 2.
pub(crate) fn block(backend: Backend) -> Block {
    let (mr, nr, lanes) = match backend {
        Backend::Portable => (2, 2, 8),
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 => (2, 2, 8),
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512 => (6, 2, 16),
        #[cfg(target_arch = "aarch64")]
        Backend::Neon => (6, 2, 4),
    };
    Block { mr, nr, lanes }
}

/// The transform sizes and prepared matrices a tile reads.
pub(crate) struct Layout<'a> {
    /// Transform length (samples a block reads), a multiple of 4.
    pub l: usize,
    /// Outputs per block.
    pub m: usize,
    /// Input and output channels per group.
    pub cin: usize,
    pub cout: usize,
    /// `F`, `L × L`, in panels of `MR` planes: `[panel][tap][MR]`.
    pub fwd: &'a [f32],
    /// `G`, `M × L`, in panels of `MR` outputs: `[panel][plane][MR]`.
    pub inv: &'a [f32],
    /// Taps of the filter.
    pub taps: usize,
    /// The weights' transform `W` (`L` planes of `conj(H_b)` × `taps`), in
    /// panels of `MR` planes: `[panel][tap][MR]`.
    pub wfwd: &'a [f32],
}

/// One tile's inputs (see the module docs).
pub(crate) struct TileArgs<'a> {
    /// The group's input rows, `cin × in_len`.
    pub x: &'a [f32],
    pub in_len: usize,
    pub pad_left: usize,
    /// First block and blocks in the tile (at most `NJ`).
    pub j0: usize,
    pub blocks: usize,
    /// Outputs of the row (the tile's last block may reach past it).
    pub out_len: usize,
    /// The group's weights.
    pub weights: Weights<'a>,
    /// The tile's panels of output channels within the group.
    pub panels: std::ops::Range<usize>,
    /// The group's bias, if any.
    pub bias: Option<&'a [f32]>,
}

/// A tile's weights: packed for the call, or as the model holds them and
/// packed panel by panel into the tile's scratch right before use (where
/// the tile is the only one to use its panels).
#[derive(Clone, Copy)]
pub(crate) enum Weights<'a> {
    /// `[panel][tap][cin][MR]` (see [`TileKernel::pack`]), then at least
    /// `NJ` more values, read past the last panel's end and ignored.
    Packed(&'a [f32]),
    /// `[cout][cin][taps]`.
    Raw(&'a [f32]),
}

/// Takes one output row of a tile: (output channel within the group, the
/// row's values from position `j0 · M` on, a temporary the rest of the
/// thread's scratch).
pub(crate) type Emit<'e> = &'e mut dyn FnMut(usize, &mut [f32], &mut [f32]);

/// Values per plane of a panel's weight spectra in scratch: `cin · MR`,
/// rounded up to whole register rows.
pub(crate) fn spectra_row(cin: usize, b: Block) -> usize {
    (cin * b.mr).next_multiple_of(b.nj())
}

/// Scratch floats for a panel the tile packs itself, the `NJ` values the
/// spectra product reads past it, and padding to whole register rows, so
/// that the regions after it keep their alignment.
fn own_panel_len(cin: usize, taps: usize, b: Block) -> usize {
    (panel_len(cin, taps, b) + b.nj()).next_multiple_of(b.nj())
}

/// Scratch floats one tile needs before the emit temporaries: the window,
/// the input spectra, a panel of packed weights, the weight spectra of
/// `MR` planes, a panel's output spectra, the transposed outputs and the
/// output row.
pub(crate) fn tile_scratch(lay_l: usize, m: usize, cin: usize, taps: usize, b: Block) -> usize {
    let nj = b.nj();
    lay_l * nj
        + lay_l * cin * nj
        + own_panel_len(cin, taps, b)
        + b.mr * spectra_row(cin, b)
        + lay_l * b.mr * nj
        + m.next_multiple_of(b.mr) * nj
        + nj * m
}

type TileFn = unsafe fn(&Layout<'_>, &TileArgs<'_>, &mut [f32], Emit<'_>);
type PackFn = fn(&[f32], usize, usize, usize, &mut [f32]);

/// The tile function for one backend and the weight packing for its
/// block, chosen at prepare.
#[derive(Clone, Copy)]
pub(crate) struct TileKernel {
    block: Block,
    f: TileFn,
    pack: PackFn,
}

impl TileKernel {
    /// The kernel on `isa`.
    pub(crate) fn new(isa: Isa) -> Self {
        let backend = isa.backend();
        let (f, pack): (TileFn, PackFn) = match backend {
            Backend::Portable => (tile_portable::<2>, pack_panel::<2>),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => (tile_avx2::<2>, pack_panel::<2>),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512 => (tile_avx512::<6>, pack_panel::<6>),
            #[cfg(target_arch = "aarch64")]
            Backend::Neon => (tile_neon::<6>, pack_panel::<6>),
        };
        TileKernel {
            block: block(backend),
            f,
            pack,
        }
    }

    pub(crate) fn block(&self) -> Block {
        self.block
    }

    /// Packs output channels `o0 .. o0 + MR` of the group's weights `w`
    /// (`[cout][cin][taps]`) into `panel` ([`panel_len`] values), as
    /// [`TileArgs::weights`] holds them.
    pub(crate) fn pack(&self, w: &[f32], cin: usize, taps: usize, o0: usize, panel: &mut [f32]) {
        (self.pack)(w, cin, taps, o0, panel)
    }

    /// Computes one tile, handing each output row to `emit`.
    pub(crate) fn tile(
        &self,
        lay: &Layout<'_>,
        a: &TileArgs<'_>,
        scratch: &mut [f32],
        emit: Emit<'_>,
    ) {
        // SAFETY: `new` chose `f` for a backend whose features this CPU
        // has; the tile function checks every bound it relies on.
        unsafe { (self.f)(lay, a, scratch, emit) }
    }
}

/// One tile on backend `S` with blocks of `MR × NR` vectors.
///
/// # Safety
/// `S`'s features are present. Everything else is checked (panics).
#[inline(always)]
unsafe fn tile_generic<S: Simd, const MR: usize, const NR: usize>(
    lay: &Layout<'_>,
    a: &TileArgs<'_>,
    scratch: &mut [f32],
    emit: Emit<'_>,
) {
    let nj = NR * S::LANES;
    let (l, m, cin) = (lay.l, lay.m, lay.cin);
    let m_pad = m.next_multiple_of(MR);
    let b = Block {
        mr: MR,
        nr: NR,
        lanes: S::LANES,
    };
    let taps = lay.taps;
    let need = tile_scratch(l, m, cin, taps, b);
    assert!(scratch.len() >= need, "scratch");
    assert!(a.blocks <= nj && a.blocks > 0, "blocks");
    assert!(a.x.len() == cin * a.in_len, "x group");
    assert!(lay.fwd.len() == l.div_ceil(MR) * l * MR, "forward matrix");
    assert!(lay.inv.len() == m_pad * l, "inverse matrix");
    let panel_len = panel_len(cin, taps, b);
    let wrow = spectra_row(cin, b);
    match a.weights {
        Weights::Packed(w) => assert!(w.len() >= a.panels.end * panel_len + nj, "weights"),
        Weights::Raw(w) => assert!(
            w.len() == lay.cout * cin * taps && a.panels.end <= lay.cout.div_ceil(MR),
            "weights"
        ),
    }
    assert!(
        lay.wfwd.len() == l.div_ceil(MR) * taps * MR,
        "weight transform"
    );
    assert!(a.bias.is_none_or(|bias| bias.len() == lay.cout), "bias");
    assert!(
        l >= 4 && l.is_multiple_of(2) && m <= l && MR.is_multiple_of(2),
        "transform"
    );

    let (xw, rest) = scratch.split_at_mut(l * nj);
    let (xs, rest) = rest.split_at_mut(l * cin * nj);
    let (own_panel, rest) = rest.split_at_mut(own_panel_len(cin, taps, b));
    own_panel[panel_len..].fill(0.0);
    let (ws, rest) = rest.split_at_mut(MR * wrow);
    let (yp, rest) = rest.split_at_mut(l * MR * nj);
    let (out_t, rest) = rest.split_at_mut(m_pad * nj);
    let (row, tmp) = rest.split_at_mut(nj * m);

    // 1. Forward: the input spectra, planes [plane][cin][nj].
    xw.fill(0.0);
    for c in 0..cin {
        let x_row = &a.x[c * a.in_len..][..a.in_len];
        for j in 0..a.blocks {
            // Block j reads padded positions q0 .. q0 + l, input samples
            // q - pad_left where inside the row.
            let q0 = (a.j0 + j) * m;
            for t in 0..l {
                let i = (q0 + t).wrapping_sub(a.pad_left);
                xw[t * nj + j] = if i < a.in_len { x_row[i] } else { 0.0 };
            }
        }
        for (p, f) in lay.fwd.chunks_exact(l * MR).enumerate() {
            let rows = (l - p * MR).min(MR);
            let out = &mut xs[(p * MR * cin + c) * nj..];
            assert!(out.len() >= (rows - 1) * cin * nj + nj);
            // SAFETY: features by our contract; reads `f` (l · MR values)
            // and `xw` rows 0 .. l of nj values; writes `rows` rows of nj
            // values cin · nj apart inside `out` (asserted).
            unsafe {
                real_micro::<S, MR, NR>(
                    f.as_ptr(),
                    xw.as_ptr(),
                    nj,
                    l,
                    out.as_mut_ptr(),
                    cin * nj,
                    rows,
                )
            }
        }
    }

    for p in a.panels.clone() {
        // 2. Per panel of MR planes (whole bins: MR is even): its weight
        // spectra, ws [plane][cin][MR] (rows wrow apart), W's panel times
        // the weights [tap][cin · MR], NJ columns a call; then the channel
        // mixing of those bins into yp [plane][MR][nj] while ws is in
        // cache. Planes 0 and 1 are the real bins 0 and l/2; planes 2b,
        // 2b + 1 bin b's parts.
        let wp: &[f32] = match a.weights {
            Weights::Packed(w) => &w[p * panel_len..],
            Weights::Raw(w) => {
                pack_panel::<MR>(w, cin, taps, p * MR, &mut own_panel[..panel_len]);
                own_panel
            }
        };
        for (q, f) in lay.wfwd.chunks_exact(taps * MR).enumerate() {
            let rows = (l - q * MR).min(MR);
            for n0 in (0..cin * MR).step_by(nj) {
                let out = &mut ws[n0..];
                assert!(out.len() >= (rows - 1) * wrow + nj);
                assert!(wp.len() >= (taps - 1) * cin * MR + n0 + nj);
                // SAFETY: reads `f` (taps · MR values) and nj values at
                // each kk · cin · MR + n0 of `wp`, kk < taps (asserted:
                // the weights run NJ past the last panel); writes `rows`
                // rows of nj values wrow apart inside `out` (asserted).
                unsafe {
                    real_micro::<S, MR, NR>(
                        f.as_ptr(),
                        wp[n0..].as_ptr(),
                        cin * MR,
                        taps,
                        out.as_mut_ptr(),
                        wrow,
                        rows,
                    )
                }
            }
            for r in (0..rows).step_by(2) {
                let plane = q * MR + r;
                if plane == 0 {
                    for plane in 0..2 {
                        // SAFETY: reads cin · MR weight spectra and cin rows
                        // of nj values of one plane of `xs`; writes MR rows
                        // of nj values of one plane of `yp`, all inside the
                        // slices (sizes above).
                        unsafe {
                            real_micro::<S, MR, NR>(
                                ws[plane * wrow..][..cin * MR].as_ptr(),
                                xs[plane * cin * nj..][..cin * nj].as_ptr(),
                                nj,
                                cin,
                                yp[plane * MR * nj..][..MR * nj].as_mut_ptr(),
                                nj,
                                MR,
                            )
                        }
                    }
                    continue;
                }
                let (wr, wi) = ws[r * wrow..][..2 * wrow].split_at(wrow);
                let (xr, xi) = xs[plane * cin * nj..][..2 * cin * nj].split_at(cin * nj);
                let (yr, yi) = yp[plane * MR * nj..][..2 * MR * nj].split_at_mut(MR * nj);
                // SAFETY: reads cin · MR weight spectra of each part (wrow
                // >= cin · MR) and cin rows of nj values of each part;
                // writes MR rows of nj values of each part; all inside the
                // slices just taken.
                unsafe {
                    complex_micro::<S, MR, NR>(
                        wr.as_ptr(),
                        wi.as_ptr(),
                        xr.as_ptr(),
                        xi.as_ptr(),
                        nj,
                        cin,
                        yr.as_mut_ptr(),
                        yi.as_mut_ptr(),
                        nj,
                    )
                }
            }
        }
        // 3. Inverse, per output channel of the panel.
        let rows = (lay.cout - p * MR).min(MR);
        for r in 0..rows {
            for (q, g) in lay.inv.chunks_exact(l * MR).enumerate() {
                // SAFETY: reads `g` (l · MR values) and l rows of nj values
                // MR · nj apart from yp[r · nj] (the last ends at
                // (l - 1) · MR · nj + r · nj + nj <= yp.len()); writes MR
                // rows of out_t from q · MR · nj, inside its m_pad rows.
                unsafe {
                    real_micro::<S, MR, NR>(
                        g.as_ptr(),
                        yp[r * nj..].as_ptr(),
                        MR * nj,
                        l,
                        out_t[q * MR * nj..][..MR * nj].as_mut_ptr(),
                        nj,
                        MR,
                    )
                }
            }
            let o = p * MR + r;
            let bias = a.bias.map_or(0.0, |bias| bias[o]);
            let n = (a.blocks * m).min(a.out_len - a.j0 * m);
            for j in 0..a.blocks {
                let dst = &mut row[j * m..((j + 1) * m).min(n).max(j * m)];
                for (t, d) in dst.iter_mut().enumerate() {
                    *d = out_t[t * nj + j] + bias;
                }
            }
            emit(o, &mut row[..n], tmp);
        }
    }
}

/// Floats of one panel of packed weights: `MR` output channels' filters
/// as `[tap][cin][MR]`, the rows of the spectra product.
pub(crate) fn panel_len(cin: usize, taps: usize, b: Block) -> usize {
    taps * cin * b.mr
}

/// Packs the filters of output channels `o0 .. o0 + MR` of `w`
/// (`[cout][cin][taps]`, as the model holds them) into `panel`
/// (`[tap][cin][MR]`, [`panel_len`] values); channels past `cout` are
/// zeros.
fn pack_panel<const MR: usize>(w: &[f32], cin: usize, taps: usize, o0: usize, panel: &mut [f32]) {
    let row = cin * taps;
    assert!(panel.len() == row * MR && w.len().is_multiple_of(row) && o0 < w.len() / row);
    let rows = w.len() / row - o0;
    if rows < MR {
        // The last panel of a group whose channels are not a multiple of MR.
        panel.fill(0.0);
        for (i, filters) in w[o0 * row..].chunks_exact(row).enumerate() {
            for (c, filter) in filters.chunks_exact(taps).enumerate() {
                for (k, &v) in filter.iter().enumerate() {
                    panel[(k * cin + c) * MR + i] = v;
                }
            }
        }
        return;
    }
    // The MR channels' filters of one input channel at a time: each read
    // stream is sequential, and each tap's MR values are stored at once
    // (twice as fast as storing value by value).
    let src: [&[f32]; MR] = std::array::from_fn(|i| &w[(o0 + i) * row..][..row]);
    for c in 0..cin {
        let filters: [&[f32]; MR] = std::array::from_fn(|i| &src[i][c * taps..][..taps]);
        for (k, tap_rows) in panel.chunks_exact_mut(cin * MR).enumerate() {
            let values: [f32; MR] = std::array::from_fn(|i| filters[i][k]);
            tap_rows[c * MR..][..MR].copy_from_slice(&values);
        }
    }
}

/// `c[i][·] = Σ_k a[k][i] · b[k · b_stride + ·]` for `MR` rows `i` and
/// `NR` vectors; rows `i < rows` are stored at `c + i · c_stride`.
///
/// # Safety
/// `S`'s features are present; `a` readable for `k · MR` values, `b` for
/// `NR · LANES` values at each `kk · b_stride`, `kk < k`; `c` writable for
/// `NR · LANES` values at each of the first `rows` rows.
#[inline(always)]
unsafe fn real_micro<S: Simd, const MR: usize, const NR: usize>(
    a: *const f32,
    b: *const f32,
    b_stride: usize,
    k: usize,
    c: *mut f32,
    c_stride: usize,
    rows: usize,
) {
    // SAFETY: in bounds by the contract; features present.
    unsafe {
        let zero = S::splat(0.0);
        let mut acc = [[zero; NR]; MR];
        for kk in 0..k {
            let bk = b.add(kk * b_stride);
            let mut xv = [zero; NR];
            for (n, v) in xv.iter_mut().enumerate() {
                *v = S::load(bk.add(n * S::LANES));
            }
            let ak = a.add(kk * MR);
            for (i, row) in acc.iter_mut().enumerate() {
                let w = S::splat(*ak.add(i));
                for (acc, &v) in row.iter_mut().zip(&xv) {
                    *acc = S::mul_add(*acc, w, v);
                }
            }
        }
        for (i, row) in acc.iter().enumerate().take(rows) {
            for (n, &v) in row.iter().enumerate() {
                S::store(c.add(i * c_stride + n * S::LANES), v);
            }
        }
    }
}

/// The complex product of `MR` rows of packed weights (parts at `ar`,
/// `ai`, each `[k][MR]`) and `k` rows of `NR` vectors (parts at `br`,
/// `bi`, rows `b_stride` apart), into `MR` rows at `cr`, `ci` (`c_stride`
/// apart).
///
/// # Safety
/// `S`'s features are present; `ar` and `ai` readable for `k · MR` values, `br`
/// and `bi` for `NR · LANES` values at each `kk · b_stride`, `kk < k`; `cr`
/// and `ci` writable for `NR · LANES` values at each of `MR` rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn complex_micro<S: Simd, const MR: usize, const NR: usize>(
    ar: *const f32,
    ai: *const f32,
    br: *const f32,
    bi: *const f32,
    b_stride: usize,
    k: usize,
    cr: *mut f32,
    ci: *mut f32,
    c_stride: usize,
) {
    // SAFETY: in bounds by the contract; features present.
    unsafe {
        let zero = S::splat(0.0);
        let mut re = [[zero; NR]; MR];
        let mut im = [[zero; NR]; MR];
        for kk in 0..k {
            let mut xr = [zero; NR];
            let mut xi = [zero; NR];
            for n in 0..NR {
                xr[n] = S::load(br.add(kk * b_stride + n * S::LANES));
                xi[n] = S::load(bi.add(kk * b_stride + n * S::LANES));
            }
            let (akr, aki) = (ar.add(kk * MR), ai.add(kk * MR));
            for i in 0..MR {
                let wr = S::splat(*akr.add(i));
                let wi = S::splat(*aki.add(i));
                for n in 0..NR {
                    re[i][n] = S::mul_add(re[i][n], wr, xr[n]);
                    re[i][n] = S::neg_mul_add(re[i][n], wi, xi[n]);
                    im[i][n] = S::mul_add(im[i][n], wr, xi[n]);
                    im[i][n] = S::mul_add(im[i][n], wi, xr[n]);
                }
            }
        }
        for i in 0..MR {
            for n in 0..NR {
                S::store(cr.add(i * c_stride + n * S::LANES), re[i][n]);
                S::store(ci.add(i * c_stride + n * S::LANES), im[i][n]);
            }
        }
    }
}

per_backend! {
    /// [`tile_generic`] on one backend with `MR` rows per register block
    /// (as [`TileKernel::new`] picks them).
    unsafe fn [tile_portable, tile_avx2, tile_avx512, tile_neon]<const MR: usize>(
        lay: &Layout<'_>,
        a: &TileArgs<'_>,
        s: &mut [f32],
        e: Emit<'_>,
    ) => tile_generic::<S, MR, 2>
}
