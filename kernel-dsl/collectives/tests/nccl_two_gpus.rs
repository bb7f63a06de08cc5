//! NCCL (cuda feature) / RCCL (rocm feature) on two GPUs against host computations: rank
//! threads joining through a unique id, one thread driving both GPUs in a group, and a
//! collective recorded in a graph and replayed with new inputs.
//!
//! Needs two GPUs and the library (`NCCL_LIBRARY` / `RCCL_LIBRARY` or the default names);
//! without them each test says SKIPPED and why on stderr and passes, unless
//! `COLLECTIVES_REQUIRE_GPU=1`, which makes that a failure (the 2-GPU CI run sets it).
#![cfg(any(feature = "cuda", feature = "rocm"))]
use half::bf16;
use kernel_collectives::{group, Backend, Collective, Communicator, Library, ReduceOp};
use kernel_runtime::Device;
use std::sync::Arc;

/// GPU `ordinal`: CUDA with the `cuda` feature, else HIP.
fn open(ordinal: usize) -> Result<Device, String> {
    let d = if cfg!(feature = "cuda") { Device::cuda(ordinal) } else { Device::rocm(ordinal) };
    d.map_err(|e| format!("GPU {ordinal}: {e}"))
}

fn backend(dev: &Device) -> Backend {
    match dev {
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => Backend::Nccl,
        _ => Backend::Rccl,
    }
}

/// A line on stderr past the test harness's output capture.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// The library, or `None` after saying why the test is skipped.
fn setup(test: &str) -> Option<Arc<Library>> {
    let reason = match (open(0), open(1)) {
        (Ok(d), Ok(_)) => match Library::load(backend(&d)) {
            Ok(lib) => {
                say(&format!("{test}: {lib:?}"));
                return Some(lib);
            }
            Err(e) => e.to_string(),
        },
        (Err(e), _) | (_, Err(e)) => format!("needs 2 GPUs: {e}"),
    };
    if std::env::var("COLLECTIVES_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("{test}: {reason} (COLLECTIVES_REQUIRE_GPU=1)");
    }
    say(&format!("SKIPPED {test}: {reason}"));
    None
}

/// Rank `r`'s input: small integers, exact in f32 and bf16 whatever the reduction order.
fn input(r: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| ((i * 5 + r * 3) % 9) as f32 - 4.0).collect()
}

/// Runs one thread per GPU, joined through one unique id: `setup(rank, device)` allocates
/// the rank's buffers, then (after every rank has) `body(rank, comm, buffers)`.
///
/// Why the barrier: with one thread per GPU in one process, a `cuMemAlloc` on one GPU can
/// wait for an NCCL kernel on the other that waits for this rank (NCCL's documented
/// thread-per-GPU hazard). Allocating everything before the first collective avoids it:
/// the caching allocator then reuses blocks and calls `cuMemAlloc` no more.
fn on_ranks<S: Send, R: Send>(lib: &Library, n: usize, setup: impl Fn(usize, &Device) -> S + Sync, body: impl Fn(usize, &Communicator, S) -> R + Sync) -> Vec<R> {
    let id = lib.unique_id().unwrap();
    // What another process would receive: the id as hex.
    let hex = id.to_hex();
    let barrier = std::sync::Barrier::new(n);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (setup, body, hex, barrier) = (&setup, &body, &hex, &barrier);
                s.spawn(move || {
                    let dev = open(r).unwrap();
                    let c = Communicator::init_rank(&dev, n, r, &hex.parse().unwrap()).unwrap();
                    assert_eq!((c.rank(), c.world_size()), (r, n));
                    let state = setup(r, &dev);
                    dev.synchronize().unwrap();
                    barrier.wait();
                    body(r, &c, state)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn all_reduce_all_gather_broadcast_reduce_scatter_on_two_gpus() {
    let Some(lib) = setup("collectives_on_two_gpus") else { return };
    let (n, len) = (2, 1000);
    let out = on_ranks(
        &lib,
        n,
        |r, dev| {
            let x = dev.upload(&input(r, len)).unwrap();
            let sum = dev.upload(&input(r, len)).unwrap();
            let max = dev.alloc::<f32>(len).unwrap();
            let xb = dev.upload(&input(r, len).into_iter().map(bf16::from_f32).collect::<Vec<_>>()).unwrap();
            let sum_b = dev.alloc::<bf16>(len).unwrap();
            let gathered = dev.alloc::<f32>(len * n).unwrap();
            let b = dev.upload(&input(r, len)).unwrap();
            let scattered = dev.alloc::<f32>(len / n).unwrap();
            (x, sum, max, xb, sum_b, gathered, b, scattered)
        },
        |_, c, (x, mut sum, mut max, xb, mut sum_b, mut gathered, mut b, mut scattered)| {
            let dev = c.device().clone();
            c.all_reduce_in_place(sum.view_mut(..).unwrap(), ReduceOp::Sum).unwrap();
            c.all_reduce(x.view(..).unwrap(), max.view_mut(..).unwrap(), ReduceOp::Max).unwrap();
            c.all_reduce(xb.view(..).unwrap(), sum_b.view_mut(..).unwrap(), ReduceOp::Sum).unwrap();
            c.all_gather(x.view(..).unwrap(), gathered.view_mut(..).unwrap()).unwrap();
            c.broadcast(b.view_mut(..).unwrap(), 1).unwrap();
            c.reduce_scatter(x.view(..).unwrap(), scattered.view_mut(..).unwrap(), ReduceOp::Sum).unwrap();
            // A bad length is refused before anything is queued (the ranks stay in step).
            let e = c.all_gather(x.view(..).unwrap(), scattered.view_mut(..).unwrap()).unwrap_err();
            assert!(e.to_string().contains("all_gather"), "{e}");
            dev.synchronize().unwrap();
            (
                dev.download(&sum).unwrap(),
                dev.download(&max).unwrap(),
                dev.download(&sum_b).unwrap().into_iter().map(bf16::to_f32).collect::<Vec<_>>(),
                dev.download(&gathered).unwrap(),
                dev.download(&b).unwrap(),
                dev.download(&scattered).unwrap(),
            )
        },
    );
    let (a, b) = (input(0, len), input(1, len));
    let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    let max: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x.max(*y)).collect();
    let gathered = [a.clone(), b.clone()].concat();
    for (r, (s, m, sb, g, bc, sc)) in out.into_iter().enumerate() {
        assert_eq!(s, sum, "all_reduce sum, rank {r}");
        assert_eq!(m, max, "all_reduce max, rank {r}");
        assert_eq!(sb, sum, "bf16 all_reduce sum (exact: small integers), rank {r}");
        assert_eq!(g, gathered, "all_gather, rank {r}");
        assert_eq!(bc, b, "broadcast from rank 1, rank {r}");
        assert_eq!(sc, sum[r * len / 2..(r + 1) * len / 2], "reduce_scatter, rank {r}");
    }
}

#[test]
fn one_thread_drives_both_gpus_in_a_group() {
    if setup("one_thread_drives_both_gpus").is_none() {
        return;
    }
    let devs = [open(0).unwrap(), open(1).unwrap()];
    let comms = Communicator::init_all(&devs).unwrap();
    let len = 4096;
    let mut bufs: Vec<_> = devs.iter().enumerate().map(|(r, d)| d.upload(&input(r, len)).unwrap()).collect();
    group(|g| {
        for (c, b) in comms.iter().zip(bufs.iter_mut()) {
            g.all_reduce_in_place(c, b.view_mut(..)?, ReduceOp::Sum)?;
        }
        Ok(())
    })
    .unwrap();
    let want: Vec<f32> = input(0, len).iter().zip(input(1, len)).map(|(x, y)| x + y).collect();
    for (r, d) in devs.iter().enumerate() {
        assert_eq!(d.download(&bufs[r]).unwrap(), want, "rank {r}");
    }
}

#[test]
fn all_reduce_inside_a_captured_graph_replays_with_new_inputs() {
    let Some(lib) = setup("all_reduce_in_a_graph") else { return };
    let len = 3000;
    let out = on_ranks(
        &lib,
        2,
        |r, dev| (dev.upload(&input(r, len)).unwrap(), dev.alloc::<f32>(len).unwrap()),
        |r, c, (mut x, mut y)| {
            let dev = c.device().clone();
            // Once eagerly (NCCL sets up its connections), then recorded.
            c.all_reduce(x.view(..).unwrap(), y.view_mut(..).unwrap(), ReduceOp::Sum).unwrap();
            dev.synchronize().unwrap();
            let (graph, ()) = dev
                .capture(|_| {
                    c.all_reduce(x.view(..)?, y.view_mut(..)?, ReduceOp::Sum)?;
                    Ok(())
                })
                .unwrap();
            let mut got = Vec::new();
            for step in 0..3 {
                dev.write(x.view_mut(..).unwrap(), &input(r + 10 * step, len)).unwrap();
                graph.replay().unwrap();
                got.push(dev.download(&y).unwrap());
            }
            got
        },
    );
    for step in 0..3 {
        let want: Vec<f32> = input(10 * step, len).iter().zip(input(1 + 10 * step, len)).map(|(a, b)| a + b).collect();
        for (r, got) in out.iter().enumerate() {
            assert_eq!(got[step], want, "replay {step}, rank {r}");
        }
    }
}
