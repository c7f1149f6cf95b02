//! Multi-head attention on the CPU through the blocked tiles, exact in f32 (or, where the
//! caller allows it and the CPU has AVX-512 BF16, both products on bf16 operands): for a
//! block of queries and a chunk of keys, the scores (one row block of S = Q Kᵀ, kept in L2),
//! an online softmax per row, then P V straight into the output, rescaled as the running
//! maximum grows. Heads are read in place from the [heads · d, n, batch] projections, so no
//! permute or copy is needed around it.
//!
//! Why: ggml's fused CPU kernel re-packs each 64-key tile for every 64-query tile and runs
//! its products at a fraction of the FMA peak; PixArt XL spent ~4 s of a 10 s bf16 step there.

use std::cell::RefCell;
use std::os::raw::{c_int, c_void};

use super::amx;
use super::claims::Claims;
use super::dispatch::{self, Tiles};
use super::driver::Packed;
use super::kernels::{self, Tile};
use super::pack::{self, Rows};
use super::softmax;
use super::{AttentionPrecision, MR, NR};
use crate::dtype::DType;
use crate::ggml::context::{Context, Tensor};
use crate::ggml::sys;

/// Queries per block. Every block streams its head's packed K and V once, so the block's
/// size is their reuse: at 14040 keys (Wan 1.3B, 480×832, 33 frames) a head's K and V are
/// 14 MiB per thread, beyond the cache, and 192 queries ran 10 % faster than 48 (96 and 144
/// in between; `cargo bench --bench attention`).
const QB: usize = 32 * MR;
/// Keys per score chunk: the block's chunk of scores (192 × 256 f32, 192 KiB) stays in L2
/// through its three passes. A multiple of [`NR`] and of [`KEY_CHUNK`].
pub(super) const SCORE_CHUNK: usize = 256;
/// Keys per P V pass: V's chunk (256 × the head size in f32) stays in L2 for the block.
const KEY_CHUNK: usize = 256;
/// Longest key sequence taken (each thread packs its head's K and V).
const MAX_KV: usize = 16384;
/// Largest head (keys × head size) taken: each thread packs its head's K and V, 2 × 8 MiB at
/// most (Qwen Image at 1024² needs ~2 MiB; a VAE's one 512-wide head over 128² latents
/// would need 64 MiB and keeps ggml's fused kernel).
const MAX_HEAD_ELEMENTS: usize = 2 << 20;
/// Where the head count and scale sit in the node's op params (after ggml's custom-op
/// parameters, which take the first 24 bytes).
const PARAM_HEADS: usize = 8;
const PARAM_SCALE: usize = 9;
/// 1 when the products run on bf16 operands (see [`AttentionPrecision::Bf16`]).
const PARAM_BF16: usize = 10;

impl super::CpuKernels {
    /// softmax(q kᵀ · scale + mask) v for each of `heads` heads, like `attention` in
    /// `nn/attention.rs` with its f32 path: q [heads · d, n_q, B], k/v [heads · d, n_kv, B]
    /// (f32, contiguous), mask [n_kv, n_q] f32 (0 / −inf, broadcast over heads and batch).
    /// `None` when the CPU lacks the blocked kernels or the shapes are not these.
    #[allow(clippy::too_many_arguments)]
    pub fn attention<'c>(
        self,
        ctx: &'c Context,
        q: Tensor<'c>,
        k: Tensor<'c>,
        v: Tensor<'c>,
        heads: usize,
        mask: Option<Tensor<'c>>,
        scale: f32,
        precision: AttentionPrecision,
    ) -> Option<Tensor<'c>> {
        // Only where the CPU has the tiles the node's body runs on.
        super::tiles()?;
        let [dim, n_q, batch, b3] = q.ne();
        let n_kv = k.ne()[1];
        let f32_contiguous = |t: Tensor<'_>| t.ty() == DType::F32 && t.is_contiguous();
        let ok = heads > 0
            && dim > 0
            && dim % heads == 0
            && b3 == 1
            && k.ne() == [dim, n_kv, batch, 1]
            && v.ne() == k.ne()
            && (1..=MAX_KV).contains(&n_kv)
            && n_kv * (dim / heads) <= MAX_HEAD_ELEMENTS
            && [q, k, v].into_iter().all(f32_contiguous)
            && mask.is_none_or(|m| f32_contiguous(m) && m.ne() == [n_kv, n_q, 1, 1]);
        if !ok {
            return None;
        }
        let mut args = [
            q.raw(),
            k.raw(),
            v.raw(),
            mask.map_or(std::ptr::null_mut(), |m| m.raw()),
        ];
        let n_args = if mask.is_some() { 4 } else { 3 };
        // SAFETY: live tensors of this context; `compute` reads exactly these sources and
        // writes the f32 [dim, n_q, B] result ggml allocates for the node.
        let out = unsafe {
            sys::ggml_custom_4d(
                ctx.raw(),
                DType::F32.raw(),
                dim as i64,
                n_q as i64,
                batch as i64,
                1,
                args.as_mut_ptr(),
                n_args,
                Some(compute),
                sys::GGML_N_TASKS_MAX,
                std::ptr::null_mut(),
            )
        };
        // SAFETY: `out` was just made; these op-param slots are past ggml's custom-op params.
        unsafe {
            (*out).op_params[PARAM_HEADS] = heads as i32;
            (*out).op_params[PARAM_SCALE] = scale.to_bits() as i32;
            (*out).op_params[PARAM_BF16] =
                (precision == AttentionPrecision::Bf16 && super::bf16_native()) as i32;
        }
        Some(ctx.wrap(out))
    }
}

/// One attention node's operands.
struct Heads<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    mask: Option<&'a [f32]>,
    out: *mut f32,
    dim: usize,
    hd: usize,
    heads: usize,
    n_q: usize,
    n_kv: usize,
    batch: usize,
    scale: f32,
    /// How V's head columns are split into panels (the same for every head).
    v_panels: Vec<VPanel>,
    tiles: Tiles,
    /// Products on bf16 pairs (`PARAM_BF16`; only set where the CPU has AVX-512 BF16).
    bf16: bool,
    /// Those products on AMX tiles, 32 query rows at a time (where the CPU has AMX-BF16).
    amx: bool,
}

/// # Safety
/// `dst` is a node built by [`super::CpuKernels::attention`], its sources allocated in host
/// memory, on a CPU with AVX-512F or AVX2 + FMA.
pub(super) unsafe extern "C" fn compute(
    dst: *mut sys::ggml_tensor,
    _ith: c_int,
    nth: c_int,
    _: *mut c_void,
) {
    // SAFETY: every one of ggml's threads makes one for this node and drops it on return.
    let claims = unsafe { Claims::of(dst, nth.max(1) as usize) };
    let Some(tiles) = super::tiles() else {
        return;
    };
    // SAFETY: the contract above; the slices cover exactly the checked shapes.
    let job = unsafe {
        let d = &*dst;
        let bf16 = d.op_params[PARAM_BF16] != 0 && super::bf16_native();
        let (q, k, v, m) = (&*d.src[0], &*d.src[1], &*d.src[2], d.src[3]);
        let [dim, n_q, batch] = [q.ne[0], q.ne[1], q.ne[2]].map(|x| x as usize);
        let n_kv = k.ne[1] as usize;
        let heads = d.op_params[PARAM_HEADS] as usize;
        Heads {
            q: std::slice::from_raw_parts(q.data.cast(), dim * n_q * batch),
            k: std::slice::from_raw_parts(k.data.cast(), dim * n_kv * batch),
            v: std::slice::from_raw_parts(v.data.cast(), dim * n_kv * batch),
            mask: (!m.is_null()).then(|| std::slice::from_raw_parts((*m).data.cast(), n_kv * n_q)),
            out: d.data.cast(),
            dim,
            hd: dim / heads.max(1),
            heads,
            n_q,
            n_kv,
            batch,
            scale: f32::from_bits(d.op_params[PARAM_SCALE] as u32),
            v_panels: v_panels(dim / heads.max(1)),
            tiles,
            bf16,
            amx: bf16 && super::amx_bf16(),
        }
    };
    job.run(&claims);
}

impl Heads<'_> {
    /// The threads claim runs of consecutive (batch, head, query block) units, so a thread
    /// packs a head's K and V again only when its next run starts on another head.
    fn run(&self, claims: &Claims) {
        let blocks = self.n_q.div_ceil(QB);
        let units = self.batch * self.heads * blocks;
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            let s = &mut *s;
            let mut packed = None;
            claims.each_run(units, |run| {
                for u in run {
                    let (bh, blk) = (u / blocks, u % blocks);
                    if packed != Some(bh) {
                        self.pack_head(bh / self.heads, bh % self.heads, s);
                        packed = Some(bh);
                    }
                    let q0 = blk * QB;
                    self.query_block(
                        bh / self.heads,
                        bh % self.heads,
                        q0..(q0 + QB).min(self.n_q),
                        s,
                    );
                }
            });
        });
    }

    /// K as panels of 64 keys over the head's d (like a weight), V as panels of its d
    /// columns over the keys (see [`v_panels`]); in bf16, of d pairs and of key pairs.
    fn pack_head(&self, b: usize, h: usize, s: &mut Scratch) {
        let kv = b * self.n_kv * self.dim..(b + 1) * self.n_kv * self.dim;
        let k_rows = Rows {
            data: &self.k[kv.clone()],
            k: self.dim,
        };
        if self.bf16 {
            let k_len = self.n_kv.div_ceil(NR) * self.hd.div_ceil(2) * NR;
            let k_out = s.k.u32s(k_len);
            pack::panels_bf16_of_f32(&k_rows, 0..self.n_kv, h * self.hd, self.hd, k_out);
        } else {
            let k_len = self.n_kv.div_ceil(NR) * self.hd * NR;
            // SAFETY: this op is only built for CPUs with the blocked kernels (`CpuKernels`).
            unsafe {
                let (at, strip) = ((h * self.hd, self.hd), dispatch::panel_strip(self.tiles));
                pack::panels_f32(&k_rows, 0..self.n_kv, at, strip, s.k.f32s(k_len))
            };
        }
        // In bf16 the panels hold key pairs.
        let depth = if self.bf16 {
            self.n_kv.div_ceil(2)
        } else {
            self.n_kv
        };
        // (AMX reads a 16-wide tile past a narrow panel's columns: 16 words of slack.)
        let total = self.v_panels.iter().map(|p| p.width).sum::<usize>() * depth + 16;
        for p in &self.v_panels {
            let (at, len) = (p.offset(depth), p.width * depth);
            let cols = (h * self.hd + p.c0, p.cols, p.width);
            let v = &self.v[kv.clone()];
            if self.bf16 {
                let out = &mut s.v.u32s(total)[at..][..len];
                pack::pair_panel_of_columns(v, self.dim, self.n_kv, cols, out);
            } else {
                let out = &mut s.v.f32s(total)[at..][..len];
                let strip = dispatch::panel_strip(self.tiles);
                pack::panel_of_columns(v, (self.dim, self.n_kv), cols, strip, out);
            }
        }
    }

    /// One block of queries, chunk by chunk of keys (flash attention's online softmax): the
    /// chunk's scores panel by panel of K (a 64-key panel serves every 6-row strip of the block
    /// from L1), then per row the scores' maximum (scaled and masked where there is a mask),
    /// their exponentials against the running maximum (what the output so far holds is
    /// rescaled to it) and their running sum, then P V into the output, [`KEY_CHUNK`] keys of
    /// V at a time. A chunk's scores stay in L2 through the three passes; once all chunks are
    /// in, each output row is divided by its sum (a row whose every key is masked stays
    /// zeros).
    fn query_block(&self, b: usize, h: usize, rows: std::ops::Range<usize>, s: &mut Scratch) {
        let ld = SCORE_CHUNK;
        let scores = s.s.f32s(rows.len() * ld).as_mut_ptr();
        // AMX tiles take 32 query rows (and read whole 32-row tiles of the packed pairs).
        let strip = if self.amx { amx::AMX_ROWS } else { MR };
        let room = rows.len().next_multiple_of(strip);
        let strips = || {
            rows.clone().step_by(strip).map(move |r0| {
                let s_row = scores.wrapping_add((r0 - rows.start) * ld);
                (r0, strip.min(rows.end - r0), s_row)
            })
        };
        let out_row = |r: usize| {
            self.out
                .wrapping_add((b * self.n_q + r) * self.dim + h * self.hd)
        };
        // Each row's running maximum in the exponent's base-2 units (see `softmax::chunk_top`).
        let mut top = [f32::NEG_INFINITY; QB];
        let mut sum = [0f32; QB];
        let hd2 = self.hd.div_ceil(2);
        if self.bf16 {
            let q = Rows {
                data: &self.q[b * self.n_q * self.dim..(b + 1) * self.n_q * self.dim],
                k: self.dim,
            };
            pack::rows_bf16(&q, rows.clone(), h * self.hd, self.hd, s.q.u32s(room * hd2));
        }
        for k0 in (0..self.n_kv).step_by(SCORE_CHUNK) {
            let kc = SCORE_CHUNK.min(self.n_kv - k0);
            for p in k0 / NR..(k0 + kc).div_ceil(NR) {
                for (r0, n_rows, s_row) in strips() {
                    let tile = Tile {
                        c: s_row.wrapping_add(p * NR - k0),
                        ldc: ld,
                        rows: n_rows,
                        cols: (self.n_kv - p * NR).min(NR),
                        accumulate: false,
                        addend: std::ptr::null(),
                        bias: std::ptr::null(),
                    };
                    // SAFETY: the tile lies inside this block's chunk of score rows.
                    unsafe { self.score_tile(b, h, r0 - rows.start, r0, p, s, &tile) };
                }
            }
            for (i, r) in rows.clone().enumerate() {
                let row = scores.wrapping_add(i * ld);
                let mask = self
                    .mask
                    .map_or(std::ptr::null(), |m| m[r * self.n_kv + k0..].as_ptr());
                // SAFETY: `self.tiles` are this CPU's; the score row and the mask row hold
                // `kc` floats from here; the output row is this thread's (its head's `hd`
                // floats of query row r).
                unsafe {
                    let (c, chunk_top) = softmax::chunk_top(self.tiles, row, mask, kc, self.scale);
                    let new_top = top[i].max(chunk_top);
                    if new_top == f32::NEG_INFINITY {
                        std::ptr::write_bytes(row, 0, kc);
                        continue;
                    }
                    let chunk_sum = softmax::chunk_exp_sum(self.tiles, row, kc, c, new_top);
                    let alpha = (top[i] - new_top).exp2();
                    if k0 > 0 && alpha != 1.0 {
                        let out = std::slice::from_raw_parts_mut(out_row(r), self.hd);
                        out.iter_mut().for_each(|v| *v *= alpha);
                    }
                    sum[i] = sum[i] * alpha + chunk_sum;
                    top[i] = new_top;
                }
            }
            for c0 in (k0..k0 + kc).step_by(KEY_CHUNK) {
                let cc = KEY_CHUNK.min(k0 + kc - c0);
                if self.bf16 {
                    // SAFETY: the block's score rows, `ld` floats each, were filled above.
                    let p = unsafe { std::slice::from_raw_parts(scores, rows.len() * ld) };
                    let p = Rows { data: p, k: ld };
                    let out = s.p.u32s(room * cc.div_ceil(2));
                    pack::rows_bf16(&p, 0..rows.len(), c0 - k0, cc, out);
                }
                // In f32 on AVX-512 the 16-wide panel of V takes [`kernels::COLUMN_ROWS`]
                // rows at a time (f32 strips are always MR rows: AMX is bf16 only).
                let column =
                    |p: &VPanel| !self.bf16 && self.tiles == Tiles::Avx512 && p.width == 16;
                for (r0, n_rows, s_row) in strips() {
                    for p in self.v_panels.iter().filter(|p| !column(p)) {
                        let tile = Tile {
                            c: out_row(r0).wrapping_add(p.c0),
                            ldc: self.dim,
                            rows: n_rows,
                            cols: p.cols,
                            accumulate: c0 > 0,
                            addend: std::ptr::null(),
                            bias: std::ptr::null(),
                        };
                        let exps = s_row.wrapping_add(c0 - k0).cast_const();
                        let i = r0 - rows.start;
                        // SAFETY: the exponential rows hold `cc` floats from `c0 − k0`, `ld`
                        // apart (rounded: `cc` halved); the tile is this head's slice of
                        // these output rows.
                        unsafe { self.value_tile((exps, ld), i, (c0, cc), p, s, &tile) };
                    }
                }
                for p in self.v_panels.iter().filter(|p| column(p)) {
                    for r0 in rows.clone().step_by(kernels::COLUMN_ROWS) {
                        let i = r0 - rows.start;
                        let tile = Tile {
                            c: out_row(r0).wrapping_add(p.c0),
                            ldc: self.dim,
                            rows: kernels::COLUMN_ROWS.min(rows.end - r0),
                            cols: p.cols,
                            accumulate: c0 > 0,
                            addend: std::ptr::null(),
                            bias: std::ptr::null(),
                        };
                        let exps = scores.wrapping_add(i * ld + c0 - k0).cast_const();
                        let panel = s.v.f32s_ro(p.offset(self.n_kv) + c0 * p.width);
                        // SAFETY: AVX-512F (`self.tiles`); the exponential rows hold `cc`
                        // floats from `c0 − k0`, `ld` apart; V's panel `n_kv * 16` floats;
                        // the tile is this head's slice of these output rows.
                        unsafe { kernels::tile_f32_column(cc, exps, ld, panel, &tile) };
                    }
                }
            }
        }
        for (i, r) in rows.enumerate() {
            let inv = if sum[i] > 0.0 { 1.0 / sum[i] } else { 0.0 };
            // SAFETY: this thread's output row slice, as above.
            let out = unsafe { std::slice::from_raw_parts_mut(out_row(r), self.hd) };
            out.iter_mut().for_each(|v| *v *= inv);
        }
    }
}

impl Heads<'_> {
    /// Scores of query rows `r0..` (strip `i` rows into the block) against K's panel `p`.
    ///
    /// # Safety
    /// `tile` lies inside the block's score rows; the head's K (and, in bf16, the block's
    /// query pairs) are packed.
    #[allow(clippy::too_many_arguments)]
    unsafe fn score_tile(
        &self,
        b: usize,
        h: usize,
        i: usize,
        r0: usize,
        p: usize,
        s: &Scratch,
        tile: &Tile,
    ) {
        if self.bf16 {
            let hd2 = self.hd.div_ceil(2);
            // SAFETY: `bf16` is only set where the CPU has AVX-512 BF16 (`amx` where AMX-BF16
            // is granted too); the block's query pairs hold `hd2` words per row, with room for
            // whole 32-row tiles; the K panel `hd2 * NR`.
            unsafe {
                let (q, panel) = (s.q.u32s_ro(i * hd2), s.k.u32s_ro(p * hd2 * NR));
                if self.amx {
                    amx::tile_bf16(NR, hd2, q, hd2, panel, tile)
                } else {
                    kernels::tile_bf16(hd2, q, hd2, panel, tile)
                }
            }
        } else {
            let q_row = (b * self.n_q + r0) * self.dim + h * self.hd;
            // SAFETY: `self.tiles` are this CPU's; the query rows hold `hd` floats `dim`
            // apart; the K panel holds `hd * NR`.
            unsafe {
                let (q, panel) = (self.q[q_row..].as_ptr(), s.k.f32s_ro(p * self.hd * NR));
                dispatch::tile_f32(self.tiles, self.hd, q, self.dim, panel, tile)
            }
        }
    }

    /// P V of keys `c0..c0 + cc` for the strip `i` rows into the block into V's panel `p` of
    /// the output: from the exponentials in place (`exps`, `ld` apart), or in bf16 from their
    /// pairs packed for this chunk of keys.
    ///
    /// # Safety
    /// `tile` is this head's slice of the strip's output rows; the head's V is packed (and,
    /// in bf16, this chunk's exponentials).
    unsafe fn value_tile(
        &self,
        (exps, ld): (*const f32, usize),
        i: usize,
        (c0, cc): (usize, usize),
        p: &VPanel,
        s: &Scratch,
        tile: &Tile,
    ) {
        if self.bf16 {
            let (cc2, n_kv2) = (cc.div_ceil(2), self.n_kv.div_ceil(2));
            // SAFETY: AVX-512 BF16 and AMX as in `score_tile`; the chunk's pairs hold `cc2`
            // words per row (room for whole 32-row tiles); V's pair panel `n_kv2 * width`
            // words (this chunk's from c0 / 2, c0 even: a multiple of KEY_CHUNK), and the
            // packed V 16 words of slack past its last panel.
            unsafe {
                let panel = s.v.u32s_ro(p.offset(n_kv2) + c0 / 2 * p.width);
                let pairs = s.p.u32s_ro(i * cc2);
                if self.amx {
                    amx::tile_bf16(p.width, cc2, pairs, cc2, panel, tile)
                } else {
                    kernels::tile_bf16_width(p.width, cc2, pairs, cc2, panel, tile)
                }
            }
        } else {
            // The chunk's first key in each of the panel's strips.
            let strip = dispatch::panel_strip(self.tiles).min(p.width);
            let panel = s.v.f32s_ro(p.offset(self.n_kv) + c0 * strip);
            let shape = (p.width, self.n_kv);
            // SAFETY: `self.tiles` are this CPU's; the V panel holds `n_kv * width` floats.
            unsafe { dispatch::tile_f32_width(self.tiles, shape, cc, exps, ld, panel, tile) }
        }
    }
}

/// One panel of V's columns: `cols` of them from column `c0` of the head, packed `width`
/// wide, after `index` panels of the head's full width.
struct VPanel {
    c0: usize,
    cols: usize,
    width: usize,
    index: usize,
}

impl VPanel {
    /// Where the panel starts in the packed buffer (panels before it are all 64 wide).
    fn offset(&self, n_kv: usize) -> usize {
        self.index * NR * n_kv
    }
}

/// The head's columns as panels of 64, the last one only as wide as the 16-lane vectors its
/// columns need (PixArt's head size 72 = 64 + 16-wide: 80 lanes of work instead of 128;
/// SD 1.x's 40: one 48-wide panel).
fn v_panels(hd: usize) -> Vec<VPanel> {
    (0..hd.div_ceil(NR))
        .map(|index| {
            let c0 = index * NR;
            let cols = (hd - c0).min(NR);
            let width = cols.next_multiple_of(16);
            VPanel {
                c0,
                cols,
                width,
                index,
            }
        })
        .collect()
}

/// Per-thread buffers: packed K and V of the current head, the block's score rows (and in
/// bf16 its query pairs and one key chunk's exponentials as pairs).
#[derive(Default)]
struct Scratch {
    k: Packed,
    v: Packed,
    s: Packed,
    q: Packed,
    p: Packed,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}
