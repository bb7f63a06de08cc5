//! Philox4x32-10 random numbers: the generator against Random123's published known-answer
//! vectors and against a second implementation written here; the streams' reproducibility
//! (same seed and offset give the same bits on every executor, wave size and launch
//! shape; an offset continues a stream); the f64 math of Box-Muller against `std`; and the
//! distributions' statistics.
//!
//! Statistical tolerances: the streams are fixed by their seeds, so each test is
//! deterministic; the bounds are set where a correct generator fails with probability
//! below about 1e-6 (so a failure means a real defect, not bad luck): means within 5
//! standard errors, variances within 5 standard errors of the sample variance
//! (`sqrt((mu4 - sigma^4)/n)`), Kolmogorov-Smirnov distance below `1.95 / sqrt(n)`
//! (the 0.1% quantile) for the continuous f32/f64 outputs.
use half::{bf16, f16};
use kernel_dsl::host::{Executor, LaunchConfig, LaunchError};
use kernel_dsl::Dim3;
use kernels::random::{self as rnd, ops};
use kernels::runtime::Device;

mod common;
use common::executors;

/// Philox4x32-10 written out again for the test, with 32-bit halves computed separately.
fn philox_ref(mut c: [u32; 4], mut k: [u32; 2]) -> [u32; 4] {
    const M0: u32 = 0xD2511F53;
    const M1: u32 = 0xCD9E8D57;
    for _ in 0..10 {
        let (hi0, lo0) = (((M0 as u64 * c[0] as u64) >> 32) as u32, M0.wrapping_mul(c[0]));
        let (hi1, lo1) = (((M1 as u64 * c[2] as u64) >> 32) as u32, M1.wrapping_mul(c[2]));
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
        k[0] = k[0].wrapping_add(0x9E3779B9);
        k[1] = k[1].wrapping_add(0xBB67AE85);
    }
    c
}

#[test]
fn philox_known_answers() {
    // Random123 tests/kat_vectors, the three "philox4x32 10" lines: counter, key, result.
    let kat: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
        ([0, 0, 0, 0], [0, 0], [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]),
        ([u32::MAX; 4], [u32::MAX; 2], [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]),
        ([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0], [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]),
    ];
    for (c, k, want) in kat {
        assert_eq!(rnd::philox4x32_10(c, k), want, "kernel's philox");
        assert_eq!(philox_ref(c, k), want, "test's philox");
    }
}

fn uniform_ref(seed: u64, offset: u64, i: usize, lo: f64, up: f64) -> f64 {
    let b = offset + (i / 2) as u64;
    let w = philox_ref([b as u32, (b >> 32) as u32, 0, 0], [seed as u32, (seed >> 32) as u32]);
    let (hi, l) = if i.is_multiple_of(2) { (w[0], w[1]) } else { (w[2], w[3]) };
    let u = ((((hi as u64) << 32) | l as u64) >> 11) as f64 / (1u64 << 53) as f64;
    lo + (up - lo) * u
}

#[test]
fn uniform_stream_is_the_philox_stream() {
    let (seed, offset) = (0x0123_4567_89ab_cdef, (1u64 << 32) - 3); // the counter crosses 2^32
    for dev in executors() {
        let mut out = dev.alloc::<f64>(1001).unwrap();
        ops::rand_uniform::<f64>(&dev, &mut out, seed, offset, -2.0, 3.0).unwrap();
        let got = dev.download(&out).unwrap();
        for (i, g) in got.iter().enumerate() {
            assert_eq!(g.to_bits(), uniform_ref(seed, offset, i, -2.0, 3.0).to_bits(), "element {i} on {}", dev.name());
        }
        // The narrow types are the same stream rounded once (through f32).
        let mut o32 = dev.alloc::<f32>(1001).unwrap();
        let mut o16 = dev.alloc::<f16>(1001).unwrap();
        let mut ob = dev.alloc::<bf16>(1001).unwrap();
        ops::rand_uniform::<f32>(&dev, &mut o32, seed, offset, -2.0, 3.0).unwrap();
        ops::rand_uniform::<f16>(&dev, &mut o16, seed, offset, -2.0, 3.0).unwrap();
        ops::rand_uniform::<bf16>(&dev, &mut ob, seed, offset, -2.0, 3.0).unwrap();
        let (g32, g16, gb) = (dev.download(&o32).unwrap(), dev.download(&o16).unwrap(), dev.download(&ob).unwrap());
        for i in 0..got.len() {
            assert_eq!(g32[i], got[i] as f32);
            assert_eq!(g16[i], f16::from_f32(got[i] as f32));
            assert_eq!(gb[i], bf16::from_f32(got[i] as f32));
        }
    }
}

/// The same numbers whatever the executor, wave size, launch shape or split into calls.
#[test]
fn streams_are_reproducible() {
    let n = 777;
    let cpu = Device::cpu(kernel_dsl::host::WaveSize::W64);
    let mut base_u = cpu.alloc::<f32>(n).unwrap();
    let mut base_n = cpu.alloc::<f64>(n).unwrap();
    ops::rand_uniform::<f32>(&cpu, &mut base_u, 42, 7, 0.0, 1.0).unwrap();
    ops::rand_normal::<f64>(&cpu, &mut base_n, 42, 7, 1.0, 2.0).unwrap();
    let (base_u, base_n) = (cpu.download(&base_u).unwrap(), cpu.download(&base_n).unwrap());
    for dev in executors() {
        for cfg in [LaunchConfig::new(Dim3::x(1), Dim3::x(64)), LaunchConfig::new(Dim3::x(7), Dim3::x(32)), LaunchConfig::new(Dim3::x(1000), Dim3::x(256))] {
            let mut u = dev.alloc::<f32>(n).unwrap();
            rnd::rand_uniform::launch::<f32>(&dev, cfg, &mut u, 42, 7, 0.0, 1.0).unwrap();
            assert_eq!(dev.download(&u).unwrap(), base_u, "uniform on {} {cfg:?}", dev.name());
            let mut z = dev.alloc::<f64>(n).unwrap();
            rnd::rand_normal::launch::<f64>(&dev, cfg, &mut z, 42, 7, 1.0, 2.0).unwrap();
            let z = dev.download(&z).unwrap();
            assert!(z.iter().zip(&base_n).all(|(a, b)| a.to_bits() == b.to_bits()), "normal on {} {cfg:?}", dev.name());
        }
        // Two calls, the second at offset + blocks_used(first), continue the stream.
        let k = 300;
        let (mut a, mut b) = (dev.alloc::<f64>(k).unwrap(), dev.alloc::<f64>(n - k).unwrap());
        ops::rand_normal::<f64>(&dev, &mut a, 42, 7, 1.0, 2.0).unwrap();
        ops::rand_normal::<f64>(&dev, &mut b, 42, 7 + ops::blocks_used(k), 1.0, 2.0).unwrap();
        let joined: Vec<f64> = dev.download(&a).unwrap().into_iter().chain(dev.download(&b).unwrap()).collect();
        assert!(joined.iter().zip(&base_n).all(|(a, b)| a.to_bits() == b.to_bits()), "split stream on {}", dev.name());
        // Another seed or offset gives other numbers.
        let mut c = dev.alloc::<f32>(n).unwrap();
        ops::rand_uniform::<f32>(&dev, &mut c, 43, 7, 0.0, 1.0).unwrap();
        let same = dev.download(&c).unwrap().iter().zip(&base_u).filter(|(a, b)| a == b).count();
        assert!(same < 5, "seed 43 repeats {same} of seed 42's values");
    }
}

#[test]
fn box_muller_math_matches_std() {
    let mut worst: [f64; 4] = [0.0; 4];
    for k in 0..200_000u64 {
        let u = (k as f64 + 0.5) / 200_000.0;
        let x = u * 1e-300_f64.max(u) * (1.0 + k as f64);
        let rel = |a: f64, b: f64| if b == 0.0 { a.abs() } else { ((a - b) / b).abs() };
        worst[0] = worst[0].max(rel(rnd::ln_f64(u), u.ln()).min((rnd::ln_f64(u) - u.ln()).abs()));
        worst[1] = worst[1].max(rel(rnd::sqrt_f64(x), x.sqrt()));
        let (s, c) = rnd::sincos_turns(u);
        let t = std::f64::consts::TAU * u;
        worst[2] = worst[2].max((s - t.sin()).abs());
        worst[3] = worst[3].max((c - t.cos()).abs());
    }
    // ln: relative (absolute near 1, where ln -> 0); sin/cos absolute (values in [-1, 1]).
    assert!(worst[0] < 1e-14 && worst[1] < 1e-15 && worst[2] < 1e-14 && worst[3] < 1e-14, "{worst:?}");
    assert!((rnd::ln_f64(2f64.powi(-53)) - (2f64.powi(-53)).ln()).abs() < 1e-12);
}

fn moments(x: &[f64]) -> (f64, f64, f64) {
    let n = x.len() as f64;
    let m = x.iter().sum::<f64>() / n;
    let v = x.iter().map(|a| (a - m).powi(2)).sum::<f64>() / n;
    let m4 = x.iter().map(|a| (a - m).powi(4)).sum::<f64>() / n;
    (m, v, m4)
}

fn ks(mut x: Vec<f64>, cdf: impl Fn(f64) -> f64) -> f64 {
    x.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = x.len() as f64;
    x.iter().enumerate().map(|(i, &v)| {
        let f = cdf(v);
        (f - i as f64 / n).abs().max(((i + 1) as f64 / n - f).abs())
    }).fold(0.0, f64::max)
}

#[test]
fn uniform_and_normal_statistics() {
    let n = 1 << 16;
    let dev = Device::cpu(kernel_dsl::host::WaveSize::W32);
    let sn = (n as f64).sqrt();
    // Uniform on [-1, 3): mean 1, variance 16/12, mu4 = 16^2/80.
    let mut u = dev.alloc::<f32>(n).unwrap();
    ops::rand_uniform::<f32>(&dev, &mut u, 2024, 0, -1.0, 3.0).unwrap();
    let u: Vec<f64> = dev.download(&u).unwrap().into_iter().map(|v| v as f64).collect();
    assert!(u.iter().all(|&v| (-1.0..=3.0).contains(&v)));
    let (m, v, _) = moments(&u);
    let var: f64 = 16.0 / 12.0;
    assert!((m - 1.0).abs() < 5.0 * var.sqrt() / sn, "uniform mean {m}");
    assert!((v - var).abs() < 5.0 * (256.0 / 80.0 - var * var).sqrt() / sn, "uniform variance {v}");
    let d = ks(u, |x| ((x + 1.0) / 4.0).clamp(0.0, 1.0));
    assert!(d < 1.95 / sn, "uniform KS {d}");
    // Normal(0.5, 2): variance 4, mu4 = 3 * 16.
    for dt in ["f32", "f64"] {
        let z: Vec<f64> = if dt == "f32" {
            let mut z = dev.alloc::<f32>(n).unwrap();
            ops::rand_normal::<f32>(&dev, &mut z, 99, 5, 0.5, 2.0).unwrap();
            dev.download(&z).unwrap().into_iter().map(|v| v as f64).collect()
        } else {
            let mut z = dev.alloc::<f64>(n).unwrap();
            ops::rand_normal::<f64>(&dev, &mut z, 99, 5, 0.5, 2.0).unwrap();
            dev.download(&z).unwrap()
        };
        let (m, v, _) = moments(&z);
        assert!((m - 0.5).abs() < 5.0 * 2.0 / sn, "{dt} normal mean {m}");
        assert!((v - 4.0).abs() < 5.0 * (48.0f64 - 16.0).sqrt() / sn, "{dt} normal variance {v}");
        let d = ks(z, |x| 0.5 * (1.0 + libm::erf((x - 0.5) / (2.0 * std::f64::consts::SQRT_2))));
        assert!(d < 1.95 / sn, "{dt} normal KS {d}");
    }
    // Pairs (even, odd) of one block are uncorrelated: |corr| < 5 / sqrt(n/2).
    let mut z = dev.alloc::<f64>(n).unwrap();
    ops::rand_normal::<f64>(&dev, &mut z, 7, 0, 0.0, 1.0).unwrap();
    let z = dev.download(&z).unwrap();
    let corr = z.chunks(2).map(|p| p[0] * p[1]).sum::<f64>() / (n / 2) as f64;
    assert!(corr.abs() < 5.0 / ((n / 2) as f64).sqrt(), "pair correlation {corr}");
}

#[test]
fn bad_parameters_are_rejected() {
    let dev = Device::cpu(kernel_dsl::host::WaveSize::W32);
    let mut out = dev.upload(&[7.0f32; 4]).unwrap();
    let bad = |r: Result<(), LaunchError>| matches!(r, Err(LaunchError::InvalidArgument { .. }));
    assert!(bad(ops::rand_uniform::<f32>(&dev, &mut out, 1, 0, 2.0, 1.0)));
    assert!(bad(ops::rand_uniform::<f32>(&dev, &mut out, 1, 0, 0.0, f64::INFINITY)));
    assert!(bad(ops::rand_normal::<f32>(&dev, &mut out, 1, 0, 0.0, -1.0)));
    assert!(bad(ops::rand_normal::<f32>(&dev, &mut out, 1, 0, f64::NAN, 1.0)));
    assert_eq!(dev.download(&out).unwrap(), [7.0; 4]);
    let mut empty = dev.alloc::<f64>(0).unwrap();
    ops::rand_normal::<f64>(&dev, &mut empty, 1, 0, 0.0, 1.0).unwrap();
}
