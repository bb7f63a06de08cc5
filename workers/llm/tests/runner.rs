//! The runner as the engine drives it: sequences batched with others (packed chunks of
//! different lengths, chunked prefill beside decodes) give the same logits and greedy
//! tokens as alone; block copies carry the cache; bad chunks are typed errors.
use candle_core::Device;
use llm_worker::generate::generate;
use llm_worker::random::{RandomModel, Shape};
use llm_worker::runner::{ModelRunner, SeqChunk};
use llm_worker::{Error, Family, LlamaRunner, Model};

fn tiny(family: Family) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut r = RandomModel::new(family, Shape::TINY);
    r.seed = 11;
    r.write(dir.path()).unwrap();
    dir
}

fn runner(dir: &tempfile::TempDir, blocks: usize) -> LlamaRunner {
    LlamaRunner::new(Model::load(dir.path(), &Device::Cpu).unwrap(), blocks, 4).unwrap()
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 37 + salt * 101 + 5) % 500).collect()
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let s = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / s
}

#[test]
fn greedy_tokens_alone_equal_batched() {
    for family in [Family::Llama, Family::Qwen3] {
        let dir = tiny(family);
        let prompts: Vec<Vec<u32>> = [5, 9, 3, 12].iter().enumerate().map(|(i, &n)| prompt(n, i as u32)).collect();
        let mut r = runner(&dir, 64);
        let (batched, _) = generate(&mut r, &prompts, 8, &[], |_, _| {}).unwrap();
        for (i, p) in prompts.iter().enumerate() {
            let (alone, _) = generate(&mut r, std::slice::from_ref(p), 8, &[], |_, _| {}).unwrap();
            assert_eq!(alone[0], batched[i], "{family:?} sequence {i}");
            assert_eq!(alone[0].len(), 8);
        }
    }
}

#[test]
fn chunked_prefill_beside_decodes_equals_alone() {
    let dir = tiny(Family::Mistral);
    let (a, b) = (prompt(6, 1), prompt(10, 2));
    let chunk = |id: u64, t: &[u32], start: usize, table: &[u32], sample: bool| SeqChunk { seq_id: id, tokens: t.to_vec(), start_pos: start, block_table: table.to_vec(), sample };
    let (ta, tb) = ([3u32, 0, 7], [6u32, 1, 4]);
    // Alone: a prefilled then two decode steps; b prefilled whole.
    let mut r = runner(&dir, 8);
    let a0 = r.step(&[chunk(1, &a, 0, &ta, true)]).unwrap();
    let a1 = r.step(&[chunk(1, &[17], 6, &ta, true)]).unwrap();
    let a2 = r.step(&[chunk(1, &[23], 7, &ta, true)]).unwrap();
    let b_whole = r.step(&[chunk(2, &b, 0, &tb, true)]).unwrap();
    // Together (a fresh cache): b's prefill in two chunks beside a's steps.
    let mut r = runner(&dir, 8);
    let s0 = r.step(&[chunk(1, &a, 0, &ta, true), chunk(2, &b[..4], 0, &tb, false)]).unwrap();
    assert_eq!(s0.len(), 1, "one row: b's first chunk does not sample");
    let s1 = r.step(&[chunk(2, &b[4..], 4, &tb, true), chunk(1, &[17], 6, &ta, true)]).unwrap();
    let s2 = r.step(&[chunk(1, &[23], 7, &ta, true)]).unwrap();
    // f32: rows of a packed product differ from a lone one only in summation order.
    for (x, y, what) in [(&s0[0], &a0[0], "a prefill"), (&s1[1], &a1[0], "a decode 1"), (&s2[0], &a2[0], "a decode 2"), (&s1[0], &b_whole[0], "b chunked")] {
        let e = max_rel(x, y);
        assert!(e < 1e-5, "{what}: {e:.2e}");
    }
}

#[test]
fn copied_blocks_carry_the_cache() {
    let dir = tiny(Family::Qwen2);
    let mut r = runner(&dir, 8);
    let p = prompt(7, 3);
    r.step(&[SeqChunk { seq_id: 0, tokens: p.clone(), start_pos: 0, block_table: vec![0, 1], sample: false }]).unwrap();
    r.copy_blocks(&[(0, 5), (1, 6)]).unwrap();
    let step = |r: &mut LlamaRunner, table: Vec<u32>| r.step(&[SeqChunk { seq_id: 0, tokens: vec![9], start_pos: 7, block_table: table, sample: true }]).unwrap();
    // Position 7 goes to offset 3 of the second block: each table writes its own copy.
    let orig = step(&mut r, vec![0, 1]);
    let copy = step(&mut r, vec![5, 6]);
    assert_eq!(orig, copy);
    // A table whose blocks were never written gives other logits (the test can fail).
    let fresh = step(&mut r, vec![2, 3]);
    assert!(max_rel(&fresh[0], &orig[0]) > 1e-3);
}

#[test]
fn bad_chunks_are_typed_errors() {
    let dir = tiny(Family::Llama);
    let mut r = runner(&dir, 4);
    let ok = SeqChunk { seq_id: 0, tokens: vec![1, 2, 3], start_pos: 0, block_table: vec![0], sample: true };
    let cases = [
        SeqChunk { tokens: vec![], ..ok.clone() },
        SeqChunk { block_table: vec![], ..ok.clone() },
        SeqChunk { start_pos: 2, ..ok.clone() },
        SeqChunk { block_table: vec![4], ..ok.clone() },
        SeqChunk { tokens: vec![1, 512, 3], ..ok.clone() },
        SeqChunk { start_pos: 5000, block_table: vec![0; 1251], ..ok.clone() },
    ];
    for c in cases {
        assert!(matches!(r.step(&[ok.clone(), c.clone()]), Err(Error::Invalid(_))), "{c:?}");
    }
    assert!(matches!(r.copy_blocks(&[(0, 4)]), Err(Error::Invalid(_))));
    assert_eq!(r.step(&[ok]).unwrap().len(), 1);
    assert!(matches!(LlamaRunner::new(Model::load(dir.path(), &Device::Cpu).unwrap(), 0, 4), Err(Error::Invalid(_))));
}

#[test]
fn batched_steps_on_the_cpu_executor_match_candles_cpu() {
    // Two prefills packed in one step, then two decodes of different context lengths (the
    // padded decode group), on our backend against the same runner on Candle's CPU (f32:
    // summation order only).
    let dir = tiny(Family::Qwen2);
    let exec = candle_rocm::cpu_executor(candle_rocm::WaveSize::W64);
    let mut ours = LlamaRunner::new(Model::load(dir.path(), &exec).unwrap(), 8, 4).unwrap();
    let mut cpu = runner(&dir, 8);
    let (a, b) = (prompt(5, 4), prompt(9, 5));
    let steps = [
        vec![SeqChunk { seq_id: 0, tokens: a.clone(), start_pos: 0, block_table: vec![7, 2], sample: true }, SeqChunk { seq_id: 1, tokens: b.clone(), start_pos: 0, block_table: vec![0, 5, 3], sample: true }],
        vec![SeqChunk { seq_id: 1, tokens: vec![44], start_pos: 9, block_table: vec![0, 5, 3], sample: true }, SeqChunk { seq_id: 0, tokens: vec![71], start_pos: 5, block_table: vec![7, 2], sample: true }],
    ];
    for (i, batch) in steps.iter().enumerate() {
        let (x, y) = (ours.step(batch).unwrap(), cpu.step(batch).unwrap());
        assert_eq!(x.len(), 2);
        for (r, (p, q)) in x.iter().zip(&y).enumerate() {
            let e = max_rel(p, q);
            assert!(e < 1e-4, "step {i} row {r}: {e:.2e}");
        }
    }
}
