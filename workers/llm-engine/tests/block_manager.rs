//! Block manager invariants under random operation sequences (proptest), against a model of
//! which tables hold which blocks.

use llm_engine::BlockManager;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    /// A new table covering this many tokens.
    New(usize),
    /// Grow table i (mod count) by this many tokens.
    Grow(usize, usize),
    Fork(usize),
    /// Copy-on-write of table i's block j before a write.
    Cow(usize, usize),
    Free(usize),
    /// Register table i's full blocks with tokens from seed s, then look them up again.
    Cache(usize, u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1usize..40).prop_map(Op::New),
        (0usize..8, 1usize..20).prop_map(|(i, n)| Op::Grow(i, n)),
        (0usize..8).prop_map(Op::Fork),
        (0usize..8, 0usize..4).prop_map(|(i, j)| Op::Cow(i, j)),
        (0usize..8).prop_map(Op::Free),
        (0usize..8, 0u32..3).prop_map(|(i, s)| Op::Cache(i, s)),
    ]
}

const BS: usize = 4;

fn block_tokens(seed: u32, i: usize) -> Vec<u32> {
    (0..BS as u32).map(|k| seed * 1000 + i as u32 * 10 + k).collect()
}

/// Applies `ops` to a manager of 24 blocks, checking the invariants and the reference
/// counts against the model after each, and that everything is free at the end.
fn run_ops(ops: Vec<Op>, caching: bool) -> Result<(), TestCaseError> {
    let nb = 24;
    let mut bm = BlockManager::new(nb, BS, caching);
    // Each table: (blocks, tokens covered).
    let mut tables: Vec<(Vec<u32>, usize)> = Vec::new();
    for op in ops {
        match op {
            Op::New(n) => {
                let mut t = Vec::new();
                let free = bm.num_free();
                match bm.grow(&mut t, n) {
                    Ok(()) => { prop_assert_eq!(t.len(), n.div_ceil(BS)); tables.push((t, n)); }
                    Err(_) => { prop_assert!(t.is_empty()); prop_assert_eq!(bm.num_free(), free); prop_assert!(n.div_ceil(BS) > free); }
                }
            }
            Op::Grow(i, n) if !tables.is_empty() => {
                let i = i % tables.len();
                let (t, len) = &mut tables[i];
                let before = t.clone();
                if bm.grow(t, *len + n).is_ok() { *len += n; } else { prop_assert_eq!(&*t, &before); }
            }
            Op::Fork(i) if !tables.is_empty() => {
                let (t, len) = tables[i % tables.len()].clone();
                bm.share(&t);
                tables.push((t, len));
            }
            Op::Cow(i, j) if !tables.is_empty() => {
                let i = i % tables.len();
                if tables[i].0.is_empty() { continue; }
                let j = j % tables[i].0.len();
                let src = tables[i].0[j];
                let shared = bm.ref_count(src) > 1;
                let free = bm.num_free();
                match bm.cow(&mut tables[i].0, j) {
                    Ok(Some((s, d))) => {
                        prop_assert!(shared);
                        prop_assert_eq!(s, src);
                        prop_assert_eq!(tables[i].0[j], d);
                        prop_assert_eq!(bm.ref_count(d), 1);
                    }
                    Ok(None) => prop_assert!(!shared),
                    Err(_) => { prop_assert!(shared && free == 0); prop_assert_eq!(tables[i].0[j], src); }
                }
            }
            Op::Free(i) if !tables.is_empty() => {
                let (mut t, _) = tables.remove(i % tables.len());
                bm.free_table(&mut t);
                // Every other free, the runner has been handed the pending copies.
                if i % 2 == 0 {
                    bm.copies_issued();
                }
            }
            Op::Cache(i, seed) if !tables.is_empty() => {
                let (t, len) = &tables[i % tables.len()];
                let full = len / BS;
                let mut parent = None;
                let mut hashes = Vec::new();
                for (k, &b) in t.iter().enumerate().take(full) {
                    let h = bm.register(b, parent, &block_tokens(seed, k));
                    hashes.push(h);
                    parent = Some(h);
                }
                // Looking the chain up again finds blocks holding exactly those tokens.
                let mut parent = None;
                for (k, &h) in hashes.iter().enumerate() {
                    if let Some((b, h2)) = bm.lookup(parent, &block_tokens(seed, k)) {
                        // A hit is a block registered under this chain (this table's, or
                        // an equal one registered first), now referenced.
                        prop_assert!(caching);
                        prop_assert_eq!(h2, h);
                        prop_assert!(bm.ref_count(b) >= 1);
                        bm.free(b);
                    }
                    // Other tokens after the same parent never hit.
                    prop_assert!(bm.lookup(parent, &block_tokens(seed + 7, k)).is_none());
                    parent = Some(h);
                }
                if !caching { prop_assert!(bm.lookup(None, &block_tokens(seed, 0)).is_none()); }
            }
            _ => {}
        }
        bm.check_invariants().map_err(TestCaseError::fail)?;
        // Reference counts equal the number of tables holding each block.
        for b in 0..nb as u32 {
            let holders = tables.iter().map(|(t, _)| t.iter().filter(|&&x| x == b).count()).sum::<usize>();
            prop_assert_eq!(bm.ref_count(b) as usize, holders, "block {}", b);
        }
        prop_assert_eq!(bm.num_used() + bm.num_free(), nb);
    }
    for (mut t, _) in tables.drain(..) {
        bm.free_table(&mut t);
    }
    // Sources of copies never issued stay pinned until they are.
    bm.copies_issued();
    prop_assert_eq!(bm.num_used(), 0);
    prop_assert_eq!(bm.num_free(), nb);
    bm.check_invariants().map_err(TestCaseError::fail)?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn invariants_hold(ops in prop::collection::vec(op(), 1..60), caching in any::<bool>()) {
        run_ops(ops, caching)?;
    }
}

#[test]
fn a_case_proptest_once_shrank_to() {
    // Forks, cache registrations and frees interleaved over one cached chain.
    use Op::*;
    let ops = vec![New(4), Fork(0), Cache(0, 2), Free(0), Fork(0), Free(0), New(1), New(1), New(1), New(4), Fork(1), Free(0), Free(0), Fork(2), Cache(2, 2)];
    run_ops(ops, true).unwrap();
}

#[test]
fn freed_cached_blocks_are_reused_by_hash_until_evicted_lru() {
    let mut bm = BlockManager::new(4, BS, true);
    let mut a = Vec::new();
    bm.grow(&mut a, 8).unwrap();
    let h0 = bm.register(a[0], None, &block_tokens(1, 0));
    bm.register(a[1], Some(h0), &block_tokens(1, 1));
    let (a0, a1) = (a[0], a[1]);
    bm.free_table(&mut a);
    assert_eq!((bm.num_used(), bm.num_cached_free()), (0, 2));
    // Both come back by hash.
    assert_eq!(bm.lookup(None, &block_tokens(1, 0)).map(|x| x.0), Some(a0));
    assert_eq!(bm.lookup(Some(h0), &block_tokens(1, 1)).map(|x| x.0), Some(a1));
    bm.free(a1);
    bm.free(a0);
    // The two never-used blocks go first, then the least recently freed cached one (a1).
    let mut b = Vec::new();
    bm.grow(&mut b, 12).unwrap();
    assert_eq!(b[2], a1);
    assert!(bm.lookup(Some(h0), &block_tokens(1, 1)).is_none(), "a1 was evicted");
    assert_eq!(bm.lookup(None, &block_tokens(1, 0)).map(|x| x.0), Some(a0));
    assert_eq!(bm.take_fresh().len(), 5, "2 + 3 fresh allocations, cache hits not counted");
}

#[test]
fn a_copy_on_write_source_is_not_reused_before_the_copy_is_issued() {
    // Two sequences share block `x`; the first writes into it (copy-on-write), then the second
    // is freed (a preemption later in the same schedule) while the copy is still pending.
    let mut bm = BlockManager::new(3, 4, false);
    let mut a = Vec::new();
    bm.grow(&mut a, 3).unwrap();
    let mut b = a.clone();
    bm.share(&b);
    let x = a[0];
    let (src, dst) = bm.cow(&mut a, 0).unwrap().expect("a shared block is copied");
    assert_eq!((src, a[0]), (x, dst));
    bm.free_table(&mut b);
    assert_eq!(bm.ref_count(x), 0);
    assert_eq!(bm.num_free(), 1, "the pending copy's source is not free");
    bm.check_invariants().unwrap();
    let mut c = Vec::new();
    bm.grow(&mut c, 4).unwrap();
    assert_ne!(c[0], x, "the source of a pending copy was handed out");
    assert!(bm.allocate().is_err());
    bm.copies_issued();
    assert_eq!(bm.num_free(), 1);
    bm.check_invariants().unwrap();
    assert_eq!(bm.allocate(), Ok(x));
}
