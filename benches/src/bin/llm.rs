//! The LLM kernel families on the shapes a Candle LLM worker runs them at, timed with GPU
//! events: softmax, RMSNorm, LayerNorm, reductions, rotary embeddings and indexing.
//!
//! `llm [--out DIR] [--quick] [--sweep] [--sweep-norms] [--profile]`: writes `DIR/rust_llm.json`; `python/torch_llm.py` times the
//! same ops and shapes in PyTorch and `python/report_llm.py` merges both.
use benches::{time, Args};
use half::bf16;
use kernel_dsl::host::{Executor, ScalarArg};
use kernel_dsl::Float;
use kernels::reduce::{self, ArgMax, Max, Sum};
use kernels::runtime::{Device, DeviceVec};
use kernels::{norm, rope, softmax};
use std::io::Write;

/// One measurement: `moved` = bytes an ideal kernel reads and writes once.
struct Sample {
    op: String,
    dtype: &'static str,
    shape: String,
    moved: usize,
    us: f64,
}

impl Sample {
    fn gbps(&self) -> f64 {
        benches::gbps(self.moved, self.us)
    }
}

/// Deterministic values in [-4, 4).
fn data<T: Float>(n: usize, seed: u64) -> Vec<T> {
    benches::uniform(n, seed, 4.0)
}

fn shape(dims: &[usize]) -> String {
    dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x")
}

struct Bench<'a> {
    dev: &'a Device,
    out: Vec<Sample>,
}

impl Bench<'_> {
    fn record(&mut self, op: &str, dtype: &'static str, dims: &[usize], moved: usize, us: f64) {
        let s = Sample { op: op.into(), dtype, shape: shape(dims), moved, us };
        eprintln!("{:>16} {:<5} {:>16} {:>10.2} us {:>8.1} GB/s", s.op, s.dtype, s.shape, s.us, s.gbps());
        self.out.push(s);
    }

    fn rows<T: Float + ScalarArg>(&mut self, rows: usize, cols: usize) {
        let dev = self.dev;
        let sz = std::mem::size_of::<T>();
        let x = dev.upload(&data::<T>(rows * cols, 1)).unwrap();
        let w = dev.upload(&data::<T>(cols, 2)).unwrap();
        let b = dev.upload(&data::<T>(cols, 3)).unwrap();
        let mut y: DeviceVec<T> = dev.alloc(rows * cols).unwrap();
        let bytes = rows * cols * sz;
        let us = time(dev, bytes, || softmax::softmax_last_dim::<T>(dev, &x, &mut y, cols).unwrap());
        self.record("softmax", T::NAME, &[rows, cols], 2 * bytes, us);
        let us = time(dev, bytes, || norm::rms_norm_rows::<T>(dev, &x, Some(&w), &mut y, cols, 1e-5).unwrap());
        self.record("rms_norm", T::NAME, &[rows, cols], 2 * bytes + cols * sz, us);
        let us = time(dev, bytes, || norm::layer_norm_rows::<T>(dev, &x, Some(&w), Some(&b), &mut y, cols, 1e-5).unwrap());
        self.record("layer_norm", T::NAME, &[rows, cols], 2 * bytes + 2 * cols * sz, us);
    }

    /// Softmax and RMSNorm at one shape with every work-group size, to tune
    /// `row::row_threads` (printed only).
    fn sweep<T: Float + ScalarArg>(&mut self, rows: usize, cols: usize) {
        let dev = self.dev;
        let x = dev.upload(&data::<T>(rows * cols, 1)).unwrap();
        let w = dev.upload(&data::<T>(cols, 2)).unwrap();
        let mut y: DeviceVec<T> = dev.alloc(rows * cols).unwrap();
        let bytes = rows * cols * std::mem::size_of::<T>();
        for threads in [128u32, 256, 512, 1024] {
            let cfg = kernel_dsl::host::LaunchConfig::new(kernel_dsl::Dim3::x(rows as u32), kernel_dsl::Dim3::x(threads));
            let a = time(dev, bytes, || softmax::softmax::launch::<T>(dev, cfg, &x, &mut y, cols as u32).unwrap());
            let b = time(dev, bytes, || norm::rms_norm::launch::<T>(dev, cfg, &x, &w, &mut y, cols as u32, 1e-5).unwrap());
            // LayerNorm's tile holds the row only from the work-group size its launcher picks up.
            let fits = cols <= kernels::row::row_chunks(std::mem::size_of::<T>(), cols) * kernels::row::CHUNK * threads as usize;
            let c = if fits { time(dev, bytes, || norm::layer_norm::launch::<T>(dev, cfg, &x, &w, &w, &mut y, cols as u32, 1e-5).unwrap()) } else { f64::NAN };
            let gb = |us: f64| 2.0 * bytes as f64 / us / 1e3;
            println!(
                "sweep {:<5} {rows}x{cols} threads {threads:>4}: softmax {a:8.2} us {:6.0} GB/s, rms_norm {b:8.2} us {:6.0} GB/s, layer_norm {c:8.2} us {:6.0} GB/s",
                T::NAME,
                gb(a),
                gb(b),
                gb(c)
            );
        }
    }

    /// The norms of `rows x cols` with each choice of affine parameters (what the weight and
    /// the bias cost on top of the row's own traffic).
    fn sweep_norm_params<T: Float + ScalarArg>(&mut self, rows: usize, cols: usize) {
        let dev = self.dev;
        let x = dev.upload(&data::<T>(rows * cols, 1)).unwrap();
        let w = dev.upload(&data::<T>(cols, 2)).unwrap();
        let bias = dev.upload(&data::<T>(cols, 3)).unwrap();
        let mut y: DeviceVec<T> = dev.alloc(rows * cols).unwrap();
        let bytes = rows * cols * std::mem::size_of::<T>();
        let gb = |us: f64| 2.0 * bytes as f64 / us / 1e3;
        for (name, wp, bp) in [("weight and bias", true, true), ("weight", true, false), ("bias", false, true), ("none", false, false)] {
            let us = time(dev, bytes, || norm::layer_norm_rows::<T>(dev, &x, wp.then_some(&w), bp.then_some(&bias), &mut y, cols, 1e-5).unwrap());
            println!("sweep {:<5} layer_norm {rows}x{cols} {name:<16}: {us:8.2} us {:6.0} GB/s", T::NAME, gb(us));
        }
        for (name, wp) in [("weight", true), ("none", false)] {
            let us = time(dev, bytes, || norm::rms_norm_rows::<T>(dev, &x, wp.then_some(&w), &mut y, cols, 1e-5).unwrap());
            println!("sweep {:<5} rms_norm   {rows}x{cols} {name:<16}: {us:8.2} us {:6.0} GB/s", T::NAME, gb(us));
        }
    }

    /// The column sum of `rows x cols` over dim 0 with each split count of its first pass
    /// (what [`reduce::vec_col_splits`] picks from).
    fn sweep_col_splits<T: Float + ScalarArg>(&mut self, rows: usize, cols: usize) {
        let dev = self.dev;
        let x = dev.upload(&data::<T>(rows * cols, 4)).unwrap();
        let mut y: DeviceVec<T> = dev.alloc(cols).unwrap();
        let bytes = rows * cols * std::mem::size_of::<T>();
        for splits in [1usize, 4, 8, 16, 32, 64] {
            let us = time(dev, bytes, || reduce::reduce_long_columns::<T, Sum>(dev, &x, (1, rows, cols), splits, &mut y).unwrap());
            println!("sweep {:<5} sum over dim 0 of {rows}x{cols}, {splits:>2} splits: {us:8.2} us {:6.0} GB/s", T::NAME, bytes as f64 / us / 1e3);
        }
    }

    /// `cat` of three 4096 x 1024 inputs along dim 1: `ops::cat`, and `cat_rows` with the
    /// work-group rows of `rows_config` and with 1/2 .. 1/8 of them (each work-item then
    /// copies several rows in turn). H100, 2026-11-23: the fractions ran faster than the
    /// full grid in this sweep but slower inside `bench-llm`'s table (cat_dim1 bf16 19.1 ->
    /// 20.4 us with 1/8 and two rows per step), so `ops::cat` keeps the full grid.
    fn sweep_cat<T: Float + ScalarArg + kernels::indexing::Pod>(&mut self) {
        let dev = self.dev;
        let (rows, w) = (4096usize, 1024usize);
        let parts: Vec<DeviceVec<T>> = (0..3).map(|k| dev.upload(&data::<T>(rows * w, 11 + k)).unwrap()).collect();
        let mut out: DeviceVec<T> = dev.alloc(3 * rows * w).unwrap();
        let none: DeviceVec<T> = dev.alloc(0).unwrap();
        let bytes = 3 * rows * w * std::mem::size_of::<T>();
        let units = w * std::mem::size_of::<T>() / 16;
        let shape = [rows, w];
        let inputs: Vec<(&DeviceVec<T>, &[usize])> = parts.iter().map(|p| (p, &shape[..])).collect();
        let us = time(dev, bytes, || kernels::indexing::ops::cat::<T, DeviceVec<T>>(dev, &inputs, 1, &mut out).unwrap());
        println!("sweep {:<5} cat 3x{rows}x{w} dim 1, ops::cat: {us:8.2} us {:6.0} GB/s", T::NAME, 2.0 * bytes as f64 / us / 1e3);
        for div in [1u32, 2, 4, 8] {
            let mut cfg = kernels::indexing::rows_config(rows, units);
            cfg.grid.y = cfg.grid.y.div_ceil(div);
            cfg.grid.z = 3;
            let us = time(dev, bytes, || {
                kernels::indexing::cat_rows::launch::<T>(dev, cfg, &parts[0], &parts[1], &parts[2], &none, &mut out, rows, 3 * w, 0, w, w, w, 0).unwrap()
            });
            println!("sweep {:<5} cat 3x{rows}x{w} dim 1, grid y / {div}: {us:8.2} us {:6.0} GB/s", T::NAME, 2.0 * bytes as f64 / us / 1e3);
        }
    }

    /// The ordered `scatter_add` of the benchmark table (4096 x 4096, sources of row i to
    /// row `ids[i]` in every column) with the slab kernel at each wave count per work-group.
    fn sweep_scatter<T: Float + ScalarArg + kernels::indexing::Pod>(&mut self) {
        let dev = self.dev;
        let (r, c) = (4096usize, 4096usize);
        let m = r * c;
        let sz = std::mem::size_of::<T>();
        let x = dev.upload(&data::<T>(m, 9)).unwrap();
        let mut y: DeviceVec<T> = dev.alloc(m).unwrap();
        let sids: Vec<u32> = (0..m).map(|i| ((i / c) as u64 * 2654435761 % r as u64) as u32).collect();
        let dsids = dev.upload(&sids).unwrap();
        let moved = m * sz + m * 4 + 2 * m * sz;
        // The wave counts the launch shape allows.
        for (waves, cfg) in [1u32, 2, 4, 8].into_iter().filter_map(|w| Some((w, kernels::indexing::slab_config::<T, u32>(1, r, c, dev.wave_lanes(), w)?))) {
            let us = time(dev, m * sz, || kernels::indexing::scatter_add_slab::launch::<T, u32>(dev, cfg, &x, &dsids, &mut y, 1, r, r, c, &[] as &[u32; 0]).unwrap());
            println!("sweep {:<5} scatter_add {r}x{c} slab, {waves} waves per work-group: {us:8.2} us {:6.0} GB/s", T::NAME, moved as f64 / us / 1e3);
        }
        // What `ops::scatter_add` runs here: the claim pass, then every source added at once.
        let us = time(dev, m * sz, || kernels::indexing::ops::scatter_add::<T, u32>(dev, &x, &dsids, &mut y, 1, r, r, c).unwrap());
        println!("sweep {:<5} scatter_add {r}x{c} ops (claimed): {us:8.2} us {:6.0} GB/s", T::NAME, moved as f64 / us / 1e3);
    }

    fn reductions<T: Float + ScalarArg>(&mut self, rows: usize, cols: usize) {
        let dev = self.dev;
        let sz = std::mem::size_of::<T>();
        let x = dev.upload(&data::<T>(rows * cols, 4)).unwrap();
        let bytes = rows * cols * sz;
        let (dims, strides) = ([rows, cols], [cols, 1]);
        let mut yr: DeviceVec<T> = dev.alloc(rows).unwrap();
        let us = time(dev, bytes, || reduce::reduce::<T, Sum>(dev, &x, &dims, &strides, &[1], &mut yr).unwrap());
        self.record("sum_last", T::NAME, &dims, bytes + rows * sz, us);
        let us = time(dev, bytes, || reduce::reduce::<T, Max>(dev, &x, &dims, &strides, &[1], &mut yr).unwrap());
        self.record("max_last", T::NAME, &dims, bytes + rows * sz, us);
        let mut yc: DeviceVec<T> = dev.alloc(cols).unwrap();
        let us = time(dev, bytes, || reduce::reduce::<T, Sum>(dev, &x, &dims, &strides, &[0], &mut yc).unwrap());
        self.record("sum_first", T::NAME, &dims, bytes + cols * sz, us);
        let mut yi: DeviceVec<u32> = dev.alloc(rows).unwrap();
        let us = time(dev, bytes, || reduce::arg_reduce::<T, ArgMax>(dev, &x, &dims, &strides, &[1], &mut yi).unwrap());
        self.record("argmax_last", T::NAME, &dims, bytes + rows * 4, us);
    }

    /// Rotary embeddings for `b` sequences of `t` tokens, 32 heads of 128.
    fn rope<T: Float + ScalarArg>(&mut self, b: usize, t: usize) {
        let dev = self.dev;
        let (h, d) = (32, 128);
        let sz = std::mem::size_of::<T>();
        let n = b * h * t * d;
        let x = dev.upload(&data::<T>(n, 5)).unwrap();
        let cos = dev.upload(&data::<T>(t * d / 2, 6)).unwrap();
        let sin = dev.upload(&data::<T>(t * d / 2, 7)).unwrap();
        let mut y: DeviceVec<T> = dev.alloc(n).unwrap();
        let moved = 2 * n * sz + t * d * sz;
        let shape = rope::RopeShape::new(b, h, t, d);
        let us = time(dev, n * sz, || rope::apply_rope_i(dev, &x, &cos, &sin, &mut y, &shape).unwrap());
        self.record("rope_i", T::NAME, &[b, h, t, d], moved, us);
        let us = time(dev, n * sz, || rope::apply_rope(dev, &x, &cos, &sin, &mut y, &shape).unwrap());
        self.record("rope", T::NAME, &[b, h, t, d], moved, us);
        let us = time(dev, n * sz, || rope::apply_rope_thd(dev, &x, &cos, &sin, &mut y, &shape).unwrap());
        self.record("rope_thd", T::NAME, &[b, t, h, d], moved, us);
    }

    /// Indexing on LLM shapes: the embedding lookup (`index_select` of `n` token rows from a
    /// 32000 x 4096 table), `where_cond` and `cat` of 4096 x 4096 data, and `scatter_add`
    /// of 4096 x 4096 values into 4096 rows.
    fn indexing<T: Float + ScalarArg + kernels::indexing::Pod>(&mut self, n: usize) {
        use kernels::indexing::ops;
        let dev = self.dev;
        let sz = std::mem::size_of::<T>();
        let (vocab, hidden) = (32000, 4096);
        let table = dev.upload(&data::<T>(vocab * hidden, 8)).unwrap();
        let ids: Vec<u32> = (0..n).map(|i| ((i as u64 * 2654435761) % vocab as u64) as u32).collect();
        let dids = dev.upload(&ids).unwrap();
        let mut emb: DeviceVec<T> = dev.alloc(n * hidden).unwrap();
        let moved = 2 * n * hidden * sz + n * 4;
        let us = time(dev, n * hidden * sz, || ops::index_select::<T, u32>(dev, &table, None, &dids, &mut emb, 1, vocab, hidden).unwrap());
        self.record("index_select", T::NAME, &[n, vocab, hidden], moved, us);
        drop((table, emb));
        if n < 4096 {
            return;
        }
        let m = 4096 * 4096;
        let (a, b) = (dev.upload(&data::<T>(m, 9)).unwrap(), dev.upload(&data::<T>(m, 10)).unwrap());
        let cond: Vec<u8> = (0..m).map(|i| (i * 7 % 3 == 0) as u8).collect();
        let dc = dev.upload(&cond).unwrap();
        let mut y: DeviceVec<T> = dev.alloc(m).unwrap();
        let us = time(dev, m * sz, || ops::where_cond::<T, u8>(dev, (&dc, None), (&a, None), (&b, None), &mut y).unwrap());
        self.record("where_cond", T::NAME, &[4096, 4096], 3 * m * sz + m, us);
        // cat of three 4096 x 1024 inputs along dim 1.
        let parts: Vec<DeviceVec<T>> = (0..3).map(|k| dev.upload(&data::<T>(4096 * 1024, 11 + k)).unwrap()).collect();
        let shape = [4096usize, 1024];
        let inputs: Vec<(&DeviceVec<T>, &[usize])> = parts.iter().map(|p| (p, &shape[..])).collect();
        let mut cat_out: DeviceVec<T> = dev.alloc(3 * 4096 * 1024).unwrap();
        let us = time(dev, 3 * 4096 * 1024 * sz, || ops::cat::<T, DeviceVec<T>>(dev, &inputs, 1, &mut cat_out).unwrap());
        self.record("cat_dim1", T::NAME, &[3, 4096, 1024], 2 * 3 * 4096 * 1024 * sz, us);
        drop((parts, cat_out));
        let sids: Vec<u32> = (0..m).map(|i| ((i / 4096) as u64 * 2654435761 % 4096) as u32).collect();
        let dsids = dev.upload(&sids).unwrap();
        let us = time(dev, m * sz, || ops::scatter_add::<T, u32>(dev, &a, &dsids, &mut y, 1, 4096, 4096, 4096).unwrap());
        self.record("scatter_add", T::NAME, &[4096, 4096], m * sz + m * 4 + 2 * m * sz, us);
        if T::NAME == "f32" {
            let (a32, mut y32) = (dev.upload(&data::<f32>(m, 9)).unwrap(), dev.alloc::<f32>(m).unwrap());
            let us = time(dev, m * 4, || ops::scatter_add_unordered::<u32>(dev, &a32, &dsids, &mut y32, 1, 4096, 4096, 4096).unwrap());
            self.record("scatter_add_unordered", "f32", &[4096, 4096], m * 4 + m * 4 + 2 * m * 4, us);
        }
    }
}

fn main() {
    let args = Args::from_env();
    let out_dir = args.out_dir();
    let quick = args.quick();
    let Some(dev) = benches::gpu() else { return };
    let mut b = Bench { dev: &dev, out: Vec::new() };

    // Device-to-device copy of 256 MiB: the bandwidth the others are measured against.
    let cb = 256 << 20;
    let us = benches::copy_us(&dev, cb);
    b.record("copy", "u8", &[cb], 2 * cb, us);

    if args.has("--profile") {
        // One launch each of the kernels the README's profile section discusses, for
        // `ncu ./llm --profile` (4096 x 4096, the shape of the benchmark table).
        let (r, c) = (4096usize, 4096usize);
        for bf in [false, true] {
            macro_rules! once {
                ($t:ty) => {{
                    let x = dev.upload(&data::<$t>(r * c, 1)).unwrap();
                    let w = dev.upload(&data::<$t>(c, 2)).unwrap();
                    let b = dev.upload(&data::<$t>(c, 3)).unwrap();
                    let mut y: DeviceVec<$t> = dev.alloc(r * c).unwrap();
                    norm::rms_norm_rows::<$t>(&dev, &x, Some(&w), &mut y, c, 1e-5).unwrap();
                    norm::layer_norm_rows::<$t>(&dev, &x, Some(&w), Some(&b), &mut y, c, 1e-5).unwrap();
                    softmax::softmax_last_dim::<$t>(&dev, &x, &mut y, c).unwrap();
                    let mut s: DeviceVec<$t> = dev.alloc(r).unwrap();
                    reduce::reduce::<$t, Sum>(&dev, &x, &[r, c], &[c, 1], &[1], &mut s).unwrap();
                    // The ordered scatter_add of the table (sources r of all columns to row
                    // ids[r]), into y.
                    let sids: Vec<u32> = (0..r * c).map(|i| ((i / c) as u64 * 2654435761 % r as u64) as u32).collect();
                    let dsids = dev.upload(&sids).unwrap();
                    kernels::indexing::ops::scatter_add::<$t, u32>(&dev, &x, &dsids, &mut y, 1, r, r, c).unwrap();
                }};
            }
            if bf { once!(bf16) } else { once!(f32) }
        }
        dev.synchronize().unwrap();
        return;
    }
    if args.has("--sweep-norms") {
        for (r, c) in [(4096, 4096), (4096, 8192), (2048, 16384), (1024, 32768)] {
            b.sweep_norm_params::<bf16>(r, c);
            b.sweep_norm_params::<f32>(r, c);
        }
        return;
    }
    if args.has("--sweep") {
        for (r, c) in [(4096, 4096), (4096, 8192), (2048, 16384), (1024, 32768)] {
            b.sweep::<f32>(r, c);
            b.sweep::<bf16>(r, c);
        }
        b.sweep_col_splits::<f32>(4096, 4096);
        b.sweep_col_splits::<bf16>(4096, 4096);
        b.sweep_cat::<f32>();
        b.sweep_cat::<bf16>();
        b.sweep_scatter::<f32>();
        b.sweep_scatter::<bf16>();
        return;
    }
    let row_shapes: &[(usize, usize)] = if quick {
        &[(64, 4096), (4096, 4096)]
    } else {
        &[(1, 4096), (64, 4096), (4096, 4096), (64, 8192), (4096, 8192), (2048, 16384), (1024, 32768), (32768, 256)]
    };
    for &(r, c) in row_shapes {
        b.rows::<f32>(r, c);
        b.rows::<bf16>(r, c);
    }
    for &(r, c) in if quick { &[(4096usize, 4096usize)][..] } else { &[(4096, 4096), (64, 32000)][..] } {
        b.reductions::<f32>(r, c);
        b.reductions::<bf16>(r, c);
    }
    for &(bs, t) in if quick { &[(1usize, 4096usize)][..] } else { &[(1, 1), (64, 1), (1, 4096), (8, 1024)][..] } {
        b.rope::<f32>(bs, t);
        b.rope::<bf16>(bs, t);
    }
    for &n in if quick { &[4096usize][..] } else { &[64, 4096][..] } {
        b.indexing::<f32>(n);
        b.indexing::<bf16>(n);
    }

    let path = format!("{out_dir}/rust_llm.json");
    let mut f = std::fs::File::create(&path).expect("create json");
    writeln!(f, "{{\"device\":\"{}\",\"samples\":[", dev.name()).unwrap();
    for (i, s) in b.out.iter().enumerate() {
        let sep = if i + 1 < b.out.len() { "," } else { "" };
        writeln!(
            f,
            "{{\"op\":\"{}\",\"dtype\":\"{}\",\"shape\":\"{}\",\"moved\":{},\"us\":{:.3},\"gbps\":{:.2}}}{sep}",
            s.op,
            s.dtype,
            s.shape,
            s.moved,
            s.us,
            s.gbps()
        )
        .unwrap();
    }
    writeln!(f, "]}}").unwrap();
    println!("wrote {path}");
}
