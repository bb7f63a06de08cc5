//! Graph capture and replay (`kernel_runtime::graph`) with the library's kernels: a step of
//! elementwise launches (a zero fill, `exp`, a broadcast `mul` through a shared layout
//! array, an affine map) recorded once and replayed with new inputs written into the same
//! buffers. On a GPU the replays must give the bits of the eager step (same kernels, same
//! device); on the CPU executor `StepGraph` runs the step eagerly. Both are checked against
//! an f64 reference too (f32 tolerances as in `elementwise.rs`: 2e-6 relative and absolute
//! per op, three ops: 1e-5). Runs on every executor of `common::executors`; a GPU that is
//! not there is reported as SKIPPED with the reason.
mod common;

use common::{executors, inputs};
use kernels::elementwise::{self as ew, Exp, Mul};
use kernels::runtime::{size_class, Device, DeviceVec, LaunchError, StepGraph};
use kernels::Executor;
use std::sync::Arc;

/// The tests of this file run one at a time: each opens its own handle of the GPU, and
/// while one captures, another freeing memory (`cuMemFree` when its device drops) or
/// waiting may disturb the capture. One capture per process at a time is the supported
/// use (an engine captures from one thread).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

const ROWS: usize = 37;
const COLS: usize = 129;
const N: usize = ROWS * COLS;

/// The step's buffers: `x` (rows x cols), `r` (one value per column, broadcast over rows
/// through a strided layout), the output `y`.
struct Step {
    x: DeviceVec<f32>,
    r: DeviceVec<f32>,
    layout: Arc<DeviceVec<usize>>,
    y: DeviceVec<f32>,
}

fn new_step(dev: &Device) -> Step {
    let layout = ew::strided_layout(&[ROWS, COLS], &[0, 1], COLS).unwrap();
    Step { x: dev.alloc(N).unwrap(), r: dev.alloc(COLS).unwrap(), layout: dev.upload_shared(&layout).unwrap(), y: dev.alloc(N).unwrap() }
}

/// `y = 1.5 * (exp(x) * r[col]) - 0.25` through two temporaries (one zero-filled).
fn step(dev: &Device, s: &mut Step) -> Result<(), LaunchError> {
    let mut t = dev.alloc::<f32>(N)?;
    ew::unary::launch::<f32, Exp>(dev, ew::launch_config(N), &s.x, &[], &mut t)?;
    let mut u = dev.alloc_uninit::<f32>(N)?;
    ew::binary::launch::<f32, Mul>(dev, ew::launch_config(N), &t, &[], &s.r, &*s.layout, &mut u)?;
    ew::affine::launch::<f32>(dev, ew::launch_config(N), &u, &[], &mut s.y, 1.5, -0.25)
}

fn reference(xs: &[f32], rs: &[f32]) -> Vec<f64> {
    (0..N).map(|i| 1.5 * ((xs[i] as f64).exp() * rs[i % COLS] as f64) - 0.25).collect()
}

fn step_inputs(k: u64) -> (Vec<f32>, Vec<f32>) {
    let xs = inputs(N, -3.0, 3.0, 100 + k, false).into_iter().map(|v| v as f32).collect();
    let rs = inputs(COLS, -2.0, 2.0, 200 + k, false).into_iter().map(|v| v as f32).collect();
    (xs, rs)
}

fn write_inputs(dev: &Device, s: &mut Step, xs: &[f32], rs: &[f32]) {
    dev.write(s.x.view_mut(..).unwrap(), xs).unwrap();
    dev.write(s.r.view_mut(..).unwrap(), rs).unwrap();
}

fn assert_near(got: &[f32], want: &[f64], what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(((*g as f64) - w).abs() <= 1e-5 * w.abs().max(1.0), "{what}: element {i}: {g} vs {w}");
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn replays_with_new_inputs_give_the_bits_of_the_eager_step() {
    let _serial = serial();
    for dev in executors() {
        let name = dev.name();
        let mut eager = new_step(&dev);
        let (xs, rs) = step_inputs(0);
        let mut graphed = new_step(&dev);
        write_inputs(&dev, &mut graphed, &xs, &rs);
        let mut g = StepGraph::new(&dev, graphed, step).unwrap();
        assert_eq!(g.is_graph(), dev.supports_graphs(), "{name}");
        assert_near(&dev.download(&g.state().y).unwrap(), &reference(&xs, &rs), &format!("{name}: the step new ran"));
        for k in 1..6 {
            let (xs, rs) = step_inputs(k);
            write_inputs(&dev, g.state_mut(), &xs, &rs);
            g.run().unwrap();
            let replayed = dev.download(&g.state().y).unwrap();
            write_inputs(&dev, &mut eager, &xs, &rs);
            step(&dev, &mut eager).unwrap();
            let want = dev.download(&eager.y).unwrap();
            assert_eq!(bits(&replayed), bits(&want), "{name}: run {k}: replay vs eager");
            assert_near(&replayed, &reference(&xs, &rs), &format!("{name}: run {k}"));
        }
    }
}

#[test]
fn a_thousand_replays_keep_memory_flat_and_dropping_the_graph_frees_its_pool() {
    let _serial = serial();
    for dev in executors() {
        let name = dev.name();
        let (xs, rs) = step_inputs(7);
        let mut s = new_step(&dev);
        write_inputs(&dev, &mut s, &xs, &rs);
        let mut g = StepGraph::new(&dev, s, step).unwrap();
        let warm = dev.memory_stats();
        if g.is_graph() {
            // The two temporaries, freed at the end of the captured step, stay with the graph.
            assert_eq!((warm.graph_pools, warm.graph_pool_bytes), (1, 2 * size_class(4 * N)), "{name}");
        } else {
            assert_eq!((warm.graph_pools, warm.graph_pool_bytes), (0, 0), "{name}");
        }
        for _ in 0..1000 {
            g.run().unwrap();
        }
        let y = dev.download(&g.state().y).unwrap();
        assert_near(&y, &reference(&xs, &rs), &format!("{name}: after 1000 runs"));
        let after = dev.memory_stats();
        assert_eq!(after.backend_allocations, warm.backend_allocations, "{name}: replays allocate nothing");
        assert_eq!((after.in_use_bytes, after.live_blocks), (warm.in_use_bytes, warm.live_blocks), "{name}");
        assert_eq!((after.graph_pools, after.graph_pool_bytes, after.cached_bytes), (warm.graph_pools, warm.graph_pool_bytes, warm.cached_bytes), "{name}");
        drop(g.into_state());
        let s = dev.memory_stats();
        assert_eq!((s.graph_pools, s.graph_pool_bytes), (0, 0), "{name}: the pool went back with the graph");
        assert_eq!(s.cached_bytes, warm.cached_bytes + warm.graph_pool_bytes + 2 * size_class(4 * N) + size_class(4 * COLS), "{name}: the pool and x, y, r are cached");
    }
}

/// The low-level API: an output allocated inside the capture keeps its address for every
/// replay; a read-back or a host copy inside a capture is a typed error that leaves the
/// device usable; launches from another thread during a capture are refused.
#[test]
fn captures_return_outputs_and_refuse_what_cannot_be_recorded() {
    let _serial = serial();
    for dev in executors() {
        let name = dev.name();
        let (xs, _) = step_inputs(3);
        let mut x = dev.upload(&xs).unwrap();
        if !dev.supports_graphs() {
            let e = dev.capture(|_| Ok(())).err().expect("no graphs on the CPU executor");
            assert!(matches!(e, LaunchError::Capture { op: "capture", .. }), "{name}: {e}");
            continue;
        }
        // Eager first: the kernel is loaded outside the capture.
        let mut warm = dev.alloc_uninit::<f32>(N).unwrap();
        ew::unary::launch::<f32, Exp>(&dev, ew::launch_config(N), &x, &[], &mut warm).unwrap();
        let (graph, y) = dev
            .capture(|d| {
                let mut y = d.alloc_uninit::<f32>(N)?;
                ew::unary::launch::<f32, Exp>(d, ew::launch_config(N), &x, &[], &mut y)?;
                Ok(y)
            })
            .unwrap();
        for k in 0..3u64 {
            let (xs, _) = step_inputs(10 + k);
            dev.write(x.view_mut(..).unwrap(), &xs).unwrap();
            graph.replay().unwrap();
            let got = dev.download(&y).unwrap();
            let want: Vec<f64> = xs.iter().map(|v| (*v as f64).exp()).collect();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(((*g as f64) - w).abs() <= 2e-6 * w.abs().max(1.0), "{name}: replay {k}: element {i}: {g} vs {w}");
            }
        }
        drop(y);
        drop(graph);

        let before = dev.memory_stats();
        let e = dev
            .capture(|d| {
                let mut y = d.alloc_uninit::<f32>(N)?;
                ew::unary::launch::<f32, Exp>(d, ew::launch_config(N), &x, &[], &mut y)?;
                d.download(&y)
            })
            .err()
            .expect("a read-back inside a capture");
        assert!(matches!(e, LaunchError::Capture { op: "download", .. }), "{name}: {e}");
        let e = dev.capture(|d| d.write(x.view_mut(..).unwrap(), &xs)).err().expect("a host copy inside a capture");
        assert!(matches!(e, LaunchError::Capture { op: "write", .. }), "{name}: {e}");
        let e = dev
            .capture(|d| {
                std::thread::scope(|s| {
                    s.spawn(|| {
                        let mut z = d.alloc_uninit::<f32>(N)?;
                        ew::unary::launch::<f32, Exp>(d, ew::launch_config(N), &x, &[], &mut z)
                    })
                    .join()
                    .unwrap()
                })
            })
            .err()
            .expect("a launch from another thread during a capture");
        assert!(matches!(e, LaunchError::Capture { .. }), "{name}: {e}");
        assert!(!dev.is_capturing(), "{name}");
        let s = dev.memory_stats();
        assert_eq!((s.graph_pools, s.graph_pool_bytes, s.in_use_bytes), (0, 0, before.in_use_bytes), "{name}: failed captures keep nothing");
        // Still usable eagerly.
        let (xs, _) = step_inputs(20);
        dev.write(x.view_mut(..).unwrap(), &xs).unwrap();
        ew::unary::launch::<f32, Exp>(&dev, ew::launch_config(N), &x, &[], &mut warm).unwrap();
        let got = dev.download(&warm).unwrap();
        assert!((got[5] as f64 - (xs[5] as f64).exp()).abs() <= 2e-6 * (xs[5] as f64).exp().max(1.0), "{name}");
    }
}
