//! The custom op's body: which part of the output a thread owns, and the blocked loops over
//! k-blocks, weight chunks, token strips and panels.

use std::cell::RefCell;
use std::ops::Range;
use std::os::raw::{c_int, c_void};

use super::claims::{Claims, Pieces, PIECES_PER_THREAD};
use super::finish::Finish;
use super::pack::{self, Rows};
use super::prefetch::WeightLines;
use super::q8;
use super::{WeightKind, MR, NR};
use crate::ggml::sys;

/// Longest k-block, in packed elements (f32, or bf16 pairs): a strip (6 × 576 × 4 bytes =
/// 14 KiB) stays in L1 while the panels it meets stream from L2; PixArt's k = 1152 is one
/// block in bf16, two in f32 (measured best on a 32 KiB L1 / 1 MiB L2 core).
const DEPTH_MAX: usize = 576;
/// Tokens packed at a time (a multiple of MR): bf16 activations of one k-block take at most
/// 3072 × 576 × 4 bytes = 6.75 MiB, q8_0 ones 3.4 MiB.
const ROW_CHUNK: usize = 512 * MR;
/// Outputs per weight chunk: 4 panels × 576 × 64 × 4 bytes = 576 KiB, inside L2.
const FC: usize = 4 * NR;

/// One product as the node describes it: y[n][m] = Σ_k x[n][k] · w[m][k] (+ bias[m])
/// (+ addend[n][m]).
struct Product<'a> {
    w: Weights<'a>,
    x: &'a [f32],
    bias: Option<&'a [f32]>,
    /// Added to the output (a LoRA's up-projection added to the layer's own output).
    addend: Option<&'a [f32]>,
    /// Applied to each tile after its last k-block.
    finish: Finish<'a>,
    y: *mut f32,
    k: usize,
    m: usize,
    n: usize,
}

/// ggml's entry point for the node built by `CpuKernels::linear`.
///
/// # Safety
/// `dst` is that node: `src[0]` contiguous f32 activations, `src[1]` a contiguous 2-D weight
/// of the type its kind names, `src[2]` null or an f32 bias, `src[3]` null or an f32 addend of
/// the output's shape (with a residual finish: the residual), `src[4]` null or the gate of a
/// residual finish, all allocated in host memory.
pub(super) unsafe extern "C" fn compute(
    dst: *mut sys::ggml_tensor,
    _ith: c_int,
    nth: c_int,
    _userdata: *mut c_void,
) {
    let nth = nth.max(1) as usize;
    // SAFETY: every one of ggml's threads makes one for this node and drops it on return.
    let claims = unsafe { Claims::of(dst, nth) };
    // SAFETY: the contract above; every slice covers exactly its tensor's elements.
    let product = unsafe { Product::from_node(&*dst) };
    if let Some(p) = product {
        p.run(
            &Grid::new(p.n, p.m, nth, p.w.packs_rows()),
            Pieces::Claimed(&claims),
        );
    }
}

impl Product<'_> {
    /// # Safety
    /// As for [`compute`].
    unsafe fn from_node(dst: &sys::ggml_tensor) -> Option<Self> {
        let (x, w, b, a, g) = (dst.src[0], dst.src[1], dst.src[2], dst.src[3], dst.src[4]);
        // SAFETY: the node's sources are live tensors (the contract of `compute`).
        let (w, x) = unsafe { (&*w, &*x) };
        // SAFETY: as above.
        let (w, k, m) = unsafe { weights_of(w) }?;
        let n = (x.ne[1] * x.ne[2] * x.ne[3]) as usize;
        // SAFETY: contiguous allocated tensors of these element counts and types.
        let (addend, gate) = unsafe {
            (
                (!a.is_null()).then(|| std::slice::from_raw_parts((*a).data.cast(), m * n)),
                (!g.is_null()).then(|| {
                    std::slice::from_raw_parts((*g).data.cast(), m * n / x.ne[1] as usize)
                }),
            )
        };
        let (addend, finish) = match dst.op_params[super::PARAM_FINISH] {
            super::FINISH_GELU => (None, Finish::GeluTanh),
            super::FINISH_RESIDUAL => (
                None,
                Finish::Residual {
                    residual: addend?,
                    gate,
                    tokens_per_gate: x.ne[1] as usize,
                },
            ),
            _ => (addend, Finish::None),
        };
        // SAFETY: contiguous allocated tensors of these element counts and types.
        unsafe {
            Some(Self {
                w,
                x: std::slice::from_raw_parts(x.data.cast(), k * n),
                bias: (!b.is_null()).then(|| std::slice::from_raw_parts((*b).data.cast(), m)),
                addend,
                finish,
                y: dst.data.cast(),
                k,
                m,
                n,
            })
        }
    }

    /// The pieces of `grid` this thread gets, each over all of k.
    fn run(&self, grid: &Grid, pieces: Pieces) {
        // k-blocks of whole bf16 pairs / q8_0 blocks; q8_0 packs 1.25 bytes per weight.
        let (kc_max, unit) = match self.w {
            Weights::Bf16(_) => (2 * DEPTH_MAX, 2),
            Weights::Q8_0(_) => (2 * DEPTH_MAX, q8::QK),
            Weights::Q8Wide(_) => (DEPTH_MAX, q8::QK),
            _ => (DEPTH_MAX, 2),
        };
        let blocks = self.k.div_ceil(kc_max);
        let step = self.k.div_ceil(blocks).next_multiple_of(unit);
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            let s = &mut *s;
            // Packed activations are only reused within one evaluation of one node.
            s.packed_rows = None;
            pieces.each(grid.pieces(), |piece| {
                let (rows, feats) = grid.piece(piece);
                // Rows in chunks, so the packed activations of one k-block stay a few MiB
                // however many tokens there are (each chunk packs the weight again).
                for r0 in rows.clone().step_by(ROW_CHUNK) {
                    let chunk = r0..(r0 + ROW_CHUNK).min(rows.end);
                    for k0 in (0..self.k).step_by(step) {
                        let kc = step.min(self.k - k0);
                        if matches!(self.w, Weights::Q8_0(_)) {
                            self.k_block_q8(&chunk, &feats, k0, kc, s);
                        } else {
                            self.k_block(&chunk, &feats, k0, kc, s);
                        }
                    }
                }
            });
        });
    }

    /// One k-block over this thread's rows and outputs.
    fn k_block(
        &self,
        rows: &Range<usize>,
        feats: &Range<usize>,
        k0: usize,
        kc: usize,
        s: &mut Scratch,
    ) {
        let Some(tiles) = super::tiles() else {
            return;
        };
        // bf16 pairs on AMX take 32 tokens per call, the vector tiles six.
        let amx = self.w.pairs() && super::amx_bf16();
        let strip = if amx { super::amx::AMX_ROWS } else { MR };
        let strips = rows.len().div_ceil(strip);
        let last = k0 + kc == self.k;
        let x = Rows {
            data: self.x,
            k: self.k,
        };
        // Elements per strip and per panel in the packed buffers.
        let depth = if self.w.pairs() { kc.div_ceil(2) } else { kc };
        // bf16 products read the activations as rounded k-pairs; f32 ones read them in place.
        // (AMX reads whole 32-row tiles: the rows past the last token are read and ignored.)
        if self.w.pairs() && s.fresh_rows(rows, k0) {
            let room = rows.len().next_multiple_of(strip) * depth;
            pack::rows_bf16(&x, rows.clone(), k0, kc, s.x.u32s(room));
        }
        for f in feats.clone().step_by(FC) {
            let chunk = f..(f + FC).min(feats.end);
            let panels = chunk.len().div_ceil(NR);
            let len = panels * depth * NR;
            let k = self.k;
            // (Outputs per strip of the packed panels; `strip` above counts tokens.)
            let (at, outs) = ((k0, kc), super::dispatch::panel_strip(tiles));
            // SAFETY: this op is only built for CPUs with AVX-512F or AVX2 (`CpuKernels`).
            unsafe {
                match self.w {
                    Weights::F32(data) => {
                        pack::panels_f32(&Rows { data, k }, chunk.clone(), at, outs, s.w.f32s(len))
                    }
                    Weights::F16(data) => {
                        pack::panels_f16(&Rows { data, k }, chunk.clone(), at, outs, s.w.f32s(len))
                    }
                    Weights::Bf16(data) => {
                        pack::panels_bf16(&Rows { data, k }, chunk.clone(), k0, kc, s.w.u32s(len))
                    }
                    Weights::Bf16Wide(data) => pack::panels_bf16_wide(
                        &Rows { data, k },
                        chunk.clone(),
                        at,
                        outs,
                        s.w.f32s(len),
                    ),
                    Weights::Q8Wide(bytes) => {
                        pack::panels_q8_wide((bytes, k), chunk.clone(), at, outs, s.w.f32s(len))
                    }
                    // Its own k-blocks: `k_block_q8`.
                    Weights::Q8_0(_) => return,
                }
            }
            let next = self.next_weights(feats, &chunk, k0, kc);
            for i in 0..strips {
                let r0 = rows.start + i * strip;
                for p in 0..panels {
                    // A few lines per tile, so the prefetches never queue up.
                    next.part(i * panels + p, strips * panels);
                    let c0 = chunk.start + p * NR;
                    let tile = super::kernels::Tile {
                        c: self.y.wrapping_add(r0 * self.m + c0),
                        ldc: self.m,
                        rows: strip.min(rows.end - r0),
                        cols: NR.min(chunk.end - c0),
                        accumulate: k0 > 0,
                        bias: match (last, self.bias) {
                            (true, Some(b)) => b[c0..].as_ptr(),
                            _ => std::ptr::null(),
                        },
                        addend: self.addend_at(k0, r0, c0),
                    };
                    let ws = p * depth * NR;
                    // SAFETY: `CpuKernels::linear` only builds this node when the CPU has the
                    // kernel's instructions; the strip's rows and the panel hold `depth`
                    // elements each; the tile lies inside this thread's part of the output.
                    unsafe {
                        self.tile(amx, tiles, (r0, rows, k0), (depth, ws), s, &tile);
                        if last {
                            self.finish.apply(
                                tiles,
                                self.y,
                                self.m,
                                r0..r0 + tile.rows,
                                c0..c0 + tile.cols,
                            );
                        }
                    }
                }
            }
        }
    }

    /// One tile's products over this k-block.
    ///
    /// # Safety
    /// As in [`Product::k_block`], which calls it.
    unsafe fn tile(
        &self,
        amx: bool,
        tiles: super::Tiles,
        (r0, rows, k0): (usize, &Range<usize>, usize),
        // The k-block's depth and where the panel starts in the packed weights.
        (depth, ws): (usize, usize),
        s: &Scratch,
        tile: &super::kernels::Tile,
    ) {
        let x = (r0 - rows.start) * depth;
        // SAFETY: the caller's contract.
        unsafe {
            match self.w {
                Weights::Bf16(_) if amx => {
                    super::amx::tile_bf16(NR, depth, s.x.u32s_ro(x), depth, s.w.u32s_ro(ws), tile)
                }
                Weights::Bf16(_) => {
                    super::kernels::tile_bf16(depth, s.x.u32s_ro(x), depth, s.w.u32s_ro(ws), tile)
                }
                _ => super::dispatch::tile_f32(
                    tiles,
                    depth,
                    self.x[r0 * self.k + k0..].as_ptr(),
                    self.k,
                    s.w.f32s_ro(ws),
                    tile,
                ),
            }
        }
    }
}

impl Product<'_> {
    /// The addend of the tile at token `r0`, output `c0`, read on the first k-block only.
    fn addend_at(&self, k0: usize, r0: usize, c0: usize) -> *const f32 {
        match self.addend {
            Some(a) if k0 == 0 => a[r0 * self.m + c0..].as_ptr(),
            _ => std::ptr::null(),
        }
    }

    /// The weight block this thread packs after `chunk` of `feats` at k-block `k0`: the next
    /// chunk, or the first one of the next k-block (none after the piece's last).
    fn next_weights(
        &self,
        feats: &Range<usize>,
        chunk: &Range<usize>,
        k0: usize,
        kc: usize,
    ) -> WeightLines {
        let (rows, k0) = if chunk.end < feats.end {
            (chunk.end..(chunk.end + FC).min(feats.end), k0)
        } else if k0 + kc < self.k {
            (feats.start..(feats.start + FC).min(feats.end), k0 + kc)
        } else {
            return WeightLines::none();
        };
        // Every k-block but the last is `kc` deep.
        let kc = kc.min(self.k - k0);
        let (data, elem_bytes) = match self.w {
            Weights::F32(d) => (d.as_ptr().cast::<u8>(), 4),
            Weights::F16(d) | Weights::Bf16(d) | Weights::Bf16Wide(d) => (d.as_ptr().cast(), 2),
            Weights::Q8_0(b) | Weights::Q8Wide(b) => {
                let row_bytes = self.k / q8::QK * q8::BLOCK_BYTES;
                let at = b.as_ptr().wrapping_add(k0 / q8::QK * q8::BLOCK_BYTES);
                return WeightLines::new(at, row_bytes, rows, kc / q8::QK * q8::BLOCK_BYTES);
            }
        };
        let at = data.wrapping_add(k0 * elem_bytes);
        WeightLines::new(at, self.k * elem_bytes, rows, kc * elem_bytes)
    }

    /// One k-block (whole q8_0 blocks) over this thread's rows and outputs.
    fn k_block_q8(
        &self,
        rows: &Range<usize>,
        feats: &Range<usize>,
        k0: usize,
        kc: usize,
        s: &mut Scratch,
    ) {
        let (Weights::Q8_0(bytes), Some(kernel), Some(tiles)) =
            (self.w, super::q8_kernel(), super::tiles())
        else {
            return;
        };
        let (b0, nb) = (k0 / q8::QK, kc / q8::QK);
        let last = k0 + kc == self.k;
        let x = Rows {
            data: self.x,
            k: self.k,
        };
        if s.fresh_rows(rows, k0) {
            let quads = s.x.u32s(rows.len() * nb * 8);
            q8::quantize_rows(&x, rows.clone(), b0, nb, quads, s.xd.f32s(rows.len() * nb));
        }
        for f in feats.clone().step_by(FC) {
            let chunk = f..(f + FC).min(feats.end);
            let panels = chunk.len().div_ceil(q8::NR8);
            let panel_words = nb * q8::PANEL_BLOCK_WORDS;
            let w = s.w.u32s(panels * panel_words);
            q8::pack_panels(bytes, self.k, chunk.clone(), b0, nb, w);
            let next = self.next_weights(feats, &chunk, k0, kc);
            let strips = rows.len().div_ceil(MR);
            for r0 in rows.clone().step_by(MR) {
                let i = r0 - rows.start;
                for p in 0..panels {
                    next.part(i / MR * panels + p, strips * panels);
                    let c0 = chunk.start + p * q8::NR8;
                    let tile = super::kernels::Tile {
                        c: self.y.wrapping_add(r0 * self.m + c0),
                        ldc: self.m,
                        rows: MR.min(rows.end - r0),
                        cols: q8::NR8.min(chunk.end - c0),
                        accumulate: k0 > 0,
                        bias: match (last, self.bias) {
                            (true, Some(b)) => b[c0..].as_ptr(),
                            _ => std::ptr::null(),
                        },
                        addend: self.addend_at(k0, r0, c0),
                    };
                    let (xq, xd) = (s.x.u32s_ro(i * nb * 8), s.xd.f32s_ro(i * nb));
                    let wp = s.w.u32s_ro(p * panel_words);
                    // SAFETY: `q8_kernel` names one whose instructions the CPU has; the
                    // quantized rows hold `nb` blocks each, the panel `panel_words`; the tile
                    // lies inside this thread's part of the output.
                    unsafe {
                        match kernel {
                            super::Q8Kernel::Avx512 => q8::tile(nb, xq, nb * 8, xd, nb, wp, &tile),
                            super::Q8Kernel::Vnni256(v) => {
                                super::q8_avx2::tile(v, nb, xq, nb * 8, xd, nb, wp, &tile)
                            }
                        }
                        if last {
                            let (rows, cols) = (r0..r0 + tile.rows, c0..c0 + tile.cols);
                            self.finish.apply(tiles, self.y, self.m, rows, cols);
                        }
                    }
                }
            }
        }
    }
}

/// A contiguous 2-D weight tensor's elements, k and m.
///
/// # Safety
/// `w` is a live, allocated, contiguous tensor.
unsafe fn weights_of(w: &sys::ggml_tensor) -> Option<(Weights<'_>, usize, usize)> {
    let kind = WeightKind::of(crate::dtype::DType::from_id(w.type_)?)?;
    let (k, m) = (w.ne[0] as usize, w.ne[1] as usize);
    // SAFETY: the caller's contract: this many elements of this type.
    let w = unsafe {
        match kind {
            WeightKind::F32 => Weights::F32(std::slice::from_raw_parts(w.data.cast(), k * m)),
            WeightKind::F16 => Weights::F16(std::slice::from_raw_parts(w.data.cast(), k * m)),
            WeightKind::Bf16 if super::bf16_native() => {
                Weights::Bf16(std::slice::from_raw_parts(w.data.cast(), k * m))
            }
            WeightKind::Bf16 => Weights::Bf16Wide(std::slice::from_raw_parts(w.data.cast(), k * m)),
            WeightKind::Q8_0 => {
                let bytes =
                    std::slice::from_raw_parts(w.data.cast(), m * (k / q8::QK) * q8::BLOCK_BYTES);
                if super::q8_native() {
                    Weights::Q8_0(bytes)
                } else {
                    Weights::Q8Wide(bytes)
                }
            }
        }
    };
    Some((w, k, m))
}

/// `y[t][j] = Σ_k x[t][k] · w[j][k] (+ bias[j])` for the `x.len() / k` tokens of `x`, all of
/// it on the calling thread (the caller splits the work): the blocked convolution's body.
///
/// # Safety
/// `w` is a live, allocated, contiguous 2-D weight of a kind the CPU has the kernel for;
/// `bias` has m elements; `y` has room for m floats per token and no other thread writes
/// these rows.
pub(super) unsafe fn product_on_this_thread(
    w: &sys::ggml_tensor,
    bias: Option<&[f32]>,
    x: &[f32],
    y: *mut f32,
) {
    // SAFETY: the caller's contract.
    let Some((w, k, m)) = (unsafe { weights_of(w) }) else {
        return;
    };
    let p = Product {
        w,
        x,
        bias,
        addend: None,
        finish: Finish::None,
        y,
        k,
        m,
        n: x.len() / k,
    };
    p.run(&Grid::new(p.n, p.m, 1, false), Pieces::All);
}

/// The weight's elements, by type.
#[derive(Clone, Copy)]
enum Weights<'a> {
    F32(&'a [f32]),
    /// f16 bits.
    F16(&'a [u16]),
    /// bf16 bits, multiplied as bf16 pairs.
    Bf16(&'a [u16]),
    /// bf16 bits, widened to f32 while packing (CPUs without AVX-512 BF16).
    Bf16Wide(&'a [u16]),
    /// q8_0 rows as ggml stores them (blocks of an f16 scale and 32 bytes), multiplied as
    /// integers against quantized activations.
    Q8_0(&'a [u8]),
    /// q8_0 rows, dequantized to f32 while packing (CPUs without AVX-512 VNNI).
    Q8Wide(&'a [u8]),
}

impl Weights<'_> {
    /// Whether products read the weight (and rounded activations) as bf16 k-pairs.
    fn pairs(&self) -> bool {
        matches!(self, Self::Bf16(_))
    }

    /// Whether products pack the activations (bf16 pairs, quantized q8_0 blocks), so that a
    /// piece of the outputs costs a packing of its tokens.
    fn packs_rows(&self) -> bool {
        matches!(self, Self::Bf16(_) | Self::Q8_0(_))
    }
}

/// The product's outputs cut into pieces: row groups (whole strips) × output groups (whole
/// panels), numbered row group by row group.
pub(super) struct Grid {
    n: usize,
    m: usize,
    row_groups: usize,
    feat_groups: usize,
}

impl Grid {
    /// The cut with the shortest estimated finish among those of at least three pieces per
    /// thread (fewer only when the outputs cannot be cut that fine) and at most twice
    /// [`PIECES_PER_THREAD`]: pieces are handed out in rounds, so a cut whose pieces do not
    /// share out evenly leaves threads idle in the last round (PixArt's 18 panels cut in 8
    /// pieces of 2 or 3 kept one of two threads idle for ~10 % of every m = 1152 product).
    /// A piece also pays for what it packs again: its weight panels (for every cut of the
    /// tokens) and, where activations are packed, its tokens (for every cut of the outputs).
    pub(super) fn new(n: usize, m: usize, nth: usize, packs_rows: bool) -> Self {
        let (strips, panels) = (n.div_ceil(MR).max(1), m.div_ceil(NR).max(1));
        if nth <= 1 {
            return Self {
                n,
                m,
                row_groups: 1,
                feat_groups: 1,
            };
        }
        // Two panels per piece at least, so the tile loop keeps its width.
        let most_feats = panels.div_ceil(2);
        let fewest = (3 * nth).min(strips * most_feats);
        let cap = 2 * PIECES_PER_THREAD * nth;
        // Packing one element costs about as much as this many of its products (f32
        // products run ~4x slower than bf16 pairs on AMX or q8_0 on VNNI).
        let pack_cost = if packs_rows { 32.0 } else { 8.0 };
        let mut best = (f64::INFINITY, 1, 1);
        for feat_groups in 1..=most_feats {
            let row_groups_from = fewest.div_ceil(feat_groups).max(1);
            for row_groups in row_groups_from..=strips.min(cap / feat_groups) {
                let pieces = feat_groups * row_groups;
                let rows = (strips.div_ceil(row_groups) * MR) as f64;
                let outs = (panels.div_ceil(feat_groups) * NR) as f64;
                let packing = pack_cost / rows + if packs_rows { pack_cost / outs } else { 0.0 };
                let rounds = pieces.div_ceil(nth) as f64;
                let finish = rounds * rows * outs * (1.0 + packing);
                // Ties go to more pieces: less held back by a descheduled thread.
                if finish <= best.0 {
                    best = (finish, row_groups, feat_groups);
                }
            }
        }
        Self {
            n,
            m,
            row_groups: best.1,
            feat_groups: best.2,
        }
    }

    pub(super) fn pieces(&self) -> usize {
        self.row_groups * self.feat_groups
    }

    /// The tokens and outputs of piece `i` (either may be empty).
    pub(super) fn piece(&self, i: usize) -> (Range<usize>, Range<usize>) {
        let (strips, panels) = (self.n.div_ceil(MR), self.m.div_ceil(NR));
        let (r, f) = (i / self.feat_groups, i % self.feat_groups);
        let rows = (strips * r / self.row_groups * MR).min(self.n)
            ..(strips * (r + 1) / self.row_groups * MR).min(self.n);
        let feats = (panels * f / self.feat_groups * NR).min(self.m)
            ..(panels * (f + 1) / self.feat_groups * NR).min(self.m);
        (rows, feats)
    }
}

/// A 64-byte line, so packed rows start on cache-line boundaries.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u32; 16]);

/// A growable, cache-line aligned buffer viewed as f32 or u32.
#[derive(Default)]
pub(super) struct Packed(Vec<Line>);

impl Packed {
    pub(super) fn grow(&mut self, elems: usize) {
        let lines = elems.div_ceil(16);
        if self.0.len() < lines {
            self.0.resize(lines, Line([0; 16]));
        }
    }

    pub(super) fn u32s(&mut self, elems: usize) -> &mut [u32] {
        self.grow(elems);
        // SAFETY: `Line` is 16 plain u32s with no padding; the buffer holds >= `elems`.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), elems) }
    }

    pub(super) fn f32s(&mut self, elems: usize) -> &mut [f32] {
        self.grow(elems);
        // SAFETY: as `u32s`; every bit pattern is a valid f32.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), elems) }
    }

    /// Start of the packed data at element `at` (within what was last filled).
    pub(super) fn u32s_ro(&self, at: usize) -> *const u32 {
        self.0.as_ptr().cast::<u32>().wrapping_add(at)
    }

    pub(super) fn f32s_ro(&self, at: usize) -> *const f32 {
        self.0.as_ptr().cast::<f32>().wrapping_add(at)
    }
}

/// Each of ggml's worker threads keeps its packing buffers between calls.
#[derive(Default)]
struct Scratch {
    x: Packed,
    /// q8_0 activation scales.
    xd: Packed,
    w: Packed,
    /// The tokens and k-block `x` holds packed, valid within one evaluation of one node:
    /// consecutive pieces of the same row group reuse them.
    packed_rows: Option<(Range<usize>, usize)>,
}

impl Scratch {
    /// Whether `rows` at k-block `k0` must be packed (and from now on count as packed).
    fn fresh_rows(&mut self, rows: &Range<usize>, k0: usize) -> bool {
        let key = Some((rows.clone(), k0));
        let fresh = self.packed_rows != key;
        self.packed_rows = key;
        fresh
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}
