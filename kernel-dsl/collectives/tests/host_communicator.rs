//! The host communicator (CPU-executor devices) against plain host computations, and the
//! typed errors of both communicators. Runs without a GPU.
use half::{bf16, f16};
use kernel_collectives::{group, Backend, Collective, CollectiveError, CollectiveType, Communicator, HostGroup, Library, NcclCommunicator, ReduceOp, UniqueId};
use kernel_runtime::{Device, WaveSize};
use std::time::Duration;

fn cpu() -> Device {
    Device::cpu(WaveSize::W32)
}

/// Rank `r`'s input: varies by rank and element, integers in -3..=3 (exact in every type;
/// products of 4 ranks stay within bf16's 8 significant bits, so the reduction order
/// does not matter and results compare exactly).
fn input<T: From<i8>>(r: usize, len: usize) -> Vec<T> {
    (0..len).map(|i| T::from(((i * 7 + r * 13) % 7) as i8 - 3)).collect()
}

fn host_reduce(inputs: &[Vec<f64>], op: ReduceOp) -> Vec<f64> {
    (0..inputs[0].len())
        .map(|i| {
            let vals = inputs.iter().map(|v| v[i]);
            match op {
                ReduceOp::Sum => vals.sum(),
                ReduceOp::Prod => vals.product(),
                ReduceOp::Max => vals.fold(f64::MIN, f64::max),
                ReduceOp::Min => vals.fold(f64::MAX, f64::min),
            }
        })
        .collect()
}

/// Runs `f(rank, comm)` on `n` threads, one rank each, and returns the results by rank.
fn on_threads<R: Send>(n: usize, f: impl Fn(usize, &Communicator) -> R + Sync) -> Vec<R> {
    let group = HostGroup::new(n).unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let c = Communicator::Host(group.communicator(r, cpu()).unwrap());
                let f = &f;
                s.spawn(move || f(r, &c))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn all_reduce_case<T: CollectiveType + From<i8> + Into<f64> + PartialEq + std::fmt::Debug>(n: usize, op: ReduceOp) {
    let len = 37;
    let out = on_threads(n, |r, c| {
        let dev = c.device().clone();
        let send = dev.upload(&input::<T>(r, len)).unwrap();
        let mut recv = dev.alloc::<T>(len).unwrap();
        c.all_reduce(send.view(..).unwrap(), recv.view_mut(..).unwrap(), op).unwrap();
        let mut inplace = dev.upload(&input::<T>(r, len)).unwrap();
        c.all_reduce_in_place(inplace.view_mut(..).unwrap(), op).unwrap();
        (dev.download(&recv).unwrap(), dev.download(&inplace).unwrap())
    });
    let inputs: Vec<Vec<f64>> = (0..n).map(|r| input::<T>(r, len).into_iter().map(Into::into).collect()).collect();
    let want = host_reduce(&inputs, op);
    for (r, (a, b)) in out.iter().enumerate() {
        let a: Vec<f64> = a.iter().map(|&v| v.into()).collect();
        assert_eq!(a, want, "{} ranks, {op:?}, {}: rank {r}", n, std::any::type_name::<T>());
        assert_eq!(&out[r].0, b, "in place equals out of place, rank {r}");
    }
}

#[test]
fn all_reduce_matches_host_reduction_on_2_and_4_ranks() {
    for n in [2, 4] {
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
            all_reduce_case::<f32>(n, op);
            all_reduce_case::<f64>(n, op);
            all_reduce_case::<i32>(n, op);
            all_reduce_case::<i8>(n, op);
            all_reduce_case::<f16>(n, op);
            all_reduce_case::<bf16>(n, op);
        }
    }
}

#[test]
fn all_reduce_rounds_to_the_type_after_each_step() {
    // bf16 has 8 significant bits: 256 + 1 rounds to 256 (ties to even), so the rank-order
    // sum 256 + 1 + 1 stays 256 where an f32 accumulation would give 258.
    let out = on_threads(3, |r, c| {
        let mut b = c.device().upload(&[bf16::from_f32(if r == 0 { 256.0 } else { 1.0 })]).unwrap();
        c.all_reduce_in_place(b.view_mut(..).unwrap(), ReduceOp::Sum).unwrap();
        c.device().download(&b).unwrap()[0].to_f32()
    });
    assert_eq!(out, vec![256.0; 3]);
}

#[test]
fn all_gather_broadcast_and_reduce_scatter_match_host_results() {
    for n in [2, 4] {
        let len = 5;
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| input(r, len)).collect();
        let out = on_threads(n, |r, c| {
            let dev = c.device().clone();
            let send = dev.upload(&input::<f32>(r, len)).unwrap();
            let mut gathered = dev.alloc::<f32>(len * n).unwrap();
            c.all_gather(send.view(..).unwrap(), gathered.view_mut(..).unwrap()).unwrap();
            let mut bcast = Vec::new();
            for root in 0..n {
                let mut b = dev.upload(&input::<f32>(r, len)).unwrap();
                c.broadcast(b.view_mut(..).unwrap(), root).unwrap();
                bcast.push(dev.download(&b).unwrap());
            }
            let big = dev.upload(&input::<f32>(r, len * n)).unwrap();
            let mut scattered = dev.alloc::<f32>(len).unwrap();
            c.reduce_scatter(big.view(..).unwrap(), scattered.view_mut(..).unwrap(), ReduceOp::Sum).unwrap();
            (dev.download(&gathered).unwrap(), bcast, dev.download(&scattered).unwrap())
        });
        let concat: Vec<f32> = inputs.concat();
        let bigs: Vec<Vec<f64>> = (0..n).map(|r| input::<f32>(r, len * n).into_iter().map(f64::from).collect()).collect();
        let summed = host_reduce(&bigs, ReduceOp::Sum);
        for (r, (g, b, s)) in out.iter().enumerate() {
            assert_eq!(g, &concat, "all_gather, {n} ranks, rank {r}");
            for (root, got) in b.iter().enumerate() {
                assert_eq!(got, &inputs[root], "broadcast from {root}, {n} ranks, rank {r}");
            }
            let want: Vec<f32> = summed[r * len..(r + 1) * len].iter().map(|&v| v as f32).collect();
            assert_eq!(s, &want, "reduce_scatter, {n} ranks, rank {r}");
        }
    }
}

#[test]
fn one_thread_drives_several_ranks_inside_a_group() {
    let devs: Vec<Device> = (0..4).map(|_| cpu()).collect();
    let comms = Communicator::init_all(&devs).unwrap();
    assert_eq!(comms.iter().map(|c| (c.rank(), c.world_size())).collect::<Vec<_>>(), vec![(0, 4), (1, 4), (2, 4), (3, 4)]);
    let len = 9;
    let mut bufs: Vec<_> = devs.iter().enumerate().map(|(r, d)| d.upload(&input::<i32>(r, len)).unwrap()).collect();
    let sends: Vec<_> = devs.iter().enumerate().map(|(r, d)| d.upload(&input::<i32>(r + 1, len)).unwrap()).collect();
    let mut gathered: Vec<_> = devs.iter().map(|d| d.alloc::<i32>(len * 4).unwrap()).collect();
    // Two collectives per rank in one group: each completes when the group ends.
    group(|g| {
        for (((c, b), s), out) in comms.iter().zip(bufs.iter_mut()).zip(&sends).zip(gathered.iter_mut()) {
            g.all_reduce_in_place(c, b.view_mut(..)?, ReduceOp::Max)?;
            g.all_gather(c, s.view(..)?, out.view_mut(..)?)?;
        }
        Ok(())
    })
    .unwrap();
    let inputs: Vec<Vec<f64>> = (0..4).map(|r| input::<i32>(r, len).into_iter().map(f64::from).collect()).collect();
    let want: Vec<i32> = host_reduce(&inputs, ReduceOp::Max).into_iter().map(|v| v as i32).collect();
    let concat: Vec<i32> = (1..5).flat_map(|r| input::<i32>(r, len)).collect();
    for (r, d) in devs.iter().enumerate() {
        assert_eq!(d.download(&bufs[r]).unwrap(), want, "rank {r}");
        assert_eq!(d.download(&gathered[r]).unwrap(), concat, "rank {r}");
    }
}

#[test]
fn bad_lengths_and_roots_are_refused_and_queue_nothing() {
    let out = on_threads(2, |r, c| {
        let dev = c.device().clone();
        let a = dev.upload(&[1.0f32, 2.0, 3.0]).unwrap();
        let mut short = dev.upload(&[9.0f32, 9.0]).unwrap();
        let e1 = c.all_reduce(a.view(..).unwrap(), short.view_mut(..).unwrap(), ReduceOp::Sum).unwrap_err();
        let e2 = c.all_gather(a.view(..).unwrap(), short.view_mut(..).unwrap()).unwrap_err();
        let e3 = c.reduce_scatter(a.view(..).unwrap(), short.view_mut(..).unwrap(), ReduceOp::Sum).unwrap_err();
        let e4 = c.broadcast(short.view_mut(..).unwrap(), 2).unwrap_err();
        let untouched = dev.download(&short).unwrap();
        // The refused calls took no step: the next collective still pairs up across ranks.
        let mut x = dev.upload(&[r as f32 + 1.0]).unwrap();
        c.all_reduce_in_place(x.view_mut(..).unwrap(), ReduceOp::Sum).unwrap();
        (e1, e2, e3, e4, untouched, dev.download(&x).unwrap())
    });
    for (e1, e2, e3, e4, untouched, x) in out {
        assert!(matches!(e1, CollectiveError::Length { op: "all_reduce", .. }), "{e1}");
        assert!(matches!(e2, CollectiveError::Length { op: "all_gather", .. }), "{e2}");
        assert!(matches!(e3, CollectiveError::Length { op: "reduce_scatter", .. }), "{e3}");
        assert!(matches!(e4, CollectiveError::InvalidArgument(_)), "{e4}");
        assert_eq!(untouched, vec![9.0, 9.0]);
        assert_eq!(x, vec![3.0]);
    }
}

#[test]
fn ranks_calling_different_collectives_all_get_a_mismatch() {
    let out = on_threads(2, |r, c| {
        let dev = c.device().clone();
        let mut b = dev.upload(&[1.0f32; 4]).unwrap();
        let e = if r == 0 { c.all_reduce_in_place(b.view_mut(..).unwrap(), ReduceOp::Sum) } else { c.broadcast(b.view_mut(..).unwrap(), 0) };
        (e, dev.download(&b).unwrap())
    });
    for (e, b) in out {
        assert!(matches!(e, Err(CollectiveError::Mismatch { seq: 0, .. })), "{e:?}");
        assert_eq!(b, vec![1.0; 4], "nothing written");
    }
}

#[test]
fn a_rank_that_never_comes_breaks_the_group_instead_of_hanging() {
    let g = HostGroup::with_timeout(2, Duration::from_millis(200)).unwrap();
    let c0 = g.communicator(0, cpu()).unwrap();
    let c1 = g.communicator(1, cpu()).unwrap();
    let mut b = c0.device().upload(&[1i32]).unwrap();
    let e = c0.all_reduce_in_place(b.view_mut(..).unwrap(), ReduceOp::Sum).unwrap_err();
    assert!(matches!(&e, CollectiveError::Broken(m) if m.contains("[1]")), "{e}");
    let mut b1 = c1.device().upload(&[1i32]).unwrap();
    assert!(matches!(c1.all_reduce_in_place(b1.view_mut(..).unwrap(), ReduceOp::Sum), Err(CollectiveError::Broken(_))));
    assert_eq!(c0.device().download(&b).unwrap(), vec![1]);
}

#[test]
fn host_collectives_outside_the_group_scope_are_refused_inside_a_group() {
    let devs = [cpu(), cpu()];
    let comms = Communicator::init_all(&devs).unwrap();
    let mut b = devs[0].upload(&[1.0f32]).unwrap();
    let e = group(|_| comms[0].all_reduce_in_place(b.view_mut(..)?, ReduceOp::Sum)).unwrap_err();
    assert!(matches!(e, CollectiveError::Unsupported(_)), "{e}");
    // Nor in a nested group (its borrows end before the outer group completes the ranks).
    let mut c = devs[0].upload(&[1.0f32]).unwrap();
    let e = group(|_| group(|inner| inner.all_reduce_in_place(&comms[0], c.view_mut(..)?, ReduceOp::Sum))).unwrap_err();
    assert!(matches!(&e, CollectiveError::Unsupported(m) if m.contains("nested")), "{e}");
    // The groups took no step: the ranks still pair up.
    let mut bufs = [devs[0].upload(&[1.0f32]).unwrap(), devs[1].upload(&[2.0f32]).unwrap()];
    group(|g| {
        for (c, b) in comms.iter().zip(bufs.iter_mut()) {
            g.all_reduce_in_place(c, b.view_mut(..)?, ReduceOp::Sum)?;
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(devs[1].download(&bufs[1]).unwrap(), vec![3.0]);
}

#[test]
fn bad_ranks_and_devices_are_typed_errors() {
    assert!(matches!(HostGroup::new(0), Err(CollectiveError::InvalidArgument(_))));
    let g = HostGroup::new(2).unwrap();
    assert!(matches!(g.communicator(2, cpu()), Err(CollectiveError::InvalidArgument(_))));
    let id = UniqueId::from_bytes(&[7u8; 128]).unwrap();
    // NCCL/RCCL need a GPU: the CPU executor says so before any library is loaded.
    let e = NcclCommunicator::init_rank(&cpu(), 2, 0, &id).err().unwrap();
    assert!(matches!(&e, CollectiveError::Unsupported(m) if m.contains("CPU executor")), "{e}");
    assert!(matches!(Communicator::init_rank(&cpu(), 2, 0, &id), Err(CollectiveError::Unsupported(_))));
    assert!(matches!(NcclCommunicator::init_all(&[cpu(), cpu()]), Err(CollectiveError::Unsupported(_))));
    assert!(matches!(Communicator::init_all(&[]), Err(CollectiveError::InvalidArgument(_))));
}

#[test]
fn missing_or_wrong_libraries_are_typed_errors() {
    let e = Library::open(Backend::Nccl, "/nonexistent/libnccl.so.2").unwrap_err();
    match &e {
        CollectiveError::LibraryNotFound { backend: Backend::Nccl, tried, env_var: "NCCL_LIBRARY", .. } => assert_eq!(tried, &["/nonexistent/libnccl.so.2"]),
        e => panic!("{e}"),
    }
    assert!(e.to_string().contains("NCCL_LIBRARY"), "{e}");
    let e = Library::open(Backend::Rccl, "/nonexistent/librccl.so").unwrap_err();
    assert!(matches!(e, CollectiveError::LibraryNotFound { backend: Backend::Rccl, env_var: "RCCL_LIBRARY", .. }), "{e}");
    // A library that loads but is not NCCL.
    let e = Library::open(Backend::Nccl, "libm.so.6").unwrap_err();
    assert!(matches!(e, CollectiveError::MissingSymbol { symbol: "ncclGetVersion", .. }), "{e}");
    // Whatever this machine has, loading gives a library or the typed error.
    match Library::load(Backend::Nccl) {
        Ok(lib) => assert!(lib.version() > 0),
        Err(e) => assert!(matches!(e, CollectiveError::LibraryNotFound { .. } | CollectiveError::MissingSymbol { .. }), "{e}"),
    }
}

#[test]
fn unique_ids_round_trip_through_bytes_and_hex() {
    let bytes: Vec<u8> = (0..128u32).map(|i| (i * 37 % 256) as u8).collect();
    let id = UniqueId::from_bytes(&bytes).unwrap();
    assert_eq!(id.to_bytes().to_vec(), bytes);
    let hex = id.to_hex();
    assert_eq!(hex.len(), 256);
    assert_eq!(&hex[..6], "00254a");
    assert_eq!(hex.parse::<UniqueId>().unwrap(), id);
    assert_eq!(id.to_string(), hex);
    assert!(matches!(UniqueId::from_bytes(&bytes[..127]), Err(CollectiveError::InvalidArgument(_))));
    assert!("00".parse::<UniqueId>().is_err());
    let mut bad = hex.clone();
    bad.replace_range(10..12, "zz");
    assert!(matches!(bad.parse::<UniqueId>(), Err(CollectiveError::InvalidArgument(m)) if m.contains("zz")));
}

#[test]
fn collective_errors_convert_to_launch_errors() {
    let e: kernel_dsl::host::LaunchError = CollectiveError::InvalidArgument("root 3 of 2 ranks".into()).into();
    assert!(e.to_string().contains("root 3 of 2 ranks"), "{e}");
}
