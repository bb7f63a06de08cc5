//! Candle ops captured into a graph on our device ([`RocmDevice::capture`]) and replayed
//! with new inputs written into the same tensors: the replay gives the eager ops' bits
//! (same kernels, same device) and matches Candle's CPU backend within f32 tolerance
//! (three ops of a few ulp each: 1e-5 relative). The CPU executor has no graphs: a clear
//! error and `supports_graphs() == false`. A GPU that is not there is reported as SKIPPED.
mod common;

use candle_core::{Device, Result, Tensor};
use common::{devices, rand};

const ROWS: usize = 9;
const COLS: usize = 65;

/// `1.5 * exp(x) * r - 0.25`, `r` broadcast over the rows.
fn ops(x: &Tensor, r: &Tensor) -> Result<Tensor> {
    x.exp()?.broadcast_mul(r)?.affine(1.5, -0.25)
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap().into_iter().map(f32::to_bits).collect()
}

#[test]
fn captured_candle_ops_replay_with_new_inputs_like_the_eager_ops() {
    for dev in devices() {
        let d = dev.as_candle();
        let name = dev.name().to_string();
        let x = rand(&[ROWS, COLS], candle_core::DType::F32, 1, false).to_device(&d).unwrap();
        let r = rand(&[COLS], candle_core::DType::F32, 2, false).to_device(&d).unwrap();
        let eager = ops(&x, &r).unwrap(); // uploads the layouts, loads the kernels
        if !dev.supports_graphs() {
            let e = dev.capture(|| ops(&x, &r)).err().expect("no graphs on the CPU executor");
            assert!(e.to_string().contains("capture"), "{name}: {e}");
            continue;
        }
        let (graph, y) = dev.capture(|| ops(&x, &r)).unwrap();
        drop(eager);
        for k in 0..4u64 {
            let (xk, rk) = (rand(&[ROWS, COLS], candle_core::DType::F32, 10 + k, false), rand(&[COLS], candle_core::DType::F32, 20 + k, false));
            x.slice_set(&xk.to_device(&d).unwrap(), 0, 0).unwrap();
            r.slice_set(&rk.to_device(&d).unwrap(), 0, 0).unwrap();
            graph.replay().unwrap();
            let want = ops(&x, &r).unwrap();
            assert_eq!(bits(&y), bits(&want), "{name}: replay {k} vs eager");
            let cpu = ops(&xk, &rk).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let got = y.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for (i, (g, w)) in got.iter().zip(&cpu).enumerate() {
                assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{name}: replay {k}: element {i}: {g} vs Candle CPU {w}");
            }
        }
        // A host read inside the capture is a typed error; the device stays usable.
        let e = dev.capture(|| ops(&x, &r)?.to_vec2::<f32>()).err().expect("a host read inside a capture");
        assert!(e.to_string().contains("capturing a graph"), "{name}: {e}");
        drop((graph, y));
        let s = dev.memory_stats();
        assert_eq!((s.graph_pools, s.graph_pool_bytes), (0, 0), "{name}: the pools went back");
        let again = ops(&x, &r).unwrap().to_device(&Device::Cpu).unwrap();
        assert_eq!(again.dims(), &[ROWS, COLS]);
    }
}
