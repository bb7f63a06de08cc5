//! The checked launchers of [`flash_fwd`](fn@super::flash_fwd): every shape, length and
//! option is validated before anything runs, so an error writes nothing.
use super::{block_rows, flash_fwd, value_chunks, Hd128, Hd256, Hd64, Hd80, Hd96, HeadDim, HEAD_DIMS, WAVES};
use crate::flash_wgmma::{self, flash_fwd_wgmma, WG_HEAD_DIMS, WG_ROWS, WG_THREADS};
use crate::AttentionError;
use kernel_dsl::host::{KernelArgSlice, LaunchConfig, MatrixUnit};
use kernel_dsl::mma::MmaFloat;
use kernel_dsl::Dim3;
use kernel_runtime::{Device, DeviceVec};

/// Sizes of a fixed-length attention: `q [batch, seq_q, heads, head_dim]`,
/// `k`/`v [batch, seq_k, kv_heads, head_dim]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashShape {
    /// Sequences.
    pub batch: usize,
    /// Query rows per sequence.
    pub seq_q: usize,
    /// Keys per sequence.
    pub seq_k: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`: grouped-query, multi-query when 1).
    pub kv_heads: usize,
    /// Head dimension: 64, 80, 96, 128 or 256.
    pub head_dim: usize,
}

/// Sizes of a variable-length attention ([`flash_attn_varlen`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VarlenShape {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Head dimension: 64, 80, 96, 128 or 256.
    pub head_dim: usize,
}

/// Softmax scale, masks and score modifiers.
#[derive(Clone, Copy)]
pub struct FlashOptions<'a> {
    /// Multiplies `q.k` (usually `1 / sqrt(head_dim)`).
    pub scale: f32,
    /// Query row `i` sees keys up to `i + seq_k - seq_q` (bottom-right aligned).
    pub causal: bool,
    /// Sliding window: row `i` sees keys from `i + seq_k - seq_q - left` (`None`: all).
    pub window_left: Option<usize>,
    /// Sliding window: row `i` sees keys up to `i + seq_k - seq_q + right` (`None`: all;
    /// `causal` makes it 0).
    pub window_right: Option<usize>,
    /// `softcap * tanh(score / softcap)` on the scaled scores (`None`: off; must be > 0).
    pub softcap: Option<f32>,
    /// ALiBi slopes: `heads` values (or `batch * heads`, per sequence); the score of
    /// row `i`, key `j` loses `slope * |i + seq_k - seq_q - j|`.
    pub alibi_slopes: Option<&'a DeviceVec<f32>>,
}

impl FlashOptions<'_> {
    /// Non-causal attention with softmax scale `scale` and nothing else.
    pub fn new(scale: f32) -> Self {
        FlashOptions { scale, causal: false, window_left: None, window_right: None, softcap: None, alibi_slopes: None }
    }
    /// The same, causal.
    pub fn causal(scale: f32) -> Self {
        FlashOptions { causal: true, ..Self::new(scale) }
    }
}

/// An element type the kernels take: `f16` or `bf16` (f32 accumulation). Other dtypes do
/// not compile against the launchers.
pub trait FlashElem: MmaFloat + kernel_dsl::host::ScalarArg {}
impl FlashElem for half::f16 {}
impl FlashElem for half::bf16 {}

fn arg(arg: &'static str, reason: impl Into<String>) -> AttentionError {
    AttentionError::Argument { arg, reason: reason.into() }
}

fn len_is(name: &'static str, have: usize, want: usize) -> Result<(), AttentionError> {
    if have != want {
        return Err(arg(name, format!("has {have} elements; the shape needs {want}")));
    }
    Ok(())
}

fn checked_mul(name: &'static str, xs: &[usize]) -> Result<usize, AttentionError> {
    xs.iter().try_fold(1usize, |a, &x| a.checked_mul(x)).ok_or_else(|| arg(name, "size overflows usize"))
}

fn fits_i32(name: &'static str, v: usize) -> Result<i32, AttentionError> {
    // Masks compare `i + off +- window` in 32 bits: keep every term below 2^29.
    if v >= 1 << 29 {
        return Err(arg(name, format!("{v} is too large (at most 2^29 - 1)")));
    }
    Ok(v as i32)
}

fn heads_ok(heads: usize, kv_heads: usize, head_dim: usize) -> Result<(), AttentionError> {
    if !HEAD_DIMS.contains(&head_dim) {
        return Err(AttentionError::HeadDim(head_dim));
    }
    if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(arg("k", format!("{kv_heads} key/value heads do not divide {heads} query heads")));
    }
    fits_i32("heads", heads)?;
    Ok(())
}

/// Everything the kernel takes besides q, k, v, out, lse, after validation.
struct Plan {
    grid: Dim3,
    seq_q: u32,
    seq_k: u32,
    heads: u32,
    kv_heads: u32,
    total_q: u32,
    alibi_bs: u32,
    scale: f32,
    softcap: f32,
    window_left: i32,
    window_right: i32,
    head_dim: usize,
}

/// Window bounds as the kernel takes them (-1: unbounded), clamped so that its 32-bit
/// arithmetic cannot overflow.
fn windows(o: &FlashOptions<'_>, longest: usize) -> (i32, i32) {
    let clamp = |w: Option<usize>| w.map_or(-1, |w| w.min(longest) as i32);
    let right = if o.causal { 0 } else { clamp(o.window_right) };
    (clamp(o.window_left), right)
}

fn options_ok(o: &FlashOptions<'_>, batch: usize, heads: usize) -> Result<u32, AttentionError> {
    if !o.scale.is_finite() {
        return Err(arg("scale", format!("{} is not finite", o.scale)));
    }
    if let Some(c) = o.softcap {
        if !(c > 0.0 && c.is_finite()) {
            return Err(arg("softcap", format!("{c} is not a positive finite number")));
        }
    }
    match o.alibi_slopes {
        None => Ok(0),
        Some(a) if a.len() == heads => Ok(0),
        Some(a) if a.len() == batch * heads => Ok(heads as u32),
        Some(a) => Err(arg("alibi_slopes", format!("has {} elements; want heads = {heads} or batch * heads = {}", a.len(), batch * heads))),
    }
}

/// `out = softmax(q k^T * scale + mask) v` per (sequence, head), and `lse` the natural
/// log-sum-exp of each row's masked, scaled scores (`-inf` for a row that sees no key,
/// whose output is zeros). Layouts: `q`, `out [batch, seq_q, heads, head_dim]`, `k`, `v
/// [batch, seq_k, kv_heads, head_dim]`, `lse [batch, heads, seq_q]`, all contiguous.
/// Query head `h` reads key/value head `h / (heads / kv_heads)`.
///
/// Errors name the argument; on an error nothing is written.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn<T: FlashElem>(
    dev: &Device,
    shape: FlashShape,
    q: &DeviceVec<T>,
    k: &DeviceVec<T>,
    v: &DeviceVec<T>,
    out: &mut DeviceVec<T>,
    lse: &mut DeviceVec<f32>,
    opts: &FlashOptions<'_>,
) -> Result<(), AttentionError> {
    let FlashShape { batch, seq_q, seq_k, heads, kv_heads, head_dim } = shape;
    heads_ok(heads, kv_heads, head_dim)?;
    let nq = checked_mul("q", &[batch, seq_q, heads, head_dim])?;
    let nk = checked_mul("k", &[batch, seq_k, kv_heads, head_dim])?;
    len_is("q", q.len(), nq)?;
    len_is("k", k.len(), nk)?;
    len_is("v", v.len(), nk)?;
    len_is("out", out.len(), nq)?;
    len_is("lse", lse.len(), checked_mul("lse", &[batch, heads, seq_q])?)?;
    let (sq, sk) = (fits_i32("seq_q", seq_q)?, fits_i32("seq_k", seq_k)?);
    if batch > 65535 {
        return Err(arg("q", format!("batch {batch} exceeds the grid limit of 65535")));
    }
    let alibi_bs = options_ok(opts, batch, heads)?;
    let (window_left, window_right) = windows(opts, seq_q + seq_k);
    if nq == 0 {
        return Ok(());
    }
    let plan = Plan {
        grid: grid(dev, seq_q, heads, head_dim, batch)?,
        seq_q: sq as u32,
        seq_k: sk as u32,
        heads: heads as u32,
        kv_heads: kv_heads as u32,
        total_q: 0,
        alibi_bs,
        scale: opts.scale,
        softcap: opts.softcap.unwrap_or(0.0),
        window_left,
        window_right,
        head_dim,
    };
    let none: Vec<u32> = Vec::new();
    launch(dev, &plan, q, k, v, out, lse, &none, opts)
}

/// [`flash_attn`] over sequences of different lengths packed one after another: sequence
/// `b` has query rows `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` of `q`, `out [total_q, heads,
/// head_dim]` and keys `cu_seqlens_k[b]..cu_seqlens_k[b + 1]` of `k`, `v [total_k,
/// kv_heads, head_dim]`; `lse [heads, total_q]`. The offsets are non-decreasing, start at
/// 0 and end at `total_q` / `total_k`; causal masks and windows align each sequence's
/// last query with its last key. A sequence without keys gets zero rows.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen<T: FlashElem>(
    dev: &Device,
    shape: VarlenShape,
    q: &DeviceVec<T>,
    k: &DeviceVec<T>,
    v: &DeviceVec<T>,
    out: &mut DeviceVec<T>,
    lse: &mut DeviceVec<f32>,
    cu_seqlens_q: &[u32],
    cu_seqlens_k: &[u32],
    opts: &FlashOptions<'_>,
) -> Result<(), AttentionError> {
    let VarlenShape { heads, kv_heads, head_dim } = shape;
    heads_ok(heads, kv_heads, head_dim)?;
    if cu_seqlens_q.len() < 2 {
        return Err(arg("cu_seqlens_q", "needs at least two offsets (one sequence)"));
    }
    if cu_seqlens_k.len() != cu_seqlens_q.len() {
        return Err(arg("cu_seqlens_k", format!("has {} offsets; cu_seqlens_q has {}", cu_seqlens_k.len(), cu_seqlens_q.len())));
    }
    let batch = cu_seqlens_q.len() - 1;
    let mut longest = (0usize, 0usize);
    for (name, cu) in [("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)] {
        if cu[0] != 0 {
            return Err(arg(name, format!("starts at {}, not 0", cu[0])));
        }
        if let Some(w) = cu.windows(2).position(|w| w[1] < w[0]) {
            return Err(arg(name, format!("decreases at index {}", w + 1)));
        }
    }
    for b in 0..batch {
        longest.0 = longest.0.max((cu_seqlens_q[b + 1] - cu_seqlens_q[b]) as usize);
        longest.1 = longest.1.max((cu_seqlens_k[b + 1] - cu_seqlens_k[b]) as usize);
    }
    let (total_q, total_k) = (cu_seqlens_q[batch] as usize, cu_seqlens_k[batch] as usize);
    let nq = checked_mul("q", &[total_q, heads, head_dim])?;
    let nk = checked_mul("k", &[total_k, kv_heads, head_dim])?;
    len_is("q", q.len(), nq)?;
    len_is("k", k.len(), nk)?;
    len_is("v", v.len(), nk)?;
    len_is("out", out.len(), nq)?;
    len_is("lse", lse.len(), checked_mul("lse", &[heads, total_q])?)?;
    fits_i32("cu_seqlens_q", total_q)?;
    fits_i32("cu_seqlens_k", total_k)?;
    if batch > 65535 {
        return Err(arg("cu_seqlens_q", format!("{batch} sequences exceed the grid limit of 65535")));
    }
    let alibi_bs = options_ok(opts, batch, heads)?;
    let (window_left, window_right) = windows(opts, longest.0 + longest.1);
    if nq == 0 {
        return Ok(());
    }
    let plan = Plan {
        grid: grid(dev, longest.0, heads, head_dim, batch)?,
        seq_q: longest.0 as u32,
        seq_k: longest.1 as u32,
        heads: heads as u32,
        kv_heads: kv_heads as u32,
        total_q: total_q as u32,
        alibi_bs,
        scale: opts.scale,
        softcap: opts.softcap.unwrap_or(0.0),
        window_left,
        window_right,
        head_dim,
    };
    let cu = dev.upload(&[cu_seqlens_q, cu_seqlens_k].concat())?;
    launch(dev, &plan, q, k, v, out, lse, &cu, opts)
}

/// Whether the `wgmma` prefill kernel ([`flash_fwd_wgmma`](fn@flash_fwd_wgmma)) runs on
/// `dev`: an NVIDIA device the crate's sm_90a PTX variant runs on, or the CPU executor in
/// its `mma.sync` mode (which emulates `wgmma`).
pub fn wgmma_runs(dev: &Device) -> bool {
    match dev {
        Device::Cpu(e) => e.executor().matrix_unit() == MatrixUnit::MmaSync,
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => crate::__KERNEL_BINARIES.variant_for("flash_fwd_wgmma_bf16_hd128").is_some_and(|v| v.runs_on(d.capability())),
        #[allow(unreachable_patterns)]
        _ => false,
    }
}

/// Which prefill kernel the launchers take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillKernel {
    /// The `wgmma` kernel where it runs and has the head dimension ([`takes_wgmma`]), else
    /// the fragment kernel. The default, unless the environment sets
    /// `ATTN_PREFILL_WGMMA=0`.
    Auto,
    /// The fragment kernel ([`flash_fwd`](fn@flash_fwd): MFMA, WMMA, `mma.sync`, VALU).
    Fragments,
}

thread_local! {
    static KERNEL: std::cell::Cell<Option<PrefillKernel>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with this thread's prefill launches taking `kernel` (for comparisons and
/// tests of both kernels on one device); the previous choice returns afterwards.
pub fn with_prefill_kernel<R>(kernel: PrefillKernel, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<PrefillKernel>);
    impl Drop for Restore {
        fn drop(&mut self) {
            KERNEL.with(|k| k.set(self.0));
        }
    }
    let _restore = Restore(KERNEL.with(|k| k.replace(Some(kernel))));
    f()
}

/// Whether a prefill of head dimension `head_dim` takes the `wgmma` kernel on `dev`:
/// where it runs ([`wgmma_runs`]), for head dimensions 64 and 128, unless this thread's
/// choice ([`with_prefill_kernel`]) or, without one, `ATTN_PREFILL_WGMMA=0` says
/// [`PrefillKernel::Fragments`].
pub fn takes_wgmma(dev: &Device, head_dim: usize) -> bool {
    let kernel = KERNEL.with(|k| k.get()).unwrap_or_else(|| {
        if std::env::var("ATTN_PREFILL_WGMMA").is_ok_and(|v| v == "0") {
            PrefillKernel::Fragments
        } else {
            PrefillKernel::Auto
        }
    });
    kernel == PrefillKernel::Auto && WG_HEAD_DIMS.contains(&head_dim) && wgmma_runs(dev)
}

fn grid(dev: &Device, seq_q: usize, heads: usize, head_dim: usize, batch: usize) -> Result<Dim3, AttentionError> {
    let low = crate::lowering_of(dev);
    let (gx, gy) = if takes_wgmma(dev, head_dim) {
        (seq_q.div_ceil(WG_ROWS), heads)
    } else {
        (seq_q.div_ceil(block_rows(head_dim, low)), heads * value_chunks(head_dim, low))
    };
    if gy > 65535 {
        return Err(arg("q", format!("{heads} heads exceed the grid limit")));
    }
    Ok(Dim3::new(gx as u32, gy as u32, batch.max(1) as u32))
}

#[allow(clippy::too_many_arguments)]
fn launch<T: FlashElem>(
    dev: &Device,
    p: &Plan,
    q: &DeviceVec<T>,
    k: &DeviceVec<T>,
    v: &DeviceVec<T>,
    out: &mut DeviceVec<T>,
    lse: &mut DeviceVec<f32>,
    cu: &(impl KernelArgSlice<u32> + ?Sized),
    opts: &FlashOptions<'_>,
) -> Result<(), AttentionError> {
    let none: Vec<f32> = Vec::new();
    let alibi: &dyn KernelArgSlice<f32> = match opts.alibi_slopes {
        Some(a) => a,
        None => &none,
    };
    fn go<T: FlashElem, H: HeadDim>(
        dev: &Device,
        p: &Plan,
        bufs: PrefillBufs<'_, T>,
        cu: &(impl KernelArgSlice<u32> + ?Sized),
        alibi: &dyn KernelArgSlice<f32>,
    ) -> Result<(), AttentionError> {
        let (q, k, v, out, lse) = bufs;
        if takes_wgmma(dev, H::D) {
            let cfg = LaunchConfig::new(p.grid, Dim3::x(WG_THREADS as u32)).with_dynamic_shared(flash_wgmma::smem_elems(H::D));
            return match H::D {
                64 => flash_fwd_wgmma::launch::<T, Hd64>(
                    dev, cfg, q, k, v, out, lse, cu, alibi, p.seq_q, p.seq_k, p.heads, p.kv_heads, p.total_q, p.alibi_bs, p.scale,
                    p.softcap, p.window_left, p.window_right,
                ),
                _ => flash_fwd_wgmma::launch::<T, Hd128>(
                    dev, cfg, q, k, v, out, lse, cu, alibi, p.seq_q, p.seq_k, p.heads, p.kv_heads, p.total_q, p.alibi_bs, p.scale,
                    p.softcap, p.window_left, p.window_right,
                ),
            }
            .map_err(Into::into);
        }
        let low = crate::lowering_of(dev);
        let cfg = LaunchConfig::new(p.grid, Dim3::x(WAVES as u32 * low.wave_lanes())).with_dynamic_shared(super::smem_elems(H::D, block_rows(H::D, low), low));
        flash_fwd::launch::<T, H>(
            dev, cfg, q, k, v, out, lse, cu, alibi, p.seq_q, p.seq_k, p.heads, p.kv_heads, p.total_q, p.alibi_bs, p.scale,
            p.softcap, p.window_left, p.window_right,
        )?;
        Ok(())
    }
    let bufs = (q, k, v, out, lse);
    match p.head_dim {
        64 => go::<T, Hd64>(dev, p, bufs, cu, alibi),
        80 => go::<T, Hd80>(dev, p, bufs, cu, alibi),
        96 => go::<T, Hd96>(dev, p, bufs, cu, alibi),
        128 => go::<T, Hd128>(dev, p, bufs, cu, alibi),
        256 => go::<T, Hd256>(dev, p, bufs, cu, alibi),
        d => Err(AttentionError::HeadDim(d)),
    }
}

/// q, k, v, the output and the per-row statistics of one prefill launch.
type PrefillBufs<'a, T> = (&'a DeviceVec<T>, &'a DeviceVec<T>, &'a DeviceVec<T>, &'a mut DeviceVec<T>, &'a mut DeviceVec<f32>);
