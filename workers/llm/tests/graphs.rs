//! Decode steps on the graph path of `LlamaRunner` (persistent per-bucket buffers, padding
//! rows on the scratch block, the forward captured once per bucket and replayed) against the
//! packed path of the same runner ([`DecodeGraphs::Off`]) on the same device.
//!
//! On the CPU executor (no graphs) the graph path runs the same buffers eagerly: these tests
//! check its buffer logic (batches of 1, 3 padded to 4, and 8 sequences of different lengths
//! over several steps, bucket changes, freed blocks reused, a block table outgrowing its
//! bucket), that padding rows write no block, and that the scratch block is never handed
//! out. On a GPU (`cuda:0`, `rocm:0` with those features) the last test checks that a
//! replayed step's logits are bit-identical to the eager step's; without one it says SKIPPED.
use candle_core::{DType, Device};
use llm_engine::{Engine, EngineConfig, Event, FinishReason, SamplingParams};
use llm_worker::random::{RandomModel, Shape};
use llm_worker::runner::{DecodeGraphs, ModelRunner, SeqChunk};
use llm_worker::{Family, LlamaRunner, Model};

/// A head size the paged kernels have (64), 2 layers, max 256 positions.
const SHAPE: Shape = Shape { vocab: 512, hidden: 128, intermediate: 256, layers: 2, heads: 4, kv_heads: 2, head_dim: 64, max_positions: 256 };
const BLOCK: usize = 4;
const BLOCKS: usize = 64;

fn model_dir(dtype: DType) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut r = RandomModel::new(Family::Llama, SHAPE);
    r.seed = 31;
    r.dtype = dtype;
    r.write(dir.path()).unwrap();
    dir
}

fn runner(dir: &tempfile::TempDir, dev: &Device, mode: DecodeGraphs) -> LlamaRunner {
    let mut r = LlamaRunner::new(Model::load(dir.path(), dev).unwrap(), BLOCKS, BLOCK).unwrap();
    assert!(r.model().kernel_attention());
    r.set_decode_graphs(mode);
    r
}

fn cpu_executor() -> Device {
    candle_rocm::cpu_executor(candle_rocm::WaveSize::W64)
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 37 + salt * 101 + 5) % 500).collect()
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let s = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / s
}

fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| if v > bv { (i, v) } else { (bi, bv) }).0 as u32
}

/// A sequence the test drives by hand: its tokens so far and its blocks.
struct Seq {
    id: u64,
    tokens: Vec<u32>,
    table: Vec<u32>,
}

/// The sequences of a scenario and a free list of blocks (lowest first), as the engine's
/// block manager would hand them out (never the scratch block: ids are `0..BLOCKS`).
struct Driver {
    free: Vec<u32>,
    seqs: Vec<Seq>,
    next_id: u64,
}

impl Driver {
    fn new() -> Self {
        Driver { free: (0..BLOCKS as u32).rev().collect(), seqs: vec![], next_id: 0 }
    }

    /// Blocks for `len` positions of sequence `s`.
    fn grow(&mut self, s: usize, len: usize) {
        while self.seqs[s].table.len() * BLOCK < len {
            let b = self.free.pop().expect("a free block");
            self.seqs[s].table.push(b);
        }
    }

    /// A new sequence's prefill chunk.
    fn add(&mut self, p: Vec<u32>) -> SeqChunk {
        let id = self.next_id;
        self.next_id += 1;
        self.seqs.push(Seq { id, tokens: p.clone(), table: vec![] });
        let s = self.seqs.len() - 1;
        self.grow(s, p.len());
        SeqChunk { seq_id: id, tokens: p, start_pos: 0, block_table: self.seqs[s].table.clone(), sample: true }
    }

    /// Ends sequence `id`; its blocks go back to the free list (reused by later sequences).
    fn finish(&mut self, id: u64) {
        let i = self.seqs.iter().position(|s| s.id == id).unwrap();
        let s = self.seqs.remove(i);
        self.free.extend(s.table.into_iter().rev());
    }

    /// One decode chunk per live sequence: its last token at the next position.
    fn decodes(&mut self) -> Vec<SeqChunk> {
        (0..self.seqs.len())
            .map(|s| {
                let pos = self.seqs[s].tokens.len() - 1;
                self.grow(s, pos + 1);
                let q = &self.seqs[s];
                SeqChunk { seq_id: q.id, tokens: vec![*q.tokens.last().unwrap()], start_pos: pos, block_table: q.table.clone(), sample: true }
            })
            .collect()
    }

    /// Appends each sampled row's greedy token to its sequence (the chunks' order).
    fn push(&mut self, batch: &[SeqChunk], logits: &[Vec<f32>]) {
        for (c, row) in batch.iter().zip(logits) {
            let s = self.seqs.iter_mut().find(|s| s.id == c.seq_id).unwrap();
            s.tokens.push(argmax(row));
        }
    }
}

/// Runs `batch` on both runners, checks their logits agree, and returns the packed path's.
fn both(fast: &mut LlamaRunner, plain: &mut LlamaRunner, batch: &[SeqChunk], what: &str, worst: &mut f32) -> Vec<Vec<f32>> {
    let (x, y) = (fast.step(batch).unwrap(), plain.step(batch).unwrap());
    assert_eq!(x.len(), y.len(), "{what}");
    for (r, (p, q)) in x.iter().zip(&y).enumerate() {
        assert_eq!(p.len(), SHAPE.vocab);
        let e = max_rel(p, q);
        *worst = worst.max(e);
        // The same kernels on the same cache; the paths differ in the products' row
        // counts (padded buckets) and the attention's split sizes (sized by the bucket's
        // block-table capacity): f32 sums in another order, rounded to f16 activations
        // (eps 4.9e-4) between ops, over two layers and the head.
        assert!(e < 5e-3, "{what}: row {r}: {e:.2e}");
    }
    y
}

/// Prefills new sequences of lengths `lens` on both runners.
fn prefill(d: &mut Driver, fast: &mut LlamaRunner, plain: &mut LlamaRunner, lens: &[usize], worst: &mut f32) {
    let batch: Vec<SeqChunk> = lens.iter().map(|&n| d.add(prompt(n, d.next_id as u32))).collect();
    let l = both(fast, plain, &batch, "prefill", worst);
    d.push(&batch, &l);
}

/// `steps` decode steps of every live sequence on both runners.
fn decode(d: &mut Driver, fast: &mut LlamaRunner, plain: &mut LlamaRunner, steps: usize, worst: &mut f32) {
    for k in 0..steps {
        let batch = d.decodes();
        let what = format!("{} sequences, step {k}", batch.len());
        let l = both(fast, plain, &batch, &what, worst);
        d.push(&batch, &l);
    }
}

#[test]
fn graph_path_logits_match_the_packed_path_over_bucket_changes_and_freed_blocks() {
    let dir = model_dir(DType::F16);
    let dev = cpu_executor();
    let (mut fast, mut plain) = (runner(&dir, &dev, DecodeGraphs::Captured), runner(&dir, &dev, DecodeGraphs::Off));
    let mut d = Driver::new();
    let mut worst = 0f32;
    // One sequence (bucket 1).
    prefill(&mut d, &mut fast, &mut plain, &[5], &mut worst);
    decode(&mut d, &mut fast, &mut plain, 4, &mut worst);
    assert_eq!(fast.decode_buckets(), [(1, 16, false)], "bucket 1, 16 blocks, nothing captured on the CPU executor");
    // Three of different lengths (bucket 4, one padding row), across block boundaries.
    prefill(&mut d, &mut fast, &mut plain, &[9, 3], &mut worst);
    decode(&mut d, &mut fast, &mut plain, 5, &mut worst);
    // Eight (bucket 8).
    prefill(&mut d, &mut fast, &mut plain, &[2, 11, 6, 7, 1], &mut worst);
    decode(&mut d, &mut fast, &mut plain, 3, &mut worst);
    // Five finish; their blocks go to a new sequence: back to bucket 4 (three padding rows
    // on a bucket that ran three sequences before).
    let ended = [0, 2, 4, 6, 7];
    let freed: Vec<u32> = d.seqs.iter().filter(|s| ended.contains(&s.id)).flat_map(|s| s.table.clone()).collect();
    for id in ended {
        d.finish(id);
    }
    prefill(&mut d, &mut fast, &mut plain, &[10], &mut worst);
    let new = &d.seqs.last().unwrap().table;
    assert!(new.iter().all(|b| freed.contains(b)), "the new sequence's blocks {new:?} are freed ones {freed:?}");
    decode(&mut d, &mut fast, &mut plain, 3, &mut worst);
    let sizes: Vec<usize> = fast.decode_buckets().iter().map(|b| b.0).collect();
    assert_eq!(sizes, [1, 4, 8]);
    // A context past the bucket's 16 blocks (64 positions): bucket 1 is rebuilt with 32.
    for id in d.seqs.iter().map(|s| s.id).collect::<Vec<_>>() {
        d.finish(id);
    }
    prefill(&mut d, &mut fast, &mut plain, &[62], &mut worst);
    decode(&mut d, &mut fast, &mut plain, 4, &mut worst);
    assert!(fast.decode_buckets().contains(&(1, 32, false)), "{:?}", fast.decode_buckets());
    eprintln!("graph path vs packed path: largest error {worst:.2e} of the largest logit");
}

/// Every layer's K and V cache on the host, as f32.
fn cache_host(r: &LlamaRunner) -> Vec<Vec<f32>> {
    (0..SHAPE.layers).flat_map(|l| [true, false].map(|k| r.cache_tensor(l, k).unwrap().to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap())).collect()
}

#[test]
fn padding_rows_write_no_block_and_the_scratch_block_stays_empty() {
    let dir = model_dir(DType::F16);
    let dev = cpu_executor();
    let mut r = runner(&dir, &dev, DecodeGraphs::Captured);
    let scratch = r.scratch_block() as usize;
    assert_eq!((scratch, r.num_blocks()), (BLOCKS, BLOCKS), "the scratch block is past the engine's blocks");
    let mut d = Driver::new();
    let batch: Vec<SeqChunk> = [6, 3, 9].iter().map(|&n| d.add(prompt(n, n as u32))).collect();
    let l = r.step(&batch).unwrap();
    d.push(&batch, &l);
    for step in 0..3 {
        let before = cache_host(&r);
        let batch = d.decodes();
        let l = r.step(&batch).unwrap();
        assert_eq!(l.len(), 3, "no logits of the padding row");
        d.push(&batch, &l);
        let after = cache_host(&r);
        // The slots the three decodes wrote, as element ranges of the flat cache.
        let per_slot = SHAPE.kv_heads * SHAPE.head_dim;
        let written: Vec<usize> = batch.iter().map(|c| (c.block_table[c.start_pos / BLOCK] as usize * BLOCK + c.start_pos % BLOCK) * per_slot).collect();
        for (t, (a, b)) in after.iter().zip(&before).enumerate() {
            assert_eq!(a.len(), (BLOCKS + 1) * BLOCK * per_slot);
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                let slot_start = i / per_slot * per_slot;
                if !written.contains(&slot_start) {
                    assert_eq!(x.to_bits(), y.to_bits(), "step {step}: cache tensor {t}: element {i} (block {}) changed", i / (BLOCK * per_slot));
                }
            }
            // Each decode's own slot was written (the check above can see a write).
            for &w in &written {
                assert!(a[w..w + per_slot] != b[w..w + per_slot], "step {step}: tensor {t}: slot at {w} not written");
            }
            let s = &a[scratch * BLOCK * per_slot..];
            assert!(s.iter().all(|&x| x == 0.0), "step {step}: the scratch block was written");
        }
    }
    assert_eq!(r.decode_buckets().iter().map(|b| b.0).collect::<Vec<_>>(), [4], "three sequences ran in bucket 4");
}

/// A runner that records every block the engine names.
struct Recording {
    inner: LlamaRunner,
    seen: std::collections::BTreeSet<u32>,
}

impl ModelRunner for Recording {
    type Error = llm_worker::Error;
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }
    fn step(&mut self, batch: &[SeqChunk]) -> Result<Vec<Vec<f32>>, Self::Error> {
        for c in batch {
            self.seen.extend(&c.block_table);
        }
        self.inner.step(batch)
    }
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), Self::Error> {
        for p in pairs {
            self.seen.extend([p.0, p.1]);
        }
        self.inner.copy_blocks(pairs)
    }
    fn blocks_allocated(&mut self, blocks: &[u32]) {
        self.seen.extend(blocks);
    }
}

#[test]
fn the_engine_never_allocates_the_scratch_block_and_tokens_match_the_packed_path() {
    let dir = model_dir(DType::F16);
    let dev = cpu_executor();
    // Few blocks: the engine uses every one of them (and preempts).
    let blocks = 12;
    let config = EngineConfig { max_num_seqs: 6, max_batched_tokens: 64, max_model_len: 40, prefix_caching: true };
    let run = |mode: DecodeGraphs| {
        let mut inner = LlamaRunner::new(Model::load(dir.path(), &dev).unwrap(), blocks, BLOCK).unwrap();
        inner.set_decode_graphs(mode);
        let mut engine = Engine::new(Recording { inner, seen: Default::default() }, config.clone());
        let mut rxs: Vec<_> = (0..6).map(|k| engine.add_request(prompt(3 + 2 * k, k as u32), SamplingParams::greedy(7)).unwrap().1).collect();
        while engine.step().unwrap() {}
        let tokens: Vec<Vec<u32>> = rxs
            .iter_mut()
            .map(|rx| {
                let mut t = vec![];
                while let Ok(ev) = rx.try_recv() {
                    match ev {
                        Event::Token { id, .. } => t.push(id),
                        Event::Finished { reason, .. } => assert_eq!(reason, FinishReason::Length),
                    }
                }
                t
            })
            .collect();
        let r = engine.runner();
        (tokens, r.seen.clone(), r.inner.scratch_block(), r.inner.decode_buckets())
    };
    let (fast, seen, scratch, buckets) = run(DecodeGraphs::Captured);
    let (plain, ..) = run(DecodeGraphs::Off);
    assert_eq!(scratch as usize, blocks);
    assert!(!seen.contains(&scratch), "the engine named the scratch block: {seen:?}");
    assert_eq!(seen.len(), blocks, "the engine used every block: {seen:?}");
    assert!(!buckets.is_empty(), "decode steps took the graph path");
    // Greedy tokens: equal unless two logits are within the paths' rounding (checked above
    // to 5e-3 of the largest); the random model's rows are not that close here.
    assert_eq!(fast, plain);
    assert!(fast.iter().all(|t| t.len() == 7));
}

/// The first GPU (`cuda:0`, `rocm:0`) with its name, or `None` after saying SKIPPED and
/// what goes unchecked.
fn gpu(what: &str) -> Option<(Device, String)> {
    let gpu = ["cuda:0", "rocm:0"].iter().find_map(|s| llm_worker::device(s).ok());
    if gpu.is_none() {
        eprintln!("SKIPPED: no GPU (build with --features cuda or rocm on a machine with one): {what} not checked");
    }
    gpu
}

/// Bits of logits rows.
fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter().map(|r| r.iter().map(|x| x.to_bits()).collect()).collect()
}

#[test]
fn replayed_decode_steps_are_bit_identical_to_eager_steps_on_a_gpu() {
    let Some((dev, name)) = gpu("graph replay") else { return };
    let dir = model_dir(DType::BF16);
    let (mut graph, mut eager) = (runner(&dir, &dev, DecodeGraphs::Captured), runner(&dir, &dev, DecodeGraphs::Eager));
    let mut plain = runner(&dir, &dev, DecodeGraphs::Off);
    let mut d = Driver::new();
    let mut steps = 0;
    for (lens, decodes) in [(&[5usize][..], 4), (&[9, 3][..], 4), (&[2, 11, 6, 7, 1][..], 4), (&[62][..], 6)] {
        let batch: Vec<SeqChunk> = lens.iter().map(|&n| d.add(prompt(n, d.next_id as u32))).collect();
        let (a, b) = (graph.step(&batch).unwrap(), eager.step(&batch).unwrap());
        plain.step(&batch).unwrap();
        assert_eq!(bits(&a), bits(&b), "{name}: prefill");
        d.push(&batch, &a);
        for k in 0..decodes {
            let batch = d.decodes();
            let (a, b, c) = (graph.step(&batch).unwrap(), eager.step(&batch).unwrap(), plain.step(&batch).unwrap());
            assert_eq!(bits(&a), bits(&b), "{name}: {} sequences, step {k}: replay vs eager", batch.len());
            for (r, (x, y)) in a.iter().zip(&c).enumerate() {
                // bf16 activations (eps 3.9e-3): the packed path rounds at the same points
                // but sums in other orders; a few ulp of bf16 over two layers.
                let e = max_rel(x, y);
                assert!(e < 3e-2, "{name}: {} sequences, step {k}, row {r}: graph vs packed path {e:.2e}", batch.len());
            }
            d.push(&batch, &a);
            steps += 1;
        }
        if lens.len() == 5 {
            for id in [0, 2, 4, 6, 7] {
                d.finish(id);
            }
        }
    }
    let b = graph.decode_buckets();
    assert!(b.iter().all(|x| x.2), "{name}: every bucket captured: {b:?}");
    eprintln!("{name}: {steps} replayed decode steps bit-identical to eager; buckets {b:?}");
}

#[test]
fn persistent_index_writes_check_their_input_and_change_nothing_on_an_error() {
    use candle_rocm::paged::{write_into, CacheIndex, DecodeIndex};
    let dev = cpu_executor();
    // write_into: whole u32 buffers of the right length only.
    let t = candle_core::Tensor::new(&[1u32, 2, 3, 4], &dev).unwrap();
    write_into(&t, &[5u32, 6, 7, 8]).unwrap();
    assert_eq!(t.to_vec1::<u32>().unwrap(), [5, 6, 7, 8]);
    assert!(write_into(&t, &[1u32, 2]).is_err(), "short");
    assert!(write_into(&t, &[1f32, 2., 3., 4.]).is_err(), "dtype");
    assert!(write_into(&t.narrow(0, 1, 2).unwrap(), &[1u32, 2]).is_err(), "a view");
    assert!(write_into(&candle_core::Tensor::new(&[1u32], &Device::Cpu).unwrap(), &[2u32]).is_err(), "Candle's CPU");
    assert_eq!(t.to_vec1::<u32>().unwrap(), [5, 6, 7, 8], "errors wrote nothing");
    // CacheIndex: 3 tokens, rope tables of 10 rows, 4 blocks of 2 (8 slots).
    let mut ci = CacheIndex::with_capacity(&dev, 3, 10, 4, 2).unwrap();
    assert_eq!(ci.tokens(), 3);
    assert_eq!(ci.positions().to_vec1::<u32>().unwrap(), [0, 0, 0]);
    ci.write(&[0, 7, -1], &[1, 9, 0]).unwrap();
    for (slots, pos, what) in [(&[0i64, 8, -1][..], &[0u32, 0, 0][..], "slot outside"), (&[3, 3, -1], &[0, 0, 0], "repeated slot"), (&[0, 1, 2], &[0, 10, 0], "position past the tables"), (&[0, 1], &[0, 1], "too few")] {
        assert!(ci.write(slots, pos).is_err(), "{what}");
    }
    assert_eq!(ci.positions().to_vec1::<u32>().unwrap(), [1, 9, 0], "errors wrote nothing");
    assert!(CacheIndex::with_capacity(&Device::Cpu, 3, 10, 4, 2).is_err());
    assert!(CacheIndex::with_capacity(&dev, 0, 10, 4, 2).is_err());
    // DecodeIndex: 2 rows of 3 blocks of 2 in a cache of 4 blocks.
    let mut di = DecodeIndex::with_capacity(&dev, 2, 3, 4, 2).unwrap();
    assert_eq!((di.batch(), di.max_blocks()), (2, 3));
    di.write(&[0, 1, 2, 3, 9, 9], &[5, 1]).unwrap();
    for (tables, lens, what) in [(&[0u32, 1, 2, 3, 0, 0][..], &[7u32, 1][..], "context past its row"), (&[0, 4, 0, 0, 0, 0], &[3, 1], "block outside"), (&[0, 1, 2], &[1, 1], "short table")] {
        assert!(di.write(tables, lens).is_err(), "{what}");
    }
    assert!(DecodeIndex::with_capacity(&dev, 0, 3, 4, 2).is_err());
    assert!(DecodeIndex::with_capacity(&dev, 2, 0, 4, 2).is_err());
    // PrefillIndex of a fixed shape: 3 chunks over 8 query rows, table rows of 4 blocks of 2
    // in a cache of 4 blocks.
    use candle_rocm::paged_prefill::PrefillIndex;
    let mut pi = PrefillIndex::with_capacity(&dev, 3, 8, 4, 4, 2).unwrap();
    assert_eq!((pi.batch(), pi.total_q()), (3, 8));
    let tables = [0u32, 1, 2, 0, 0, 0, 0, 0, 3, 3, 3, 0];
    pi.write(&[0, 3, 3, 8], &[5, 0, 5], &tables).unwrap();
    type Step<'a> = (&'a [u32], &'a [u32], &'a [u32], &'a str);
    let bad: [Step; 6] = [
        (&[0, 3, 3, 7], &[5, 0, 5], &tables, "rows other than the index's 8"),
        (&[0, 3, 3, 8], &[2, 0, 5], &tables, "a chunk longer than its context"),
        (&[0, 3, 3, 8], &[9, 0, 5], &tables, "a context past its row"),
        (&[0, 3, 3, 8], &[5, 0, 5], &[0, 1, 4, 0, 0, 0, 0, 0, 3, 3, 3, 0], "a block outside the cache"),
        (&[0, 3, 3, 8], &[5, 0, 5], &tables[..8], "short tables"),
        (&[0, 3, 2, 8], &[5, 0, 6], &tables, "decreasing offsets"),
    ];
    for (cu, lens, t, what) in bad {
        assert!(pi.write(cu, lens, t).is_err(), "{what}");
    }
    assert_eq!((pi.batch(), pi.total_q()), (3, 8), "errors changed nothing");
    assert!(PrefillIndex::with_capacity(&Device::Cpu, 3, 8, 4, 4, 2).is_err(), "Candle's CPU");
    assert!(PrefillIndex::with_capacity(&dev, 3, 9, 4, 4, 2).is_err(), "9 rows cannot fit tables of 4 blocks of 2");
}

/// A prompt chunk of `p[from..to]` of the driver's sequence `id` (blocks grown to `to`);
/// it samples when it ends the prompt.
fn chunk(d: &mut Driver, id: u64, p: &[u32], from: usize, to: usize) -> SeqChunk {
    let s = d.seqs.iter().position(|s| s.id == id).unwrap();
    d.grow(s, to);
    SeqChunk { seq_id: id, tokens: p[from..to].to_vec(), start_pos: from, block_table: d.seqs[s].table.clone(), sample: to == p.len() }
}

/// A new sequence of prompt `p` with no step run yet (its first chunk comes from [`chunk`]).
fn open(d: &mut Driver, p: &[u32]) -> u64 {
    let id = d.next_id;
    d.next_id += 1;
    d.seqs.push(Seq { id, tokens: p.to_vec(), table: vec![] });
    id
}

/// Runs a step of decodes and prompt chunks on both runners; appends the sampled tokens.
fn mixed(d: &mut Driver, fast: &mut LlamaRunner, plain: &mut LlamaRunner, chunks: Vec<SeqChunk>, what: &str, worst: &mut f32) {
    let mut batch = d.decodes();
    // Sequences whose prompt is still being chunked are not decoding yet.
    batch.retain(|c| chunks.iter().all(|k| k.seq_id != c.seq_id));
    // Chunks first and last, decodes between: the fast path packs decodes first and puts
    // the output rows back in the batch's order.
    let mut all = vec![];
    let split = chunks.len() / 2;
    all.extend_from_slice(&chunks[..split]);
    all.extend(batch);
    all.extend_from_slice(&chunks[split..]);
    let l = both(fast, plain, &all, what, worst);
    let sampled: Vec<SeqChunk> = all.into_iter().filter(|c| c.sample).collect();
    d.push(&sampled, &l);
}

#[test]
fn mixed_steps_match_the_packed_path_over_chunk_slots_prefixes_and_padding() {
    let dir = model_dir(DType::F16);
    let dev = cpu_executor();
    let (mut fast, mut plain) = (runner(&dir, &dev, DecodeGraphs::Captured), runner(&dir, &dev, DecodeGraphs::Off));
    fast.set_mixed_max_rows(64);
    let mut d = Driver::new();
    let mut worst = 0f32;
    prefill(&mut d, &mut fast, &mut plain, &[5, 9], &mut worst);
    decode(&mut d, &mut fast, &mut plain, 2, &mut worst);
    // Two decodes and a new 7-token prompt: 16 prompt rows (9 of them padding).
    let p = prompt(7, 40);
    let id = open(&mut d, &p);
    let c = chunk(&mut d, id, &p, 0, 7);
    mixed(&mut d, &mut fast, &mut plain, vec![c], "2 decodes + 7", &mut worst);
    // A 30-token prompt in two chunks (the first samples nothing, the second has a cached
    // prefix) beside a whole 10-token prompt, then three chunks beside the decodes.
    let (p1, p2) = (prompt(30, 41), prompt(10, 42));
    let (a, b) = (open(&mut d, &p1), open(&mut d, &p2));
    let (c1, c2) = (chunk(&mut d, a, &p1, 0, 13), chunk(&mut d, b, &p2, 0, 10));
    mixed(&mut d, &mut fast, &mut plain, vec![c1, c2], "3 decodes + 13 + 10", &mut worst);
    let p3 = prompt(6, 43);
    let e = open(&mut d, &p3);
    let (c1, c3) = (chunk(&mut d, a, &p1, 13, 30), chunk(&mut d, e, &p3, 0, 6));
    mixed(&mut d, &mut fast, &mut plain, vec![c1, c3], "4 decodes + 17 (prefix 13) + 6", &mut worst);
    decode(&mut d, &mut fast, &mut plain, 2, &mut worst);
    // Four chunks (every slot), 64 rows exactly: no padding chunk rows.
    let ps: Vec<Vec<u32>> = (0..4).map(|k| prompt(16, 50 + k)).collect();
    let chunks: Vec<SeqChunk> = ps.iter().map(|p| (open(&mut d, p), p)).collect::<Vec<_>>().into_iter().map(|(id, p)| chunk(&mut d, id, p, 0, 16)).collect();
    let ids: Vec<u64> = chunks.iter().map(|c| c.seq_id).collect();
    mixed(&mut d, &mut fast, &mut plain, chunks, "6 decodes + 4 x 16", &mut worst);
    // They end (room in the cache for what follows).
    for id in ids {
        d.finish(id);
    }
    let before = fast.mixed_buckets().len();
    // Five chunks, or more prompt tokens than 64: the packed path (no new bucket).
    let ps: Vec<Vec<u32>> = (0..5).map(|k| prompt(3, 60 + k)).collect();
    let chunks: Vec<SeqChunk> = ps.iter().map(|p| (open(&mut d, p), p)).collect::<Vec<_>>().into_iter().map(|(id, p)| chunk(&mut d, id, p, 0, 3)).collect();
    mixed(&mut d, &mut fast, &mut plain, chunks, "6 decodes + 5 x 3", &mut worst);
    let p = prompt(65, 70);
    let id = open(&mut d, &p);
    let c = chunk(&mut d, id, &p, 0, 65);
    mixed(&mut d, &mut fast, &mut plain, vec![c], "11 decodes + 65", &mut worst);
    assert_eq!(fast.mixed_buckets().len(), before, "steps past the mixed buckets' limits take the packed path");
    decode(&mut d, &mut fast, &mut plain, 2, &mut worst);
    let got: Vec<(usize, usize)> = fast.mixed_buckets().iter().map(|b| (b.0, b.1)).collect();
    assert_eq!(got, [(2, 16), (4, 32), (8, 64)], "decode rows and prompt rows of each mixed bucket");
    assert!(fast.mixed_buckets().iter().all(|b| !b.3), "nothing captured on the CPU executor");
    // The same cache contents: padding rows wrote nothing (the scratch block is still zero).
    let (x, y) = (cache_host(&fast), cache_host(&plain));
    let per_block = BLOCK * SHAPE.kv_heads * SHAPE.head_dim;
    for (t, (a, b)) in x.iter().zip(&y).enumerate() {
        assert!(a[BLOCKS * per_block..].iter().all(|&v| v == 0.0), "tensor {t}: the scratch block was written");
        let e = a.iter().zip(b).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        assert!(e < 2e-2, "tensor {t}: caches differ by {e}");
    }
    eprintln!("mixed steps vs packed path: largest error {worst:.2e} of the largest logit; buckets {:?}", fast.mixed_buckets());
}

#[test]
fn replayed_mixed_steps_are_bit_identical_to_eager_steps_on_a_gpu() {
    let Some((dev, name)) = gpu("mixed-step graph replay") else { return };
    let dir = model_dir(DType::BF16);
    let (mut graph, mut eager) = (runner(&dir, &dev, DecodeGraphs::Captured), runner(&dir, &dev, DecodeGraphs::Eager));
    let mut d = Driver::new();
    let batch: Vec<SeqChunk> = [5usize, 9, 3].iter().map(|&n| d.add(prompt(n, n as u32))).collect();
    let (a, b) = (graph.step(&batch).unwrap(), eager.step(&batch).unwrap());
    assert_eq!(bits(&a), bits(&b), "{name}: prefill");
    d.push(&batch, &a);
    // Each step: the live sequences decode beside new prompts of these lengths; the same
    // shapes come back (replays of one bucket with other chunks) and a prompt continues.
    let mut steps = 0;
    for (k, lens) in [&[7usize][..], &[11][..], &[3, 4][..], &[20, 9][..], &[6][..], &[12, 2, 5][..]].iter().enumerate() {
        let chunks: Vec<SeqChunk> = lens
            .iter()
            .map(|&n| {
                let p = prompt(n, 80 + k as u32 + n as u32);
                let id = open(&mut d, &p);
                chunk(&mut d, id, &p, 0, n)
            })
            .collect();
        let mut all = d.decodes();
        all.retain(|c| chunks.iter().all(|x| x.seq_id != c.seq_id));
        all.extend(chunks);
        let (a, b) = (graph.step(&all).unwrap(), eager.step(&all).unwrap());
        assert_eq!(bits(&a), bits(&b), "{name}: mixed step {k}: replay vs eager");
        let sampled: Vec<SeqChunk> = all.into_iter().filter(|c| c.sample).collect();
        d.push(&sampled, &a);
        steps += 1;
        // Some sequences end, so later steps reuse buckets.
        if k % 2 == 1 {
            let id = d.seqs[0].id;
            d.finish(id);
        }
    }
    let m = graph.mixed_buckets();
    assert!(m.iter().all(|x| x.3), "{name}: every mixed bucket captured: {m:?}");
    eprintln!("{name}: {steps} mixed steps bit-identical to eager; mixed buckets {m:?}");
}
