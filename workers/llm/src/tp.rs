//! Tensor parallelism in one process: [`TpRunner`] runs one rank per device, each a
//! [`LlamaRunner`] over its shard ([`crate::shard`]) in its own thread, all stepping together.
//!
//! The engine (scheduler, block manager, sampling) stays on the calling thread, which also
//! runs rank 0; ranks `1..N` get each batch through a channel. Every rank holds the same
//! block tables over its own key/value heads, so one block manager serves them all. Per
//! layer the ranks meet twice (all-reduce after o and after down), plus once for the
//! vocabulary-parallel embedding and once for the logits (all-gather) per step.
//!
//! Pure-decode steps take [`LlamaRunner`]'s graph path on every rank: each rank fills its
//! bucket's persistent buffers, runs the step eagerly once, then captures it on its own
//! device's stream and replays it. The collectives are queued on that stream (NCCL/RCCL
//! record into a capture), so a rank's graph holds its all-reduces and gather, and the
//! ranks' graphs meet in them on the devices. Ranks capture the same buckets at the same
//! steps, each in its own thread (thread-local capture mode). On CPU-executor devices
//! (no graphs) the same buffers run eagerly, with the host stand-in collective.
//!
//! Why threads in one process, not a process per GPU: the engine needs every rank to run
//! exactly its batch, and in one process a batch is a channel send instead of a
//! serialized message to other processes; `ncclCommInitAll` sets the communicator up
//! without a rendezvous; and the CPU executor's host stand-in collective, which CI tests
//! with, only exists within a process. Multi-host runs need a process per host (see
//! docs/multi-gpu.md).
use crate::error::{Error, Result};
use crate::runner::{DecodeGraphs, LlamaRunner};
use crate::shard::{self, TpPlan};
use crate::Model;
use candle_core::{Device, Tensor};
use kernel_collectives::{Collective, Communicator};
use llm_engine::{ModelRunner, SeqChunk};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

/// The collectives a tensor-parallel forward needs, on one rank's tensors. Every rank
/// calls the same ones in the same order with tensors of the same shape.
pub trait TpCollective: Send {
    /// This rank, `0..world()`.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn world(&self) -> usize;
    /// The elementwise sum of `x` over every rank.
    fn all_reduce_sum(&self, x: &Tensor) -> candle_core::Result<Tensor>;
    /// Every rank's `x` stacked in rank order: `[world, x.dims...]`.
    fn all_gather(&self, x: &Tensor) -> candle_core::Result<Tensor>;
}

/// NCCL/RCCL on GPUs, the host stand-in on CPU-executor devices.
impl TpCollective for Communicator {
    fn rank(&self) -> usize {
        Collective::rank(self)
    }
    fn world(&self) -> usize {
        self.world_size()
    }
    fn all_reduce_sum(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        candle_rocm::collective::all_reduce_sum(self, x)
    }
    fn all_gather(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        candle_rocm::collective::all_gather(self, x)
    }
}

/// A profiling stand-in for the collectives (`LLM_TP_SKIP_COLLECTIVES=1`): the sum returns
/// this rank's own tensor and the gather stacks copies of it, so each rank runs its shard's
/// kernels alone. The outputs are wrong; what it measures is a tensor-parallel step's time
/// without its collectives (their share of the step, against the real run).
struct NoCollectives {
    rank: usize,
    world: usize,
}

impl TpCollective for NoCollectives {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn all_reduce_sum(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        Ok(x.clone())
    }
    fn all_gather(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        Tensor::stack(&vec![x.clone(); self.world], 0)
    }
}

/// Whether `LLM_TP_SKIP_COLLECTIVES=1` is set (said once, loudly: outputs are wrong).
fn skip_collectives() -> bool {
    let on = std::env::var("LLM_TP_SKIP_COLLECTIVES").is_ok_and(|v| v == "1");
    if on {
        tracing::warn!("LLM_TP_SKIP_COLLECTIVES=1: every rank skips its all-reduces and all-gathers (timing only: the outputs are wrong)");
    }
    on
}

/// One rank's share of a model and its communicator.
pub struct TpRank {
    pub plan: TpPlan,
    pub comm: Box<dyn TpCollective>,
    /// Per token id of the whole vocabulary, `[vocab]` u32: its row in this rank's
    /// embedding shard (0 for ids outside the shard).
    vocab_rows: Tensor,
    /// Per token id, `[vocab, 1]` in the embedding's dtype: 1 where this rank's shard holds
    /// the id, 0 elsewhere.
    vocab_keep: Tensor,
}

impl TpRank {
    /// Rank `plan.rank` with its communicator, and the device tables of its vocabulary
    /// range (`vocab` ids, the embedding in `dtype` on `dev`) that let the vocabulary-parallel
    /// embedding run on the device alone, so a decode step with it can be captured as a graph.
    pub fn new(plan: TpPlan, comm: Box<dyn TpCollective>, vocab: usize, dtype: candle_core::DType, dev: &Device) -> Result<TpRank> {
        let r = plan.vocab_range();
        let rows: Vec<u32> = (0..vocab).map(|t| if r.contains(&t) { (t - r.start) as u32 } else { 0 }).collect();
        let keep: Vec<f32> = (0..vocab).map(|t| if r.contains(&t) { 1.0 } else { 0.0 }).collect();
        let vocab_rows = Tensor::from_vec(rows, vocab, dev)?;
        let vocab_keep = Tensor::from_vec(keep, (vocab, 1), dev)?.to_dtype(dtype)?;
        Ok(TpRank { plan, comm, vocab_rows, vocab_keep })
    }

    /// The embedding rows of `tokens` (`[T]` u32 on the device) from this rank's shard
    /// `embed` (its rows for the ids it holds, zeros for the others), summed over the ranks:
    /// the whole table's rows. Device ops and one all-reduce, no host read: capturable.
    pub(crate) fn embed_rows(&self, embed: &Tensor, tokens: &Tensor) -> candle_core::Result<Tensor> {
        let local = self.vocab_rows.index_select(tokens, 0)?;
        let keep = self.vocab_keep.index_select(tokens, 0)?;
        let rows = embed.index_select(&local, 0)?.broadcast_mul(&keep)?;
        self.comm.all_reduce_sum(&rows)
    }
}

/// The `n` devices of `--device spec --tensor-parallel n`: `cpu-executor[:w]` gives `n`
/// CPU-executor devices; `cuda:k` / `rocm:k` gives ordinals `k..k + n`. An error when a
/// device cannot be opened (fewer visible GPUs than `n`) or for Candle's CPU backend
/// (`cpu`), which has no communicator.
pub fn tp_devices(spec: &str, n: usize) -> Result<Vec<(Device, String)>> {
    if n == 0 {
        return Err(Error::TensorParallel("a tensor-parallel size of 0".into()));
    }
    if n == 1 {
        return Ok(vec![crate::device(spec)?]);
    }
    let (kind, ord) = spec.split_once(':').unwrap_or((spec, ""));
    match kind {
        "cpu" => Err(Error::TensorParallel(format!("--tensor-parallel {n} needs our backend's devices (cpu-executor, cuda:N, rocm:N); Candle's CPU backend (`cpu`) has no communicator"))),
        "cpu-executor" => (0..n).map(|_| crate::device(spec)).collect(),
        "cuda" | "rocm" => {
            let first: usize = if ord.is_empty() { 0 } else { ord.parse().map_err(|_| Error::Invalid(format!("device {spec:?}: bad ordinal")))? };
            (first..first + n)
                .map(|o| {
                    crate::device(&format!("{kind}:{o}")).map_err(|e| {
                        Error::TensorParallel(format!("--tensor-parallel {n} from {spec} needs the {n} devices {kind}:{first}..{kind}:{}; {kind}:{o} cannot be opened (fewer visible GPUs?): {e}", first + n - 1))
                    })
                })
                .collect()
        }
        _ => Err(Error::Invalid(format!("device {spec:?}: unknown (cpu, cpu-executor, cuda:N, rocm:N)"))),
    }
}

/// One communicator per device (rank `i` on `devs[i]`): `ncclCommInitAll` on GPUs, a host
/// group on CPU-executor devices. A failure is [`Error::Collective`] with the library's message.
pub fn communicators(devs: &[Device]) -> Result<Vec<Communicator>> {
    let kdevs = devs
        .iter()
        .map(|d| candle_rocm::RocmDevice::from_candle(d).map(|r| r.kernels().clone()).ok_or_else(|| Error::TensorParallel(format!("device {:?} is not one of our backend's (cpu-executor, cuda:N, rocm:N)", d.location()))))
        .collect::<Result<Vec<_>>>()?;
    Communicator::init_all(&kdevs).map_err(collective_error)
}

/// A communicator's failure as this crate's error, with the library's own text
/// (`ncclGetErrorString` and `ncclGetLastError` for a failed NCCL/RCCL call).
fn collective_error(e: kernel_collectives::CollectiveError) -> Error {
    Error::Collective(e.to_string())
}

/// Sets a rank's decode-graph mode and largest bucket (each when given).
fn configure(r: &mut LlamaRunner, mode: Option<DecodeGraphs>, max_batch: Option<usize>) {
    if let Some(m) = mode {
        r.set_decode_graphs(m);
    }
    if let Some(n) = max_batch {
        r.set_graph_max_batch(n);
    }
}

enum Job {
    Step(Vec<SeqChunk>),
    Copy(Vec<(u32, u32)>),
    Allocated(Vec<u32>),
    /// Decode-graph settings: the mode and the largest bucket (each when `Some`).
    Graphs(Option<DecodeGraphs>, Option<usize>),
    /// The rank's decode buckets (see [`LlamaRunner::decode_buckets`]).
    Buckets,
}

/// What a rank's thread answers to a job.
enum Reply {
    /// A step ran (rank 0's logits are the step's: every rank has them after the gather).
    Stepped,
    Done,
    Buckets(Vec<(usize, usize, bool)>),
}

struct Worker {
    rank: usize,
    jobs: mpsc::Sender<Job>,
    done: mpsc::Receiver<Result<Reply>>,
    thread: Option<JoinHandle<()>>,
}

/// A [`ModelRunner`] over `N` ranks of one model (see the module docs); with `N = 1` a plain
/// [`LlamaRunner`].
pub struct TpRunner {
    rank0: LlamaRunner,
    workers: Vec<Worker>,
}

impl TpRunner {
    /// A one-rank runner.
    pub fn single(runner: LlamaRunner) -> TpRunner {
        TpRunner { rank0: runner, workers: vec![] }
    }

    /// Loads `path` split across `devs` (one rank each, rank 0 on `devs[0]` in this thread,
    /// each rank reading only its slices), with a cache of `num_blocks` blocks of
    /// `block_size` tokens per rank. One device: the whole model, no communicator.
    pub fn load(path: &Path, devs: &[Device], num_blocks: usize, block_size: usize) -> Result<TpRunner> {
        match devs {
            [] => Err(Error::TensorParallel("no devices".into())),
            [d] => Ok(TpRunner::single(LlamaRunner::new(Model::load(path, d)?, num_blocks, block_size)?)),
            _ => {
                // Refuse a split the model cannot take before setting up the communicator.
                TpPlan::new(&shard::read_config(path)?, 0, devs.len())?;
                let comms = communicators(devs)?;
                let (world, skip) = (comms.len(), skip_collectives());
                let comms = comms
                    .into_iter()
                    .enumerate()
                    .map(|(rank, c)| match skip {
                        true => Box::new(NoCollectives { rank, world }) as Box<dyn TpCollective>,
                        false => Box::new(c) as Box<dyn TpCollective>,
                    })
                    .collect();
                TpRunner::with_comms(path, devs, comms, num_blocks, block_size)
            }
        }
    }

    /// [`TpRunner::load`] with given communicators (`comms[i]` is rank `i`, on `devs[i]`).
    pub fn with_comms(path: &Path, devs: &[Device], comms: Vec<Box<dyn TpCollective>>, num_blocks: usize, block_size: usize) -> Result<TpRunner> {
        if comms.len() != devs.len() || comms.is_empty() {
            return Err(Error::TensorParallel(format!("{} communicators for {} devices", comms.len(), devs.len())));
        }
        let mut comms = comms.into_iter();
        let comm0 = comms.next().ok_or_else(|| Error::TensorParallel("no communicator".into()))?;
        let mut workers = Vec::new();
        let mut ready = Vec::new();
        for (rank, (dev, comm)) in devs.iter().skip(1).zip(comms).enumerate().map(|(i, x)| (i + 1, x)) {
            let (jobs, job_rx) = mpsc::channel::<Job>();
            let (done_tx, done) = mpsc::channel();
            let (ready_tx, ready_rx) = mpsc::channel();
            let (path, dev): (PathBuf, Device) = (path.into(), dev.clone());
            let thread = std::thread::Builder::new()
                .name(format!("tp-rank-{rank}"))
                .spawn(move || {
                    let runner = shard::load_shard(&path, &dev, comm).and_then(|m| LlamaRunner::new(m, num_blocks, block_size));
                    let mut runner = match runner {
                        Ok(r) => {
                            let _ = ready_tx.send(Ok(()));
                            r
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    while let Ok(job) = job_rx.recv() {
                        let out = match job {
                            Job::Step(batch) => runner.run_discarding(&batch).map(|()| Reply::Stepped),
                            Job::Copy(pairs) => runner.copy_blocks(&pairs).map(|()| Reply::Done),
                            Job::Allocated(blocks) => {
                                runner.blocks_allocated(&blocks);
                                continue;
                            }
                            Job::Graphs(mode, max) => {
                                configure(&mut runner, mode, max);
                                Ok(Reply::Done)
                            }
                            Job::Buckets => Ok(Reply::Buckets(runner.decode_buckets())),
                        };
                        if done_tx.send(out).is_err() {
                            return;
                        }
                    }
                })
                .map_err(|e| Error::TensorParallel(format!("starting rank {rank}'s thread: {e}")))?;
            workers.push(Worker { rank, jobs, done, thread: Some(thread) });
            ready.push(ready_rx);
        }
        let rank0 = shard::load_shard(path, &devs[0], comm0).and_then(|m| LlamaRunner::new(m, num_blocks, block_size));
        let mut err = None;
        for (w, r) in workers.iter().zip(&ready) {
            match r.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    err.get_or_insert(format!("rank {}: {e}", w.rank));
                }
                Err(_) => {
                    err.get_or_insert(format!("rank {} stopped while loading", w.rank));
                }
            }
        }
        let runner = TpRunner { rank0: rank0?, workers };
        match err {
            // Rank 0's own error returned above with its type; a later rank's keeps its text.
            Some(e) => Err(Error::TensorParallel(format!("loading the shards: {e}"))),
            None => Ok(runner),
        }
    }

    /// The decode-graph cap of every rank (see [`LlamaRunner::set_graph_max_batch`]): the
    /// ranks of a split model run pure-decode steps through the same per-bucket buffers and
    /// captured graphs as one GPU, their collectives inside the graphs.
    pub fn set_graph_max_batch(&mut self, n: usize) -> Result<()> {
        self.together(|| Job::Graphs(None, Some(n)), |r| {
            configure(r, None, Some(n));
            Ok(())
        }).map(|_| ())
    }

    /// How every rank runs pure-decode steps (see [`LlamaRunner::set_decode_graphs`]).
    pub fn set_decode_graphs(&mut self, mode: DecodeGraphs) -> Result<()> {
        self.together(|| Job::Graphs(Some(mode), None), |r| {
            configure(r, Some(mode), None);
            Ok(())
        }).map(|_| ())
    }

    /// Each rank's decode buckets in rank order (see [`LlamaRunner::decode_buckets`]): the
    /// ranks step together, so they build and capture the same buckets.
    pub fn decode_buckets(&mut self) -> Result<Vec<Vec<(usize, usize, bool)>>> {
        let (first, rest) = self.together(|| Job::Buckets, |r| Ok(r.decode_buckets()))?;
        let mut all = vec![first];
        for reply in rest {
            match reply {
                Reply::Buckets(b) => all.push(b),
                _ => return Err(Error::TensorParallel("a rank answered another job".into())),
            }
        }
        Ok(all)
    }

    /// The largest decode bucket (every rank's; see [`LlamaRunner::graph_max_batch`]).
    pub fn graph_max_batch(&self) -> usize {
        self.rank0.graph_max_batch()
    }

    /// The prompt row counts of the mixed buckets (every rank's; see
    /// [`LlamaRunner::mixed_row_buckets`]).
    pub fn mixed_row_buckets(&self) -> Vec<usize> {
        self.rank0.mixed_row_buckets()
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.workers.len() + 1
    }

    /// Rank 0's model (its `cfg` is the whole model's).
    pub fn model(&self) -> &Model {
        self.rank0.model()
    }

    /// Bytes of K/V one cache block holds over every layer and every rank.
    pub fn block_bytes(&self) -> usize {
        self.rank0.block_bytes()
    }

    /// Sends `job` to every other rank, runs `f` on rank 0, and waits for the others: rank
    /// 0's result and the others' replies in rank order. The first error (rank 0's first)
    /// is returned.
    fn together<T>(&mut self, job: impl Fn() -> Job, f: impl FnOnce(&mut LlamaRunner) -> Result<T>) -> Result<(T, Vec<Reply>)> {
        for w in &self.workers {
            w.jobs.send(job()).map_err(|_| Error::TensorParallel(format!("rank {}'s thread has stopped", w.rank)))?;
        }
        let out = f(&mut self.rank0);
        let (mut err, mut replies) = (None, Vec::with_capacity(self.workers.len()));
        for w in &self.workers {
            match w.done.recv() {
                Ok(Ok(r)) => replies.push(r),
                Ok(Err(e)) => {
                    err.get_or_insert(Error::TensorParallel(format!("rank {}: {e}", w.rank)));
                }
                Err(_) => {
                    err.get_or_insert(Error::TensorParallel(format!("rank {}'s thread has stopped", w.rank)));
                }
            }
        }
        let out = out?;
        match err {
            Some(e) => Err(e),
            None => Ok((out, replies)),
        }
    }

    /// One step on every rank (see [`ModelRunner::step`]): rank 0's logits (every rank has
    /// the whole vocabulary after the gather). Bad chunks are refused by every rank before
    /// any collective, so nothing waits.
    pub fn run(&mut self, batch: &[SeqChunk]) -> Result<Vec<Vec<f32>>> {
        let owned = batch.to_vec();
        self.together(|| Job::Step(owned.clone()), |r| r.run(batch)).map(|(logits, _)| logits)
    }
}

impl Drop for TpRunner {
    fn drop(&mut self) {
        for w in &mut self.workers {
            // Closing the job channel ends the thread's loop.
            let (closed, _) = mpsc::channel();
            drop(std::mem::replace(&mut w.jobs, closed));
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl ModelRunner for TpRunner {
    type Error = Error;
    fn block_size(&self) -> usize {
        self.rank0.block_size()
    }
    fn num_blocks(&self) -> usize {
        self.rank0.num_blocks()
    }
    fn step(&mut self, batch: &[SeqChunk]) -> Result<Vec<Vec<f32>>> {
        self.run(batch)
    }
    fn samples_on_device(&self) -> bool {
        self.rank0.samples_on_device()
    }
    /// Rank 0 draws (it has the whole vocabulary's logits); the other ranks step as usual.
    fn step_sampled(&mut self, batch: &[SeqChunk], sampling: &[Option<llm_engine::DeviceSample>]) -> Result<Vec<llm_engine::RowOutput>> {
        // Refused before any rank starts (the others would wait in a collective).
        self.rank0.check_draws(batch, sampling)?;
        let owned = batch.to_vec();
        self.together(|| Job::Step(owned.clone()), |r| r.run_sampled(batch, sampling)).map(|(rows, _)| rows)
    }
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<()> {
        let owned = pairs.to_vec();
        self.together(|| Job::Copy(owned.clone()), |r| r.copy_blocks(pairs)).map(|_| ())
    }
    fn blocks_allocated(&mut self, blocks: &[u32]) {
        for w in &self.workers {
            let _ = w.jobs.send(Job::Allocated(blocks.to_vec()));
        }
        self.rank0.blocks_allocated(blocks);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_collectives::{Backend, CollectiveError};

    #[test]
    fn a_failed_communicator_set_up_keeps_the_librarys_message() {
        let e = collective_error(CollectiveError::Library {
            backend: Backend::Nccl,
            call: "ncclCommInitAll",
            code: 2,
            message: "unhandled system error (run with NCCL_DEBUG=INFO for details)".into(),
            detail: Some("socketStartConnect: Connect to 10.0.0.1<1234> failed".into()),
        });
        let text = e.to_string();
        assert!(matches!(e, Error::Collective(_)));
        for part in ["tensor parallelism: communicator:", "ncclCommInitAll failed", "error 2", "unhandled system error", "socketStartConnect: Connect to 10.0.0.1<1234> failed"] {
            assert!(text.contains(part), "{part:?} missing from {text:?}");
        }
    }
}
