//! Checked launches of the LLM kernels: every length, shape and parameter is validated
//! first (bad input: [`LaunchError::InvalidArgument`] naming the argument, nothing launched
//! or written); empty outputs are a no-op. Each takes any [`Executor`] (a
//! [`Device`](crate::runtime::Device), or a [`CpuExecutor`](kernel_dsl::host::CpuExecutor)
//! on host slices) and buffers or views as slice arguments.
use super::{matvec_group, matvec_team, Rows1, Rows2, Rows4, Rows8, MATVEC_BLOCK, MATVEC_MIN_TEAM, MATVEC_TILE_ROWS, SAMPLE_PARAMS};
use kernel_dsl::host::{ArgValue, Executor, KernelArgSlice, KernelArgSliceMut, LaunchConfig, LaunchError, MemLocation, ScalarArg};
use crate::host_args::{offset, Part};
use kernel_dsl::{Dim3, Float};

/// Most activation rows of one [`dense_matvec`] call.
pub const MAX_ROWS: usize = 8;

fn invalid(kernel: &'static str, reason: String) -> LaunchError {
    LaunchError::InvalidArgument { kernel, reason }
}

fn len_of<T>(b: &(impl KernelArgSlice<T> + ?Sized)) -> usize {
    match b.kernel_arg() {
        ArgValue::Slice { len, .. } => len,
        _ => 0,
    }
}

/// Checks that buffer `name` holds exactly `want` elements.
fn check_len(kernel: &'static str, name: &str, got: usize, want: Option<usize>, what: &str) -> Result<usize, LaunchError> {
    match want {
        Some(w) if w == got => Ok(w),
        Some(w) => Err(invalid(kernel, format!("`{name}` has {got} elements; {what} needs {w}"))),
        None => Err(invalid(kernel, format!("{what} overflows usize"))),
    }
}

/// Checks `team`, the work-items per tile of weight rows: a power of two from
/// [`MATVEC_MIN_TEAM`] to [`MATVEC_BLOCK`].
fn check_team(kernel: &'static str, team: usize) -> Result<(), LaunchError> {
    if !(team.is_power_of_two() && (MATVEC_MIN_TEAM..=MATVEC_BLOCK as usize).contains(&team)) {
        return Err(invalid(kernel, format!("`team` = {team}; a power of two from {MATVEC_MIN_TEAM} to {MATVEC_BLOCK}")));
    }
    Ok(())
}

/// Checks `batch`, the activation rows of a matvec: 1..=[`MAX_ROWS`].
fn check_batch(kernel: &'static str, batch: usize) -> Result<(), LaunchError> {
    if !(1..=MAX_ROWS).contains(&batch) {
        return Err(invalid(kernel, format!("`batch` = {batch}; 1..={MAX_ROWS} activation rows")));
    }
    Ok(())
}

/// Checks the lengths of a matvec's operands: `w` of `rows x cols`, `x` of `batch x cols`,
/// `y` of `batch x rows` and `bias`, where given, of `rows`.
#[allow(clippy::too_many_arguments)]
fn check_operands<T>(
    kernel: &'static str,
    w: &(impl KernelArgSlice<T> + ?Sized),
    x: &(impl KernelArgSlice<T> + ?Sized),
    bias: Option<&(dyn KernelArgSlice<T> + '_)>,
    y: &(impl KernelArgSliceMut<T> + ?Sized),
    rows: usize,
    cols: usize,
    batch: usize,
) -> Result<(), LaunchError> {
    check_len(kernel, "w", len_of(w), rows.checked_mul(cols), &format!("a {rows} x {cols} weight"))?;
    check_len(kernel, "x", len_of(x), batch.checked_mul(cols), &format!("{batch} x {cols} activations"))?;
    check_len(kernel, "y", len_of(y), batch.checked_mul(rows), &format!("a {batch} x {rows} output"))?;
    if let Some(b) = bias {
        check_len(kernel, "bias", len_of(b), Some(rows), &format!("{rows} output features"))?;
    }
    Ok(())
}

/// Activation rows of one matvec launch on `exec`: [`MAX_ROWS`] (one launch reads the
/// weights once for all rows), 4 on an AMD GPU (which runs
/// [`dense_matvec_wave`](fn@super::dense_matvec_wave), at most 4 rows per launch).
pub fn matvec_tile(exec: &(impl Executor + ?Sized)) -> usize {
    if is_rocm(exec) {
        4
    } else {
        MAX_ROWS
    }
}

fn is_rocm(exec: &(impl Executor + ?Sized)) -> bool {
    matches!(exec.memory(), MemLocation::Device { backend: "rocm", .. })
}

/// `y (batch x rows) = x (batch x cols) W^T (+ bias)` for a dense row-major `rows x cols`
/// weight `w` and `batch` (1..=[`MAX_ROWS`]) contiguous activation rows, `f32`
/// accumulation ([`dense_matvec`](fn@super::dense_matvec)); `bias` has `rows` elements.
/// One launch reads the weights once for [`matvec_tile`] activation rows; on CUDA devices
/// `f16`/`bf16` products of aligned whole-chunk rows run on the matrix units
/// ([`dense_matvec_mma`]).
#[allow(clippy::too_many_arguments)]
pub fn dense_matvec<T: Float + ScalarArg>(
    exec: &(impl Executor + ?Sized),
    w: &(impl KernelArgSlice<T> + ?Sized),
    x: &(impl KernelArgSlice<T> + ?Sized),
    bias: Option<&(dyn KernelArgSlice<T> + '_)>,
    y: &mut (impl KernelArgSliceMut<T> + ?Sized),
    rows: usize,
    cols: usize,
    batch: usize,
) -> Result<(), LaunchError> {
    dense_matvec_tiled(exec, w, x, bias, y, rows, cols, batch, matvec_tile(exec))
}

/// [`dense_matvec`] in launches of at most `tile` (1, 2, 4 or 8) activation rows each
/// (public so that tests run the smaller batch tiles on any batch).
#[allow(clippy::too_many_arguments)]
pub fn dense_matvec_tiled<T: Float + ScalarArg>(
    exec: &(impl Executor + ?Sized),
    w: &(impl KernelArgSlice<T> + ?Sized),
    x: &(impl KernelArgSlice<T> + ?Sized),
    bias: Option<&(dyn KernelArgSlice<T> + '_)>,
    y: &mut (impl KernelArgSliceMut<T> + ?Sized),
    rows: usize,
    cols: usize,
    batch: usize,
    tile: usize,
) -> Result<(), LaunchError> {
    dense_matvec_team(exec, w, x, bias, y, rows, cols, batch, tile, matvec_team(rows, cols))
}

/// [`dense_matvec_tiled`] with `team` work-items per tile of weight rows (a power of two
/// from [`MATVEC_MIN_TEAM`] to [`MATVEC_BLOCK`]) instead of [`matvec_team`]'s choice:
/// for tests of every reduction shape and for tuning.
#[allow(clippy::too_many_arguments)]
pub fn dense_matvec_team<T: Float + ScalarArg>(
    exec: &(impl Executor + ?Sized),
    w: &(impl KernelArgSlice<T> + ?Sized),
    x: &(impl KernelArgSlice<T> + ?Sized),
    bias: Option<&(dyn KernelArgSlice<T> + '_)>,
    y: &mut (impl KernelArgSliceMut<T> + ?Sized),
    rows: usize,
    cols: usize,
    batch: usize,
    tile: usize,
    team: usize,
) -> Result<(), LaunchError> {
    const K: &str = "dense_matvec";
    if !matches!(tile, 1 | 2 | 4 | 8) {
        return Err(invalid(K, format!("`tile` = {tile}; 1, 2, 4 or 8")));
    }
    check_team(K, team)?;
    check_batch(K, batch)?;
    check_operands(K, w, x, bias, y, rows, cols, batch)?;
    let cfg = matvec_launch(rows, team)?;
    if rows == 0 {
        return Ok(());
    }
    let cuda = matches!(exec.memory(), MemLocation::Device { backend: "cuda", .. });
    if cuda && batch > 1 && mma_fits::<T>(w, x, cols) {
        return launch_mma(exec, cfg, w, x, bias, y, rows, cols, batch, team);
    }
    // One row on NVIDIA: the wave kernel streams the weights faster than the tensor-core
    // path, which pays its fragment shuffles for a single useful row (benches/results).
    if is_rocm(exec) || (cuda && batch == 1) {
        return launch_wave(exec, w, x, bias, y, rows, cols, batch, tile.min(4));
    }
    let bias: &(dyn KernelArgSlice<T> + '_) = bias.unwrap_or(&[] as &[T; 0]);
    per_batch_tile::<T>(x, y, rows, cols, batch, tile, |x_t, y_t, nb| match nb.next_power_of_two() {
        1 => super::dense_matvec::launch::<T, Rows1>(exec, cfg, w, x_t, bias, y_t, rows, cols, nb, team),
        2 => super::dense_matvec::launch::<T, Rows2>(exec, cfg, w, x_t, bias, y_t, rows, cols, nb, team),
        4 => super::dense_matvec::launch::<T, Rows4>(exec, cfg, w, x_t, bias, y_t, rows, cols, nb, team),
        _ => super::dense_matvec::launch::<T, Rows8>(exec, cfg, w, x_t, bias, y_t, rows, cols, nb, team),
    })
}

/// Calls `launch(x_t, y_t, nb)` for each tile of at most `tile` consecutive activation rows:
/// `x_t` the tile's `nb` rows of `cols` inputs, `y_t` its `nb` rows of `rows` outputs (the
/// batch loop of both row kernels; lengths checked by the caller).
#[allow(clippy::too_many_arguments)]
fn per_batch_tile<T>(
    x: &(impl KernelArgSlice<T> + ?Sized),
    y: &mut (impl KernelArgSliceMut<T> + ?Sized),
    rows: usize,
    cols: usize,
    batch: usize,
    tile: usize,
    mut launch: impl FnMut(&Part, &mut Part, usize) -> Result<(), LaunchError>,
) -> Result<(), LaunchError> {
    let size = std::mem::size_of::<T>();
    let mut b0 = 0;
    while b0 < batch {
        let nb = (batch - b0).min(tile);
        let x_t = Part(offset(x.kernel_arg(), b0 * cols * size, nb * cols));
        let mut y_t = Part(offset(y.kernel_arg(), b0 * rows * size, nb * rows));
        launch(&x_t, &mut y_t, nb)?;
        b0 += nb;
    }
    Ok(())
}

/// [`dense_matvec_wave`](fn@super::dense_matvec_wave) launches (what AMD GPUs run) of at
/// most `tile` (1, 2 or 4) activation rows; arguments checked by the caller.
#[allow(clippy::too_many_arguments)]
fn launch_wave<T: Float + ScalarArg>(
    exec: &(impl Executor + ?Sized),
    w: &(impl KernelArgSlice<T> + ?Sized),
    x: &(impl KernelArgSlice<T> + ?Sized),
    bias: Option<&(dyn KernelArgSlice<T> + '_)>,
    y: &mut (impl KernelArgSliceMut<T> + ?Sized),
    rows: usize,
    cols: usize,
    batch: usize,
    tile: usize,
) -> Result<(), LaunchError> {
    let (cfg, group) = wave_launch(exec, "dense_matvec", (rows, "rows"), cols)?;
    let bias: &(dyn KernelArgSlice<T> + '_) = bias.unwrap_or(&[] as &[T; 0]);
    per_batch_tile::<T>(x, y, rows, cols, batch, tile, |x_t, y_t, nb| match nb.next_power_of_two() {
        1 => super::dense_matvec_wave::launch::<T, Rows1>(exec, cfg, w, x_t, bias, y_t, rows, cols, nb, group),
        2 => super::dense_matvec_wave::launch::<T, Rows2>(exec, cfg, w, x_t, bias, y_t, rows, cols, nb, group),
        _ => super::dense_matvec_wave::launch::<T, Rows4>(exec, cfg, w, x_t, bias, y_t, rows, cols, nb, group),
    })
}

/// [`dense_matvec`] by the kernel AMD GPUs run ([`dense_matvec_wave`](fn@super::dense_matvec_wave):
/// one weight row per team of whole waves) in launches of at most `tile` (1, 2 or 4)
/// activation rows, on any executor: public for the CPU executor's tests of that kernel.
#[allow(clippy::too_many_arguments)]
pub fn dense_matvec_wave_tiled<T: Float + ScalarArg>(
    exec: &(impl Executor + ?Sized),
    w: &(impl KernelArgSlice<T> + ?Sized),
    x: &(impl KernelArgSlice<T> + ?Sized),
    bias: Option<&(dyn KernelArgSlice<T> + '_)>,
    y: &mut (impl KernelArgSliceMut<T> + ?Sized),
    rows: usize,
    cols: usize,
    batch: usize,
    tile: usize,
) -> Result<(), LaunchError> {
    const K: &str = "dense_matvec";
    check_tile(K, tile)?;
    check_batch(K, batch)?;
    check_operands(K, w, x, bias, y, rows, cols, batch)?;
    if rows == 0 {
        return Ok(());
    }
    launch_wave(exec, w, x, bias, y, rows, cols, batch, tile)
}

/// Whether the gated matvec ([`dense_matvec_gated`]) is the faster form of a gate/up
/// product of `batch` rows followed by `SiLU(gate) * up` on `exec`: everywhere the plain
/// product runs the wave kernel (AMD GPUs, one row on CUDA devices) and on the CPU
/// executor; not for several rows on CUDA devices, whose plain product runs on the matrix
/// units ([`dense_matvec_mma`]) and stays separate.
pub fn gated_matvec_preferred(exec: &(impl Executor + ?Sized), batch: usize) -> bool {
    let cuda = matches!(exec.memory(), MemLocation::Device { backend: "cuda", .. });
    (1..=MAX_ROWS).contains(&batch) && !(cuda && batch > 1)
}

/// `y (batch x inter) = SiLU(x Wg^T + bg) * (x Wu^T + bu)` for `w` of `2 inter x cols`
/// holding the gate rows `Wg` then the up rows `Wu` (a stacked `[gate; up]` weight),
/// `bias` (optional) of `2 inter` likewise, and `batch` (1..=[`MAX_ROWS`]) contiguous
/// activation rows ([`dense_matvec_gated`](fn@super::dense_matvec_gated)): both products
/// in `f32`, the activation in `f32`, one rounding. One launch per 4 activation rows.
#[allow(clippy::too_many_arguments)]
pub fn dense_matvec_gated<T: Float + ScalarArg>(
    exec: &(impl Executor + ?Sized),
    w: &(impl KernelArgSlice<T> + ?Sized),
    x: &(impl KernelArgSlice<T> + ?Sized),
    bias: Option<&(dyn KernelArgSlice<T> + '_)>,
    y: &mut (impl KernelArgSliceMut<T> + ?Sized),
    inter: usize,
    cols: usize,
    batch: usize,
) -> Result<(), LaunchError> {
    dense_matvec_gated_tiled(exec, w, x, bias, y, inter, cols, batch, 4)
}

/// [`dense_matvec_gated`] in launches of at most `tile` (1, 2 or 4) activation rows each
/// (public so that tests run every batch tile).
#[allow(clippy::too_many_arguments)]
pub fn dense_matvec_gated_tiled<T: Float + ScalarArg>(
    exec: &(impl Executor + ?Sized),
    w: &(impl KernelArgSlice<T> + ?Sized),
    x: &(impl KernelArgSlice<T> + ?Sized),
    bias: Option<&(dyn KernelArgSlice<T> + '_)>,
    y: &mut (impl KernelArgSliceMut<T> + ?Sized),
    inter: usize,
    cols: usize,
    batch: usize,
    tile: usize,
) -> Result<(), LaunchError> {
    const K: &str = "dense_matvec_gated";
    check_tile(K, tile)?;
    check_batch(K, batch)?;
    let Some(rows) = inter.checked_mul(2) else {
        return Err(invalid(K, format!("`inter` = {inter}: 2 x inter overflows usize")));
    };
    check_len(K, "w", len_of(w), rows.checked_mul(cols), &format!("a {rows} x {cols} [gate; up] weight"))?;
    check_len(K, "x", len_of(x), batch.checked_mul(cols), &format!("{batch} x {cols} activations"))?;
    check_len(K, "y", len_of(y), batch.checked_mul(inter), &format!("a {batch} x {inter} output"))?;
    if let Some(b) = bias {
        check_len(K, "bias", len_of(b), Some(rows), &format!("{rows} gate and up features"))?;
    }
    if inter == 0 {
        return Ok(());
    }
    let (cfg, group) = wave_launch(exec, K, (inter, "outputs"), cols)?;
    let bias: &(dyn KernelArgSlice<T> + '_) = bias.unwrap_or(&[] as &[T; 0]);
    per_batch_tile::<T>(x, y, inter, cols, batch, tile, |x_t, y_t, nb| match nb.next_power_of_two() {
        1 => super::dense_matvec_gated::launch::<T, Rows1>(exec, cfg, w, x_t, bias, y_t, inter, cols, nb, group),
        2 => super::dense_matvec_gated::launch::<T, Rows2>(exec, cfg, w, x_t, bias, y_t, inter, cols, nb, group),
        _ => super::dense_matvec_gated::launch::<T, Rows4>(exec, cfg, w, x_t, bias, y_t, inter, cols, nb, group),
    })
}

/// The launch of the wave-team kernels ([`dense_matvec_wave`](fn@super::dense_matvec_wave),
/// [`dense_matvec_gated`](fn@super::dense_matvec_gated)): a work-group of [`MATVEC_BLOCK`]
/// work-items per `group` of the `outputs` (named `what` in the error), and `group`.
fn wave_launch(exec: &(impl Executor + ?Sized), kernel: &'static str, (outputs, what): (usize, &str), cols: usize) -> Result<(LaunchConfig, usize), LaunchError> {
    let group = matvec_group(cols, exec.wave_lanes() as usize);
    let groups = outputs.div_ceil(group);
    if groups > u32::MAX as usize {
        return Err(invalid(kernel, format!("{outputs} {what} need more than 2^32 work-groups")));
    }
    Ok((LaunchConfig::new(Dim3::x(groups as u32), Dim3::x(MATVEC_BLOCK)), group))
}

/// A batch tile the wave-team launchers take: 1, 2 or 4 activation rows.
fn check_tile(kernel: &'static str, tile: usize) -> Result<(), LaunchError> {
    if matches!(tile, 1 | 2 | 4) {
        Ok(())
    } else {
        Err(invalid(kernel, format!("`tile` = {tile}; 1, 2 or 4")))
    }
}

/// The launch shape of both matvec kernels: [`MATVEC_BLOCK`] work-items, a work-group per
/// `MATVEC_TILE_ROWS * MATVEC_BLOCK / team` rows.
fn matvec_launch(rows: usize, team: usize) -> Result<LaunchConfig, LaunchError> {
    let groups = rows.div_ceil(MATVEC_TILE_ROWS * (MATVEC_BLOCK as usize / team));
    if groups > u32::MAX as usize {
        return Err(invalid("dense_matvec", format!("{rows} rows need more than 2^32 work-groups")));
    }
    Ok(LaunchConfig::new(Dim3::x(groups.max(1) as u32), Dim3::x(MATVEC_BLOCK)))
}

fn addr_of<T>(b: &(impl KernelArgSlice<T> + ?Sized)) -> u64 {
    match b.kernel_arg() {
        ArgValue::Slice { addr, .. } => addr,
        _ => 1,
    }
}

/// `true` when [`dense_matvec_mma`](fn@super::dense_matvec_mma) takes the product: a 16-bit
/// type, rows of whole chunks, `w` and `x` on 16 bytes.
fn mma_fits<T>(w: &(impl KernelArgSlice<T> + ?Sized), x: &(impl KernelArgSlice<T> + ?Sized), cols: usize) -> bool {
    std::mem::size_of::<T>() == 2 && cols % 8 == 0 && addr_of(w) % 16 == 0 && addr_of(x) % 16 == 0
}

#[allow(clippy::too_many_arguments)]
fn launch_mma<T: Float + ScalarArg>(
    exec: &(impl Executor + ?Sized),
    cfg: LaunchConfig,
    w: &(impl KernelArgSlice<T> + ?Sized),
    x: &(impl KernelArgSlice<T> + ?Sized),
    bias: Option<&(dyn KernelArgSlice<T> + '_)>,
    y: &mut (impl KernelArgSliceMut<T> + ?Sized),
    rows: usize,
    cols: usize,
    batch: usize,
    team: usize,
) -> Result<(), LaunchError> {
    let bias: &(dyn KernelArgSlice<T> + '_) = bias.unwrap_or(&[] as &[T; 0]);
    super::dense_matvec_mma::launch::<T>(exec, cfg, w, x, bias, y, rows, cols, batch, team)
}

/// [`dense_matvec`] by the matrix-unit kernel ([`dense_matvec_mma`](fn@super::dense_matvec_mma),
/// what CUDA devices run for `f16`/`bf16`), all `batch` rows in one launch, `team` as in
/// [`dense_matvec_team`]. It needs a 16-bit `T`, `cols` a multiple of 8, `w` and `x` on
/// 16 bytes and waves of 32 (else an error), and computes on executors whose matrix unit
/// is `mma.sync`: CUDA devices and the CPU executor in that mode (on others the kernel
/// writes nothing). Public for the CPU executor's tests of that kernel.
#[allow(clippy::too_many_arguments)]
pub fn dense_matvec_mma<T: Float + ScalarArg>(
    exec: &(impl Executor + ?Sized),
    w: &(impl KernelArgSlice<T> + ?Sized),
    x: &(impl KernelArgSlice<T> + ?Sized),
    bias: Option<&(dyn KernelArgSlice<T> + '_)>,
    y: &mut (impl KernelArgSliceMut<T> + ?Sized),
    rows: usize,
    cols: usize,
    batch: usize,
    team: usize,
) -> Result<(), LaunchError> {
    const K: &str = "dense_matvec_mma";
    check_team(K, team)?;
    check_batch(K, batch)?;
    if exec.wave_lanes() != 32 || !mma_fits::<T>(w, x, cols) {
        return Err(invalid(K, format!("needs waves of 32, a 16-bit type, `cols` ({cols}) a multiple of 8 and `w`, `x` on 16 bytes")));
    }
    check_operands(K, w, x, bias, y, rows, cols, batch)?;
    let cfg = matvec_launch(rows, team)?;
    if rows == 0 {
        return Ok(());
    }
    launch_mma(exec, cfg, w, x, bias, y, rows, cols, batch, team)
}

/// Work-items of a row kernel for rows of `cols` elements: whole waves of both sizes (64),
/// one element each where the row is short, at most 1024.
fn row_threads(cols: usize) -> u32 {
    (cols.div_ceil(64) * 64).clamp(64, 1024) as u32
}

/// Chunks per work-item of the [`add_rms_norm_tile`](fn@super::add_rms_norm_tile) tiles
/// of the code `exec` runs (AMD code objects hold fewer: [`crate::row::row_chunks_on`]).
fn add_norm_chunks(exec: &(impl Executor + ?Sized), elem_bytes: usize, cols: usize) -> usize {
    if matches!(exec.memory(), kernel_dsl::host::MemLocation::Device { backend: "rocm", .. }) {
        crate::row::AMD_TILE_CHUNKS
    } else {
        crate::row::row_chunks(elem_bytes, cols)
    }
}

/// Work-items of an [`add_rms_norm_tile`](fn@super::add_rms_norm_tile) or
/// [`add_rms_norm_q8`](fn@super::add_rms_norm_q8) work-group for rows of `cols` elements
/// on tiles of `chunks` chunks: the fewest that hold the row, raised towards one chunk per
/// work-item (at most [`add_norm_max_threads`]). Decode runs one work-group per row, so a
/// row's time is one work-item's serial work (loads, conversions, the sum of squares, the
/// q8_1 codes, stores). Independent of the row count, so a row's result does not depend
/// on the batch it is in.
fn add_norm_tile_threads(cols: usize, elem_bytes: usize, chunks: usize) -> usize {
    let tile = crate::row::row_threads_for(cols, elem_bytes, chunks) as usize;
    let wide = (cols.div_ceil(crate::row::CHUNK).div_ceil(64) * 64).min(add_norm_max_threads());
    tile.max(wide)
}

/// The most work-items [`add_norm_tile_threads`] raises a row to: [`ADD_NORM_TILE_THREADS`](super::ADD_NORM_TILE_THREADS),
/// or a smaller power of two (64 or more) from `KERNELS_ADD_NORM_THREADS` (read once; an
/// A/B of the work-group width without a rebuild).
fn add_norm_max_threads() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        let most = super::ADD_NORM_TILE_THREADS;
        std::env::var("KERNELS_ADD_NORM_THREADS").ok().and_then(|v| v.trim().parse::<usize>().ok()).filter(|&n| n >= 64 && n.is_power_of_two() && n <= most).unwrap_or(most)
    })
}

/// Residual add + RMSNorm of `rows` rows of `cols` elements
/// ([`add_rms_norm`](fn@super::add_rms_norm)): `res_out = x + residual`, `out =
/// RMSNorm(res_out) * weight`; `weight` has `cols` elements, `eps` is finite and >= 0.
/// Rows that fit the register tiles of [`ADD_NORM_TILE_THREADS`](super::ADD_NORM_TILE_THREADS)
/// work-items run [`add_rms_norm_tile`](fn@super::add_rms_norm_tile), longer ones
/// [`add_rms_norm`](fn@super::add_rms_norm).
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm<T: Float + ScalarArg>(
    exec: &(impl Executor + ?Sized),
    x: &(impl KernelArgSlice<T> + ?Sized),
    residual: &(impl KernelArgSlice<T> + ?Sized),
    weight: Option<&(dyn KernelArgSlice<T> + '_)>,
    res_out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    cols: usize,
    eps: f32,
) -> Result<(), LaunchError> {
    const K: &str = "add_rms_norm";
    let n = len_of(x);
    if cols == 0 || n % cols != 0 {
        return Err(invalid(K, format!("`x` has {n} elements, not a whole number of rows of `cols` = {cols}")));
    }
    let rows = n / cols;
    let what = format!("{rows} rows of {cols}");
    check_len(K, "residual", len_of(residual), Some(n), &what)?;
    check_len(K, "res_out", len_of(res_out), Some(n), &what)?;
    check_len(K, "out", len_of(out), Some(n), &what)?;
    if let Some(w) = weight {
        check_len(K, "weight", len_of(w), Some(cols), &format!("rows of {cols}"))?;
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(invalid(K, format!("`eps` must be finite and >= 0, got {eps}")));
    }
    if rows > u32::MAX as usize || cols > u32::MAX as usize {
        return Err(invalid(K, format!("{rows} x {cols} exceeds 2^32 rows or columns")));
    }
    if rows == 0 {
        return Ok(());
    }
    let weight: &(dyn KernelArgSlice<T> + '_) = weight.unwrap_or(&[] as &[T; 0]);
    // Rows that fit the register tiles of at most ADD_NORM_TILE_THREADS work-items
    // (decode's 2048 / 4096 columns: 64 to 256 work-items with 16-byte accesses).
    let chunks = add_norm_chunks(exec, std::mem::size_of::<T>(), cols);
    let tile_threads = add_norm_tile_threads(cols, std::mem::size_of::<T>(), chunks);
    if tile_threads <= super::ADD_NORM_TILE_THREADS && tile_threads * crate::row::CHUNK * chunks >= cols {
        let cfg = LaunchConfig::new(Dim3::x(rows as u32), Dim3::x(tile_threads as u32));
        return super::add_rms_norm_tile::launch::<T>(exec, cfg, x, residual, weight, res_out, out, cols as u32, eps);
    }
    // Four elements per work-item up to 4096 columns (a smaller group reduces faster),
    // at most `ADD_NORM_REGS` (register path) up to 8192.
    let cfg = LaunchConfig::new(Dim3::x(rows as u32), Dim3::x(row_threads(cols.div_ceil(4))));
    super::add_rms_norm::launch::<T>(exec, cfg, x, residual, weight, res_out, out, cols as u32, eps)
}

/// `out [rows, inter] = SiLU(gu[.., :inter]) * gu[.., inter..]` for `gu` of `[rows, 2 *
/// inter]` ([`silu_mul`](fn@super::silu_mul)).
pub fn silu_mul<T: Float + ScalarArg>(
    exec: &(impl Executor + ?Sized),
    gu: &(impl KernelArgSlice<T> + ?Sized),
    out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    inter: usize,
) -> Result<(), LaunchError> {
    const K: &str = "silu_mul";
    let n = len_of(gu);
    if inter == 0 || n % (2 * inter) != 0 {
        return Err(invalid(K, format!("`gu` has {n} elements, not a whole number of rows of 2 x {inter}")));
    }
    check_len(K, "out", len_of(out), Some(n / 2), &format!("{} rows of {inter}", n / (2 * inter)))?;
    if n == 0 {
        return Ok(());
    }
    let cfg = LaunchConfig::new(Dim3::x((n / 2).div_ceil(256).min(65536) as u32), Dim3::x(256));
    super::silu_mul::launch::<T>(exec, cfg, gu, out, inter)
}

/// [`add_rms_norm`] (with `residual` and `res_out`) or a plain RMSNorm of `x` (without
/// them) that also writes `out`'s q8_1 codes into `xq` (`len / 4` words) and `xds` (`len /
/// 16` floats), bit for bit what [`crate::quantized::ops::quantize_q8_1`] writes for `out`
/// ([`add_rms_norm_q8`](fn@super::add_rms_norm_q8), one launch): the input of the int8
/// matvec of GGUF weights ([`crate::quantized::ops::matvec_q8_1`]). `cols` must be a
/// multiple of 32 (q8_1 blocks never span rows). Returns `Ok(false)`, with nothing
/// launched or written, where the fused kernel does not apply (rows too long for its
/// tiles, buffers that do not start on 16 bytes): the caller runs the separate kernels.
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm_q8<T: Float + ScalarArg>(
    exec: &(impl Executor + ?Sized),
    x: &(impl KernelArgSlice<T> + ?Sized),
    residual: Option<&(dyn KernelArgSlice<T> + '_)>,
    weight: Option<&(dyn KernelArgSlice<T> + '_)>,
    res_out: Option<&mut (dyn KernelArgSliceMut<T> + '_)>,
    out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    xq: &mut (impl KernelArgSliceMut<u32> + ?Sized),
    xds: &mut (impl KernelArgSliceMut<f32> + ?Sized),
    cols: usize,
    eps: f32,
) -> Result<bool, LaunchError> {
    const K: &str = "add_rms_norm_q8";
    let n = len_of(x);
    if cols == 0 || n % cols != 0 || cols % 32 != 0 {
        return Err(invalid(K, format!("`x` has {n} elements, not a whole number of rows of `cols` = {cols} (a positive multiple of 32)")));
    }
    let rows = n / cols;
    let what = format!("{rows} rows of {cols}");
    match (residual, &res_out) {
        (Some(r), Some(h)) => {
            check_len(K, "residual", len_of(r), Some(n), &what)?;
            check_len(K, "res_out", len_of(&**h), Some(n), &what)?;
        }
        (None, None) => {}
        _ => return Err(invalid(K, "`residual` and `res_out` come together (the residual add) or not at all (a plain norm)".into())),
    }
    check_len(K, "out", len_of(out), Some(n), &what)?;
    check_len(K, "xq", len_of(xq), Some(n / 4), &what)?;
    check_len(K, "xds", len_of(xds), Some(n / 16), &what)?;
    if let Some(w) = weight {
        check_len(K, "weight", len_of(w), Some(cols), &format!("rows of {cols}"))?;
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(invalid(K, format!("`eps` must be finite and >= 0, got {eps}")));
    }
    if rows > u32::MAX as usize || cols > u32::MAX as usize {
        return Err(invalid(K, format!("{rows} x {cols} exceeds 2^32 rows or columns")));
    }
    let size = std::mem::size_of::<T>();
    let chunks = add_norm_chunks(exec, size, cols);
    let threads = add_norm_tile_threads(cols, size, chunks);
    let mut aligned = [addr_of(x), addr_of(out)].iter().all(|a| a.is_multiple_of(16));
    aligned &= residual.is_none_or(|r| addr_of(r).is_multiple_of(16)) && res_out.as_ref().is_none_or(|h| addr_of(&**h).is_multiple_of(16)) && weight.is_none_or(|w| addr_of(w).is_multiple_of(16));
    if threads > super::ADD_NORM_TILE_THREADS || threads * crate::row::CHUNK * chunks < cols || !aligned {
        return Ok(false);
    }
    if rows == 0 {
        return Ok(true);
    }
    let (empty, mut empty_mut): ([T; 0], [T; 0]) = ([], []);
    let residual: &(dyn KernelArgSlice<T> + '_) = residual.unwrap_or(&empty);
    let weight: &(dyn KernelArgSlice<T> + '_) = weight.unwrap_or(&empty);
    let res_out: &mut (dyn KernelArgSliceMut<T> + '_) = match res_out {
        Some(h) => h,
        None => &mut empty_mut,
    };
    let cfg = LaunchConfig::new(Dim3::x(rows as u32), Dim3::x(threads as u32));
    super::add_rms_norm_q8::launch::<T>(exec, cfg, x, residual, weight, res_out, out, xq, xds, cols as u32, eps)?;
    Ok(true)
}

/// [`silu_mul`] that also writes `out`'s q8_1 codes into `xq` (`len / 4` words) and `xds`
/// (`len / 16` floats), bit for bit what [`crate::quantized::ops::quantize_q8_1`] writes
/// for `out` ([`silu_mul_q8`](fn@super::silu_mul_q8), one launch): the down product's
/// int8 matvec input. `inter` must be a multiple of 32.
pub fn silu_mul_q8<T: Float + ScalarArg>(
    exec: &(impl Executor + ?Sized),
    gu: &(impl KernelArgSlice<T> + ?Sized),
    out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    xq: &mut (impl KernelArgSliceMut<u32> + ?Sized),
    xds: &mut (impl KernelArgSliceMut<f32> + ?Sized),
    inter: usize,
) -> Result<(), LaunchError> {
    const K: &str = "silu_mul_q8";
    let n = len_of(gu);
    if inter == 0 || inter % 32 != 0 || n % (2 * inter) != 0 {
        return Err(invalid(K, format!("`gu` has {n} elements, not a whole number of rows of 2 x {inter} (`inter` a positive multiple of 32)")));
    }
    let what = format!("{} rows of {inter}", n / (2 * inter));
    check_len(K, "out", len_of(out), Some(n / 2), &what)?;
    check_len(K, "xq", len_of(xq), Some(n / 8), &what)?;
    check_len(K, "xds", len_of(xds), Some(n / 32), &what)?;
    if n == 0 {
        return Ok(());
    }
    let chunks = n / 2 / crate::row::CHUNK;
    let cfg = LaunchConfig::new(Dim3::x(chunks.div_ceil(256).min(65536) as u32), Dim3::x(256));
    super::silu_mul_q8::launch::<T>(exec, cfg, gu, out, xq, xds, inter)
}

/// Sampling parameters of one row of [`sample_packed`]; `Default` is greedy decoding.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 (or less): greedy (argmax).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (ties at the boundary all kept); 0: off.
    pub top_k: u32,
    /// Keep the fewest most likely tokens whose probability reaches `top_p`; 1: off.
    pub top_p: f32,
    /// Keep tokens at least `min_p` times as likely as the most likely one; 0: off.
    pub min_p: f32,
    /// Hugging Face's repetition penalty on the row's penalized ids; 1: off.
    pub repetition_penalty: f32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, repetition_penalty: 1.0 }
    }
}

impl SamplingParams {
    /// The row's [`SAMPLE_PARAMS`] values as [`sample`](fn@super::sample) reads them.
    pub fn to_row(&self) -> [f32; SAMPLE_PARAMS] {
        [self.temperature, self.top_k as f32, self.top_p, self.min_p, self.repetition_penalty]
    }

    /// Checks the values: finite, `top_p` in `(0, 1]`, `min_p` in `[0, 1]`, a positive
    /// penalty, `top_k` below 2^24 (carried exactly in `f32`).
    pub fn check(&self) -> Result<(), String> {
        let SamplingParams { temperature, top_k, top_p, min_p, repetition_penalty } = *self;
        if !temperature.is_finite() {
            return Err(format!("temperature {temperature} is not finite"));
        }
        if top_k >= 1 << 24 {
            return Err(format!("top_k {top_k} is 2^24 or more"));
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(format!("top_p {top_p} is outside (0, 1]"));
        }
        if !(0.0..=1.0).contains(&min_p) {
            return Err(format!("min_p {min_p} is outside [0, 1]"));
        }
        if !(repetition_penalty.is_finite() && repetition_penalty > 0.0) {
            return Err(format!("repetition_penalty {repetition_penalty} is not finite and positive"));
        }
        Ok(())
    }
}

/// Checks one row of packed [`sample_packed`] parameters (as [`SamplingParams::check`]).
fn check_param_row(p: &[f32]) -> Result<(), String> {
    let k = p[1];
    if !(k >= 0.0 && k < (1 << 24) as f32 && k.fract() == 0.0) {
        return Err(format!("top_k {k} is not an integer in [0, 2^24)"));
    }
    SamplingParams { temperature: p[0], top_k: k as u32, top_p: p[2], min_p: p[3], repetition_penalty: p[4] }.check()
}

/// Work-items of a [`sample`](fn@super::sample) work-group for a vocabulary of `vocab`.
fn sample_threads(vocab: usize) -> u32 {
    row_threads(vocab.div_ceil(4))
}

/// One token per row of `logits` (`[rows, vocab]`) into `out` (`rows`), by
/// [`sample`](fn@super::sample): `params` holds each row's [`SAMPLE_PARAMS`] parameters
/// ([`SamplingParams::to_row`], checked on the host by [`check_sampling_params`]: device
/// values are not read here), `penalized` `[rows, n_pen]` token ids (ids `>=
/// vocab` are padding), `keys` `[rows, 2]` Philox keys (the same key and logits give the
/// same token). `work` is `f32` scratch of `rows * vocab`.
#[allow(clippy::too_many_arguments)]
pub fn sample_packed<T: Float + ScalarArg>(
    exec: &(impl Executor + ?Sized),
    logits: &(impl KernelArgSlice<T> + ?Sized),
    params: &(impl KernelArgSlice<f32> + ?Sized),
    penalized: &(impl KernelArgSlice<u32> + ?Sized),
    keys: &(impl KernelArgSlice<u32> + ?Sized),
    out: &mut (impl KernelArgSliceMut<u32> + ?Sized),
    work: &mut (impl KernelArgSliceMut<f32> + ?Sized),
    vocab: usize,
) -> Result<(), LaunchError> {
    const K: &str = "sample";
    let rows = len_of(out);
    if vocab == 0 || vocab > u32::MAX as usize - 1 {
        return Err(invalid(K, format!("`vocab` = {vocab}; 1..2^32 - 1")));
    }
    let what = format!("{rows} rows of {vocab}");
    check_len(K, "logits", len_of(logits), rows.checked_mul(vocab), &what)?;
    check_len(K, "work", len_of(work), rows.checked_mul(vocab), &what)?;
    check_len(K, "params", len_of(params), Some(rows * SAMPLE_PARAMS), &format!("{rows} rows of {SAMPLE_PARAMS} parameters"))?;
    check_len(K, "keys", len_of(keys), Some(rows * 2), &format!("{rows} rows of 2 key words"))?;
    let np = len_of(penalized);
    if rows > 0 && np % rows != 0 {
        return Err(invalid(K, format!("`penalized` has {np} elements, not a whole number of rows for {rows} rows")));
    }
    if rows > u32::MAX as usize {
        return Err(invalid(K, format!("{rows} rows exceed 2^32")));
    }
    if rows == 0 {
        return Ok(());
    }
    let n_pen = np / rows;
    let cfg = LaunchConfig::new(Dim3::x(rows as u32), Dim3::x(sample_threads(vocab)));
    super::sample::launch::<T>(exec, cfg, logits, params, penalized, keys, out, work, vocab as u32, n_pen as u32)
}

/// Checks each row's parameters ([`SamplingParams::check`]) and packs them as
/// [`sample_packed`] reads them.
pub fn check_sampling_params(params: &[SamplingParams]) -> Result<Vec<f32>, LaunchError> {
    let mut packed = Vec::with_capacity(params.len() * SAMPLE_PARAMS);
    for (r, p) in params.iter().enumerate() {
        p.check().map_err(|e| invalid("sample", format!("`params[{r}]`: {e}")))?;
        packed.extend_from_slice(&p.to_row());
    }
    Ok(packed)
}

/// Checks packed parameter rows read back from the host (`params.len()` a multiple of
/// [`SAMPLE_PARAMS`]), as [`SamplingParams::check`].
pub fn check_packed_params(params: &[f32]) -> Result<(), LaunchError> {
    if params.len() % SAMPLE_PARAMS != 0 {
        return Err(invalid("sample", format!("`params` has {} values, not rows of {SAMPLE_PARAMS}", params.len())));
    }
    for (r, p) in params.chunks(SAMPLE_PARAMS).enumerate() {
        check_param_row(p).map_err(|e| invalid("sample", format!("`params` row {r}: {e}")))?;
    }
    Ok(())
}
