//! End-to-end tests of the CPU executor through its public API.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use cpu_executor::item::{self, WaveLanes};
use cpu_executor::{CpuExecutor, Dim3, ExecError, Geometry, RunStats, WaveSize};

fn geometry(grid: Dim3, block: Dim3) -> Geometry {
    Geometry { grid, block }
}

fn atomics(n: usize) -> Vec<AtomicU32> {
    (0..n).map(|_| AtomicU32::new(u32::MAX)).collect()
}

fn values(v: &[AtomicU32]) -> Vec<u32> {
    v.iter().map(|a| a.load(Ordering::Relaxed)).collect()
}

/// Global linear id of the calling work-item in a 1-D launch.
fn global_x() -> usize {
    (item::block_idx().x * item::block_dim().x + item::thread_idx().x) as usize
}

/// Shared memory viewed as `u32`s.
fn shared_u32() -> *mut u32 {
    let ptr = item::shared_ptr();
    assert_eq!(ptr as usize % 16, 0, "shared memory must be 16-byte aligned");
    ptr.cast()
}

#[test]
fn every_work_item_runs_exactly_once() {
    let grid = Dim3::new(3, 2, 2);
    let block = Dim3::new(5, 3, 2);
    let seen = Mutex::new(HashSet::new());
    let duplicates = AtomicUsize::new(0);
    let stats = CpuExecutor::new(WaveSize::W32)
        .run(geometry(grid, block), 0, &|| {
            assert_eq!(item::grid_dim(), grid);
            assert_eq!(item::block_dim(), block);
            let t = item::thread_idx();
            assert_eq!(item::flat_thread_idx(), t.x + t.y * 5 + t.z * 15);
            assert_eq!(item::lane_id(), item::flat_thread_idx() % 32);
            assert_eq!(item::wave_id(), item::flat_thread_idx() / 32);
            assert_eq!(item::wave_size(), 32);
            assert!(item::in_launch());
            if !seen.lock().unwrap().insert((item::block_idx(), t)) {
                duplicates.fetch_add(1, Ordering::Relaxed);
            }
        })
        .unwrap();
    assert_eq!(duplicates.load(Ordering::Relaxed), 0);
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.len(), 12 * 30);
    for (gx, gy, gz) in (0..3).flat_map(|x| (0..2).flat_map(move |y| (0..2).map(move |z| (x, y, z)))) {
        for (tx, ty, tz) in (0..5).flat_map(|x| (0..3).flat_map(move |y| (0..2).map(move |z| (x, y, z)))) {
            assert!(seen.contains(&(Dim3::new(gx, gy, gz), Dim3::new(tx, ty, tz))));
        }
    }
    assert_eq!(stats, RunStats { work_groups: 12, work_items: 360, barriers: 0, wave_ops: 0 });
}

#[test]
fn empty_grid_runs_nothing() {
    let ran = AtomicUsize::new(0);
    let exec = CpuExecutor::new(WaveSize::W64);
    for grid in [Dim3::new(0, 1, 1), Dim3::new(4, 0, 1), Dim3::new(4, 4, 0)] {
        let stats = exec
            .run(geometry(grid, Dim3::x(64)), 0, &|| {
                ran.fetch_add(1, Ordering::Relaxed);
            })
            .unwrap();
        assert_eq!(stats, RunStats::default());
    }
    assert_eq!(ran.load(Ordering::Relaxed), 0);
}

#[test]
fn barrier_orders_shared_memory_phases() {
    for wave in [WaveSize::W32, WaveSize::W64] {
        for n in [256u32, 1024] {
            let groups = 3u32;
            let out = atomics((groups * n) as usize);
            let exec = CpuExecutor::new(wave);
            let stats = exec
                .run(geometry(Dim3::x(groups), Dim3::x(n)), n as usize * 4, &|| {
                    let flat = item::flat_thread_idx();
                    let lds = shared_u32();
                    // SAFETY: `flat < n` slots of u32 fit in the region; the barrier orders
                    // the write before the neighbour's read.
                    unsafe { lds.add(flat as usize).write(global_x() as u32) };
                    item::barrier();
                    let neighbour = unsafe { lds.add(((flat + 1) % n) as usize).read() };
                    out[global_x()].store(neighbour, Ordering::Relaxed);
                })
                .unwrap();
            let expected: Vec<u32> =
                (0..groups).flat_map(|g| (0..n).map(move |i| g * n + (i + 1) % n)).collect();
            assert_eq!(values(&out), expected, "wave {wave:?}, block {n}");
            assert_eq!(stats.barriers, u64::from(groups));
            assert_eq!(stats.work_items, u64::from(groups * n));
        }
    }
}

#[test]
fn lds_tree_reduction() {
    let n = 1024u32;
    let live = 1000u32;
    let sums = Mutex::new(Vec::new());
    let stats = CpuExecutor::new(WaveSize::W64)
        .run(geometry(Dim3::x(2), Dim3::x(n)), n as usize * 8, &|| {
            let flat = item::flat_thread_idx() as usize;
            let lds = item::shared_ptr().cast::<u64>();
            let value = if (flat as u32) < live { flat as u64 + 1 + u64::from(item::block_idx().x) } else { 0 };
            // SAFETY: every index is below `n`; barriers separate the phases.
            unsafe { lds.add(flat).write(value) };
            item::barrier();
            let mut stride = n as usize / 2;
            while stride > 0 {
                if flat < stride {
                    unsafe { lds.add(flat).write(lds.add(flat).read() + lds.add(flat + stride).read()) };
                }
                item::barrier();
                stride /= 2;
            }
            if flat == 0 {
                sums.lock().unwrap().push((item::block_idx().x, unsafe { lds.read() }));
            }
        })
        .unwrap();
    let mut sums = sums.into_inner().unwrap();
    sums.sort();
    let base = u64::from(live) * u64::from(live + 1) / 2;
    assert_eq!(sums, vec![(0, base), (1, base + u64::from(live))]);
    // One barrier after the stores plus one per halving step (512 ..= 1), per group.
    assert_eq!(stats.barriers, 2 * 11);
}

#[test]
fn shared_memory_starts_poisoned_in_every_group() {
    let first_reads = Mutex::new(Vec::new());
    CpuExecutor::new(WaveSize::W32)
        .with_threads(1)
        .run(geometry(Dim3::x(3), Dim3::x(4)), 20, &|| {
            let lds = item::shared_ptr();
            assert_eq!(item::shared_len(), 20);
            let flat = item::flat_thread_idx() as usize;
            // SAFETY: 4 work-items x 5 bytes = the 20-byte region; barriers order accesses.
            let before: Vec<u8> = (0..5).map(|i| unsafe { lds.add(flat * 5 + i).read() }).collect();
            item::barrier();
            for i in 0..5 {
                unsafe { lds.add(flat * 5 + i).write(0) };
            }
            first_reads.lock().unwrap().push(before);
        })
        .unwrap();
    let reads = first_reads.into_inner().unwrap();
    assert_eq!(reads.len(), 12);
    assert!(reads.iter().all(|r| r == &[0xFF; 5]), "{reads:?}");
    // A read of uninitialised LDS as f32 is a NaN, as on hardware.
    assert!(f32::from_bits(u32::from_ne_bytes([0xFF; 4])).is_nan());
}

#[test]
fn zero_shared_bytes_gives_aligned_pointer() {
    CpuExecutor::new(WaveSize::W32)
        .run(geometry(Dim3::x(1), Dim3::x(2)), 0, &|| {
            assert_eq!(item::shared_len(), 0);
            assert!(!item::shared_ptr().is_null());
            assert_eq!(item::shared_ptr() as usize % 16, 0);
        })
        .unwrap();
}

/// Per work-item record of what `wave_exchange` returned.
fn run_exchange(wave: WaveSize, block: u32, groups: u32) -> (Vec<(Dim3, u32, WaveLanes)>, RunStats) {
    let seen = Mutex::new(Vec::new());
    let stats = CpuExecutor::new(wave)
        .run(geometry(Dim3::x(groups), Dim3::x(block)), 0, &|| {
            let lane = u64::from(item::lane_id());
            let value = (u64::from(item::block_idx().x) << 40) | (u64::from(item::wave_id()) << 20) | (lane * 3 + 1);
            let lanes = item::wave_exchange(value);
            seen.lock().unwrap().push((item::block_idx(), item::flat_thread_idx(), lanes));
        })
        .unwrap();
    (seen.into_inner().unwrap(), stats)
}

#[test]
fn wave_exchange_with_full_and_partial_waves() {
    for wave in [WaveSize::W32, WaveSize::W64] {
        let size = wave.lanes();
        let (block, groups) = (100u32, 2u32);
        let (seen, stats) = run_exchange(wave, block, groups);
        assert_eq!(seen.len(), (block * groups) as usize);
        let waves = block.div_ceil(size);
        assert_eq!(stats.wave_ops, u64::from(waves * groups));
        for (group, flat, lanes) in seen {
            let wave_id = flat / size;
            let present = (block - wave_id * size).min(size);
            assert_eq!(lanes.lanes, size);
            let mask = if present == 64 { u64::MAX } else { (1u64 << present) - 1 };
            assert_eq!(lanes.active, mask, "{wave:?} group {group} wave {wave_id}");
            for lane in 0..64u32 {
                let expected = if lane < present {
                    (u64::from(group.x) << 40) | (u64::from(wave_id) << 20) | (u64::from(lane) * 3 + 1)
                } else {
                    0
                };
                assert_eq!(lanes.values[lane as usize], expected, "{wave:?} lane {lane}");
            }
        }
    }
    // 100 = 3 full waves of 32 + 4 lanes; with W64: 64 + 36.
    let (seen, _) = run_exchange(WaveSize::W32, 100, 1);
    let last = seen.iter().find(|(_, flat, _)| *flat == 99).unwrap().2;
    assert_eq!(last.active, 0b1111);
    let (seen, _) = run_exchange(WaveSize::W64, 100, 1);
    let last = seen.iter().find(|(_, flat, _)| *flat == 99).unwrap().2;
    assert_eq!(last.active, (1 << 36) - 1);
}

#[test]
fn wave_exchange_skips_returned_lanes() {
    let seen = Mutex::new(Vec::new());
    CpuExecutor::new(WaveSize::W32)
        .run(geometry(Dim3::x(1), Dim3::x(32)), 0, &|| {
            let lane = item::lane_id();
            if lane % 2 == 1 {
                return;
            }
            // Never hold a lock across a wave operation or barrier: the other work-items
            // of the group run on this same OS thread and would deadlock on it.
            let lanes = item::wave_exchange(u64::from(lane) + 100);
            seen.lock().unwrap().push(lanes);
        })
        .unwrap();
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.len(), 16);
    for lanes in seen {
        assert_eq!(lanes.active, 0x5555_5555);
        for lane in 0..32 {
            assert_eq!(lanes.values[lane], if lane % 2 == 0 { lane as u64 + 100 } else { 0 });
        }
    }
}

#[test]
fn waves_exchange_independently_of_a_waiting_wave() {
    // Block of 3 waves of 32: waves 0 and 1 exchange twice while wave 2 already waits at
    // the barrier; then everyone meets at the barrier.
    let out = atomics(96);
    let stats = CpuExecutor::new(WaveSize::W32)
        .run(geometry(Dim3::x(1), Dim3::x(96)), 96 * 4, &|| {
            let flat = item::flat_thread_idx();
            let lds = shared_u32();
            if item::wave_id() < 2 {
                // Rotate the lane values by one, twice: lane l ends up with lane l + 2.
                let first = item::wave_exchange(u64::from(flat));
                let next = first.values[((item::lane_id() + 1) % 32) as usize];
                let second = item::wave_exchange(next);
                let got = second.values[((item::lane_id() + 1) % 32) as usize] as u32;
                unsafe { lds.add(flat as usize).write(got) };
            } else {
                unsafe { lds.add(flat as usize).write(1000 + flat) };
            }
            item::barrier();
            // Read the slot of the same lane in the next wave.
            let other = unsafe { lds.add(((flat + 32) % 96) as usize).read() };
            out[flat as usize].store(other, Ordering::Relaxed);
        })
        .unwrap();
    let slot = |f: u32| if f < 64 { (f / 32) * 32 + (f % 32 + 2) % 32 } else { 1000 + f };
    let expected: Vec<u32> = (0..96).map(|f| slot((f + 32) % 96)).collect();
    assert_eq!(values(&out), expected);
    assert_eq!(stats.wave_ops, 4);
    assert_eq!(stats.barriers, 1);
}

#[test]
fn barriers_at_different_sites_diverge() {
    let err = CpuExecutor::new(WaveSize::W64)
        .run(geometry(Dim3::x(2), Dim3::x(128)), 0, &|| {
            // The branches differ in their call site, which is what identifies a barrier.
            #[allow(clippy::if_same_then_else)]
            if item::flat_thread_idx() < 64 {
                item::barrier();
            } else {
                item::barrier();
            }
        })
        .unwrap_err();
    let ExecError::BarrierDivergence { group, detail } = &err else { panic!("unexpected {err:?}") };
    assert!(group.x < 2 && group.y == 0 && group.z == 0);
    // Both sites are named, with their counts.
    assert_eq!(detail.matches("64 at ").count(), 2, "{detail}");
    assert_eq!(detail.matches(file!()).count(), 2, "{detail}");
    let text = err.to_string();
    assert!(text.starts_with(&format!("barrier divergence in work-group {group}: ")), "{text}");
}

#[test]
fn wave_op_against_barrier_in_one_wave_diverges() {
    let err = CpuExecutor::new(WaveSize::W32)
        .run(geometry(Dim3::x(1), Dim3::x(64)), 0, &|| {
            // Wave 1 is fine; in wave 0 lanes 0..8 take a wave operation, the rest a barrier.
            if item::wave_id() == 0 && item::lane_id() < 8 {
                item::wave_exchange(1);
            }
            item::barrier();
        })
        .unwrap_err();
    let ExecError::WaveDivergence { group, wave, detail } = &err else { panic!("unexpected {err:?}") };
    assert_eq!((*group, *wave), (Dim3::new(0, 0, 0), 0));
    assert!(detail.contains("8 at ") && detail.contains("24 at ") && detail.contains(file!()), "{detail}");
    assert!(err.to_string().starts_with("wave divergence in wave 0 of work-group (0,0,0): "), "{err}");
}

#[test]
fn wave_ops_at_different_sites_diverge() {
    let err = CpuExecutor::new(WaveSize::W32)
        .run(geometry(Dim3::x(1), Dim3::x(32)), 0, &|| {
            if item::lane_id() < 16 {
                item::wave_exchange(1);
            } else {
                item::wave_exchange(2);
            }
        })
        .unwrap_err();
    let ExecError::WaveDivergence { wave: 0, detail, .. } = &err else { panic!("unexpected {err:?}") };
    assert!(detail.contains("different wave operations"), "{detail}");
    assert_eq!(detail.matches("16 at ").count(), 2, "{detail}");
}

#[test]
fn early_exit_does_not_block_barriers() {
    let out = atomics(64);
    let stats = CpuExecutor::new(WaveSize::W32)
        .run(geometry(Dim3::x(1), Dim3::x(64)), 64 * 4, &|| {
            let flat = item::flat_thread_idx();
            if flat >= 10 {
                return;
            }
            let lds = shared_u32();
            unsafe { lds.add(flat as usize).write(flat * 10) };
            item::barrier();
            let v = unsafe { lds.add(((flat + 1) % 10) as usize).read() };
            item::barrier();
            out[flat as usize].store(v, Ordering::Relaxed);
        })
        .unwrap();
    let got = values(&out);
    let expected: Vec<u32> = (0..64).map(|f| if f < 10 { (f + 1) % 10 * 10 } else { u32::MAX }).collect();
    assert_eq!(got, expected);
    assert_eq!(stats.barriers, 2);
}

#[test]
fn out_of_bounds_and_panics_become_errors() {
    let exec = CpuExecutor::new(WaveSize::W64).with_threads(2);
    let data: Vec<u32> = (0..7).collect();
    let err = exec
        .run(geometry(Dim3::x(2), Dim3::x(7)), 0, &|| {
            // Group 0 reads indices 0..7; in group 1 only work-item 3 reads (index 9).
            let index = item::thread_idx().x as usize + 6 * item::block_idx().x as usize;
            if item::block_idx().x == 1 && item::thread_idx().x != 3 {
                return;
            }
            std::hint::black_box(data[index]);
        })
        .unwrap_err();
    assert_eq!(
        err,
        ExecError::OutOfBounds {
            group: Dim3::new(1, 0, 0),
            item: Dim3::new(3, 0, 0),
            message: "index out of bounds: the len is 7 but the index is 9".into(),
        }
    );
    assert_eq!(
        err.to_string(),
        "out-of-bounds access in work-item (3,0,0) of work-group (1,0,0): \
         index out of bounds: the len is 7 but the index is 9"
    );

    let err = exec
        .run(geometry(Dim3::new(1, 3, 1), Dim3::new(4, 2, 1)), 16, &|| {
            item::barrier();
            if item::block_idx() == Dim3::new(0, 2, 0) && item::thread_idx() == Dim3::new(1, 1, 0) {
                panic!("boom");
            }
            item::barrier();
        })
        .unwrap_err();
    assert_eq!(
        err,
        ExecError::Panic { group: Dim3::new(0, 2, 0), item: Dim3::new(1, 1, 0), message: "boom".into() }
    );
    assert_eq!(err.to_string(), "work-item (1,1,0) of work-group (0,2,0) panicked: boom");

    // A formatted message and a non-string payload.
    let err = exec.run(geometry(Dim3::x(1), Dim3::x(1)), 0, &|| panic!("value {}", 42)).unwrap_err();
    assert!(matches!(err, ExecError::Panic { ref message, .. } if message == "value 42"));
    let err = exec.run(geometry(Dim3::x(1), Dim3::x(1)), 0, &|| std::panic::panic_any(7u8)).unwrap_err();
    assert!(matches!(err, ExecError::Panic { ref message, .. } if message == "non-string panic payload"));

    // The executor is still usable.
    let count = AtomicUsize::new(0);
    let stats = exec
        .run(geometry(Dim3::x(4), Dim3::x(64)), 0, &|| {
            item::barrier();
            count.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
    assert_eq!(count.load(Ordering::Relaxed), 256);
    assert_eq!(stats.barriers, 4);
}

#[test]
fn failed_launch_unwinds_suspended_work_items() {
    struct Guard<'a>(&'a AtomicUsize);
    impl Drop for Guard<'_> {
        fn drop(&mut self) {
            // Destructors still run inside the work-item's context.
            assert!(item::in_launch());
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    let dropped = AtomicUsize::new(0);
    let err = CpuExecutor::new(WaveSize::W32)
        .with_threads(1)
        .run(geometry(Dim3::x(1), Dim3::x(16)), 0, &|| {
            let _guard = Guard(&dropped);
            if item::flat_thread_idx() == 15 {
                panic!("late failure");
            }
            item::barrier();
        })
        .unwrap_err();
    assert!(matches!(err, ExecError::Panic { .. }));
    // 15 suspended at the barrier were unwound, 1 unwound by its own panic.
    assert_eq!(dropped.load(Ordering::Relaxed), 16);
    assert!(!item::in_launch());
}

#[test]
fn error_stops_the_launch() {
    let started = AtomicUsize::new(0);
    let err = CpuExecutor::new(WaveSize::W32)
        .with_threads(1)
        .run(geometry(Dim3::x(100), Dim3::x(4)), 0, &|| {
            started.fetch_add(1, Ordering::Relaxed);
            if item::block_idx().x == 5 {
                panic!("stop");
            }
        })
        .unwrap_err();
    assert!(matches!(err, ExecError::Panic { group, .. } if group == Dim3::new(5, 0, 0)));
    // Groups 0..=5 ran (the failing one stops at its first work-item); no further group.
    assert_eq!(started.load(Ordering::Relaxed), 5 * 4 + 1);
}

#[test]
fn invalid_geometry_is_rejected() {
    let exec = CpuExecutor::new(WaveSize::W64);
    for block in [Dim3::new(0, 1, 1), Dim3::new(4, 0, 1), Dim3::new(1, 1, 0), Dim3::x(2048), Dim3::new(32, 32, 2)] {
        let err = exec.run(geometry(Dim3::x(1), block), 0, &|| {}).unwrap_err();
        assert!(matches!(err, ExecError::InvalidGeometry { .. }), "{block}: {err:?}");
        assert!(err.to_string().starts_with("invalid launch geometry: "));
    }
    assert!(exec.run(geometry(Dim3::x(1), Dim3::new(32, 32, 1)), 0, &|| {}).is_ok());
}

/// A launch mixing barriers, shared memory, wave exchanges and per-group data.
fn mixed_launch(threads: usize) -> (Vec<u64>, RunStats) {
    let groups = 64u32;
    let block = 128u32;
    let out: Vec<AtomicU64> = (0..groups * block).map(|_| AtomicU64::new(0)).collect();
    let stats = CpuExecutor::new(WaveSize::W32)
        .with_threads(threads)
        .run(geometry(Dim3::new(8, 8, 1), Dim3::x(block)), block as usize * 8, &|| {
            let b = item::block_idx();
            let group = u64::from(b.x + 8 * b.y);
            let flat = item::flat_thread_idx() as usize;
            let lds = item::shared_ptr().cast::<u64>();
            let lanes = item::wave_exchange(group * 1000 + flat as u64);
            let wave_sum: u64 = lanes.values.iter().sum();
            unsafe { lds.add(flat).write(wave_sum ^ (flat as u64)) };
            item::barrier();
            let mirrored = unsafe { lds.add(block as usize - 1 - flat).read() };
            out[group as usize * block as usize + flat].store(mirrored.wrapping_mul(group + 1), Ordering::Relaxed);
        })
        .unwrap();
    (out.iter().map(|v| v.load(Ordering::Relaxed)).collect(), stats)
}

#[test]
fn thread_count_does_not_change_results() {
    let (one, stats_one) = mixed_launch(1);
    let (two, stats_two) = mixed_launch(2);
    assert_eq!(one, two);
    assert_eq!(stats_one, stats_two);
    assert_eq!(stats_one, RunStats { work_groups: 64, work_items: 64 * 128, barriers: 64, wave_ops: 64 * 4 });
    // Spot-check one value: group 9, flat 0 reads the slot of flat 127 (wave 3).
    let wave3: u64 = (96..128).map(|f| 9 * 1000 + f).sum();
    assert_eq!(one[9 * 128], (wave3 ^ 127) * 10);
}

#[test]
fn executor_settings() {
    let exec = CpuExecutor::new(WaveSize::W64);
    assert!(exec.threads() >= 1);
    assert_eq!(exec.wave_size(), WaveSize::W64);
    assert_eq!(exec.clone().with_threads(0).threads(), 1);
    assert_eq!(exec.clone().with_threads(3).threads(), 3);
    assert_eq!(WaveSize::W32.lanes(), 32);
    assert_eq!(WaveSize::W64.lanes(), 64);
    assert_eq!(Dim3::x(7), Dim3::new(7, 1, 1));
    assert_eq!(Dim3::new(2, 3, 4).volume(), 24);
    assert_eq!(Dim3::new(u32::MAX, u32::MAX, u32::MAX).volume(), u64::MAX);
    assert_eq!(Dim3::new(1, 2, 3).to_string(), "(1,2,3)");

    // A small stack is enough for a small kernel, and a large one for large locals.
    let small = exec.clone().with_stack_size(32 * 1024);
    small.run(geometry(Dim3::x(2), Dim3::x(64)), 0, &|| item::barrier()).unwrap();
    let large = exec.with_stack_size(4 << 20);
    large
        .run(geometry(Dim3::x(1), Dim3::x(4)), 0, &|| {
            let big = std::hint::black_box([item::flat_thread_idx() as u8; 512 << 10]);
            item::barrier();
            assert_eq!(big[12345], item::flat_thread_idx() as u8);
        })
        .unwrap();
}

#[test]
fn hooks_report_launch_state() {
    assert!(!item::in_launch());
    CpuExecutor::new(WaveSize::W32).run(geometry(Dim3::x(1), Dim3::x(1)), 0, &|| assert!(item::in_launch())).unwrap();
    assert!(!item::in_launch());
}

#[test]
#[should_panic(expected = "cpu_executor::item::barrier called outside a kernel launch")]
fn barrier_outside_a_launch_panics() {
    item::barrier();
}

#[test]
#[should_panic(expected = "cpu_executor::item::thread_idx called outside a kernel launch")]
fn thread_idx_outside_a_launch_panics() {
    item::thread_idx();
}

#[test]
#[should_panic(expected = "cpu_executor::item::wave_exchange called outside a kernel launch")]
fn wave_exchange_outside_a_launch_panics() {
    item::wave_exchange(0);
}

#[test]
#[should_panic(expected = "cpu_executor::item::shared_ptr called outside a kernel launch")]
fn shared_ptr_outside_a_launch_panics() {
    item::shared_ptr();
}

#[test]
fn hooks_on_another_thread_panic() {
    CpuExecutor::new(WaveSize::W32)
        .run(geometry(Dim3::x(1), Dim3::x(1)), 0, &|| {
            let joined = std::thread::spawn(|| std::panic::catch_unwind(item::lane_id).is_err()).join();
            assert!(joined.unwrap(), "hooks must not see another thread's work-item");
        })
        .unwrap();
}

/// Between synchronisation points work-items run in ascending flat id, or descending with
/// `with_reversed_items`; at a barrier and at a wave operation the order restarts. A
/// last-writer-wins slot per phase records who ran last.
#[test]
fn reversed_items_run_in_descending_order_between_synchronisation_points() {
    for (reversed, want_last) in [(false, 63u32), (true, 0)] {
        let exec = CpuExecutor::new(WaveSize::W32).with_threads(1).with_reversed_items(reversed);
        assert_eq!(exec.reversed_items(), reversed);
        let last = atomics(3);
        exec.run(geometry(Dim3::x(1), Dim3::x(64)), 0, &|| {
            let me = item::flat_thread_idx();
            last[0].store(me, Ordering::Relaxed);
            item::barrier();
            last[1].store(me, Ordering::Relaxed);
            item::wave_exchange(0);
            last[2].store(me, Ordering::Relaxed);
        })
        .unwrap();
        // Waves complete their exchange in the same order.
        let want = [want_last, want_last, want_last];
        assert_eq!(values(&last), want, "reversed = {reversed}");
    }
}
