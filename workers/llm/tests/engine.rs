//! The runner under `llm_engine::Engine`: f32 greedy tokens of every request equal the same
//! request run alone, when batched with 7 others of different lengths, with chunked prefill,
//! preemption (recompute) and prefix sharing; every block is free at the end.
use candle_core::Device;
use llm_engine::{Engine, EngineConfig, Event, FinishReason, SamplingParams};
use llm_worker::generate::generate;
use llm_worker::random::{RandomModel, Shape};
use llm_worker::{Family, LlamaRunner, Model};

const MAX_NEW: usize = 6;

fn prompts() -> Vec<Vec<u32>> {
    // Lengths 3..=17; the last four share an 8-token prefix (two full blocks of 4).
    let shared: Vec<u32> = (0..8).map(|i| 40 + i * 3).collect();
    (0..8u32)
        .map(|k| {
            let own: Vec<u32> = (0..3 + k * 2).map(|i| (i * 53 + k * 97 + 1) % 500).collect();
            if k >= 4 {
                shared.iter().chain(&own[..own.len() - 8]).copied().collect()
            } else {
                own
            }
        })
        .collect()
}

fn run_engine(dir: &std::path::Path, num_blocks: usize, config: EngineConfig) -> (Vec<Vec<u32>>, llm_engine::EngineStats) {
    let runner = LlamaRunner::new(Model::load(dir, &Device::Cpu).unwrap(), num_blocks, 4).unwrap();
    let mut engine = Engine::new(runner, config);
    let mut rxs: Vec<_> = prompts().into_iter().map(|p| engine.add_request(p, SamplingParams::greedy(MAX_NEW)).unwrap().1).collect();
    while engine.step().unwrap() {}
    let stats = engine.stats();
    assert_eq!((stats.running, stats.waiting, stats.blocks_used), (0, 0, 0), "{stats:?}");
    let tokens = rxs
        .iter_mut()
        .map(|rx| {
            let mut t = vec![];
            let mut finished = None;
            while let Ok(ev) = rx.try_recv() {
                match ev {
                    Event::Token { id, .. } => t.push(id),
                    Event::Finished { reason, .. } => finished = Some(reason),
                }
            }
            assert_eq!(finished, Some(FinishReason::Length));
            t
        })
        .collect();
    (tokens, stats)
}

#[test]
fn greedy_tokens_through_the_engine_equal_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = RandomModel::new(Family::Llama, Shape::TINY);
    r.seed = 21;
    r.write(dir.path()).unwrap();
    // Alone: each prompt by itself on a fresh cache.
    let alone: Vec<Vec<u32>> = prompts()
        .iter()
        .map(|p| {
            let mut runner = LlamaRunner::new(Model::load(dir.path(), &Device::Cpu).unwrap(), 8, 4).unwrap();
            generate(&mut runner, std::slice::from_ref(p), MAX_NEW, &[], |_, _| {}).unwrap().0.remove(0)
        })
        .collect();
    // Roomy: all 8 in one batch.
    let roomy = EngineConfig { max_num_seqs: 8, max_batched_tokens: 256, max_model_len: 32, prefix_caching: false };
    let (tokens, _) = run_engine(dir.path(), 64, roomy);
    assert_eq!(tokens, alone, "batched");
    // Tight: chunked prefill (8 tokens a step), 12 blocks (preemption), prefix caching.
    let tight = EngineConfig { max_num_seqs: 8, max_batched_tokens: 8, max_model_len: 32, prefix_caching: true };
    let (tokens, stats) = run_engine(dir.path(), 12, tight);
    assert_eq!(tokens, alone, "chunked, preempted, prefix-shared");
    eprintln!("{stats:?}");
    assert!(stats.preemptions > 0 && stats.prefix_cache_hit_tokens > 0, "{stats:?}");
}

#[test]
fn blocks_and_device_memory_return_to_steady_state() {
    // On our backend (a CPU executor device of its own, so no other test's tensors count):
    // after requests finish, stop at a token or are cancelled, the engine holds no block and,
    // once warm, the device holds exactly what it held before them. The first two rounds
    // are the warm-up: first launches make one-time allocations (the second round's prefix
    // cache hits give new chunk shapes); candle-rocm's memory test warms up the same way.
    let dir = tempfile::tempdir().unwrap();
    RandomModel::new(Family::Qwen2, Shape::TINY).write(dir.path()).unwrap();
    let rocm = candle_rocm::RocmDevice::new_cpu_executor(candle_rocm::WaveSize::W64);
    let runner = LlamaRunner::new(Model::load(dir.path(), &rocm.as_candle()).unwrap(), 16, 4).unwrap();
    let config = EngineConfig { max_num_seqs: 4, max_batched_tokens: 32, max_model_len: 24, prefix_caching: true };
    let mut engine = Engine::new(runner, config);
    let mut steady = rocm.memory_stats();
    for round in 0..4 {
        let p = prompts();
        let (_, mut finished) = engine.add_request(p[1].clone(), SamplingParams::greedy(4)).unwrap();
        let (cancelled, mut rx_c) = engine.add_request(p[5].clone(), SamplingParams::greedy(8)).unwrap();
        // A stop token: the first token the model picks for this prompt.
        let first = {
            let mut r = LlamaRunner::new(Model::load(dir.path(), &Device::Cpu).unwrap(), 8, 4).unwrap();
            generate(&mut r, &[p[2].clone()], 1, &[], |_, _| {}).unwrap().0[0][0]
        };
        let (_, mut stopped) = engine.add_request(p[2].clone(), SamplingParams { stop_token_ids: vec![first], ..SamplingParams::greedy(8) }).unwrap();
        engine.step().unwrap();
        engine.step().unwrap();
        engine.cancel(cancelled);
        while engine.step().unwrap() {}
        let reason = |rx: &mut llm_engine::Receiver<Event>| {
            let mut last = None;
            while let Ok(ev) = rx.try_recv() {
                if let Event::Finished { reason, .. } = ev {
                    last = Some(reason);
                }
            }
            last
        };
        assert_eq!(reason(&mut finished), Some(FinishReason::Length), "round {round}");
        assert_eq!(reason(&mut rx_c), Some(FinishReason::Cancelled), "round {round}");
        assert_eq!(reason(&mut stopped), Some(FinishReason::Stop), "round {round}");
        let s = engine.stats();
        assert_eq!((s.running, s.waiting, s.blocks_used), (0, 0, 0), "round {round}: {s:?}");
        let now = rocm.memory_stats();
        eprintln!("round {round}: {now:?}");
        if round >= 2 {
            assert_eq!((now.in_use_bytes, now.live_blocks, now.cached_bytes), (steady.in_use_bytes, steady.live_blocks, steady.cached_bytes), "round {round}");
        }
        steady = now;
    }
}
