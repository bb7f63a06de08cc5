//! The vendor BLAS behind matmul on a GPU (cuBLAS on NVIDIA), against Candle's CPU backend
//! in f64 and against the backend's own kernel on the same GPU
//! ([`candle_rocm::blas::with_kernel_gemm`]), with error bounds derived from the dtype.
//!
//! Needs a GPU: without one (CI, the CPU machine) every test is SKIPPED with the reason. A
//! GPU whose BLAS does not load is also SKIPPED, unless `CANDLE_ROCM_REQUIRE_BLAS=1` (the
//! project's GPU runs set it), which makes that a failure.
mod common;

use candle_core::{DType, Device, IndexOp, Result, Tensor};
use candle_rocm::blas::{blas_gemm_count, with_kernel_gemm};
use candle_rocm::RocmDevice;
use common::rand;

/// The GPU under test with its BLAS loaded, or `None` (reported).
fn gpu_with_blas() -> Option<RocmDevice> {
    let dev = if cfg!(feature = "cuda") {
        RocmDevice::new_cuda(0)
    } else if cfg!(feature = "rocm") {
        RocmDevice::new_rocm(0)
    } else {
        eprintln!("SKIPPED: built without the cuda/rocm feature, no GPU BLAS to test");
        return None;
    };
    let dev = match dev {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIPPED: no GPU: {e}");
            return None;
        }
    };
    let lib = dev.gemm_library().unwrap_or_default();
    let required = std::env::var("CANDLE_ROCM_REQUIRE_BLAS").is_ok_and(|v| v == "1");
    if lib.starts_with("no ") || lib.is_empty() {
        assert!(
            !required,
            "CANDLE_ROCM_REQUIRE_BLAS=1 but {}: {lib}",
            dev.name()
        );
        eprintln!("SKIPPED on {}: {lib}", dev.name());
        return None;
    }
    assert!(
        dev.name().contains(&lib),
        "the device name says which BLAS runs: {}",
        dev.name()
    );
    eprintln!("testing {} (matmul on {lib})", dev.name());
    Some(dev)
}

/// Checks `got` against the exact product of the (already rounded) inputs: per element
/// `|got - c| <= k * u_acc * (|A||B|) + u_out * |c|` — the standard bound for a sum of `k`
/// products accumulated with unit roundoff `u_acc` (f32: 2^-24, doubled for margin; f64:
/// 2^-53, doubled), plus one rounding of the result to the output type (f16: 2^-10,
/// bf16: 2^-7, one unit in the last place). `c` and `|A||B|` come from Candle's CPU in f64.
fn assert_product(what: &str, a: &Tensor, b: &Tensor, got: &Tensor) {
    let f64s = |x: &Tensor| {
        x.to_device(&Device::Cpu)
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
    };
    let (a, b) = (f64s(a), f64s(b));
    let k = a.dim(a.rank() - 1).unwrap();
    let exact = a.matmul(&b).unwrap();
    let scale = a.abs().unwrap().matmul(&b.abs().unwrap()).unwrap();
    let (u_acc, u_out) = match got.dtype() {
        DType::F64 => (f64::powi(2.0, -52), 0.0),
        DType::F32 => (f64::powi(2.0, -23), 0.0),
        DType::F16 => (f64::powi(2.0, -23), f64::powi(2.0, -10)),
        _ => (f64::powi(2.0, -23), f64::powi(2.0, -7)),
    };
    let flat = |x: &Tensor| x.flatten_all().unwrap().to_vec1::<f64>().unwrap();
    let (c, s, g) = (flat(&exact), flat(&scale), flat(&f64s(got)));
    assert_eq!(c.len(), g.len(), "{what}: element count");
    let mut worst = 0f64;
    for i in 0..c.len() {
        let bound = k as f64 * u_acc * s[i] + u_out * c[i].abs();
        let err = (g[i] - c[i]).abs();
        assert!(
            err <= bound,
            "{what}: element {i}: got {}, exact {}, error {err:e} > bound {bound:e}",
            g[i],
            c[i]
        );
        worst = worst.max(if bound > 0.0 { err / bound } else { 0.0 });
    }
    eprintln!(
        "{what}: {} elements, worst error {:.3} of its bound",
        c.len(),
        worst
    );
}

type Case = (
    &'static str,
    Box<dyn Fn(&Tensor, &Tensor) -> Result<Tensor>>,
);

/// Layouts: contiguous, each operand transposed, broadcast batch, an offset (narrowed) view.
fn cases() -> Vec<Case> {
    vec![
        ("contiguous", Box::new(|a, b| a.matmul(b))),
        (
            "lhs transposed",
            Box::new(|a, b| a.transpose(1, 2)?.contiguous()?.transpose(1, 2)?.matmul(b)),
        ),
        (
            "rhs transposed",
            Box::new(|a, b| a.matmul(&b.transpose(1, 2)?.contiguous()?.transpose(1, 2)?)),
        ),
        (
            "broadcast rhs",
            Box::new(|a, b| a.broadcast_matmul(&b.i(0)?)),
        ),
        (
            "offset views",
            Box::new(|a, b| a.i(1..3)?.matmul(&b.i(0..2)?)),
        ),
    ]
}

#[test]
fn blas_matmul_matches_cpu_and_our_kernel() {
    let Some(dev) = gpu_with_blas() else { return };
    let gd = dev.as_candle();
    // (batch, m, k, n): a square-ish batch, decode's m = 1 with a long k, odd sizes.
    for &(bs, m, k, n) in &[
        (4, 128, 200, 96),
        (3, 1, 4096, 512),
        (3, 37, 61, 1),
        (3, 65, 129, 33),
    ] {
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            let a = rand(&[bs, m, k], dtype, 300 + k as u64, false);
            let b = rand(&[bs, k, n], dtype, 400 + n as u64, false);
            for (name, f) in cases() {
                let what = format!("{dtype:?} {bs}x{m}x{k}x{n} {name}");
                let (ag, bg) = (a.to_device(&gd).unwrap(), b.to_device(&gd).unwrap());
                let before = blas_gemm_count();
                let got = f(&ag, &bg).unwrap_or_else(|e| panic!("{what} ({}): {e}", dev.name()));
                assert!(
                    blas_gemm_count() > before,
                    "{what}: the product did not run on the BLAS"
                );
                // The inputs of the product as the case sees them, for the reference.
                let (ra, rb) = operands(name, &a, &b);
                assert_product(&format!("{what} BLAS"), &ra, &rb, &got);
                if dtype == DType::F64 {
                    continue; // no f64 kernel: the BLAS is the only path
                }
                let before = blas_gemm_count();
                let ours = with_kernel_gemm(|| f(&ag, &bg))
                    .unwrap_or_else(|e| panic!("{what} (kernel): {e}"));
                assert_eq!(
                    blas_gemm_count(),
                    before,
                    "{what}: with_kernel_gemm still used the BLAS"
                );
                assert_product(&format!("{what} kernel"), &ra, &rb, &ours);
            }
        }
    }
}

/// The operands each case multiplies (the same views, on the CPU).
fn operands(name: &str, a: &Tensor, b: &Tensor) -> (Tensor, Tensor) {
    match name {
        "broadcast rhs" => {
            let bs = a.dim(0).unwrap();
            let b0 = b.i(0).unwrap().unsqueeze(0).unwrap();
            let dims = b0.dims().to_vec();
            (
                a.clone(),
                b0.broadcast_as((bs, dims[1], dims[2]))
                    .unwrap()
                    .contiguous()
                    .unwrap(),
            )
        }
        "offset views" => (a.i(1..3).unwrap(), b.i(0..2).unwrap()),
        _ => (a.clone(), b.clone()),
    }
}
