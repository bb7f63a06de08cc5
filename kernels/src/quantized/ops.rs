//! Checked launches of the quantized kernels: every shape, byte length and alignment is
//! validated first (bad input: [`LaunchError::InvalidArgument`], nothing launched or
//! written); empty outputs are a no-op.
use super::{batch_tile, matvec_block, matvec_lds_words, matvec_row_group, matvec_row_words, Batch1, Batch2, Batch4, Batch8, GgmlDType, LANE_UNITS_AMD, LANE_UNITS_OTHER, ROW_BLOCK, ROW_STAGE_BYTES};
use super::{batch_stage_bytes, stream_batch_per_step, stream_groups_per_cu, stream_per_step, stream_stage_words, BATCH_BLOCK, BATCH_STAGES, MAX_STREAM_STAGES, MIN_STREAM_STAGES, STREAM_BLOCK, STREAM_STAGES};
use super::{Q2K, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8K, Q8_0};
use super::{OUT_BF16, OUT_F16, OUT_F32};
use crate::host_args::{offset, Part};
use crate::runtime::{Device, DeviceVec};
use kernel_dsl::host::{ArgValue, Executor, KernelArgSlice, KernelArgSliceMut, LaunchConfig, LaunchError, MemLocation, ScalarArg};
use kernel_dsl::{Dim3, Float};

/// Most activation rows of one matvec launch ([`matvec_q8_1`]).
pub const MAX_BATCH: usize = 8;

/// Most activation rows of one [`matvec`] call (a decode step of up to 64 sequences):
/// over [`MAX_BATCH`] the activations are quantized once and the launches take them in
/// tiles of [`MAX_BATCH`] rows, each tile streaming the weights once. That reads the
/// weights `ceil(batch / 8)` times where a dequantize + GEMM writes and reads them
/// dequantized (4 to 8 times the block bytes in f16) on every call.
pub const MAX_DECODE_BATCH: usize = 64;

/// Runs `$body` with `$q` bound to the marker type of `$dtype`.
macro_rules! with_format {
    ($dtype:expr, $q:ident => $body:expr) => {
        match $dtype {
            GgmlDType::Q4_0 => { type $q = Q4_0; $body }
            GgmlDType::Q4_1 => { type $q = Q4_1; $body }
            GgmlDType::Q5_0 => { type $q = Q5_0; $body }
            GgmlDType::Q5_1 => { type $q = Q5_1; $body }
            GgmlDType::Q8_0 => { type $q = Q8_0; $body }
            GgmlDType::Q2K => { type $q = Q2K; $body }
            GgmlDType::Q3K => { type $q = Q3K; $body }
            GgmlDType::Q4K => { type $q = Q4K; $body }
            GgmlDType::Q5K => { type $q = Q5K; $body }
            GgmlDType::Q6K => { type $q = Q6K; $body }
            GgmlDType::Q8K => { type $q = Q8K; $body }
        }
    };
}

/// Runs `$body` with `$q` bound to the marker type of `$dtype` for the formats that have
/// [`matvec_row`](fn@super::matvec_row) and [`matvec_stream`](fn@super::matvec_stream) instances
/// ([`staged_format`]); the others: an error naming `$kernel`.
macro_rules! with_staged_format {
    ($dtype:expr, $kernel:expr, $q:ident => $body:expr) => {
        match $dtype {
            GgmlDType::Q4_0 => { type $q = Q4_0; $body }
            GgmlDType::Q4_1 => { type $q = Q4_1; $body }
            GgmlDType::Q5_0 => { type $q = Q5_0; $body }
            GgmlDType::Q5_1 => { type $q = Q5_1; $body }
            GgmlDType::Q8_0 => { type $q = Q8_0; $body }
            GgmlDType::Q4K => { type $q = Q4K; $body }
            GgmlDType::Q6K => { type $q = Q6K; $body }
            other => Err(invalid("matvec", format!("{} has no {} instance", $kernel, other.name()))),
        }
    };
}

/// `true` for the formats [`with_staged_format`] takes: all matvec formats but `Q2K`,
/// `Q3K` and `Q5K` (their kernels needed more than gfx9's scalar registers).
const fn staged_format(dtype: GgmlDType) -> bool {
    !matches!(dtype, GgmlDType::Q2K | GgmlDType::Q3K | GgmlDType::Q5K | GgmlDType::Q8K)
}

fn invalid(kernel: &'static str, reason: String) -> LaunchError {
    LaunchError::InvalidArgument { kernel, reason }
}

fn slice_of<T>(b: &(impl KernelArgSlice<T> + ?Sized)) -> (u64, usize) {
    match b.kernel_arg() {
        ArgValue::Slice { addr, len, .. } => (addr, len),
        _ => (0, 0),
    }
}

/// The matvec output `y` as the kernels take it: a view of its bytes, and the code of its
/// element type ([`OUT_F32`](super::OUT_F32)).
fn out_view<O: Float>(y: &(impl KernelArgSlice<O> + ?Sized)) -> Result<(Part, u32), LaunchError> {
    let code = match O::NAME {
        "f32" => OUT_F32,
        "f16" => OUT_F16,
        "bf16" => OUT_BF16,
        other => return Err(invalid("matvec", format!("output of {other} (f32, f16 or bf16)"))),
    };
    let len = slice_of(y).1 * std::mem::size_of::<O>();
    Ok((Part(offset(y.kernel_arg(), 0, len)), code))
}

/// Checks that `arg` starts on 16 bytes (the kernels read blocks with aligned loads).
fn check_aligned<T>(kernel: &'static str, arg: &str, b: &(impl KernelArgSlice<T> + ?Sized)) -> Result<(), LaunchError> {
    let (addr, len) = slice_of(b);
    if len > 0 && addr % 16 != 0 {
        return Err(invalid(kernel, format!("`{arg}` must start on 16 bytes (address {addr:#x})")));
    }
    Ok(())
}

/// Blocks of a `rows x cols` matrix in `dtype`, checking `cols` and the byte length.
fn check_matrix(kernel: &'static str, dtype: GgmlDType, w_len: usize, rows: usize, cols: usize) -> Result<usize, LaunchError> {
    let bw = dtype.block_weights();
    if cols == 0 || cols % bw != 0 {
        return Err(invalid(kernel, format!("{} rows hold blocks of {bw} weights; cols = {cols} is not a positive multiple", dtype.name())));
    }
    let bytes = rows.checked_mul(cols / bw).and_then(|b| b.checked_mul(dtype.block_bytes()));
    match bytes {
        Some(b) if b == w_len => Ok(b),
        Some(b) => Err(invalid(kernel, format!("{rows} x {cols} {} weights are {b} bytes; the buffer has {w_len}", dtype.name()))),
        None => Err(invalid(kernel, format!("{rows} x {cols} overflows usize"))),
    }
}

fn elements_config(n: usize) -> LaunchConfig {
    LaunchConfig::new(Dim3::x(n.div_ceil(256).clamp(1, 65536) as u32), Dim3::x(256))
}

/// Which kernel [`dequantize_with`] and [`get_rows_with`] launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DequantKernel {
    /// [`dequantize_pieces`](fn@super::dequantize_pieces) /
    /// [`get_rows_pieces`](fn@super::get_rows_pieces): eight consecutive weights per
    /// work-item, the scales decoded once per piece, 16-byte stores. Needs `out` on 16 bytes;
    /// a misaligned `out` takes [`DequantKernel::Generic`].
    Pieces,
    /// [`dequantize`](fn@super::dequantize) / [`get_rows`](fn@super::get_rows): one weight
    /// per work-item (kept to compare against, and for misaligned outputs).
    Generic,
}

impl DequantKernel {
    /// [`DequantKernel::Generic`] when the environment variable `KERNELS_DEQUANT_GENERIC`
    /// is set to anything but `0` (read once per process), else [`DequantKernel::Pieces`].
    pub fn from_env() -> DequantKernel {
        static GENERIC: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let generic = *GENERIC.get_or_init(|| std::env::var("KERNELS_DEQUANT_GENERIC").is_ok_and(|v| v != "0"));
        if generic { DequantKernel::Generic } else { DequantKernel::Pieces }
    }

    /// `self`, or [`DequantKernel::Generic`] where `out` does not start on 16 bytes.
    fn for_out<T>(self, out: &(impl KernelArgSlice<T> + ?Sized)) -> DequantKernel {
        if slice_of(out).0 % 16 == 0 { self } else { DequantKernel::Generic }
    }
}

/// Launch shape of the piece kernels: one work-item per [`PIECE`](super::PIECE) outputs.
fn pieces_config(n: usize) -> LaunchConfig {
    elements_config(n / super::PIECE)
}

/// Dequantizes `w` (a whole number of `dtype` blocks) into `out` (`blocks * block_weights`
/// elements of `T`) with the kernel [`DequantKernel::from_env`] picks.
pub fn dequantize<T: Float + ScalarArg>(
    exec: &(impl Executor + ?Sized),
    dtype: GgmlDType,
    w: &(impl KernelArgSlice<u8> + ?Sized),
    out: &mut (impl KernelArgSliceMut<T> + ?Sized),
) -> Result<(), LaunchError> {
    dequantize_with(exec, dtype, w, out, DequantKernel::from_env())
}

/// [`dequantize`] with the given kernel (benchmarks and tests compare the two).
pub fn dequantize_with<T: Float + ScalarArg>(
    exec: &(impl Executor + ?Sized),
    dtype: GgmlDType,
    w: &(impl KernelArgSlice<u8> + ?Sized),
    out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    kernel: DequantKernel,
) -> Result<(), LaunchError> {
    const K: &str = "dequantize";
    let (_, w_len) = slice_of(w);
    let (_, out_len) = slice_of(out);
    if w_len % dtype.block_bytes() != 0 {
        return Err(invalid(K, format!("{w_len} bytes are not whole {} blocks of {} bytes", dtype.name(), dtype.block_bytes())));
    }
    let n = w_len / dtype.block_bytes() * dtype.block_weights();
    if out_len != n {
        return Err(invalid(K, format!("`out` has {out_len} elements; {w_len} bytes of {} hold {n} weights", dtype.name())));
    }
    check_aligned(K, "w", w)?;
    if n == 0 {
        return Ok(());
    }
    match kernel.for_out(out) {
        DequantKernel::Pieces => with_format!(dtype, Q => super::dequantize_pieces::launch::<Q, T>(exec, pieces_config(n), w, out)),
        DequantKernel::Generic => with_format!(dtype, Q => super::dequantize::launch::<Q, T>(exec, elements_config(n), w, out)),
    }
}

/// `out[i, :] = W[ids[i], :]` dequantized, for a `rows x cols` matrix `w` (zero rows for
/// ids `>= rows`); `out` holds `ids.len() * cols` elements. The kernel: as [`dequantize`].
pub fn get_rows<T: Float + ScalarArg>(
    exec: &(impl Executor + ?Sized),
    dtype: GgmlDType,
    w: &(impl KernelArgSlice<u8> + ?Sized),
    ids: &(impl KernelArgSlice<u32> + ?Sized),
    out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    rows: usize,
    cols: usize,
) -> Result<(), LaunchError> {
    get_rows_with(exec, dtype, w, ids, out, rows, cols, DequantKernel::from_env())
}

/// [`get_rows`] with the given kernel.
#[allow(clippy::too_many_arguments)]
pub fn get_rows_with<T: Float + ScalarArg>(
    exec: &(impl Executor + ?Sized),
    dtype: GgmlDType,
    w: &(impl KernelArgSlice<u8> + ?Sized),
    ids: &(impl KernelArgSlice<u32> + ?Sized),
    out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    rows: usize,
    cols: usize,
    kernel: DequantKernel,
) -> Result<(), LaunchError> {
    const K: &str = "get_rows";
    check_matrix(K, dtype, slice_of(w).1, rows, cols)?;
    let n = slice_of(ids).1.checked_mul(cols).ok_or_else(|| invalid(K, "ids x cols overflows usize".into()))?;
    if slice_of(out).1 != n {
        return Err(invalid(K, format!("`out` has {} elements; {} ids of {cols} columns need {n}", slice_of(out).1, slice_of(ids).1)));
    }
    check_aligned(K, "w", w)?;
    if n == 0 {
        return Ok(());
    }
    match kernel.for_out(out) {
        DequantKernel::Pieces => with_format!(dtype, Q => super::get_rows_pieces::launch::<Q, T>(exec, pieces_config(n), w, ids, out, rows, cols)),
        DequantKernel::Generic => with_format!(dtype, Q => super::get_rows::launch::<Q, T>(exec, elements_config(n), w, ids, out, rows, cols)),
    }
}

/// q8_1 quantization of `x` (`batch * cols` values, a multiple of 32) into `xq`
/// (`len / 4` words) and `xds` (`len / 16` floats), as the matvec reads them.
pub fn quantize_q8_1<T: Float + ScalarArg>(
    exec: &(impl Executor + ?Sized),
    x: &(impl KernelArgSlice<T> + ?Sized),
    xq: &mut (impl KernelArgSliceMut<u32> + ?Sized),
    xds: &mut (impl KernelArgSliceMut<f32> + ?Sized),
) -> Result<(), LaunchError> {
    const K: &str = "quantize_q8_1";
    let n = slice_of(x).1;
    if n % 32 != 0 {
        return Err(invalid(K, format!("{n} values are not whole blocks of 32")));
    }
    if slice_of(xq).1 != n / 4 || slice_of(xds).1 != n / 16 {
        return Err(invalid(K, format!("{n} values need `xq` of {} words and `xds` of {} floats; got {} and {}", n / 4, n / 16, slice_of(xq).1, slice_of(xds).1)));
    }
    check_aligned(K, "xq", xq)?;
    if n == 0 {
        return Ok(());
    }
    // The kernel waits for the kernel before it first thing (`kernel_dsl::grid`), so it may
    // overlap it.
    super::quantize_q8_1::launch::<T>(exec, elements_config(n).overlapping_prior(), x, xq, xds)
}

/// Checks a matvec's arguments (everything but the activations' own length); returns the
/// launch shape.
#[allow(clippy::too_many_arguments)]
fn check_matvec<O>(
    amd: bool,
    wave_lanes: u32,
    dtype: GgmlDType,
    w: &(impl KernelArgSlice<u8> + ?Sized),
    xq: &(impl KernelArgSlice<u32> + ?Sized),
    xds: &(impl KernelArgSlice<f32> + ?Sized),
    y: &(impl KernelArgSlice<O> + ?Sized),
    rows: usize,
    cols: usize,
    batch: usize,
) -> Result<LaunchConfig, LaunchError> {
    const K: &str = "matvec";
    if !dtype.has_matvec() {
        return Err(invalid(K, format!("{} has no matvec (GGML uses it for activations only)", dtype.name())));
    }
    if batch == 0 || batch > MAX_BATCH {
        return Err(invalid(K, format!("batch = {batch}; the matvec takes 1..={MAX_BATCH} rows (larger batches are a matmul)")));
    }
    check_matrix(K, dtype, slice_of(w).1, rows, cols)?;
    let n = batch * cols;
    if slice_of(xq).1 != n / 4 || slice_of(xds).1 != n / 16 {
        return Err(invalid(K, format!("{batch} x {cols} activations need `xq` of {} words and `xds` of {} floats; got {} and {}", n / 4, n / 16, slice_of(xq).1, slice_of(xds).1)));
    }
    let y_len = rows.checked_mul(batch).ok_or_else(|| invalid(K, "rows x batch overflows usize".into()))?;
    if slice_of(y).1 != y_len {
        return Err(invalid(K, format!("`y` has {} elements; {batch} x {rows} needed", slice_of(y).1)));
    }
    if wave_lanes != 32 && wave_lanes != 64 {
        return Err(invalid(K, format!("wave size {wave_lanes} (32 or 64)")));
    }
    check_aligned(K, "w", w)?;
    check_aligned(K, "xq", xq)?;
    let block = matvec_block(amd, wave_lanes);
    let groups = (rows * wave_lanes as usize).div_ceil(block as usize);
    if groups > u32::MAX as usize {
        return Err(invalid(K, format!("{rows} rows need more than 2^32 work-groups")));
    }
    Ok(LaunchConfig::new(Dim3::x(groups.max(1) as u32), Dim3::x(block)))
}

/// `true` when `exec` launches on an AMD GPU (smaller LDS chunks and batch tiles).
fn on_amd(exec: &(impl Executor + ?Sized)) -> bool {
    matches!(exec.memory(), MemLocation::Device { backend: "rocm", .. })
}

fn on_cuda(exec: &(impl Executor + ?Sized)) -> bool {
    matches!(exec.memory(), MemLocation::Device { backend: "cuda", .. })
}

/// 32-weight units a wave stages in LDS per step ([`LANE_UNITS_AMD`] or
/// [`LANE_UNITS_OTHER`] per lane; the CPU executor runs the NVIDIA shape).
fn chunk_units(exec: &(impl Executor + ?Sized), wave_lanes: u32) -> usize {
    wave_lanes as usize * if on_amd(exec) { LANE_UNITS_AMD } else { LANE_UNITS_OTHER }
}

/// `super::$k::launch::<$q, tile>(args)` with the batch tile that holds `$nb` activation
/// rows (1, 2, up to 4, up to 8).
macro_rules! launch_tile {
    ($k:ident, $q:ty, $nb:expr, ($($arg:expr),* $(,)?)) => {
        match $nb {
            1 => super::$k::launch::<$q, Batch1>($($arg),*),
            2 => super::$k::launch::<$q, Batch2>($($arg),*),
            3 | 4 => super::$k::launch::<$q, Batch4>($($arg),*),
            _ => super::$k::launch::<$q, Batch8>($($arg),*),
        }
    };
}

/// `y[b * rows + r] = sum_k W[r, k] x[b * cols + k]` for `b < batch` (1..=8) with
/// activations already in q8_1 ([`quantize_q8_1`]), `y` in `f32`, `f16` or `bf16` (summed
/// in `f32`, rounded once at the store); `wave_lanes` is the device's wave size
/// ([`Device::wave_lanes`]). NVIDIA GPUs run [`matvec_stream`] for one activation row
/// where it takes the rows and the matrix has at least [`STREAM_MIN_BYTES`], and for
/// batches of at least [`STREAM_MIN_BATCH`] where it takes the rows; else
/// [`matvec_rows`] (rows staged whole by `cp.async`) for rows of up to [`ROW_STAGE_BYTES`];
/// AMD GPUs and the CPU executor the chunked wave-per-row [`matvec`](fn@super::matvec).
#[allow(clippy::too_many_arguments)]
pub fn matvec_q8_1<O: Float>(
    exec: &(impl Executor + ?Sized),
    wave_lanes: u32,
    dtype: GgmlDType,
    w: &(impl KernelArgSlice<u8> + ?Sized),
    xq: &(impl KernelArgSlice<u32> + ?Sized),
    xds: &(impl KernelArgSlice<f32> + ?Sized),
    y: &mut (impl KernelArgSliceMut<O> + ?Sized),
    rows: usize,
    cols: usize,
    batch: usize,
) -> Result<(), LaunchError> {
    matvec_q8_1_after(exec, wave_lanes, dtype, w, xq, xds, y, rows, cols, batch, StreamTuning::default(), Prior::Unknown).map(|_| ())
}

/// [`matvec_q8_1`] on codes that the kernel launched just before it wrote together with
/// the activations themselves (`kernels::llm::ops::add_rms_norm_q8`, `silu_mul_q8`), or
/// that an earlier such kernel wrote with only other matvecs on the same codes since: the
/// streaming and row kernels start their weight copies while that kernel ends, as after
/// [`quantize_q8_1`] (nothing a forward pass launches writes a weight matrix).
#[allow(clippy::too_many_arguments)]
pub fn matvec_q8_1_prequantized<O: Float>(
    exec: &(impl Executor + ?Sized),
    wave_lanes: u32,
    dtype: GgmlDType,
    w: &(impl KernelArgSlice<u8> + ?Sized),
    xq: &(impl KernelArgSlice<u32> + ?Sized),
    xds: &(impl KernelArgSlice<f32> + ?Sized),
    y: &mut (impl KernelArgSliceMut<O> + ?Sized),
    rows: usize,
    cols: usize,
    batch: usize,
) -> Result<(), LaunchError> {
    matvec_q8_1_after(exec, wave_lanes, dtype, w, xq, xds, y, rows, cols, batch, StreamTuning::default(), Prior::Quantize).map(|_| ())
}

/// What a matvec's launcher knows of the kernel launched just before it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Prior {
    /// Nothing: the matvec starts after it.
    Unknown,
    /// The quantization of the matvec's activations ([`quantize_q8_1`]), which writes
    /// nothing in `w`.
    Quantize,
    /// A matvec [`Device::mark_overlappable`] marked whose writes miss `w` (a chain on the
    /// same activations).
    Matvec,
}

/// [`matvec_q8_1`] after the kernel `prior` describes: after a known one (it writes nothing
/// in `w`) the streaming and row kernels may overlap it, their weight copies, issued before
/// they wait for it, then reading nothing a running kernel writes. `tuning` goes to the
/// streaming kernels. Returns whether the kernel that ran waits for the kernel before it
/// and only then releases the next (the streaming and row kernels): what
/// `mark_overlappable` needs.
#[allow(clippy::too_many_arguments)]
fn matvec_q8_1_after<O: Float>(
    exec: &(impl Executor + ?Sized),
    wave_lanes: u32,
    dtype: GgmlDType,
    w: &(impl KernelArgSlice<u8> + ?Sized),
    xq: &(impl KernelArgSlice<u32> + ?Sized),
    xds: &(impl KernelArgSlice<f32> + ?Sized),
    y: &mut (impl KernelArgSliceMut<O> + ?Sized),
    rows: usize,
    cols: usize,
    batch: usize,
    tuning: StreamTuning,
    prior: Prior,
) -> Result<bool, LaunchError> {
    let cfg = check_matvec(on_amd(exec), wave_lanes, dtype, w, xq, xds, y, rows, cols, batch)?;
    let (mut y, out) = out_view(y)?;
    let y = &mut y;
    if rows == 0 {
        return Ok(false);
    }
    let row_bytes = cols / dtype.block_weights() * dtype.block_bytes();
    // Batch 1 streams from STREAM_MIN_BYTES, batches of 2..8 at every size
    // (`bench-quantized --sweep`, H100).
    let (per_step, ..) = stream_step(exec, wave_lanes, dtype, cols, batch);
    let big_enough = if batch == 1 { rows * row_bytes >= STREAM_MIN_BYTES } else { batch >= STREAM_MIN_BATCH };
    if on_cuda(exec) && staged_format(dtype) && per_step > 0 && big_enough {
        return launch_stream(exec, dtype, w, xq, xds, y, out, rows, cols, batch, per_step, tuning, prior).map(|_| true);
    }
    if on_cuda(exec) && row_bytes <= ROW_STAGE_BYTES && staged_format(dtype) {
        return launch_rows(exec, dtype, w, xq, xds, y, out, rows, cols, batch, prior != Prior::Unknown).map(|_| true);
    }
    let units = chunk_units(exec, wave_lanes);
    let cfg = cfg.with_dynamic_shared(matvec_lds_words(dtype, units, (cfg.block.x / wave_lanes) as usize));
    // One launch for the whole batch where the tile allows (NVIDIA, CPU executor: 8 rows);
    // otherwise tiles of 4 (AMD) or 2 (Q2K/Q3K/Q5K), each launch on views of the
    // activations and output.
    let tile = batch_tile(dtype, on_amd(exec));
    let osz = std::mem::size_of::<O>();
    let mut b0 = 0;
    while b0 < batch {
        let nb = (batch - b0).min(tile);
        let xq_t = Part(offset(xq.kernel_arg(), b0 * cols / 4 * 4, nb * cols / 4));
        let xds_t = Part(offset(xds.kernel_arg(), b0 * cols / 16 * 4, nb * cols / 16));
        let mut y_t = Part(offset(KernelArgSlice::<u8>::kernel_arg(y), b0 * rows * osz, nb * rows * osz));
        macro_rules! go {
            ($k:ident, $q:ty) => {
                launch_tile!($k, $q, nb, (exec, cfg, w, &xq_t, &xds_t, &mut y_t, out, rows, cols, nb, units))
            };
        }
        match dtype {
            GgmlDType::Q4_0 => go!(matvec, Q4_0),
            GgmlDType::Q4_1 => go!(matvec, Q4_1),
            GgmlDType::Q5_0 => go!(matvec, Q5_0),
            GgmlDType::Q5_1 => go!(matvec, Q5_1),
            GgmlDType::Q8_0 => go!(matvec, Q8_0),
            GgmlDType::Q4K => go!(matvec, Q4K),
            GgmlDType::Q5K => go!(matvec_tile2, Q5K),
            GgmlDType::Q6K => go!(matvec, Q6K),
            GgmlDType::Q2K => go!(matvec_tile2, Q2K),
            GgmlDType::Q3K => go!(matvec_tile2, Q3K),
            GgmlDType::Q8K => Err(invalid("matvec", "q8_K has no matvec".into())),
        }?;
        b0 += nb;
    }
    Ok(false)
}

/// [`matvec_q8_1`] through [`matvec_row`](fn@super::matvec_row) (a work-group per weight row,
/// the row staged by asynchronous copies): what NVIDIA GPUs run for rows of up to
/// [`ROW_STAGE_BYTES`]; the arguments are checked by the caller. Public for the tests,
/// which run it on the CPU executor too.
#[allow(clippy::too_many_arguments)]
pub fn matvec_rows<O: Float>(
    exec: &(impl Executor + ?Sized),
    dtype: GgmlDType,
    w: &(impl KernelArgSlice<u8> + ?Sized),
    xq: &(impl KernelArgSlice<u32> + ?Sized),
    xds: &(impl KernelArgSlice<f32> + ?Sized),
    y: &mut (impl KernelArgSliceMut<O> + ?Sized),
    rows: usize,
    cols: usize,
    batch: usize,
) -> Result<(), LaunchError> {
    let (mut yb, out) = out_view(y)?;
    launch_rows(exec, dtype, w, xq, xds, &mut yb, out, rows, cols, batch, false)
}

/// [`matvec_rows`] on the bytes `y` of elements of code `out` ([`out_view`]); `overlap`:
/// the kernel may overlap the kernel before it, which writes nothing in `w`
/// ([`matvec_q8_1_after`]).
#[allow(clippy::too_many_arguments)]
fn launch_rows(
    exec: &(impl Executor + ?Sized),
    dtype: GgmlDType,
    w: &(impl KernelArgSlice<u8> + ?Sized),
    xq: &(impl KernelArgSlice<u32> + ?Sized),
    xds: &(impl KernelArgSlice<f32> + ?Sized),
    y: &mut (impl KernelArgSliceMut<u8> + ?Sized),
    out: u32,
    rows: usize,
    cols: usize,
    batch: usize,
    overlap: bool,
) -> Result<(), LaunchError> {
    const K: &str = "matvec";
    let row_bytes = cols / dtype.block_weights() * dtype.block_bytes();
    if row_bytes > ROW_STAGE_BYTES || rows > u32::MAX as usize || !(1..=8).contains(&batch) || cols % dtype.block_weights() != 0 {
        return Err(invalid(K, format!("matvec_row takes rows of at most {ROW_STAGE_BYTES} bytes and batches of 1..=8 ({rows} x {cols} {}, batch {batch})", dtype.name())));
    }
    if rows == 0 {
        return Ok(());
    }
    let group = matvec_row_group(cols / 32, row_bytes);
    let mut cfg = LaunchConfig::new(Dim3::x(rows.div_ceil(group) as u32), Dim3::x(ROW_BLOCK)).with_dynamic_shared(matvec_row_words(row_bytes, group));
    if overlap {
        cfg = cfg.overlapping_prior();
    }
    with_staged_format!(dtype, "matvec_row", Q => launch_tile!(matvec_row, Q, batch, (exec, cfg, w, xq, xds, y, out, rows, cols, batch, group)))
}

/// [`matvec_q8_1`] through the streaming kernels (rows streamed through shared memory,
/// activations held in registers): [`matvec_stream`](fn@super::matvec_stream) for one
/// activation row, what NVIDIA GPUs run for batch 1 where [`stream_per_step`] takes the
/// rows, and [`matvec_stream_batch`](fn@super::matvec_stream_batch) for batches of 2..=8,
/// NVIDIA's kernel for them where [`stream_batch_per_step`] takes the rows. The grid is
/// [`stream_groups_per_cu`] work-groups per compute unit for batch 1 and one per compute
/// unit for larger batches (where the executor knows them, else 1024), at most one per
/// step; `tuning` overrides it and the batch-1 kernel's stages (`None` or `Some(groups)`
/// converts). Checked as [`matvec_q8_1`]; a shape the kernel does not take is an error
/// too.
#[allow(clippy::too_many_arguments)]
pub fn matvec_stream<O: Float>(
    exec: &(impl Executor + ?Sized),
    wave_lanes: u32,
    dtype: GgmlDType,
    w: &(impl KernelArgSlice<u8> + ?Sized),
    xq: &(impl KernelArgSlice<u32> + ?Sized),
    xds: &(impl KernelArgSlice<f32> + ?Sized),
    y: &mut (impl KernelArgSliceMut<O> + ?Sized),
    rows: usize,
    cols: usize,
    batch: usize,
    tuning: impl Into<StreamTuning>,
) -> Result<(), LaunchError> {
    const K: &str = "matvec";
    check_matvec(on_amd(exec), wave_lanes, dtype, w, xq, xds, y, rows, cols, batch)?;
    let (per_step, most_units, stage_bytes) = stream_step(exec, wave_lanes, dtype, cols, batch);
    if per_step == 0 {
        let name = if batch == 1 { "matvec_stream" } else { "matvec_stream_batch" };
        return Err(invalid(K, format!("{name} takes rows of at most {most_units} units and {stage_bytes} bytes (batch {batch}; {rows} x {cols} {})", dtype.name())));
    }
    let (mut yb, out) = out_view(y)?;
    launch_stream(exec, dtype, w, xq, xds, &mut yb, out, rows, cols, batch, per_step, tuning.into(), Prior::Unknown)
}

/// Overrides of the streaming launchers' choices ([`matvec_stream`]), for tests and tuning
/// sweeps; `Option<usize>` converts to `groups`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamTuning {
    /// Work-groups of the grid (default: the launcher's).
    pub groups: Option<usize>,
    /// Shared-memory stages of the batch-1 kernel, `MIN_STREAM_STAGES..=MAX_STREAM_STAGES`
    /// (default: [`STREAM_STAGES`]); an error for batches of 2..=8.
    pub stages: Option<usize>,
}

impl From<Option<usize>> for StreamTuning {
    fn from(groups: Option<usize>) -> StreamTuning {
        StreamTuning { groups, stages: None }
    }
}

/// Rows per step of the streaming kernel for `batch` activation rows of `cols` columns
/// of `dtype` on `exec` ([`stream_per_step`] for batch 1, [`stream_batch_per_step`] for
/// 2..=8; 0 where the kernel cannot take the rows), with the limits that decide it: the
/// most 32-weight units and bytes a step's rows may have.
fn stream_step(exec: &(impl Executor + ?Sized), wave_lanes: u32, dtype: GgmlDType, cols: usize, batch: usize) -> (usize, usize, usize) {
    let (units, row_bytes, lanes) = (cols / 32, cols / dtype.block_weights() * dtype.block_bytes(), wave_lanes as usize);
    if batch == 1 {
        return (stream_per_step(units, row_bytes, lanes), super::STREAM_UNITS * STREAM_BLOCK as usize, super::STREAM_STAGE_BYTES);
    }
    let (n, amd, stage_bytes) = (tile_rows(batch), on_amd(exec), batch_stage_bytes(exec.max_shared_bytes()));
    (stream_batch_per_step(dtype, units, row_bytes, lanes, n, stage_bytes, amd), super::batch_held(dtype, n, amd) * BATCH_BLOCK as usize, stage_bytes)
}

/// Activation rows of the batch tile that holds `batch` rows (2, 4 or 8; 1 for 1).
fn tile_rows(batch: usize) -> usize {
    batch.next_power_of_two()
}

/// The launch of the streaming kernels for arguments [`check_matvec`] accepted, rows the
/// kernel takes in steps of `per_step` ([`stream_per_step`], [`stream_batch_per_step`]):
/// [`matvec_stream`](fn@super::matvec_stream) for batch 1 ([`stream_groups_per_cu`]
/// work-groups per compute unit), [`matvec_stream_batch`](fn@super::matvec_stream_batch) for
/// 2..=8 (one per compute unit); `tuning` overrides the grid and stages. After a known
/// kernel (`prior`) it overlaps it ([`matvec_q8_1_after`]); chained after a matvec, batch
/// 1 takes as many work-groups as the device holds at once and [`CHAINED_STAGES`] stages
/// (from [`CHAINED_MIN_ROUNDS`] steps per work-group).
#[allow(clippy::too_many_arguments)]
fn launch_stream(
    exec: &(impl Executor + ?Sized),
    dtype: GgmlDType,
    w: &(impl KernelArgSlice<u8> + ?Sized),
    xq: &(impl KernelArgSlice<u32> + ?Sized),
    xds: &(impl KernelArgSlice<f32> + ?Sized),
    y: &mut (impl KernelArgSliceMut<u8> + ?Sized),
    out: u32,
    rows: usize,
    cols: usize,
    batch: usize,
    per_step: usize,
    tuning: StreamTuning,
    prior: Prior,
) -> Result<(), LaunchError> {
    const K: &str = "matvec";
    let row_bytes = cols / dtype.block_weights() * dtype.block_bytes();
    let chained = batch == 1 && prior == Prior::Matvec;
    // The static grid: `per_cu` work-groups per compute unit (1024 in all where the
    // executor does not know its compute units).
    let static_groups = |per_cu: usize| exec.compute_units().map_or(1024, |cu| cu as usize * per_cu);
    let steps = rows.div_ceil(per_step);
    // Three stages only where a work-group takes several steps (at 4096x4096, 1.3-2.6 steps
    // each, three were 15-25% slower chained than two on the H100).
    let two_stages = STREAM_STAGES * 16 * stream_stage_words(row_bytes, per_step);
    let default_stages = if chained && steps >= CHAINED_MIN_ROUNDS * static_groups(stream_groups_per_cu(dtype, two_stages)) { CHAINED_STAGES } else { STREAM_STAGES };
    let (name, block, stages) = if batch == 1 { ("matvec_stream", STREAM_BLOCK, tuning.stages.unwrap_or(default_stages)) } else { ("matvec_stream_batch", BATCH_BLOCK, BATCH_STAGES) };
    if let Some(n) = tuning.stages {
        if batch > 1 || !(MIN_STREAM_STAGES..=MAX_STREAM_STAGES).contains(&n) {
            return Err(invalid(K, format!("{name}: {n} stages (batch {batch}); the batch-1 kernel takes {MIN_STREAM_STAGES}..={MAX_STREAM_STAGES}")));
        }
    }
    // The kernels index rows (plus a work-group's work-items) in 32 bits.
    if rows > (u32::MAX - 2 * block) as usize {
        return Err(invalid(K, format!("{name} takes fewer than 2^32 - {} rows ({rows})", 2 * block)));
    }
    if batch > 1 && tile_rows(batch) > batch_tile(dtype, on_amd(exec)) {
        return Err(invalid(K, format!("{name}: batch {batch} is more than this device's code objects hold ({})", batch_tile(dtype, on_amd(exec)))));
    }
    let words = stages * stream_stage_words(row_bytes, per_step);
    if 16 * words > exec.max_shared_bytes() {
        return Err(invalid(K, format!("{name} needs {} bytes of shared memory per work-group; the device has {}", 16 * words, exec.max_shared_bytes())));
    }
    let per_cu = if batch == 1 { stream_groups_per_cu(dtype, 16 * words) } else { 1 };
    let groups = tuning.groups.unwrap_or_else(|| static_groups(per_cu));
    if groups == 0 || groups > u32::MAX as usize {
        return Err(invalid(K, format!("{name}: {groups} work-groups")));
    }
    if rows == 0 {
        return Ok(());
    }
    let mut cfg = LaunchConfig::new(Dim3::x(groups.min(steps) as u32), Dim3::x(block)).with_dynamic_shared(words);
    if chained && tuning.groups.is_none() {
        // As many as the device holds at once, where the runtime can tell from the code it
        // runs (the H100 runs the sm_90a variant, whose register counts differ: Q8_0 72,
        // Q5_0 and Q5_1 80 against 80 and 88 in the sm_80 PTX); else the estimate above.
        cfg = cfg.resident_grid(steps as u32);
    }
    if prior != Prior::Unknown {
        cfg = cfg.overlapping_prior();
    }
    with_staged_format!(dtype, name, Q => match tile_rows(batch) {
        1 => super::matvec_stream::launch::<Q>(exec, cfg, w, xq, xds, y, out, rows, cols, per_step, stages),
        2 => super::matvec_stream_batch::launch::<Q, Batch2>(exec, cfg, w, xq, xds, y, out, rows, cols, batch, per_step),
        4 => super::matvec_stream_batch::launch::<Q, Batch4>(exec, cfg, w, xq, xds, y, out, rows, cols, batch, per_step),
        _ => super::matvec_stream_batch::launch::<Q, Batch8>(exec, cfg, w, xq, xds, y, out, rows, cols, batch, per_step),
    })
}

/// Activation rows from which NVIDIA GPUs run batches through
/// [`matvec_stream_batch`](fn@super::matvec_stream_batch) instead of [`matvec_rows`] (H100,
/// `bench-quantized --sweep`, Llama-3-8B shapes, Q4_0/Q8_0/Q4K/Q6K: batch 8 took 0.50-0.61
/// of `matvec_row`'s time, batch 4 0.75-0.95, batch 2 0.84-0.98 except 4096x4096 `Q8_0`
/// and `Q6K`, 1.03-1.06).
pub const STREAM_MIN_BATCH: usize = 2;

/// Weight bytes from which NVIDIA GPUs run batch 1 through [`matvec_stream`] (H100, the
/// weights read from DRAM as in decode: 4096 x 4096 `Q4_0` / `Q4K` / `Q6K` / `Q8_0`,
/// 9.4-17.8 MB, 12-18% faster through the stream with two stages than through
/// [`matvec_rows`]; the smallest matrices timed. Timings of one matrix in a loop, partly
/// served from L2, had put the line at 16 MiB).
pub const STREAM_MIN_BYTES: usize = 8 << 20;

/// `y (batch x rows) = x (batch x cols) W^T` for a quantized `rows x cols` matrix `w` and
/// `batch` (1..=8) activation rows: quantizes `x` to q8_1, then runs the int8 matvec; `y`
/// in `f32`, `f16` or `bf16` (summed in `f32`, rounded once at the store: no cast launch
/// after a product of half-precision activations).
/// Candle's `QMatMul::forward` for small batches. On CUDA the q8_1 codes stay with the
/// device: the next call on the same `x` with nothing else queued in between (a layer's
/// q, k and v; gate and up) reuses them, and its matvec starts while this one ends unless
/// this one's `y` overlaps its weights.
#[allow(clippy::too_many_arguments)]
pub fn matvec<T: Float + ScalarArg, O: Float>(
    dev: &Device,
    dtype: GgmlDType,
    w: &(impl KernelArgSlice<u8> + ?Sized),
    x: &(impl KernelArgSlice<T> + ?Sized),
    y: &mut (impl KernelArgSliceMut<O> + ?Sized),
    rows: usize,
    cols: usize,
    batch: usize,
) -> Result<(), LaunchError> {
    matvec_tuned(dev, dtype, w, x, y, rows, cols, batch, StreamTuning::default())
}

/// [`matvec`] with the streaming kernels' grid and stages overridden by `tuning` (for
/// tuning sweeps; see [`matvec_stream`]).
#[allow(clippy::too_many_arguments)]
pub fn matvec_tuned<T: Float + ScalarArg, O: Float>(
    dev: &Device,
    dtype: GgmlDType,
    w: &(impl KernelArgSlice<u8> + ?Sized),
    x: &(impl KernelArgSlice<T> + ?Sized),
    y: &mut (impl KernelArgSliceMut<O> + ?Sized),
    rows: usize,
    cols: usize,
    batch: usize,
    tuning: StreamTuning,
) -> Result<(), LaunchError> {
    const K: &str = "matvec";
    let n = batch.checked_mul(cols).ok_or_else(|| invalid(K, "batch x cols overflows usize".into()))?;
    if slice_of(x).1 != n {
        return Err(invalid(K, format!("`x` has {} elements; {batch} x {cols} needed", slice_of(x).1)));
    }
    if batch > MAX_BATCH {
        return matvec_tiles(dev, dtype, w, x, y, rows, cols, batch, tuning);
    }
    if let Some(r) = dev.with_state(|held: &mut HeldActivations| matvec_reusing(dev, held, dtype, w, x, y, rows, cols, batch, tuning)) {
        return r;
    }
    let (mut xq, mut xds): (DeviceVec<u32>, DeviceVec<f32>) = (dev.scratch(n / 4)?, dev.scratch(n / 16)?);
    check_matvec(on_amd(dev), dev.wave_lanes(), dtype, w, &xq, &xds, y, rows, cols, batch)?;
    if rows == 0 {
        return Ok(());
    }
    quantize_q8_1(dev, x, &mut xq, &mut xds)?;
    matvec_q8_1_after(dev, dev.wave_lanes(), dtype, w, &xq, &xds, y, rows, cols, batch, tuning, Prior::Quantize).map(|_| ())
}

/// [`matvec`] for `MAX_BATCH < batch <= MAX_DECODE_BATCH` (`x` of `batch * cols`
/// elements: checked by the caller): the activations quantized once, then one launch per
/// tile of [`MAX_BATCH`] rows on views of the codes and of `y`.
#[allow(clippy::too_many_arguments)]
fn matvec_tiles<T: Float + ScalarArg, O: Float>(
    dev: &Device,
    dtype: GgmlDType,
    w: &(impl KernelArgSlice<u8> + ?Sized),
    x: &(impl KernelArgSlice<T> + ?Sized),
    y: &mut (impl KernelArgSliceMut<O> + ?Sized),
    rows: usize,
    cols: usize,
    batch: usize,
    tuning: StreamTuning,
) -> Result<(), LaunchError> {
    const K: &str = "matvec";
    if batch > MAX_DECODE_BATCH {
        return Err(invalid(K, format!("batch = {batch}; the matvec takes 1..={MAX_DECODE_BATCH} rows (larger batches are a matmul)")));
    }
    // Every tile's check before anything runs: the first tile's shape (a full one) checks
    // the format, weights and alignment; the lengths of the whole batch are checked here.
    let n = batch * cols;
    let (mut xq, mut xds): (DeviceVec<u32>, DeviceVec<f32>) = (dev.scratch(n / 4)?, dev.scratch(n / 16)?);
    let y_len = rows.checked_mul(batch).ok_or_else(|| invalid(K, "rows x batch overflows usize".into()))?;
    if slice_of(y).1 != y_len {
        return Err(invalid(K, format!("`y` has {} elements; {batch} x {rows} needed", slice_of(y).1)));
    }
    {
        let (xq_t, xds_t) = (Part(offset(xq.kernel_arg(), 0, MAX_BATCH * cols / 4)), Part(offset(xds.kernel_arg(), 0, MAX_BATCH * cols / 16)));
        let y_t = Part(offset(y.kernel_arg(), 0, MAX_BATCH * rows));
        check_matvec::<O>(on_amd(dev), dev.wave_lanes(), dtype, w, &xq_t, &xds_t, &y_t, rows, cols, MAX_BATCH)?;
    }
    if rows == 0 {
        return Ok(());
    }
    quantize_q8_1(dev, x, &mut xq, &mut xds)?;
    let mut prior = Prior::Quantize;
    for b0 in (0..batch).step_by(MAX_BATCH) {
        let nb = (batch - b0).min(MAX_BATCH);
        // Byte offsets: a row's codes are `cols` bytes, its (d, s) pairs `cols / 4` bytes.
        let xq_t = Part(offset(xq.kernel_arg(), b0 * cols, nb * cols / 4));
        let xds_t = Part(offset(xds.kernel_arg(), b0 * cols / 4, nb * cols / 16));
        let mut y_t = Part(offset(y.kernel_arg(), b0 * rows * std::mem::size_of::<O>(), nb * rows));
        matvec_q8_1_after::<O>(dev, dev.wave_lanes(), dtype, w, &xq_t, &xds_t, &mut y_t, rows, cols, nb, tuning, prior)?;
        // The next tile starts after this one (it writes `y` only, but the launcher's
        // overlap of a matvec after a matvec needs `mark_overlappable`: not worth it here).
        prior = Prior::Unknown;
    }
    Ok(())
}

/// The q8_1 activations [`matvec`] made last on a device (CUDA), kept so that the next
/// call on the same activations (a layer's projections of one input: q, k and v; gate and
/// up) skips their quantization and its matvec starts while the matvec before it ends.
#[derive(Default)]
struct HeldActivations {
    /// Address and element count of the activations `xq` / `xds` hold, and their type.
    of: Option<(u64, usize, &'static str)>,
    /// [`Device::queued_ops`] right after the last launch of [`matvec`]: while it has not
    /// moved, no operation but those launches ran since the quantization, and none of them
    /// wrote the activations.
    at: u64,
    xq: Option<DeviceVec<u32>>,
    xds: Option<DeviceVec<f32>>,
}

/// [`matvec`] on a device that keeps [`HeldActivations`]: quantizes `x` unless `held`
/// already has it and nothing was queued since; a streaming matvec after a matvec that
/// writes nothing in `w` starts its weight copies at once (it waits for that matvec before
/// it reads the activations or writes `y`), and marks itself so the next one may do the same.
#[allow(clippy::too_many_arguments)]
fn matvec_reusing<T: Float + ScalarArg, O: Float>(
    dev: &Device,
    held: &mut HeldActivations,
    dtype: GgmlDType,
    w: &(impl KernelArgSlice<u8> + ?Sized),
    x: &(impl KernelArgSlice<T> + ?Sized),
    y: &mut (impl KernelArgSliceMut<O> + ?Sized),
    rows: usize,
    cols: usize,
    batch: usize,
    tuning: StreamTuning,
) -> Result<(), LaunchError> {
    let (x_at, n) = slice_of(x);
    let of = Some((x_at, n, T::NAME));
    let reuse = held.of == of && dev.queued_ops() == Some(held.at);
    if held.xq.as_ref().map(|v| v.len()) != Some(n / 4) {
        held.of = None;
        held.xq = Some(dev.alloc(n / 4)?);
        held.xds = Some(dev.alloc(n / 16)?);
    }
    let (Some(xq), Some(xds)) = (held.xq.as_mut(), held.xds.as_mut()) else {
        unreachable!("allocated above");
    };
    check_matvec(on_amd(dev), dev.wave_lanes(), dtype, w, &*xq, &*xds, y, rows, cols, batch)?;
    if rows == 0 {
        return Ok(());
    }
    // From here on the held activations change or are read: forget them until the
    // launches succeed.
    held.of = None;
    let prior = if reuse {
        let (w_at, w_len) = slice_of(w);
        if dev.may_read_during_prior(w_at..w_at + w_len as u64) {
            Prior::Matvec
        } else {
            Prior::Unknown
        }
    } else {
        quantize_q8_1(dev, x, xq, xds)?;
        Prior::Quantize
    };
    // `ordered`: the kernel waits for the kernel before it, then releases the next, so
    // the next matvec may overlap it where it reads nothing this one writes.
    let ordered = matvec_q8_1_after(dev, dev.wave_lanes(), dtype, w, &*xq, &*xds, y, rows, cols, batch, tuning, prior)?;
    let (y_at, y_len) = slice_of(y);
    let y_bytes = y_at..y_at + (y_len * std::mem::size_of::<O>()) as u64;
    if ordered {
        dev.mark_overlappable(y_bytes.clone());
    }
    // The held codes stay valid unless `y` overwrote part of `x`.
    let x_end = x_at + (n * std::mem::size_of::<T>()) as u64;
    if y_bytes.end <= x_at || x_end <= y_bytes.start {
        held.of = of;
        held.at = dev.queued_ops().unwrap_or(0);
    }
    Ok(())
}

/// Shared stages of a batch-1 matvec chained after another ([`matvec`] on the same
/// activations), against [`STREAM_STAGES`] for the others: the third keeps one more step
/// in flight across the end of the matvec before. H100, `bench-quantized --sweep-chain`,
/// chained, 4096x14336 / 14336x4096, 3 against 2 stages: `Q4_0` 12.74 / 12.35 against
/// 13.22 / 12.89 us, `Q4K` 13.20 / 12.90 against 13.55 / 13.22, `Q6K` 19.58 / 18.37
/// against 19.55 / 18.58, `Q8_0` 21.54 / 21.41 against 22.34 / 22.26 (resident grids);
/// calls that each quantize were 1-3% slower with three, so they keep two. Chained
/// matvecs also take the resident grid (`LaunchConfig::resident_grid`): `Q8_0` at 7
/// work-groups per SM (two stages), chained, 22.4 against 24.3 us at 6 (4096x14336),
/// while calls that each quantize were 2-3% slower at 7, so they keep
/// [`stream_groups_per_cu`].
pub const CHAINED_STAGES: usize = 3;

/// Steps per work-group (of the launcher's estimated grid) from which a chained batch-1
/// matvec takes [`CHAINED_STAGES`]: at 4096x4096 (1.3-2.6 steps each) three stages were
/// 15-25% slower chained than two on the H100 (`Q4_0` 6.33 against 5.29 us, `Q8_0` 8.33
/// against 7.08, `Q4K` 6.20 against 5.05).
pub const CHAINED_MIN_ROUNDS: usize = 3;
