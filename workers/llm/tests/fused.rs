//! The fused path (rope_and_cache, paged decode attention, varlen flash prefill over the
//! cache) against the plain Candle-op path of the same runner on the same device (the CPU
//! executor, which runs the kernels): a step of fresh prefills, then a step mixing a decode,
//! a continued chunk and a new prefill, then decodes; llama (no window) and mistral (a
//! window shorter than the contexts: windowed varlen, plain decodes past the window).
use candle_core::DType;
use llm_worker::random::{RandomModel, Shape};
use llm_worker::runner::{ModelRunner, SeqChunk};
use llm_worker::{Family, LlamaRunner, Model};

/// A head size the attention kernels have (64), f16 weights (their dtype).
const SHAPE: Shape = Shape { vocab: 512, hidden: 128, intermediate: 256, layers: 2, heads: 4, kv_heads: 2, head_dim: 64, max_positions: 256 };

fn model_dir(family: Family, window: Option<usize>) -> tempfile::TempDir {
    model_dir_of(family, window, DType::F16)
}

fn model_dir_of(family: Family, window: Option<usize>, dtype: DType) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut r = RandomModel::new(family, SHAPE);
    r.seed = 21;
    r.dtype = dtype;
    r.sliding_window = window;
    r.write(dir.path()).unwrap();
    dir
}

fn runner(dir: &tempfile::TempDir, fused: bool) -> LlamaRunner {
    runner_with(dir, fused, true, candle_rocm::WaveSize::W64)
}

fn runner_with(dir: &tempfile::TempDir, fused: bool, gated: bool, wave: candle_rocm::WaveSize) -> LlamaRunner {
    let exec = candle_rocm::cpu_executor(wave);
    let mut m = Model::load(dir.path(), &exec).unwrap();
    m.set_fused(fused);
    m.set_gated_matvec(gated);
    LlamaRunner::new(m, 16, 4).unwrap()
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 37 + salt * 101 + 5) % 500).collect()
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let s = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / s
}

fn chunk(seq_id: u64, tokens: Vec<u32>, start_pos: usize, block_table: &[u32]) -> SeqChunk {
    SeqChunk { seq_id, tokens, start_pos, block_table: block_table.to_vec(), sample: true }
}

fn compare(family: Family, window: Option<usize>) {
    let dir = model_dir(family, window);
    let (mut fast, mut plain) = (runner(&dir, true), runner(&dir, false));
    assert!(fast.model().kernel_attention() && !plain.model().kernel_attention());
    let (t0, t1, t2) = ([3u32, 9, 4], [0u32, 5, 11], [7u32, 1, 14]);
    let steps = [
        // Two fresh prefills packed together (varlen over their own keys).
        vec![chunk(0, prompt(6, 1), 0, &t0), chunk(1, prompt(9, 2), 0, &t1)],
        // A decode, a continued chunk over its cached prefix, a new prefill.
        vec![chunk(1, vec![44], 9, &t1), chunk(0, prompt(3, 3), 6, &t0), chunk(2, prompt(5, 4), 0, &t2)],
        // Decodes of three context lengths (paged attention, or past the window plain).
        vec![chunk(2, vec![71], 5, &t2), chunk(0, vec![12], 9, &t0), chunk(1, vec![300], 10, &t1)],
    ];
    let mut worst = 0f32;
    for (i, batch) in steps.iter().enumerate() {
        let (x, y) = (fast.step(batch).unwrap(), plain.step(batch).unwrap());
        assert_eq!(x.len(), batch.len());
        for (r, (p, q)) in x.iter().zip(&y).enumerate() {
            let e = max_rel(p, q);
            worst = worst.max(e);
            // f16 activations: both paths round q/k/v, the rotated keys and the attention
            // output to f16 (eps 2^-11 ~ 4.9e-4) at different points (the kernels rotate in
            // f32 and round once, the flash kernel rounds P to f16 for P.V); over two layers
            // and the head that is a few 1e-3 of the largest logit.
            assert!(e < 1e-2, "{family:?} step {i} row {r}: {e:.2e}");
        }
    }
    eprintln!("{family:?}: largest error {worst:.2e} of the largest logit");
}

#[test]
fn fused_llama_matches_plain_ops_on_the_cpu_executor() {
    compare(Family::Llama, None);
}

#[test]
fn fused_mistral_window_matches_plain_ops_on_the_cpu_executor() {
    compare(Family::Mistral, Some(5));
}

/// Backend op calls of one decode step of two sequences, fused and plain: the fused path
/// makes fewer (rope, cache write and attention are one op each per layer).
#[test]
fn fused_decode_makes_fewer_backend_ops() {
    let dir = model_dir(Family::Llama, None);
    let mut calls = vec![];
    for fused in [false, true] {
        let mut r = runner(&dir, fused);
        let (ta, tb) = ([1u32, 2], [5u32, 6]);
        r.step(&[chunk(0, prompt(5, 1), 0, &ta), chunk(1, prompt(3, 2), 0, &tb)]).unwrap();
        let device = r.model().device.clone();
        let dev = candle_rocm::RocmDevice::from_candle(&device).unwrap();
        dev.take_profile().unwrap();
        dev.set_profiling(true);
        r.step(&[chunk(0, vec![7], 5, &ta), chunk(1, vec![8], 3, &tb)]).unwrap();
        dev.set_profiling(false);
        let p = dev.take_profile().unwrap();
        eprintln!("fused = {fused}: {} backend op calls per decode step ({} layers)\n{}", p.calls(), SHAPE.layers, p.table());
        calls.push(p.calls());
    }
    assert!(calls[1] < calls[0], "fused {} calls, plain {}", calls[1], calls[0]);
}

/// Backend op calls of the q/k/v path on the fused path (llama: stacked q/k/v weights, no
/// q/k norms), per step of two sequences: the stacked product's q, k, v column slices go
/// to `rope_and_cache` in place (no `copy_strided` of them: before, a prefill of more than
/// 8 rows made three a layer), a step of fresh prefills attends over its own keys (no
/// `index_select` gathers out of the cache: the embedding's and the sampled rows' remain),
/// and continued chunks read their cached prefixes through the block tables (the paged
/// prefill kernel, one launch a layer: no gather of keys and values either).
#[test]
fn fused_qkv_path_reads_the_stacked_product_in_place() {
    let dir = model_dir(Family::Llama, None);
    let mut r = runner(&dir, true);
    let device = r.model().device.clone();
    let dev = candle_rocm::RocmDevice::from_candle(&device).unwrap();
    let (ta, tb) = ([1u32, 2, 3], [5u32, 6, 7]);
    let layers = SHAPE.layers as u64;
    let profile = |r: &mut LlamaRunner, batch: &[SeqChunk]| {
        dev.take_profile().unwrap();
        dev.set_profiling(true);
        r.step(batch).unwrap();
        dev.set_profiling(false);
        let p = dev.take_profile().unwrap();
        eprintln!("{} backend op calls\n{}", p.calls(), p.table());
        p
    };
    // Fresh prefills of 13 rows (the stacked GEMM, not the matvec): every chunk from 0.
    let p = profile(&mut r, &[chunk(0, prompt(7, 1), 0, &ta), chunk(1, prompt(6, 2), 0, &tb)]);
    assert_eq!(p.calls_of("copy_strided"), 0, "prefill copies");
    assert_eq!(p.calls_of("rope_and_cache"), layers);
    assert_eq!(p.calls_of("flash_attn_varlen"), layers);
    assert!(p.calls_of("index_select") <= 2, "prefill gathers {} (embedding and sampled rows only)", p.calls_of("index_select"));
    // Decode.
    let p = profile(&mut r, &[chunk(0, vec![7], 7, &ta), chunk(1, vec![8], 6, &tb)]);
    assert_eq!(p.calls_of("copy_strided"), 0, "decode copies");
    assert_eq!(p.calls_of("rope_and_cache"), layers);
    // Continued chunks: their cached prefixes are read in place by the paged prefill kernel.
    let p = profile(&mut r, &[chunk(0, prompt(4, 3), 8, &ta), chunk(1, prompt(2, 4), 7, &tb)]);
    assert_eq!(p.calls_of("copy_strided"), 0, "continued chunks copy");
    assert_eq!(p.calls_of("paged_prefill"), layers);
    assert!(p.calls_of("index_select") <= 2, "continued chunks gather {} (embedding and sampled rows only)", p.calls_of("index_select"));
}

/// The gated matvec (decode's gate/up product and `SiLU(gate) * up` in one kernel) against
/// the unfused MLP (the product rounded to the dtype, then `silu_mul`), both on the fused
/// path of the CPU executor (waves of 32 and 64), f16 and bf16 weights: prefills (more
/// than 8 rows: both take the product), then decode steps of 1 and 3 sequences (the gated
/// kernel). The logits must differ (the gated kernel ran: it rounds once where the
/// unfused MLP rounds the gate and up values first) by at most a bf16-sized error: both
/// paths agree up to one rounding of the [tokens, 2 I] product per layer (2^-8 relative
/// for bf16), which two layers and the head carry to a few 1e-3 of the largest logit.
#[test]
fn gated_matvec_matches_the_unfused_mlp() {
    for dtype in [DType::F16, DType::BF16] {
        let dir = model_dir_of(Family::Llama, None, dtype);
        for wave in [candle_rocm::WaveSize::W32, candle_rocm::WaveSize::W64] {
            let (mut gated, mut plain) = (runner_with(&dir, true, true, wave), runner_with(&dir, true, false, wave));
            let (t0, t1, t2) = ([3u32, 9, 4], [0u32, 5, 11], [7u32, 1, 14]);
            let steps = [
                vec![chunk(0, prompt(6, 1), 0, &t0), chunk(1, prompt(9, 2), 0, &t1), chunk(2, prompt(4, 3), 0, &t2)],
                vec![chunk(0, vec![12], 6, &t0)],
                vec![chunk(2, vec![71], 4, &t2), chunk(0, vec![19], 7, &t0), chunk(1, vec![300], 9, &t1)],
                vec![chunk(1, vec![44], 10, &t1), chunk(2, vec![5], 5, &t2), chunk(0, vec![8], 8, &t0)],
            ];
            let (mut worst, mut decode_worst) = (0f32, 0f32);
            for (i, batch) in steps.iter().enumerate() {
                let (x, y) = (gated.step(batch).unwrap(), plain.step(batch).unwrap());
                assert_eq!(x.len(), batch.len());
                for (r, (p, q)) in x.iter().zip(&y).enumerate() {
                    let e = max_rel(p, q);
                    worst = worst.max(e);
                    if i > 0 {
                        decode_worst = decode_worst.max(e);
                    }
                    assert!(e < 2e-2, "{dtype:?} {wave:?} step {i} row {r}: {e:.2e}");
                }
            }
            assert!(decode_worst > 0.0, "{dtype:?} {wave:?}: decode logits identical: the gated kernel did not run");
            eprintln!("{dtype:?} {wave:?}: largest difference {worst:.2e} of the largest logit (decode steps {decode_worst:.2e})");
        }
    }
}
