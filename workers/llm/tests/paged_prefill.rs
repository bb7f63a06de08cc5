//! A prompt prefilled in capped chunks beside a decoding sequence, as the engine schedules
//! it with `--prefill-chunk-while-decoding`, on the fused path of the CPU executor: every
//! chunk after the first reads its cached prefix through the block table (the paged
//! prefill kernel, no gather of keys or values). Its last logits against a one-shot
//! prefill of the whole prompt, against the gather path (`Model::set_paged_prefill(false)`),
//! and against unmodified `candle-transformers` llama.
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models as ct;
use llm_worker::random::{RandomModel, Shape};
use llm_worker::runner::{ModelRunner, SeqChunk};
use llm_worker::{Family, LlamaRunner, Model, ModelConfig};

/// Head size 64 (a paged prefill instance), four query heads per KV head, hidden = heads *
/// head_dim (as candle-transformers' llama assumes), f16 weights.
const SHAPE: Shape = Shape { vocab: 512, hidden: 256, intermediate: 256, layers: 2, heads: 4, kv_heads: 1, head_dim: 64, max_positions: 256 };
const BS: usize = 16;

fn model_dir() -> (tempfile::TempDir, ModelConfig) {
    let dir = tempfile::tempdir().unwrap();
    let mut r = RandomModel::new(Family::Llama, SHAPE);
    r.seed = 5;
    r.dtype = DType::F16;
    r.write(dir.path()).unwrap();
    let c = ModelConfig::from_hf_file(&dir.path().join("config.json")).unwrap();
    (dir, c)
}

fn runner(dir: &tempfile::TempDir, paged: bool) -> LlamaRunner {
    let exec = candle_rocm::cpu_executor(candle_rocm::WaveSize::W64);
    let mut m = Model::load(dir.path(), &exec).unwrap();
    m.set_paged_prefill(paged);
    assert_eq!(m.paged_prefill(), paged);
    LlamaRunner::new(m, 12, BS).unwrap()
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 37 + salt * 101 + 5) % 500).collect()
}

/// Largest |a - b| over the largest |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let s = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / s
}

const PROMPT_LEN: usize = 45;
/// The cap: chunks of at most this many prompt tokens while the other sequence decodes.
const CAP: usize = 20;
/// Sequence 0's blocks, scrambled (its prompt spans three, the last partly filled).
const TABLE: [u32; 3] = [7, 2, 10];
/// Sequence 1 (the decoding one).
const OTHER: [u32; 1] = [4];

/// Sequence 1 prefills 5 tokens, then sequence 0's prompt runs in chunks of at most
/// [`CAP`] (prefixes 0, 20 and 40: not multiples of the block size) each beside a decode
/// of sequence 1; returns the last chunk's logits and the backend op calls of that step.
fn chunked(r: &mut LlamaRunner) -> (Vec<f32>, candle_rocm::profile::Profile) {
    let p = prompt(PROMPT_LEN, 1);
    let other = prompt(6, 2);
    r.step(&[SeqChunk { seq_id: 1, tokens: other[..5].to_vec(), start_pos: 0, block_table: OTHER.to_vec(), sample: false }]).unwrap();
    let device = r.model().device.clone();
    let dev = candle_rocm::RocmDevice::from_candle(&device).unwrap();
    let mut start = 0;
    let mut pos1 = 5;
    loop {
        let end = (start + CAP).min(PROMPT_LEN);
        let last = end == PROMPT_LEN;
        let batch = [
            SeqChunk { seq_id: 1, tokens: vec![other[pos1 % 6]], start_pos: pos1, block_table: OTHER.to_vec(), sample: true },
            SeqChunk { seq_id: 0, tokens: p[start..end].to_vec(), start_pos: start, block_table: TABLE.to_vec(), sample: last },
        ];
        if last {
            dev.take_profile().unwrap();
            dev.set_profiling(true);
        }
        let out = r.step(&batch).unwrap();
        if last {
            dev.set_profiling(false);
            return (out[1].clone(), dev.take_profile().unwrap());
        }
        start = end;
        pos1 += 1;
    }
}

#[test]
fn chunked_prefill_over_the_paged_cache_matches_one_shot_gather_and_candle_transformers() {
    let (dir, c) = model_dir();
    let layers = SHAPE.layers as u64;
    let (paged, prof) = chunked(&mut runner(&dir, true));
    let (gather, prof_gather) = chunked(&mut runner(&dir, false));
    eprintln!("paged path, last chunk step:\n{}\ngather path:\n{}", prof.table(), prof_gather.table());
    // The chunk with a prefix ran on the paged prefill kernel, one launch per layer, and
    // gathered no keys or values: the gather path's two index_select per layer are gone.
    assert_eq!(prof.calls_of("paged_prefill"), layers);
    assert_eq!(prof_gather.calls_of("paged_prefill"), 0);
    assert_eq!(prof_gather.calls_of("index_select"), prof.calls_of("index_select") + 2 * layers);

    // One-shot prefill of the whole prompt (fresh: attends over its own keys).
    let mut one = runner(&dir, true);
    let full = one.step(&[SeqChunk { seq_id: 0, tokens: prompt(PROMPT_LEN, 1), start_pos: 0, block_table: TABLE.to_vec(), sample: true }]).unwrap().remove(0);

    // candle-transformers' llama on Candle's CPU: the same weights in f32 (the exact
    // reference) and in f16 (Candle's own f16 error).
    let cfg = ct::llama::Config {
        hidden_size: c.hidden_size,
        intermediate_size: c.intermediate_size,
        vocab_size: c.vocab_size,
        num_hidden_layers: c.num_layers,
        num_attention_heads: c.num_heads,
        num_key_value_heads: c.num_kv_heads,
        use_flash_attn: false,
        rms_norm_eps: c.rms_norm_eps,
        rope_theta: c.rope_theta as f32,
        bos_token_id: None,
        eos_token_id: None,
        rope_scaling: None,
        max_position_embeddings: c.max_position_embeddings,
        tie_word_embeddings: c.tie_word_embeddings,
    };
    let logits = |dtype: DType| -> Vec<f32> {
        // SAFETY: the file was just written by this test and is not modified while mapped.
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[dir.path().join("model.safetensors")], dtype, &Device::Cpu).unwrap() };
        let model = ct::llama::Llama::load(vb, &cfg).unwrap();
        let mut cache = ct::llama::Cache::new(true, dtype, &cfg, &Device::Cpu).unwrap();
        let ids = Tensor::new(prompt(PROMPT_LEN, 1).as_slice(), &Device::Cpu).unwrap().unsqueeze(0).unwrap();
        model.forward(&ids, 0, &mut cache).unwrap().flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1().unwrap()
    };
    let (exact, candle_f16) = (logits(DType::F32), logits(DType::F16));

    let (e_full, e_gather) = (rel_err(&paged, &full), rel_err(&paged, &gather));
    let (e_ours, e_one, e_candle) = (rel_err(&paged, &exact), rel_err(&full, &exact), rel_err(&candle_f16, &exact));
    eprintln!("chunked vs one-shot {e_full:.2e}, vs gather {e_gather:.2e}; against f32 candle-transformers: chunked {e_ours:.2e}, one-shot {e_one:.2e}, Candle f16 {e_candle:.2e}");
    // The gather path runs the same tile step over the same keys in the same order (the
    // paged kernel only finds the rows through the table): the same logits up to
    // accumulation-order effects, far below one f16 rounding of a logit.
    assert!(e_gather <= 1e-3, "chunked paged vs gather: {e_gather:.3e}");
    // Against the one-shot prefill: both round q/k/v, the attention output and P to f16
    // (eps 2^-11 ~ 4.9e-4) at the same points, but over different chunk boundaries (the
    // chunks' products have other row counts): a few 1e-3 of the largest logit over two
    // layers, as in tests/fused.rs.
    assert!(e_full < 1e-2, "chunked vs one-shot: {e_full:.3e}");
    // Against the exact reference: f16 activations, so within twice Candle's own f16 error
    // (the style of families.rs' bf16 test).
    assert!(e_candle > 0.0 && e_ours <= 2.0 * e_candle, "chunked {e_ours:.3e} vs Candle's f16 {e_candle:.3e}");
}

/// The runner under the engine, recording each step's (decode rows, prompt tokens).
struct Rec {
    inner: LlamaRunner,
    /// Prompt lengths by sequence id (a one-token chunk at or past it is a decode).
    prompts: Vec<usize>,
    steps: Vec<(usize, usize)>,
}

impl llm_engine::ModelRunner for Rec {
    type Error = <LlamaRunner as llm_engine::ModelRunner>::Error;
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }
    fn step(&mut self, batch: &[SeqChunk]) -> Result<Vec<Vec<f32>>, Self::Error> {
        let decode = |c: &SeqChunk| c.tokens.len() == 1 && c.start_pos >= self.prompts[c.seq_id as usize];
        let d = batch.iter().filter(|c| decode(c)).count();
        let p = batch.iter().filter(|c| !decode(c)).map(|c| c.tokens.len()).sum();
        self.steps.push((d, p));
        self.inner.step(batch)
    }
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), Self::Error> {
        self.inner.copy_blocks(pairs)
    }
    fn blocks_allocated(&mut self, blocks: &[u32]) {
        self.inner.blocks_allocated(blocks)
    }
}

/// Greedy tokens of each request (sequence 0: 5-token prompt, 12 tokens, from the first
/// step; sequence 1: 40-token prompt, 3 tokens, added after the first step), and each
/// step's (decode rows, prompt tokens).
fn engine_run(dir: &tempfile::TempDir, cap: Option<usize>) -> (Vec<Vec<u32>>, Vec<(usize, usize)>) {
    use llm_engine::{Engine, EngineConfig, Event, SamplingParams};
    let (pa, pb) = (prompt(5, 3), prompt(40, 4));
    let rec = Rec { inner: runner(dir, true), prompts: vec![pa.len(), pb.len()], steps: vec![] };
    let mut e = Engine::new(rec, EngineConfig { max_num_seqs: 4, max_batched_tokens: 64, max_model_len: 64, prefix_caching: false });
    if let Some(c) = cap {
        e = e.with_prefill_chunk_while_decoding(c).unwrap();
    }
    let (_, mut ra) = e.add_request(pa, SamplingParams::greedy(12)).unwrap();
    assert!(e.step().unwrap());
    let (_, mut rb) = e.add_request(pb, SamplingParams::greedy(3)).unwrap();
    while e.step().unwrap() {}
    let mut toks = vec![vec![], vec![]];
    for (i, rx) in [&mut ra, &mut rb].into_iter().enumerate() {
        while let Ok(ev) = rx.try_recv() {
            if let Event::Token { id, .. } = ev {
                toks[i].push(id);
            }
        }
    }
    let steps = std::mem::take(&mut e.runner_mut().steps);
    (toks, steps)
}

/// The scheduler cap through the engine on the paged path: while sequence 0 decodes, the
/// 40-token prompt of sequence 1 runs in chunks of at most the cap (8), each continued
/// chunk on the paged prefill kernel, and both sequences' greedy tokens equal those of the
/// uncapped run (whose prompt runs in one step beside the decode).
#[test]
fn capped_chunks_beside_decodes_keep_the_greedy_tokens() {
    let (dir, _) = model_dir();
    let (capped, steps) = engine_run(&dir, Some(8));
    let (whole, steps_whole) = engine_run(&dir, None);
    eprintln!("capped steps {steps:?}\nuncapped steps {steps_whole:?}");
    assert_eq!((capped[0].len(), capped[1].len()), (12, 3));
    assert_eq!(capped, whole);
    // Capped: every step with a decode carries at most 8 prompt tokens, and the 40 run in
    // five such steps; uncapped: one step beside the decode carries all 40.
    assert!(steps.iter().all(|&(d, p)| d == 0 || p <= 8), "{steps:?}");
    assert_eq!(steps.iter().filter(|&&(d, p)| d > 0 && p > 0).count(), 5, "{steps:?}");
    assert!(steps_whole.iter().any(|&(d, p)| d > 0 && p == 40), "{steps_whole:?}");
}
