//! The DSL's kernel model on the CPU executor, wave 32 and 64: shared memory, barriers,
//! wave operations, atomics, half scalars, 2-D grids, device helpers.
use half::f16;
use kernel_dsl::host::{CpuExecutor, LaunchConfig, LaunchError, WaveSize};
use kernel_dsl::Dim3;
use std::sync::atomic::{AtomicU32, Ordering};
use workspace_tests::dsl_kernels as k;

fn executors() -> [CpuExecutor; 2] {
    [CpuExecutor::new(WaveSize::W32), CpuExecutor::new(WaveSize::W64)]
}

#[test]
fn block_sum_reduces_each_group_through_shared_memory() {
    for exec in executors() {
        for n in [1usize, 255, 256, 1000, 4099] {
            let x: Vec<f32> = (0..n).map(|i| (i % 17) as f32 - 8.0).collect();
            let groups = n.div_ceil(256);
            let mut partial = vec![f32::NAN; groups];
            let cfg = LaunchConfig::new(Dim3::x(groups as u32), Dim3::x(256));
            k::block_sum::launch(&exec, cfg, &x, &mut partial).unwrap();
            for g in 0..groups {
                let want: f32 = x[g * 256..((g + 1) * 256).min(n)].iter().sum();
                assert_eq!(partial[g], want, "group {g} of n={n} ({:?})", exec.wave_size());
            }
        }
    }
}

#[test]
fn wave_sum_follows_the_wave_size() {
    for exec in executors() {
        let w = exec.wave_size().lanes() as usize;
        let n = 512;
        let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let mut sums = vec![0.0f32; n / w];
        let mut lanes = vec![99u32; n];
        let mut size = vec![0u32; n];
        k::wave_sums::launch(&exec, LaunchConfig::new(Dim3::x(2), Dim3::x(256)), &x, &mut sums, &mut lanes, &mut size).unwrap();
        for (wi, s) in sums.iter().enumerate() {
            let want: f32 = x[wi * w..(wi + 1) * w].iter().sum();
            assert_eq!(*s, want, "wave {wi} with wave size {w}");
        }
        assert!(lanes.iter().enumerate().all(|(i, l)| *l as usize == i % w));
        assert!(size.iter().all(|s| *s as usize == w));
    }
}

#[test]
fn wave_reduce_pair_gives_every_lane_both_results() {
    for exec in executors() {
        let w = exec.wave_size().lanes() as usize;
        let n = 256;
        // Distinct integers (exact sums in any order), maxima in different lanes.
        let x: Vec<f32> = (0..n).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
        let (mut a, mut b, mut s, mut c) = (vec![0.0f32; n], vec![0.0f32; n], vec![0.0f32; n], vec![0.0f32; n]);
        k::wave_pairs::launch(&exec, LaunchConfig::new(Dim3::x(2), Dim3::x(128)), &x, &mut a, &mut b, &mut s, &mut c).unwrap();
        for i in 0..n {
            let wave = &x[i - i % w..i - i % w + w];
            let what = format!("work-item {i}, wave of {w}");
            assert_eq!(a[i], wave.iter().copied().fold(f32::MIN, f32::max), "max of x: {what}");
            assert_eq!(b[i], wave.iter().map(|v| -v).fold(f32::MIN, f32::max), "max of -x: {what}");
            assert_eq!(s[i], wave.iter().sum::<f32>(), "sum of x: {what}");
            assert_eq!(c[i], w as f32, "lane count: {what}");
        }
    }
}

#[test]
fn wave_match_finds_the_lanes_with_the_same_key() {
    for exec in executors() {
        let w = exec.wave_size().lanes() as usize;
        let n = 200;
        for bits in [3u32, 12, 32] {
            let keys: Vec<u32> = (0..n as u32).map(|i| if bits == 32 { (i * 7919) % 5 * 0x1000_0001 } else { i.wrapping_mul(2654435761u32.wrapping_mul(i)) >> (32 - bits) }).collect();
            let (mut lo, mut hi, mut seen) = (vec![0u32; n], vec![0u32; n], vec![0u32; n]);
            k::wave_match::launch(&exec, LaunchConfig::new(Dim3::x(2), Dim3::x(128)), &keys, bits, &mut lo, &mut hi, &mut seen).unwrap();
            for i in 0..n {
                let key = |j: usize| if j < n { keys[j] } else { u32::MAX };
                let wave0 = i - i % w;
                let want = (0..w).filter(|&l| key(wave0 + l) == key(i)).fold(0u64, |m, l| m | 1 << l);
                let got = lo[i] as u64 | (hi[i] as u64) << 32;
                assert_eq!(got, want, "key {} of work-item {i}, {bits} bits, wave {w}", keys[i]);
                assert_eq!(seen[i], key(wave0 + (i + 1) % w), "wave::sync: work-item {i}, wave {w}");
            }
        }
    }
}

#[test]
fn launch_sized_shared_memory_reverses_blocks() {
    for exec in executors() {
        let block = 96u32;
        let data: Vec<u32> = (0..block * 5).collect();
        let mut out = vec![0u32; data.len()];
        let cfg = LaunchConfig::new(Dim3::x(5), Dim3::x(block)).with_dynamic_shared(block as usize);
        k::reverse_blocks::launch(&exec, cfg, &data, &mut out).unwrap();
        for (i, v) in out.iter().enumerate() {
            let (g, t) = (i / block as usize, i % block as usize);
            assert_eq!(*v as usize, g * block as usize + block as usize - 1 - t);
        }
    }
}

#[test]
fn too_little_dynamic_shared_memory_is_an_out_of_bounds_error() {
    let exec = CpuExecutor::new(WaveSize::W64);
    let data: Vec<u32> = (0..64).collect();
    let mut out = vec![0u32; 64];
    // The kernel indexes tile[n - 1 - t] with n = 64 but only 32 elements exist.
    let cfg = LaunchConfig::new(Dim3::x(1), Dim3::x(64)).with_dynamic_shared(32);
    let err = k::reverse_blocks::launch(&exec, cfg, &data, &mut out).unwrap_err();
    assert!(matches!(err, LaunchError::Exec { .. }), "{err}");
    assert!(err.to_string().contains("shared memory index out of bounds"), "{err}");
}

#[test]
fn atomics_and_ballot_count_values() {
    for exec in executors() {
        let values: Vec<u32> = (0..1000u32).map(|i| (i * 7919) % 1013).collect();
        let bins: Vec<AtomicU32> = (0..16).map(|_| AtomicU32::new(0)).collect();
        let odd = [AtomicU32::new(0)];
        k::histogram::launch(&exec, LaunchConfig::for_elements(values.len(), 128), &values, &bins[..], &odd[..]).unwrap();
        let mut want = [0u32; 16];
        for v in &values {
            want[(*v as usize) % 16] += 1;
        }
        for (b, w) in bins.iter().zip(want) {
            assert_eq!(b.load(Ordering::Relaxed), w);
        }
        assert_eq!(odd[0].load(Ordering::Relaxed), values.iter().filter(|v| *v % 2 == 1).count() as u32);
    }
}

#[test]
fn half_precision_scalar_arguments() {
    let exec = CpuExecutor::new(WaveSize::W32);
    let a: Vec<f16> = (0..100).map(|i| f16::from_f32(i as f32 * 0.25)).collect();
    let mut out = vec![f16::ZERO; 100];
    k::scale_half::launch::<f16>(&exec, LaunchConfig::for_elements(100, 64), &a, &mut out, f16::from_f32(-2.0)).unwrap();
    for (x, y) in a.iter().zip(&out) {
        assert_eq!(*y, f16::from_f32(x.to_f32() * -2.0));
    }
}

#[test]
fn two_dimensional_grid_indices() {
    for exec in executors() {
        let (w, h) = (50u32, 37u32);
        let mut out = vec![u32::MAX; (w * h) as usize];
        let cfg = LaunchConfig::new(Dim3::new(w.div_ceil(16), h.div_ceil(8), 1), Dim3::new(16, 8, 1));
        k::grid_2d::launch(&exec, cfg, &mut out, w, h).unwrap();
        for y in 0..h {
            for x in 0..w {
                assert_eq!(out[(y * w + x) as usize], x + 1000 * y);
            }
        }
    }
}

#[test]
fn device_helpers_are_callable() {
    let exec = CpuExecutor::new(WaveSize::W64);
    let x = vec![-1.0f32, 0.25, 7.0];
    let mut out = vec![0.0f32; 3];
    k::clamp_kernel::launch(&exec, LaunchConfig::for_elements(3, 64), &x, &mut out).unwrap();
    assert_eq!(out, vec![0.0, 0.25, 1.0]);
}

#[test]
fn launcher_layouts_follow_the_signature() {
    let inst = &k::block_sum::INSTANCES[0];
    assert_eq!(inst.symbol, "block_sum");
    // input (ptr, len), partial (ptr, len); the Shared parameter takes no slot.
    let slots: Vec<_> = inst.abi.iter().map(|s| (s.name, s.offset, s.size)).collect();
    assert_eq!(slots, vec![("input", 0, 8), ("input.len", 8, 8), ("partial", 16, 8), ("partial.len", 24, 8)]);
    let rev = &k::reverse_blocks::INSTANCES[0];
    assert_eq!(rev.abi.last().unwrap().name, "__shared_dyn_len");
    let half: Vec<_> = k::scale_half::INSTANCES.iter().map(|i| i.symbol).collect();
    assert_eq!(half, vec!["scale_half_f16", "scale_half_bf16"]);
    assert_eq!(k::scale_half::INSTANCES[0].abi[4].size, 2, "an f16 scalar is 2 bytes");
}

#[test]
fn launch_bounds_reject_larger_work_groups_and_write_nothing() {
    assert_eq!(k::bounded_iota::INSTANCES[0].max_threads, k::BOUNDED_THREADS);
    assert!(k::bounded_fill::INSTANCES.iter().all(|i| i.max_threads == 64));
    assert!(k::block_sum::INSTANCES[0].max_threads == 1024, "no bound given: 1024");
    for exec in executors() {
        let mut out = vec![7u32; 300];
        k::bounded_iota::launch(&exec, LaunchConfig::for_elements(300, 128), &mut out).unwrap();
        assert_eq!(out, (0..300).collect::<Vec<u32>>());
        let mut out = vec![7u32; 300];
        match k::bounded_iota::launch(&exec, LaunchConfig::for_elements(300, 256), &mut out) {
            Err(LaunchError::BlockTooLarge { kernel: "bounded_iota", work_items: 256, max: 128 }) => {}
            other => panic!("expected BlockTooLarge, got {other:?}"),
        }
        assert!(out.iter().all(|&v| v == 7), "a rejected launch wrote");
        // The bound counts all three dimensions.
        let cfg = LaunchConfig::new(Dim3::x(1), Dim3::new(8, 8, 2));
        assert!(matches!(k::bounded_fill::launch::<f32>(&exec, cfg, &mut [0.0f32; 4][..], 1.0), Err(LaunchError::BlockTooLarge { max: 64, .. })));
        let mut f = vec![0.0f32; 100];
        k::bounded_fill::launch::<f32>(&exec, LaunchConfig::for_elements(100, 64), &mut f, 2.5).unwrap();
        assert!(f.iter().all(|&v| v == 2.5));
    }
}
