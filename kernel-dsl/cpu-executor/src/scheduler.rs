//! The per-work-group scheduler: one OS thread runs the work-items of one group as
//! coroutines, releasing barriers and completing wave operations when they are ready.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::panic::{self, AssertUnwindSafe, Location};
use std::ptr;

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult};

use crate::error::is_bounds_message;
use crate::item::{Entered, GroupCtx, ItemCtx, ItemYielder, Resume, Suspend, WaveLanes};
use crate::stack::StackPool;
use crate::{Dim3, ExecError, RunStats};

/// How a work-item's body ended: normally, or with the payload of a caught panic.
type ItemOutcome = Result<(), Box<dyn Any + Send>>;

/// A work-item running as a coroutine.
type ItemCoroutine = Coroutine<Resume, Suspend, ItemOutcome, DefaultStack>;

/// Where a work-item of the current group stands.
#[derive(Clone, Copy)]
enum State {
    /// Being resumed (transient).
    Running,
    /// Suspended at the barrier called at this site.
    Barrier(&'static Location<'static>),
    /// Suspended at the wave operation called at this site, contributing the value.
    Wave(&'static Location<'static>, u64),
    /// Returned (or not started yet).
    Done,
}

/// Shared memory of one OS thread: 16-byte aligned, reused by every group it runs.
pub(crate) struct Lds {
    /// Owns the allocation; never touched after `ptr` is taken from it.
    _buf: Vec<Chunk>,
    ptr: *mut u8,
    len: usize,
}

#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Chunk([u8; 16]);

impl Lds {
    /// A region of `len` bytes (dangling but aligned when `len` is 0).
    pub(crate) fn new(len: usize) -> Self {
        let mut buf = vec![Chunk([0xFF; 16]); len.div_ceil(16)];
        let ptr = buf.as_mut_ptr().cast::<u8>();
        Self { _buf: buf, ptr, len }
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Refills the region with 0xFF ("uninitialised"); no work-item may be running.
    fn poison(&self) {
        // SAFETY: `ptr` is valid for `len` bytes (it may be dangling only when `len` is 0),
        // and no coroutine of this thread holds a reference into it between groups.
        unsafe { ptr::write_bytes(self.ptr, 0xFF, self.len) }
    }
}

/// Runs work-groups one after another on the calling OS thread.
pub(crate) struct GroupRunner<'a> {
    work_item: &'a (dyn Fn() + Sync),
    grid: Dim3,
    group: &'a GroupCtx,
    lds: &'a Lds,
    /// One context per work-item slot (`items` of them).
    ctxs: &'a [ItemCtx],
    stacks: StackPool<'a>,
    /// Live coroutine of each slot (`None` once it has returned).
    coroutines: Vec<Option<ItemCoroutine>>,
    states: Vec<State>,
    /// Work-items that have not returned.
    alive: u32,
    /// Work-items suspended at a barrier.
    at_barrier: u32,
    /// Per wave: lanes that have not returned, and lanes suspended at a wave operation.
    wave_alive: Vec<u32>,
    wave_waiting: Vec<u32>,
    /// Run work-items in descending slot order.
    reversed: bool,
}

impl<'a> GroupRunner<'a> {
    /// A runner for groups of `ctxs.len()` work-items.
    pub(crate) fn new(
        work_item: &'a (dyn Fn() + Sync),
        grid: Dim3,
        group: &'a GroupCtx,
        lds: &'a Lds,
        ctxs: &'a [ItemCtx],
        stacks: StackPool<'a>,
        reversed: bool,
    ) -> Self {
        let items = ctxs.len();
        let waves = items.div_ceil(group.wave_lanes as usize);
        Self {
            work_item,
            grid,
            group,
            lds,
            ctxs,
            stacks,
            coroutines: (0..items).map(|_| None).collect(),
            states: vec![State::Done; items],
            alive: 0,
            at_barrier: 0,
            wave_alive: vec![0; waves],
            wave_waiting: vec![0; waves],
            reversed,
        }
    }

    /// The slots of `range` in the order work-items run.
    fn in_order(&self, range: std::ops::Range<usize>) -> impl Iterator<Item = usize> + use<> {
        let (reversed, first, last) = (self.reversed, range.start, range.end.saturating_sub(1));
        range.map(move |i| if reversed { first + last - i } else { i })
    }

    fn wave_lanes(&self) -> usize {
        self.group.wave_lanes as usize
    }

    /// Slot range of wave `wave`.
    fn wave_range(&self, wave: usize) -> std::ops::Range<usize> {
        let lanes = self.wave_lanes();
        wave * lanes..((wave + 1) * lanes).min(self.ctxs.len())
    }

    /// Runs work-group number `linear` (x fastest) to completion.
    pub(crate) fn run_group(&mut self, linear: u64) -> Result<RunStats, ExecError> {
        let (gx, gy) = (u64::from(self.grid.x), u64::from(self.grid.y));
        // The quotients fit in u32: `linear` is below the grid volume.
        let block_idx = Dim3::new((linear % gx) as u32, (linear / gx % gy) as u32, (linear / (gx * gy)) as u32);
        self.group.block_idx.set(block_idx);
        self.lds.poison();

        let items = self.ctxs.len();
        self.alive = items as u32;
        self.at_barrier = 0;
        for wave in 0..self.wave_alive.len() {
            self.wave_alive[wave] = self.wave_range(wave).len() as u32;
            self.wave_waiting[wave] = 0;
        }

        let mut stats = RunStats { work_groups: 1, work_items: items as u64, ..RunStats::default() };
        let result = self.schedule(&mut stats);
        if result.is_err() {
            self.abandon();
        }
        result.map(|()| stats)
    }

    /// Drives every work-item of the current group until all have returned.
    fn schedule(&mut self, stats: &mut RunStats) -> Result<(), ExecError> {
        // Start every work-item in turn; each runs until it returns or first synchronises.
        // One that returns frees its stack for the next, so a kernel that never
        // synchronises runs on a single stack.
        for slot in self.in_order(0..self.ctxs.len()) {
            self.start(slot)?;
        }
        loop {
            if self.alive == 0 {
                return Ok(());
            }
            // Waves are independent of each other and of the barrier: complete every wave
            // whose remaining lanes all wait at the same wave operation.
            let mut progressed = false;
            for wave in self.in_order(0..self.wave_alive.len()) {
                if self.wave_ready(wave) {
                    self.complete_wave(wave)?;
                    stats.wave_ops += 1;
                    progressed = true;
                }
            }
            if progressed {
                continue;
            }
            // Nothing else can move: everyone left must be at one barrier.
            if self.at_barrier == self.alive && self.barrier_uniform() {
                self.release_barrier()?;
                stats.barriers += 1;
                continue;
            }
            return Err(self.divergence());
        }
    }

    /// Creates slot `slot`'s coroutine on a pooled stack and runs it to its first stop.
    fn start(&mut self, slot: usize) -> Result<(), ExecError> {
        let stack = self.stacks.acquire().map_err(|err| ExecError::StackAllocation {
            bytes: self.stacks_size(),
            message: err.to_string(),
        })?;
        let ctx: *const ItemCtx = &self.ctxs[slot];
        let work_item = self.work_item;
        let body = move |yielder: &ItemYielder, _start: Resume| -> ItemOutcome {
            // SAFETY: the slot context outlives the coroutine (see below).
            let ctx = unsafe { &*ctx };
            ctx.yielder.set(yielder);
            // Panics stop here, on the coroutine's own stack: they never unwind through
            // the stack-switching code.
            let outcome = panic::catch_unwind(AssertUnwindSafe(work_item));
            ctx.yielder.set(ptr::null());
            outcome
        };
        // SAFETY: `body` borrows `work_item` and the slot context for 'a. Every coroutine
        // is stored in `self.coroutines` and is either run to completion or force-unwound
        // (`abandon`, also called from `Drop`) before `self` (and so 'a) ends; none is leaked.
        let coroutine = unsafe { Coroutine::with_stack_unchecked(stack, body) };
        self.coroutines[slot] = Some(coroutine);
        self.states[slot] = State::Running;
        self.resume(slot, Resume::Run)
    }

    fn stacks_size(&self) -> usize {
        self.stacks.size()
    }

    /// Resumes slot `slot` until it suspends again or returns, and records where it stopped.
    fn resume(&mut self, slot: usize, input: Resume) -> Result<(), ExecError> {
        let coroutine = self.coroutines[slot].as_mut().expect("resumed a work-item that has returned");
        let result = {
            let _current = Entered::new(&self.ctxs[slot]);
            coroutine.resume(input)
        };
        let wave = slot / self.wave_lanes();
        match result {
            CoroutineResult::Yield(Suspend::Barrier(site)) => {
                self.states[slot] = State::Barrier(site);
                self.at_barrier += 1;
                Ok(())
            }
            CoroutineResult::Yield(Suspend::Wave { site, value }) => {
                self.states[slot] = State::Wave(site, value);
                self.wave_waiting[wave] += 1;
                Ok(())
            }
            CoroutineResult::Return(outcome) => {
                self.states[slot] = State::Done;
                self.alive -= 1;
                self.wave_alive[wave] -= 1;
                let coroutine = self.coroutines[slot].take().expect("returned twice");
                self.stacks.release(coroutine.into_stack());
                outcome.map_err(|payload| self.panic_error(slot, payload))
            }
        }
    }

    /// Whether every remaining lane of `wave` waits at one and the same wave operation.
    fn wave_ready(&self, wave: usize) -> bool {
        let waiting = self.wave_waiting[wave];
        if waiting == 0 || waiting != self.wave_alive[wave] {
            return false;
        }
        let mut sites = self.states[self.wave_range(wave)].iter().filter_map(|state| match state {
            State::Wave(site, _) => Some(*site),
            _ => None,
        });
        let first = sites.next().expect("a waiting lane");
        sites.all(|site| same_site(site, first))
    }

    /// Hands every waiting lane of `wave` the exchanged values and runs it on.
    fn complete_wave(&mut self, wave: usize) -> Result<(), ExecError> {
        let range = self.wave_range(wave);
        let mut lanes = WaveLanes { values: [0; 64], active: 0, lanes: self.group.wave_lanes };
        for (lane, state) in self.states[range.clone()].iter().enumerate() {
            if let State::Wave(_, value) = *state {
                lanes.values[lane] = value;
                lanes.active |= 1 << lane;
            }
        }
        self.wave_waiting[wave] = 0;
        // A resumed lane may stop at the next wave operation; it is behind us in the loop,
        // so each lane is resumed exactly once here.
        for slot in self.in_order(range) {
            if let State::Wave(..) = self.states[slot] {
                self.states[slot] = State::Running;
                self.resume(slot, Resume::Wave(&lanes))?;
            }
        }
        Ok(())
    }

    /// Whether all work-items at a barrier wait at the same call site.
    fn barrier_uniform(&self) -> bool {
        let mut sites = self.states.iter().filter_map(|state| match state {
            State::Barrier(site) => Some(*site),
            _ => None,
        });
        match sites.next() {
            Some(first) => sites.all(|site| same_site(site, first)),
            None => false,
        }
    }

    /// Releases every work-item waiting at the barrier, in run order.
    fn release_barrier(&mut self) -> Result<(), ExecError> {
        self.at_barrier = 0;
        for slot in self.in_order(0..self.states.len()) {
            if let State::Barrier(_) = self.states[slot] {
                self.states[slot] = State::Running;
                self.resume(slot, Resume::Run)?;
            }
        }
        Ok(())
    }

    /// Explains why no work-item of the group can make progress.
    fn divergence(&self) -> ExecError {
        let group = self.group.block_idx.get();
        // A wave with a lane at a wave operation that cannot complete is the culprit.
        for wave in 0..self.wave_alive.len() {
            if self.wave_waiting[wave] == 0 {
                continue;
            }
            let mut wave_sites = BTreeMap::new();
            let mut barrier_sites = BTreeMap::new();
            for state in &self.states[self.wave_range(wave)] {
                match *state {
                    State::Wave(site, _) => *wave_sites.entry(*site).or_insert(0u32) += 1,
                    State::Barrier(site) => *barrier_sites.entry(*site).or_insert(0u32) += 1,
                    State::Running | State::Done => {}
                }
            }
            let detail = if barrier_sites.is_empty() {
                format!("its lanes wait at different wave operations: {}", site_list(&wave_sites))
            } else {
                format!(
                    "some lanes wait at a wave operation ({}) while others wait at a barrier ({})",
                    site_list(&wave_sites),
                    site_list(&barrier_sites)
                )
            };
            return ExecError::WaveDivergence { group, wave: wave as u32, detail };
        }
        // Otherwise everyone left waits at a barrier, at different call sites.
        let mut sites = BTreeMap::new();
        for state in &self.states {
            if let State::Barrier(site) = *state {
                *sites.entry(*site).or_insert(0u32) += 1;
            }
        }
        let mut detail = format!("work-items wait at different barriers: {}", site_list(&sites));
        let finished = self.ctxs.len() as u32 - self.alive;
        if finished > 0 {
            let _ = write!(detail, " ({finished} work-items have already returned)");
        }
        ExecError::BarrierDivergence { group, detail }
    }

    /// The error for a work-item of slot `slot` that panicked with `payload`.
    fn panic_error(&self, slot: usize, payload: Box<dyn Any + Send>) -> ExecError {
        let message = match payload.downcast::<String>() {
            Ok(message) => *message,
            Err(payload) => match payload.downcast_ref::<&'static str>() {
                Some(message) => (*message).to_owned(),
                None => "non-string panic payload".to_owned(),
            },
        };
        let group = self.group.block_idx.get();
        let item = self.ctxs[slot].thread_idx;
        if is_bounds_message(&message) {
            ExecError::OutOfBounds { group, item, message }
        } else {
            ExecError::Panic { group, item, message }
        }
    }

    /// Unwinds every suspended work-item of the group (after an error), dropping what is on
    /// their stacks, and recycles the stacks.
    fn abandon(&mut self) {
        for slot in 0..self.coroutines.len() {
            if let Some(mut coroutine) = self.coroutines[slot].take() {
                {
                    // Destructors on the work-item's stack may still ask who they are.
                    let _current = Entered::new(&self.ctxs[slot]);
                    coroutine.force_unwind();
                }
                self.states[slot] = State::Done;
                self.stacks.release(coroutine.into_stack());
            }
        }
    }
}

impl Drop for GroupRunner<'_> {
    fn drop(&mut self) {
        // Only reached with live coroutines if the scheduler itself panicked.
        self.abandon();
    }
}

/// Whether two call sites are the same (fast path: the same `Location` static).
fn same_site(a: &'static Location<'static>, b: &'static Location<'static>) -> bool {
    ptr::eq(a, b) || a == b
}

/// `"3 at src/a.rs:10:5, 1 at src/a.rs:12:5"`.
fn site_list(sites: &BTreeMap<Location<'static>, u32>) -> String {
    let mut list = String::new();
    for (site, count) in sites {
        if !list.is_empty() {
            list.push_str(", ");
        }
        let _ = write!(list, "{count} at {site}");
    }
    list
}
