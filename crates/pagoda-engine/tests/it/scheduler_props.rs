//! Property tests of the scheduler through its public API, with a simulated paged KV cache.
//!
//! The harness plays the engine: random arrivals (prompt lengths, shared prefixes, max_tokens,
//! priorities), random aborts and engine-side stops, random sampled tokens, forks (`n > 1`),
//! on small pools that force preemption. The "KV" the simulated runner writes for position `p`
//! is a hash of the sequence's tokens `0..=p`, so reading a chunk's positions `0..start`
//! through its block table proves that the cache holds exactly that sequence's prefix —
//! whether it was computed by the sequence itself, found in the prefix cache, or copied on
//! write after a fork. After every operation: no block leaked or freed twice, ref counts equal
//! the tables holding each block, the step respects its limits, and every live sequence's
//! tokens are the prompt plus what it was sampled — also across preemptions. At the end every
//! request has finished or been aborted within a step bound.
//!
//! Some setups are a hybrid model's (state slots beside the blocks): the simulated runner's
//! "state" in a slot is the prefix hash of the tokens it has consumed, so a chunk whose slot
//! does not hold exactly its sequence's tokens `0..start` (restored from a snapshot, copied at
//! a fork, kept across steps) is caught; at the end no slot is held.

use pagoda_engine::block_pool::BlockPool;
use pagoda_engine::scheduler::{
    BatchingMode, Policy, Scheduler, SchedulerConfig, SchedulerError, SchedulerOutput, SeqEnd,
    SeqId, SeqRequest, SeqStatus,
};
use pagoda_engine::state_pool::StatePool;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

/// What the harness knows of one sequence it submitted.
#[derive(Debug, Clone)]
struct Track {
    tokens: Vec<u32>,
    prompt_len: usize,
    max_tokens: usize,
}

/// The simulated runner's KV: `slots[block][slot]` = prefix hash of the token written there;
/// a hybrid's state slots: `states[slot]` = prefix hash of the last token consumed.
struct Kv {
    bs: usize,
    slots: Vec<Vec<Option<u64>>>,
    states: Vec<Option<u64>>,
}

fn prefix_hashes(tokens: &[u32]) -> Vec<u64> {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    tokens
        .iter()
        .map(|&t| {
            h = (h ^ u64::from(t))
                .wrapping_mul(0x0100_0000_01b3)
                .rotate_left(17);
            h
        })
        .collect()
}

impl Kv {
    fn new(n_blocks: usize, bs: usize, state_slots: usize) -> Self {
        Kv {
            bs,
            slots: vec![vec![None; bs]; n_blocks],
            states: vec![None; state_slots],
        }
    }

    /// A hybrid chunk's state: continues exactly its sequence's tokens `0..start`.
    fn consume_state(
        &mut self,
        slot: u32,
        seq: SeqId,
        start: usize,
        hashes: &[u64],
        end: usize,
    ) -> Result<(), String> {
        let s = self
            .states
            .get_mut(slot as usize)
            .ok_or_else(|| format!("seq {seq}: state slot {slot} out of range"))?;
        let want = start.checked_sub(1).map(|p| hashes[p]);
        if start > 0 && *s != want {
            return Err(format!(
                "seq {seq}: state slot {slot} does not hold its first {start} tokens"
            ));
        }
        *s = Some(hashes[end - 1]);
        Ok(())
    }

    /// Runs a step as the runner would: copies first, then every chunk's writes. Checks that
    /// each chunk's already-computed positions hold its own prefix.
    fn execute(
        &mut self,
        out: &SchedulerOutput,
        live: &BTreeMap<SeqId, Track>,
    ) -> Result<(), String> {
        for &(src, dst) in &out.copies {
            let row = self.slots[src as usize].clone();
            self.slots[dst as usize] = row;
        }
        for &(src, dst) in &out.state_copies {
            self.states[dst as usize] = self.states[src as usize];
        }
        for c in &out.chunks {
            let t = live
                .get(&c.seq)
                .ok_or_else(|| format!("chunk for unknown sequence {}", c.seq))?;
            let hashes = prefix_hashes(&t.tokens);
            match (c.state_slot, self.states.is_empty()) {
                (Some(slot), false) => {
                    let end = c.start + c.tokens.len() - c.num_draft;
                    self.consume_state(slot, c.seq, c.start, &hashes, end)?;
                }
                (None, true) => {}
                (slot, _) => {
                    return Err(format!("seq {}: state slot {slot:?} for this model", c.seq))
                }
            }
            for (p, &want) in hashes.iter().enumerate().take(c.start) {
                let b = c.block_table[p / self.bs] as usize;
                if self.slots[b][p % self.bs] != Some(want) {
                    return Err(format!(
                        "seq {} position {p} (block {b}) does not hold its prefix",
                        c.seq
                    ));
                }
            }
            for (i, p) in (c.start..c.start + c.tokens.len()).enumerate() {
                if c.tokens[i] != t.tokens[p] {
                    return Err(format!("seq {} chunk token {p} differs", c.seq));
                }
                let b = c.block_table[p / self.bs] as usize;
                self.slots[b][p % self.bs] = Some(hashes[p]);
            }
        }
        for &(live_slot, snapshot) in &out.state_snapshots {
            self.states[snapshot as usize] = self.states[live_slot as usize];
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
enum Op {
    Add {
        family: usize,
        shared: usize,
        own: usize,
        max_tokens: usize,
        priority: i32,
    },
    Abort(usize),
    Stop(usize),
    Fork(usize),
    Step {
        fork_ended: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..3, 0usize..40, 0usize..12, 1usize..24, -2i32..3).prop_map(
            |(family, shared, own, max_tokens, priority)| Op::Add {
                family,
                shared,
                own,
                max_tokens,
                priority
            }
        ),
        1 => any::<usize>().prop_map(Op::Abort),
        1 => any::<usize>().prop_map(Op::Stop),
        1 => any::<usize>().prop_map(Op::Fork),
        8 => any::<bool>().prop_map(|fork_ended| Op::Step { fork_ended }),
    ]
}

#[derive(Debug, Clone)]
struct Setup {
    n_blocks: usize,
    block_size: usize,
    caching: bool,
    config: SchedulerConfig,
    /// A hybrid model's state slots (0: a transformer).
    state_slots: usize,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        2usize..24,
        prop_oneof![Just(1usize), Just(2), Just(4), Just(8)],
        any::<bool>(),
        1usize..48,
        1usize..6,
        prop_oneof![
            Just(Policy::Fcfs),
            Just(Policy::Priority),
            Just(Policy::Sjf)
        ],
        prop_oneof![3 => Just(BatchingMode::Continuous), 1 => Just(BatchingMode::Static)],
        8usize..96,
        prop_oneof![Just(0.0), Just(1.0), Just(50.0)],
        prop_oneof![2 => Just(0usize), 1 => 0usize..4],
    )
        .prop_map(
            |(n_blocks, block_size, caching, budget, seqs, policy, mode, len, aging, extra)| {
                Setup {
                    n_blocks,
                    block_size,
                    caching,
                    // A hybrid has a live slot per sequence that may run, and some for snapshots.
                    state_slots: if extra == 0 { 0 } else { seqs + extra - 1 },
                    config: SchedulerConfig {
                        max_num_batched_tokens: budget,
                        max_num_seqs: seqs,
                        policy,
                        mode,
                        max_model_len: len,
                        aging_per_sec: aging,
                    },
                }
            },
        )
}

struct Harness {
    s: Scheduler,
    kv: Kv,
    live: BTreeMap<SeqId, Track>,
    next_id: SeqId,
    t0: Instant,
    steps: u64,
    tok: u32,
}

impl Harness {
    fn new(setup: &Setup) -> Self {
        let pool = BlockPool::new(setup.n_blocks, setup.block_size, setup.caching);
        let mut s = Scheduler::new(setup.config.clone(), pool);
        if setup.state_slots > 0 {
            s = s.with_states(StatePool::new(setup.state_slots, 8, setup.caching));
        }
        Harness {
            s,
            kv: Kv::new(setup.n_blocks, setup.block_size, setup.state_slots),
            live: BTreeMap::new(),
            next_id: 1,
            t0: Instant::now(),
            steps: 0,
            tok: 0,
        }
    }

    fn now(&self) -> Instant {
        self.t0 + Duration::from_millis(10 * self.steps)
    }

    fn next_token(&mut self) -> u32 {
        self.tok = self.tok.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        (self.tok >> 16) % 7
    }

    fn pick(&self, k: usize) -> Option<SeqId> {
        if self.live.is_empty() {
            return None;
        }
        self.live.keys().nth(k % self.live.len()).copied()
    }

    fn end(&mut self, id: SeqId, end: SeqEnd) -> Result<(), String> {
        let t = self
            .live
            .remove(&id)
            .ok_or_else(|| format!("end {end:?} of unknown sequence {id}"))?;
        let generated = t.tokens.len() - t.prompt_len;
        let cfg = self.s.config();
        let capacity = self.s.pool().num_blocks() * self.s.pool().block_size();
        match end {
            SeqEnd::Length if generated != t.max_tokens => Err(format!(
                "seq {id} ended Length after {generated} of {}",
                t.max_tokens
            )),
            SeqEnd::ContextFull
                if generated >= t.max_tokens
                    || (t.tokens.len() < cfg.max_model_len && t.tokens.len() <= capacity) =>
            {
                Err(format!(
                    "seq {id} ended ContextFull at {} tokens",
                    t.tokens.len()
                ))
            }
            SeqEnd::Aborted | SeqEnd::Stopped => Err(format!("scheduler ended {id} with {end:?}")),
            _ => Ok(()),
        }
    }

    fn add(
        &mut self,
        family: usize,
        shared: usize,
        own: usize,
        max_tokens: usize,
        priority: i32,
    ) -> Result<(), String> {
        let mut prompt: Vec<u32> = (0..shared as u32)
            .map(|i| (i * 7 + family as u32 * 3) % 11)
            .collect();
        for _ in 0..own {
            let t = self.next_token();
            prompt.push(t + 100);
        }
        let id = self.next_id;
        self.next_id += 1;
        let now = self.now();
        let len = prompt.len();
        let pool = self.s.pool();
        // The engine refuses these before the scheduler sees them (EngineCore::validate).
        if len == 0
            || max_tokens == 0
            || len >= self.s.config().max_model_len
            || pool.blocks_for(len) > pool.num_blocks()
        {
            return Ok(());
        }
        let r = self.s.add(
            SeqRequest {
                id,
                prompt: prompt.clone(),
                max_tokens,
                // Both ways of predicting the output under SJF: the client's max_tokens, and
                // the running estimate.
                max_tokens_explicit: id.is_multiple_of(2),
                priority,
            },
            now,
        );
        if let Err(e) = &r {
            return Err(format!("add of {len} tokens: {e}"));
        }
        if r.is_ok() {
            self.live.insert(
                id,
                Track {
                    tokens: prompt,
                    prompt_len: len,
                    max_tokens,
                },
            );
        }
        Ok(())
    }

    fn fork(&mut self, parent: SeqId) -> Result<(), String> {
        let child = self.next_id;
        self.next_id += 1;
        let first = self.next_token();
        let info = self
            .s
            .seq(parent)
            .map(|i| (i.state, i.num_computed, i.prompt_len));
        let r = self.s.fork(parent, child, first);
        let parent_track = self.live.get(&parent).cloned();
        match r {
            Ok(()) => {
                let Some(p) = parent_track else {
                    return Err(format!("fork of unknown {parent} succeeded"));
                };
                if p.tokens.len() == p.prompt_len {
                    return Err(format!("fork of {parent} before its first token succeeded"));
                }
                let mut tokens = p.tokens[..p.prompt_len].to_vec();
                tokens.push(first);
                self.live.insert(
                    child,
                    Track {
                        tokens,
                        prompt_len: p.prompt_len,
                        max_tokens: p.max_tokens,
                    },
                );
                Ok(())
            }
            Err(SchedulerError::ForkNotReady { .. }) => match info {
                // Mid-(re)computation of its prompt, or no token yet.
                Some((SeqStatus::Running, computed, prompt_len)) if computed < prompt_len => Ok(()),
                _ if parent_track.is_some_and(|p| p.tokens.len() == p.prompt_len) => Ok(()),
                _ => Err(format!("fork of {parent} refused: {info:?}")),
            },
            // A child that was complete at its fork: ended, reported by the next schedule.
            Err(SchedulerError::UnknownSequence { .. })
                if info.is_none() && parent_track.is_some() =>
            {
                Ok(())
            }
            Err(e) => Err(format!("fork of {parent}: {e}")),
        }
    }

    /// One engine step: schedule, check the plan, run it on the simulated KV, sample, update.
    fn step(&mut self, fork_ended: bool) -> Result<(), String> {
        let now = self.now();
        self.steps += 1;
        let cfg = self.s.config().clone();
        let running_before: HashSet<SeqId> = self
            .s
            .seqs()
            .filter(|i| i.state == SeqStatus::Running)
            .map(|i| i.id)
            .collect();
        let out = self.s.schedule(now);
        for &(id, end) in &out.ended {
            self.end(id, end)?;
        }
        let bs = self.s.pool().block_size();
        if out.num_batched_tokens > cfg.max_num_batched_tokens {
            return Err(format!("{} tokens over the budget", out.num_batched_tokens));
        }
        if out.num_batched_tokens != out.chunks.iter().map(|c| c.tokens.len()).sum::<usize>() {
            return Err("num_batched_tokens is not the sum of the chunks".into());
        }
        if out.chunks.len() > cfg.max_num_seqs {
            return Err(format!("{} chunks over max_num_seqs", out.chunks.len()));
        }
        let mut seen = HashSet::new();
        let mut admitted_yet = false;
        for c in &out.chunks {
            if !seen.insert(c.seq) {
                return Err(format!("seq {} scheduled twice", c.seq));
            }
            if c.tokens.is_empty() {
                return Err(format!("empty chunk for {}", c.seq));
            }
            if c.block_table.len() * bs < c.start + c.tokens.len() {
                return Err(format!("seq {}'s table does not cover its chunk", c.seq));
            }
            let t = self
                .live
                .get(&c.seq)
                .ok_or("chunk of an untracked sequence")?;
            if c.sample != (c.start + c.tokens.len() == t.tokens.len()) {
                return Err(format!("seq {} sample flag wrong", c.seq));
            }
            // Written blocks are owned by this sequence alone (copy-on-write done).
            for p in c.start..c.start + c.tokens.len() {
                let b = c.block_table[p / bs];
                if self.s.pool().ref_count(b) != 1 {
                    return Err(format!("seq {} writes shared block {b}", c.seq));
                }
            }
            let was_running = running_before.contains(&c.seq);
            if was_running && admitted_yet {
                return Err("a running sequence scheduled after an admitted one".into());
            }
            admitted_yet |= !was_running;
            if !was_running && cfg.mode == BatchingMode::Static && !running_before.is_empty() {
                return Err(format!("static mode admitted {} while others ran", c.seq));
            }
        }
        if !out.preempted.is_empty() && out.chunks.iter().any(|c| !running_before.contains(&c.seq))
        {
            return Err("admitted in a step that preempted".into());
        }
        for &id in &out.preempted {
            let i = self.s.seq(id).ok_or("preempted sequence vanished")?;
            if i.state != SeqStatus::Waiting || !i.block_table.is_empty() || i.num_computed != 0 {
                return Err(format!("preempted {id} still holds KV"));
            }
        }
        self.kv.execute(&out, &self.live)?;
        let mut sampled = Vec::new();
        for c in out.chunks.iter().filter(|c| c.sample) {
            let t = self.next_token();
            sampled.push((c.seq, t));
        }
        let ends = self.s.update(&out, &sampled);
        for &(id, t) in &sampled {
            if let Some(track) = self.live.get_mut(&id) {
                track.tokens.push(t);
            }
        }
        let mut ended_tracks = Vec::new();
        for &(id, end) in &ends {
            if let Some(t) = self.live.get(&id) {
                ended_tracks.push((id, t.clone()));
            }
            self.end(id, end)?;
        }
        if fork_ended {
            if let Some((id, t)) = ended_tracks.first().cloned() {
                // Fork the parent that just ended: the child is its prompt plus its own token.
                let child = self.next_id;
                self.next_id += 1;
                let first = self.next_token();
                self.s
                    .fork(id, child, first)
                    .map_err(|e| format!("fork of ended {id}: {e}"))?;
                let mut tokens = t.tokens[..t.prompt_len].to_vec();
                tokens.push(first);
                self.live.insert(
                    child,
                    Track {
                        tokens,
                        prompt_len: t.prompt_len,
                        max_tokens: t.max_tokens,
                    },
                );
            }
        }
        Ok(())
    }

    /// Checks the books between operations.
    fn check(&self) -> Result<(), String> {
        self.s.check_invariants()?;
        let pool = self.s.pool();
        let mut held: HashMap<u32, u32> = HashMap::new();
        let mut seen = 0;
        for i in self.s.seqs() {
            seen += 1;
            let t = self
                .live
                .get(&i.id)
                .ok_or_else(|| format!("scheduler holds untracked {}", i.id))?;
            if i.tokens != t.tokens.as_slice() || i.prompt_len != t.prompt_len {
                return Err(format!(
                    "seq {}'s tokens differ from what it was given",
                    i.id
                ));
            }
            for &b in i.block_table {
                *held.entry(b).or_insert(0) += 1;
            }
        }
        let mut refs_total = 0;
        for b in 0..pool.num_blocks() as u32 {
            let r = pool.ref_count(b);
            refs_total += r;
            if r != held.get(&b).copied().unwrap_or(0) {
                return Err(format!("block {b}: ref {r}, held {:?}", held.get(&b)));
            }
        }
        if refs_total != held.values().sum::<u32>() {
            return Err("sum of refs != references held".into());
        }
        let st = pool.stats();
        if st.blocks_free + st.blocks_used != st.blocks_total || st.blocks_used != held.len() {
            return Err(format!(
                "pool counts wrong: {st:?}, {} blocks held",
                held.len()
            ));
        }
        // Tracked but not listed: only children that ended at fork, reported next step.
        if seen > self.live.len() {
            return Err("scheduler holds more sequences than tracked".into());
        }
        let (alloc, used) = self.s.kv_waste();
        if used > alloc || alloc != st.blocks_used * pool.block_size() {
            return Err(format!(
                "kv_waste ({alloc}, {used}) inconsistent with {st:?}"
            ));
        }
        Ok(())
    }
}

fn run(setup: Setup, ops: Vec<Op>) -> Result<(), String> {
    let mut h = Harness::new(&setup);
    for op in ops {
        match op {
            Op::Add {
                family,
                shared,
                own,
                max_tokens,
                priority,
            } => h.add(family, shared, own, max_tokens, priority)?,
            Op::Abort(k) => {
                if let Some(id) = h.pick(k) {
                    if !h.s.finish(id, SeqEnd::Aborted) {
                        return Err(format!("abort of live {id} found nothing"));
                    }
                    h.live.remove(&id);
                }
            }
            Op::Stop(k) => {
                if let Some(id) = h.pick(k) {
                    if !h.s.finish(id, SeqEnd::Stopped) {
                        return Err(format!("stop of live {id} found nothing"));
                    }
                    h.live.remove(&id);
                }
            }
            Op::Fork(k) => {
                if let Some(id) = h.pick(k) {
                    h.fork(id)?;
                }
            }
            Op::Step { fork_ended } => h.step(fork_ended)?,
        }
        h.check()?;
    }
    // Drain: everything admitted finishes within a bound.
    let bound = 20_000;
    let mut steps = 0;
    while h.s.has_work() {
        h.step(false)?;
        h.check()?;
        steps += 1;
        if steps > bound {
            return Err(format!(
                "no completion after {bound} steps: {:?}",
                h.s.stats()
            ));
        }
    }
    if !h.live.is_empty() {
        return Err(format!(
            "sequences never ended: {:?}",
            h.live.keys().collect::<Vec<_>>()
        ));
    }
    let st = h.s.pool().stats();
    if st.blocks_free != st.blocks_total {
        return Err(format!("blocks leaked: {st:?}"));
    }
    if let Some(states) = h.s.stats().states {
        if states.slots_used != 0 {
            return Err(format!("state slots leaked: {states:?}"));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn scheduler_keeps_the_books(setup in setup(), ops in proptest::collection::vec(op(), 1..160)) {
        if let Err(e) = run(setup, ops) {
            prop_assert!(false, "{}", e);
        }
    }
}

/// Tight pools with long generations: preemption must happen, and still everything finishes
/// with every sequence's tokens intact (checked at every step by the harness).
#[test]
fn small_pools_preempt_and_still_finish() {
    let mut preempted = 0;
    // The last two: a hybrid model's (state slots, with and without snapshots).
    for (i, policy) in [
        Policy::Fcfs,
        Policy::Priority,
        Policy::Sjf,
        Policy::Fcfs,
        Policy::Priority,
    ]
    .into_iter()
    .enumerate()
    {
        let setup = Setup {
            n_blocks: 6,
            block_size: 4,
            caching: i != 1 && i != 4,
            state_slots: if i >= 3 { 6 } else { 0 },
            config: SchedulerConfig {
                max_num_batched_tokens: 16,
                max_num_seqs: 4,
                policy,
                mode: BatchingMode::Continuous,
                max_model_len: 64,
                aging_per_sec: 1.0,
            },
        };
        let mut h = Harness::new(&setup);
        for k in 0..6 {
            h.add(k % 2, 6, 2, 12, k as i32 % 3 - 1).unwrap();
        }
        h.fork_ready_then_drain(&mut preempted);
    }
    assert!(preempted > 0, "the workload never preempted");
}

impl Harness {
    fn fork_ready_then_drain(&mut self, preempted: &mut u64) {
        let mut steps = 0;
        let mut forked = false;
        while self.s.has_work() {
            self.step(false).unwrap();
            self.check().unwrap();
            if !forked {
                if let Some(id) = self
                    .live
                    .iter()
                    .find(|(_, t)| t.tokens.len() > t.prompt_len)
                    .map(|(id, _)| *id)
                {
                    self.fork(id).unwrap();
                    self.check().unwrap();
                    forked = true;
                }
            }
            steps += 1;
            assert!(steps < 10_000, "no completion");
        }
        assert!(forked);
        assert!(self.live.is_empty());
        *preempted += self.s.stats().preempted_total;
    }
}

/// KV waste of paged allocation under a mixed-length workload (block size 16): at the step
/// with the most KV allocated, under 5% of the allocated slots hold no token.
#[test]
fn kv_waste_under_mixed_lengths_is_small() {
    let bs = 16;
    let n_blocks = 8192;
    let max_model_len = 2048;
    let mut s = Scheduler::new(
        SchedulerConfig {
            max_num_batched_tokens: 512,
            max_num_seqs: 64,
            max_model_len,
            ..SchedulerConfig::default()
        },
        BlockPool::new(n_blocks, bs, false),
    );
    let t0 = Instant::now();
    let mut x = 12345u64;
    let mut rnd = |lo: usize, hi: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        lo + (x % (hi - lo) as u64) as usize
    };
    let n_seqs = 200;
    for id in 0..n_seqs {
        let prompt: Vec<u32> = (0..rnd(8, 900)).map(|i| i as u32).collect();
        let max_tokens = rnd(4, 600);
        s.add(
            SeqRequest {
                id,
                prompt,
                max_tokens,
                max_tokens_explicit: true,
                priority: 0,
            },
            t0,
        )
        .unwrap();
    }
    let (mut peak_alloc, mut peak_used, mut peak_running) = (0, 0, 0);
    let mut steps = 0;
    while s.has_work() {
        let out = s.schedule(t0);
        let (alloc, used) = s.kv_waste();
        if alloc > peak_alloc {
            (peak_alloc, peak_used, peak_running) = (alloc, used, s.num_running());
        }
        let sampled: Vec<_> = out
            .chunks
            .iter()
            .filter(|c| c.sample)
            .map(|c| (c.seq, 1))
            .collect();
        s.update(&out, &sampled);
        steps += 1;
        assert!(steps < 100_000);
    }
    assert_eq!(
        s.stats().preempted_total,
        0,
        "the pool was meant to be large enough"
    );
    let waste = (peak_alloc - peak_used) as f64 / peak_alloc as f64;
    let contiguous = peak_running * max_model_len;
    println!(
        "kv waste at peak: {} of {} allocated slots unused = {:.2}% ({} sequences, block size \
         {bs}); a contiguous max_model_len={max_model_len} reservation per sequence would \
         allocate {contiguous} slots ({:.1}% unused)",
        peak_alloc - peak_used,
        peak_alloc,
        100.0 * waste,
        peak_running,
        100.0 * (contiguous - peak_used) as f64 / contiguous as f64
    );
    assert!(waste < 0.05, "kv waste {:.2}% at peak", 100.0 * waste);
}
