//! 10,000 tensor ops in a loop: device memory stays flat (the caching allocator's figures).
use candle_core::{DType, Tensor};
use candle_rocm::{RocmDevice, WaveSize};

#[test]
fn ten_thousand_ops_keep_device_memory_flat() {
    let dev = RocmDevice::new_cpu_executor(WaveSize::W64);
    let d = dev.as_candle();
    let x0 = Tensor::arange(0f32, 256., &d).unwrap().reshape((16, 16)).unwrap();
    let w = Tensor::ones((16, 16), DType::F32, &d).unwrap();
    // One step = 12 ops (unary, binary, affine, matmul, softmax, reduction, casts, index_select):
    // 1000 steps = 12,000 ops.
    let ids = Tensor::new(&[3u32, 1, 4], &d).unwrap();
    let step = |x: &Tensor| -> Tensor {
        let y = ((x * 0.5).unwrap().tanh().unwrap() + x).unwrap();
        let y = y.matmul(&w).unwrap().affine(1e-3, 0.0).unwrap();
        let y = candle_nn::ops::softmax_last_dim(&y).unwrap();
        let s = y.sum_keepdim(1).unwrap().to_dtype(DType::BF16).unwrap();
        let _ = y.index_select(&ids, 0).unwrap();
        (y.broadcast_mul(&s.to_dtype(DType::F32).unwrap()).unwrap() + x).unwrap()
    };
    let mut x = x0.clone();
    for _ in 0..20 {
        x = step(&x);
    }
    let before = dev.memory_stats();
    for _ in 0..1000 {
        x = step(&x);
    }
    let after = dev.memory_stats();
    eprintln!("before {before:?}\nafter  {after:?}");
    // The same live buffers (x, w, ids, x0) at the end as at the start of the timed loop ...
    assert_eq!(after.in_use_bytes, before.in_use_bytes, "bytes in use grew");
    assert_eq!(after.live_blocks, before.live_blocks, "live buffers grew");
    // ... every allocation of the 10,000 ops came from the cache, none from the backend ...
    assert_eq!(after.backend_allocations, before.backend_allocations, "new backend allocations");
    assert!(after.cache_hits >= before.cache_hits + 10_000, "{} cache hits", after.cache_hits - before.cache_hits);
    // ... and the cache did not grow.
    assert_eq!(after.cached_bytes, before.cached_bytes, "cache grew");
    assert!(x.to_device(&candle_core::Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().all(|v| v.is_finite()));
}
