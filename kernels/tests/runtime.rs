//! The runtime a framework backend builds on: views as kernel arguments, device copies,
//! the caching allocator's reuse and its flat memory over many operations, typed errors.
mod common;

use common::executors as devices;
use kernels::elementwise::{self as ew, Exp};
use kernels::runtime::{Device, WaveSize};
use kernels::Executor;

#[test]
fn views_pass_sub_ranges_to_kernels_without_copies() {
    for dev in devices() {
        let xs: Vec<f32> = (0..1000).map(|i| i as f32 * 0.01 - 3.0).collect();
        let x = dev.upload(&xs).unwrap();
        let mut y = dev.upload(&vec![7.0f32; 1000]).unwrap();
        // exp of elements 100..400 into 500..800; the rest of `y` stays untouched.
        ew::unary::launch::<f32, Exp>(&dev, ew::launch_config(300), &x.view(100..400).unwrap(), &[], &mut y.view_mut(500..800).unwrap()).unwrap();
        let got = dev.download(&y).unwrap();
        for (i, g) in got.iter().enumerate() {
            let want = if (500..800).contains(&i) { (xs[i - 400] as f64).exp() } else { 7.0 };
            assert!(((*g as f64) - want).abs() <= 2e-6 * want.abs().max(1.0), "{}: element {i}: {g} vs {want}", dev.name());
        }
        let part = dev.read(y.view(499..502).unwrap()).unwrap();
        assert_eq!(part[0], 7.0);
        assert_eq!(part[1], got[500]);
    }
}

#[test]
fn device_copies_between_views_and_overlapping_ranges() {
    for dev in devices() {
        let mut a = dev.upload(&(0u32..64).collect::<Vec<_>>()).unwrap();
        let mut b = dev.alloc::<u32>(16).unwrap();
        dev.copy(a.view(8..24).unwrap(), b.view_mut(..).unwrap()).unwrap();
        assert_eq!(dev.download(&b).unwrap(), (8u32..24).collect::<Vec<_>>());
        // Into a sub-range of another buffer.
        dev.copy(b.view(0..4).unwrap(), a.view_mut(60..64).unwrap()).unwrap();
        let got = dev.download(&a).unwrap();
        assert_eq!(&got[56..64], &[56, 57, 58, 59, 8, 9, 10, 11]);
        dev.write(a.view_mut(0..2).unwrap(), &[100, 101]).unwrap();
        assert_eq!(&dev.download(&a).unwrap()[..3], &[100, 101, 2]);
    }
}

#[test]
fn bad_ranges_and_lengths_are_typed_errors_that_change_nothing() {
    let dev = Device::cpu(WaveSize::W32);
    let mut a = dev.upload(&[1.0f32, 2.0, 3.0]).unwrap();
    let mut b = dev.upload(&[9.0f32; 2]).unwrap();
    assert!(a.view(2..4).is_err());
    assert!(a.view_mut(4..).is_err());
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = a.view(2..1);
    assert!(reversed.is_err());
    let e = dev.copy(a.view(..).unwrap(), b.view_mut(..).unwrap()).unwrap_err();
    assert!(e.to_string().contains("3 elements") && e.to_string().contains("2"), "{e}");
    assert!(dev.write(b.view_mut(..).unwrap(), &[1.0, 2.0, 3.0]).is_err());
    assert_eq!(dev.download(&b).unwrap(), vec![9.0, 9.0]);
    // A buffer of another device is refused.
    let other = Device::cpu(WaveSize::W64);
    assert!(!other.same_device(&dev) && dev.same_device(&dev.clone()));
    let c = other.alloc::<f32>(2).unwrap();
    // CPU executors share host memory, so that copy is allowed; sizes still checked.
    assert!(dev.copy(c.view(..).unwrap(), b.view_mut(..).unwrap()).is_ok());
    assert!(a.reinterpret::<u64>().is_err(), "12 bytes are not whole u64s");
}

#[test]
fn many_operations_keep_memory_flat() {
    for dev in devices() {
        let x = dev.upload(&vec![0.5f32; 4096]).unwrap();
        let run = |steps: usize| {
            for i in 0..steps {
                // A framework's pattern: a fresh output per op, dropped soon after.
                let n = 1024 + (i % 7) * 512;
                let mut y = dev.alloc_uninit::<f32>(n).unwrap();
                ew::unary::launch::<f32, Exp>(&dev, ew::launch_config(n), &x.view(..n).unwrap(), &[], &mut y).unwrap();
                let s = dev.scratch::<u32>(i % 300).unwrap();
                drop((y, s));
            }
        };
        run(300); // every size the loop asks for has appeared
        let warm = dev.memory_stats();
        run(10_000);
        let after = dev.memory_stats();
        assert_eq!(after.backend_allocations, warm.backend_allocations, "{}: steady state allocates nothing new", dev.name());
        assert_eq!(after.cached_bytes, warm.cached_bytes);
        assert_eq!(after.in_use_bytes, warm.in_use_bytes);
        assert_eq!(after.live_blocks, 1, "only `x` is alive");
        assert!(after.cache_hits >= warm.cache_hits + 10_000);
        drop(x);
        dev.empty_cache();
        let s = dev.memory_stats();
        assert_eq!((s.in_use_bytes, s.cached_bytes, s.live_blocks), (0, 0, 0));
        assert_eq!(s.backend_frees, s.backend_allocations, "every block went back");
    }
}

/// Queues enough work that, on a GPU, the kernels queued next are still waiting when the
/// host issues the writes that follow them (a write that did not wait its turn would then
/// change what they read). Nothing to do on the CPU executor, which runs launches in order.
fn keep_busy(dev: &Device) {
    if !dev.is_gpu() {
        return;
    }
    let n = 1 << 24;
    let a = dev.alloc::<f32>(n).unwrap();
    let mut b = dev.alloc_uninit::<f32>(n).unwrap();
    for _ in 0..40 {
        ew::unary::launch::<f32, Exp>(dev, ew::launch_config(n), &a, &[], &mut b).unwrap();
    }
}

fn assert_exp_of(got: &[f32], xs: &[f32], what: &str) {
    for (i, (g, x)) in got.iter().zip(xs).enumerate() {
        let want = (*x as f64).exp();
        assert!(((*g as f64) - want).abs() <= 2e-6 * want.abs().max(1.0), "{what}: element {i}: {g} vs exp({x}) = {want}");
    }
}

#[test]
fn writes_and_memsets_are_ordered_after_queued_kernels() {
    for dev in devices() {
        let n = if dev.is_gpu() { 1 << 22 } else { 4096 };
        let xs: Vec<f32> = (0..n).map(|i| (i % 601) as f32 * 0.01 - 3.0).collect();
        let later: Vec<f32> = (0..n).map(|i| (i % 7) as f32 + 100.0).collect();
        let name = dev.name();

        // 1. A write into the buffer a queued kernel reads.
        let mut x = dev.upload(&xs).unwrap();
        let mut y = dev.alloc_uninit::<f32>(n).unwrap();
        keep_busy(&dev);
        ew::unary::launch::<f32, Exp>(&dev, ew::launch_config(n), &x, &[], &mut y).unwrap();
        dev.write(x.view_mut(..).unwrap(), &later).unwrap();
        assert_exp_of(&dev.download(&y).unwrap(), &xs, &format!("{name}: kernel queued before a write"));
        assert_eq!(dev.download(&x).unwrap(), later, "{name}: the write landed");

        // 2. The block of a dropped input, reused by the caching allocator for an upload.
        let x = dev.upload(&xs).unwrap();
        keep_busy(&dev);
        ew::unary::launch::<f32, Exp>(&dev, ew::launch_config(n), &x, &[], &mut y).unwrap();
        drop(x);
        let before = dev.memory_stats();
        let z = dev.upload(&later).unwrap();
        let after = dev.memory_stats();
        assert_eq!((after.backend_allocations, after.cache_hits), (before.backend_allocations, before.cache_hits + 1), "{name}: the upload reused the cached block");
        assert_exp_of(&dev.download(&y).unwrap(), &xs, &format!("{name}: kernel queued before an upload into its input's reused block"));
        assert_eq!(dev.download(&z).unwrap(), later);
        drop(z);

        // 3. The same for a zero-filled allocation (memset) of the reused block.
        let x = dev.upload(&xs).unwrap();
        keep_busy(&dev);
        ew::unary::launch::<f32, Exp>(&dev, ew::launch_config(n), &x, &[], &mut y).unwrap();
        drop(x);
        let zeros = dev.alloc::<f32>(n).unwrap();
        assert_exp_of(&dev.download(&y).unwrap(), &xs, &format!("{name}: kernel queued before a memset of its input's reused block"));
        assert!(dev.download(&zeros).unwrap().iter().all(|&v| v == 0.0), "{name}: alloc zero-fills");
    }
}

#[test]
fn a_written_host_slice_may_be_reused_as_soon_as_write_returns() {
    for dev in devices() {
        let n = if dev.is_gpu() { 1 << 20 } else { 4096 };
        let want: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2654435761)).collect();
        let mut src = want.clone();
        let mut v = dev.alloc_uninit::<u32>(n).unwrap();
        keep_busy(&dev);
        dev.write(v.view_mut(..).unwrap(), &src).unwrap();
        // Overwritten and freed before the queued copy can have run on a GPU.
        src.iter_mut().for_each(|s| *s = !*s);
        drop(src);
        assert_eq!(dev.download(&v).unwrap(), want, "{}: the copy took the data as it was at the call", dev.name());
    }
}

#[test]
fn shared_uploads_are_uploaded_once_per_distinct_array() {
    for dev in devices() {
        let a = dev.upload_shared(&[4, 8, 8, 1]).unwrap();
        let before = dev.memory_stats();
        let b = dev.upload_shared(&[4, 8, 8, 1]).unwrap();
        let c = dev.upload_shared(&[4, 8, 1, 4]).unwrap();
        let after = dev.memory_stats();
        assert!(std::sync::Arc::ptr_eq(&a, &b), "{}: same contents, same buffer", dev.name());
        assert!(!std::sync::Arc::ptr_eq(&a, &c));
        assert_eq!(after.live_blocks, before.live_blocks + 1, "{}: only the new array took a block", dev.name());
        assert_eq!((dev.download(&b).unwrap(), dev.download(&c).unwrap()), (vec![4, 8, 8, 1], vec![4, 8, 1, 4]));
        assert_eq!(dev.shared_uploads_len(), 2);
        // A clone shares the cache; `empty_cache` drops it.
        assert!(std::sync::Arc::ptr_eq(&dev.clone().upload_shared(&[4, 8, 1, 4]).unwrap(), &c));
        drop((a, b, c));
        dev.empty_cache();
        assert_eq!((dev.shared_uploads_len(), dev.memory_stats().live_blocks), (0, 0), "{}", dev.name());
    }
}
