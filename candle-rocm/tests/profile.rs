//! The per-op profile (`RocmDevice::set_profiling` / `take_profile`): exact op counts of a
//! small graph and of a small `candle-transformers` llama (derived from the model's
//! structure), times that add up, and nothing recorded while profiling is off.
mod common;

use candle_core::{DType, Result, Tensor};
use candle_nn::{VarBuilder, VarMap};
use candle_rocm::{Profile, RocmDevice};
use candle_transformers::models::llama::{Cache, Llama};
use common::models::small_llama_config;
use std::collections::BTreeMap;
use std::time::Instant;

/// `(op, dtype) -> calls`.
fn counts(p: &Profile) -> BTreeMap<(String, String), u64> {
    p.ops.iter().map(|o| ((o.op.clone(), o.dtype.as_str().to_string()), o.calls)).collect()
}

fn key(op: &str, dtype: &str) -> (String, String) {
    (op.to_string(), dtype.to_string())
}

/// Times are non-negative, sorted largest first, sum to the total and fit in `wall_ms`; on
/// the CPU executor (launches finish before returning) an op's device time spans its host time.
fn check_times(dev: &RocmDevice, p: &Profile, wall_ms: f64) {
    let what = dev.name();
    assert!(p.ops.windows(2).all(|w| w[0].device_ms >= w[1].device_ms), "{what}: sorted by device time");
    for o in &p.ops {
        assert!(o.device_ms >= 0.0 && o.host_ms >= 0.0 && o.calls > 0, "{what}: {o:?}");
        if !dev.kernels().is_gpu() {
            assert!(o.device_ms >= o.host_ms, "{what}: {o:?}: the CPU executor's device time is the call's wall time");
        }
    }
    let sum: f64 = p.ops.iter().map(|o| o.device_ms).sum();
    assert!((sum - p.total_ms()).abs() <= 1e-9 * sum.max(1.0));
    assert!(p.total_ms() <= wall_ms, "{what}: ops {} ms within the {wall_ms} ms they ran in", p.total_ms());
    // The table and files hold one row per (op, dtype).
    assert_eq!(p.to_csv().lines().count(), p.ops.len() + 1);
    assert_eq!(p.table().lines().count(), p.ops.len() + 2);
    assert_eq!(p.to_json().matches("\"op\":").count(), p.ops.len());
}

#[test]
fn a_small_graph_counts_each_backend_op_once() -> Result<()> {
    for dev in common::devices() {
        let d = dev.as_candle();
        dev.set_profiling(true);
        assert!(dev.is_profiling());
        let t = Instant::now();
        let a = Tensor::new(&[0.5f32, -1.0, 2.0, 3.5], &d)?;
        let b = a.exp()?;
        let c = (&b + &a)?;
        let s = c.sum_keepdim(0)?;
        let got = s.to_vec1::<f32>()?;
        let p = dev.take_profile()?;
        // Measured after the take, which waits for the last event: every op's interval lies
        // between `t` and now.
        let wall = t.elapsed().as_secs_f64() * 1e3;
        let want: f32 = [0.5f32, -1.0, 2.0, 3.5].iter().map(|x| x.exp() + x).sum();
        assert!((got[0] - want).abs() <= 1e-5 * want.abs(), "{}: {got:?} vs {want}", dev.name());
        let want_counts: BTreeMap<_, _> = [
            (key("upload", "f32"), 1),
            (key("unary.exp", "f32"), 1),
            (key("binary.add", "f32"), 1),
            (key("reduce.sum", "f32"), 1),
            (key("download", "f32"), 1),
        ]
        .into_iter()
        .collect();
        assert_eq!(counts(&p), want_counts, "{}", dev.name());
        check_times(&dev, &p, wall);

        // A take starts a new profile; with profiling off nothing is recorded.
        assert_eq!(dev.take_profile()?.calls(), 0);
        dev.set_profiling(false);
        let _ = (a.exp()? + 1.0)?.to_vec1::<f32>()?;
        assert_eq!(dev.take_profile()?, Profile::default(), "{}: profiling off records nothing", dev.name());
    }
    Ok(())
}

#[test]
fn a_small_llama_profiles_the_ops_its_structure_implies() -> Result<()> {
    for dev in common::devices() {
        for layers in [1usize, 3] {
            let d = dev.as_candle();
            let cfg = small_llama_config(layers);
            let vm = VarMap::new();
            let model = Llama::load(VarBuilder::from_varmap(&vm, DType::F32, &d), &cfg)?;
            let mut cache = Cache::new(true, DType::F32, &cfg, &d)?;
            dev.set_profiling(true);

            let t = Instant::now();
            let prompt = Tensor::new(&[1u32, 17, 42, 5, 88], &d)?.unsqueeze(0)?;
            let logits = model.forward(&prompt, 0, &mut cache)?;
            let _ = logits.to_vec2::<f32>()?;
            let prefill = dev.take_profile()?;
            let prefill_wall = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            let step = Tensor::new(&[7u32], &d)?.unsqueeze(0)?;
            let logits = model.forward(&step, 5, &mut cache)?;
            let _ = logits.to_vec2::<f32>()?;
            let decode = dev.take_profile()?;
            let decode_wall = t.elapsed().as_secs_f64() * 1e3;
            dev.set_profiling(false);

            let l = layers as u64;
            for (phase, p, wall) in [("prefill", &prefill, prefill_wall), ("decode", &decode, decode_wall)] {
                let what = format!("{} {layers} layers {phase}", dev.name());
                // Per layer: q, k, v, o projections, q·kᵀ and att·v, gate, up and down
                // projections; then the LM head.
                assert_eq!(p.calls_of("matmul"), 9 * l + 1, "{what}: {}", p.table());
                // Two RMS norms per layer and the final one.
                assert_eq!(p.calls_of("fused.rms_norm"), 2 * l + 1, "{what}");
                // Rotary embedding of q and k, one softmax per layer.
                assert_eq!(p.calls_of("fused.rope"), 2 * l, "{what}");
                assert_eq!(p.calls_of("fused.softmax_last_dim"), l, "{what}");
                // The token embedding lookup; the logits' transfer back.
                assert_eq!(p.calls_of("index_select"), 1, "{what}");
                assert_eq!(p.calls_of("download"), 1, "{what}");
                check_times(&dev, p, wall);
            }
            // The causal mask exists for the prompt only: uploaded once (then cached), applied
            // per layer by `masked_fill`, which uploads its -inf scalar each time. Both
            // phases upload their token ids.
            assert_eq!(prefill.calls_of("where_cond"), l, "{}", prefill.table());
            assert_eq!(decode.calls_of("where_cond"), 0, "{}", decode.table());
            assert_eq!(prefill.calls_of("upload"), 2 + l, "{}", prefill.table());
            assert_eq!(decode.calls_of("upload"), 1, "{}", decode.table());
        }
    }
    Ok(())
}
