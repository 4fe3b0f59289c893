//! Unit tests of the scheduler: one behaviour of the module docs each, on tiny pools
//! (block size 4) so every block decision is visible.

use super::*;
use std::time::Duration;

const BS: usize = 4;

fn config(budget: usize, max_seqs: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: budget,
        max_num_seqs: max_seqs,
        max_model_len: 64,
        aging_per_sec: 0.0,
        ..SchedulerConfig::default()
    }
}

fn sched(cfg: SchedulerConfig, blocks: usize, caching: bool) -> Scheduler {
    Scheduler::new(cfg, BlockPool::new(blocks, BS, caching))
}

fn req(id: SeqId, prompt_len: usize, max_tokens: usize) -> SeqRequest {
    SeqRequest {
        id,
        prompt: (0..prompt_len as u32)
            .map(|t| t + 1000 * id as u32)
            .collect(),
        max_tokens,
        max_tokens_explicit: true,
        priority: 0,
    }
}

/// One step; every sampling chunk gets token `7`. Returns the output and the ends.
fn step(s: &mut Scheduler, now: Instant) -> (SchedulerOutput, Vec<(SeqId, SeqEnd)>) {
    let out = s.schedule(now);
    let sampled: Vec<_> = out
        .chunks
        .iter()
        .filter(|c| c.sample)
        .map(|c| (c.seq, 7))
        .collect();
    let ends = s.update(&out, &sampled);
    (out, ends)
}

fn lens(out: &SchedulerOutput) -> Vec<(SeqId, usize, usize)> {
    out.chunks
        .iter()
        .map(|c| (c.seq, c.start, c.tokens.len()))
        .collect()
}

#[test]
fn add_refuses_an_id_it_already_holds() {
    let t = Instant::now();
    let mut s = sched(config(16, 4), 4, false);
    s.add(req(1, 16, 4), t).unwrap();
    assert_eq!(
        s.add(req(1, 3, 4), t),
        Err(SchedulerError::DuplicateId { id: 1 })
    );
    assert!(s.is_waiting(1));
    assert!(s.has_work());
}

/// Requests out of range are the engine's to refuse (`EngineCore::validate`, tested in
/// `tests/it/batching.rs`); the scheduler asserts it was given none.
#[test]
#[cfg(debug_assertions)]
fn add_asserts_its_requests_were_checked() {
    let t = Instant::now();
    for (prompt, max_tokens) in [(0, 4), (3, 0), (64, 4), (17, 4)] {
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut s = sched(config(16, 4), 4, false);
            let _ = s.add(req(1, prompt, max_tokens), t);
        }));
        assert!(caught.is_err(), "{prompt} tokens, max_tokens {max_tokens}");
    }
}

#[test]
fn config_validation_names_the_field() {
    assert!(SchedulerConfig::default().validate().is_ok());
    let bad = SchedulerConfig {
        max_num_seqs: 0,
        ..SchedulerConfig::default()
    };
    assert!(bad
        .validate()
        .unwrap_err()
        .to_string()
        .contains("max_num_seqs"));
    let bad = SchedulerConfig {
        aging_per_sec: f64::NAN,
        ..SchedulerConfig::default()
    };
    assert!(bad.validate().is_err());
    // new() clamps instead of failing.
    let s = Scheduler::new(
        SchedulerConfig {
            max_num_batched_tokens: 0,
            ..SchedulerConfig::default()
        },
        BlockPool::new(4, BS, false),
    );
    assert_eq!(s.config().max_num_batched_tokens, 1);
}

#[test]
fn chunked_prefill_then_decode() {
    let t = Instant::now();
    let mut s = sched(config(4, 4), 8, false);
    s.add(req(1, 10, 3), t).unwrap();
    let (o, _) = step(&mut s, t);
    assert_eq!(lens(&o), vec![(1, 0, 4)]);
    assert!(!o.chunks[0].sample);
    assert_eq!(o.chunks[0].block_table.len(), 1);
    let (o, _) = step(&mut s, t);
    assert_eq!(lens(&o), vec![(1, 4, 4)]);
    let (o, _) = step(&mut s, t);
    assert_eq!(lens(&o), vec![(1, 8, 2)]);
    assert!(o.chunks[0].sample);
    assert_eq!(o.chunks[0].block_table.len(), 3);
    assert_eq!(s.seq(1).unwrap().generated(), &[7]);
    // Decode: one token at a time, from the last sampled one.
    let (o, _) = step(&mut s, t);
    assert_eq!(lens(&o), vec![(1, 10, 1)]);
    assert_eq!(o.chunks[0].tokens, vec![7]);
    let (o, ends) = step(&mut s, t);
    assert_eq!(lens(&o), vec![(1, 11, 1)]);
    assert_eq!(ends, vec![(1, SeqEnd::Length)]);
    assert!(!s.has_work());
    assert_eq!(s.pool().num_free(), 8);
}

#[test]
fn running_first_then_waiting_joins_within_the_budget() {
    let t = Instant::now();
    let mut s = sched(config(6, 4), 16, false);
    s.add(req(1, 3, 10), t).unwrap();
    let (o, _) = step(&mut s, t);
    assert_eq!(lens(&o), vec![(1, 0, 3)]);
    s.add(req(2, 8, 10), t).unwrap();
    s.add(req(3, 2, 10), t).unwrap();
    // Decode of 1 first, then 2's first chunk takes the rest of the budget; 3 waits.
    let (o, _) = step(&mut s, t);
    assert_eq!(lens(&o), vec![(1, 3, 1), (2, 0, 5)]);
    assert_eq!(o.num_batched_tokens, 6);
    assert!(s.is_waiting(3));
    let (o, _) = step(&mut s, t);
    assert_eq!(lens(&o), vec![(1, 4, 1), (2, 5, 3), (3, 0, 2)]);
    assert_eq!(s.stats().tokens_last_step, 6);
    assert_eq!(s.stats().running, 3);
}

#[test]
fn max_num_seqs_caps_running() {
    let t = Instant::now();
    let mut s = sched(config(64, 2), 16, false);
    for id in 1..=3 {
        s.add(req(id, 2, 5), t).unwrap();
    }
    let (o, _) = step(&mut s, t);
    assert_eq!(o.chunks.len(), 2);
    assert_eq!(s.num_running(), 2);
    assert_eq!(s.num_waiting(), 1);
}

#[test]
fn context_length_ends_with_context_full() {
    let t = Instant::now();
    let cfg = SchedulerConfig {
        max_model_len: 6,
        ..config(16, 4)
    };
    let mut s = sched(cfg, 8, false);
    s.add(req(1, 4, 100), t).unwrap();
    step(&mut s, t);
    let (_, ends) = step(&mut s, t);
    assert_eq!(ends, vec![(1, SeqEnd::ContextFull)]);
    assert!(s.seq(1).is_none());
    assert_eq!(s.pool().num_free(), 8);
}

#[test]
fn blocks_are_allocated_when_a_write_crosses_into_a_new_block() {
    let t = Instant::now();
    let mut s = sched(config(16, 4), 8, false);
    s.add(req(1, 3, 10), t).unwrap();
    let (o, _) = step(&mut s, t);
    assert_eq!(o.chunks[0].block_table.len(), 1);
    // Position 3 still fits block 0.
    let (o, _) = step(&mut s, t);
    assert_eq!((o.chunks[0].start, o.chunks[0].block_table.len()), (3, 1));
    // Position 4 needs block 1.
    let (o, _) = step(&mut s, t);
    assert_eq!((o.chunks[0].start, o.chunks[0].block_table.len()), (4, 2));
    assert_eq!(s.pool().num_free(), 6);
}

#[test]
fn prefix_cache_reuses_full_blocks_and_always_computes_one_token() {
    let t = Instant::now();
    let mut s = sched(config(32, 4), 16, true);
    s.add(req(1, 10, 1), t).unwrap();
    let (o, ends) = step(&mut s, t);
    assert_eq!(lens(&o), vec![(1, 0, 10)]);
    assert_eq!(ends, vec![(1, SeqEnd::Length)]);
    assert_eq!(s.pool().stats().blocks_cached, 2);
    // Same prompt: two full blocks reused, the partial one recomputed.
    let mut r = req(1, 10, 1);
    r.id = 2;
    s.add(r.clone(), t).unwrap();
    let (o, _) = step(&mut s, t);
    assert_eq!(lens(&o), vec![(2, 8, 2)]);
    // A prompt of exactly two full blocks reuses only the first: one token must be computed.
    r.id = 3;
    r.prompt.truncate(8);
    s.add(r, t).unwrap();
    let (o, _) = step(&mut s, t);
    assert_eq!(lens(&o), vec![(3, 4, 4)]);
    let st = s.stats();
    assert_eq!(st.prefix_queried_tokens, 10 + 10 + 8);
    assert_eq!(st.prefix_hit_tokens, 8 + 4);
    assert!((st.prefix_hit_rate() - 12.0 / 28.0).abs() < 1e-12);
    assert!(st.pool.prefix_hits >= 3);
}

#[test]
fn prefix_cache_shares_blocks_with_a_running_sequence() {
    let t = Instant::now();
    let mut s = sched(config(32, 4), 16, true);
    s.add(req(1, 9, 10), t).unwrap();
    step(&mut s, t);
    let mut r = req(1, 9, 10);
    r.id = 2;
    s.add(r, t).unwrap();
    let (o, _) = step(&mut s, t);
    let a = &s.seq(1).unwrap().block_table[..2].to_vec();
    let b = &s.seq(2).unwrap().block_table[..2].to_vec();
    assert_eq!(a, b);
    assert_eq!(s.pool().ref_count(a[0]), 2);
    assert_eq!(lens(&o), vec![(1, 9, 1), (2, 8, 1)]);
}

#[test]
fn out_of_blocks_preempts_the_newest_which_resumes_with_its_tokens() {
    let t = Instant::now();
    // 4 blocks = 16 slots; two sequences of 7 prompt tokens need 2 blocks each.
    let mut s = sched(config(32, 4), 4, false);
    s.add(req(1, 7, 6), t).unwrap();
    s.add(req(2, 7, 6), t).unwrap();
    let (o, _) = step(&mut s, t);
    assert_eq!(lens(&o), vec![(1, 0, 7), (2, 0, 7)]);
    // Both write position 7 (still block 1); then position 8 needs a third block each.
    step(&mut s, t);
    let (o, _) = step(&mut s, t);
    assert_eq!(o.preempted, vec![2]);
    assert_eq!(lens(&o), vec![(1, 8, 1)]);
    let info = s.seq(2).unwrap();
    assert_eq!(info.state, SeqStatus::Waiting);
    assert_eq!(info.generated(), &[7, 7]);
    assert!(info.block_table.is_empty());
    assert_eq!(s.stats().preempted_total, 1);
    // 1 finishes (6 tokens); 2 then recomputes prompt + generated in one chunk.
    let mut resumed = None;
    for _ in 0..10 {
        let (o, _) = step(&mut s, t);
        if let Some(c) = o.chunks.iter().find(|c| c.seq == 2) {
            resumed = Some(c.clone());
            break;
        }
    }
    let c = resumed.expect("preempted sequence resumed");
    assert_eq!(c.start, 0);
    assert_eq!(c.tokens.len(), 9);
    assert_eq!(&c.tokens[7..], &[7, 7]);
    assert!(c.sample);
    while s.has_work() {
        step(&mut s, t);
    }
    assert_eq!(s.pool().num_free(), 4);
}

#[test]
fn priority_policy_preempts_the_lowest_priority() {
    let t = Instant::now();
    let cfg = SchedulerConfig {
        policy: Policy::Priority,
        ..config(32, 4)
    };
    let mut s = sched(cfg, 4, false);
    let mut low = req(1, 7, 6);
    low.priority = -1;
    s.add(low, t).unwrap();
    let mut high = req(2, 7, 6);
    high.priority = 5;
    s.add(high, t).unwrap();
    let (o, _) = step(&mut s, t);
    // Higher priority admitted first.
    assert_eq!(o.chunks[0].seq, 2);
    step(&mut s, t);
    let (o, _) = step(&mut s, t);
    assert_eq!(o.preempted, vec![1]);
}

#[test]
fn a_sequence_the_pool_cannot_hold_ends_context_full() {
    let t = Instant::now();
    // 2 blocks = 8 positions, context 64.
    let mut s = sched(config(32, 4), 2, false);
    s.add(req(1, 6, 100), t).unwrap();
    let mut ended = Vec::new();
    for _ in 0..10 {
        let (o, e) = step(&mut s, t);
        ended.extend(o.ended.iter().copied());
        ended.extend(e);
        if !s.has_work() {
            break;
        }
    }
    assert_eq!(ended, vec![(1, SeqEnd::ContextFull)]);
    assert_eq!(s.pool().num_free(), 2);
}

#[test]
fn static_mode_admits_only_when_nothing_runs() {
    let t = Instant::now();
    let cfg = SchedulerConfig {
        mode: BatchingMode::Static,
        ..config(32, 4)
    };
    let mut s = sched(cfg, 16, false);
    s.add(req(1, 3, 2), t).unwrap();
    s.add(req(2, 3, 3), t).unwrap();
    let (o, _) = step(&mut s, t);
    assert_eq!(o.chunks.len(), 2);
    s.add(req(3, 3, 2), t).unwrap();
    let (o, ends) = step(&mut s, t);
    assert_eq!(ends, vec![(1, SeqEnd::Length)]);
    assert!(o.chunks.iter().all(|c| c.seq != 3));
    // 2 is still running: 3 keeps waiting.
    let (o, ends) = step(&mut s, t);
    assert_eq!(ends, vec![(2, SeqEnd::Length)]);
    assert!(o.chunks.iter().all(|c| c.seq != 3));
    let (o, _) = step(&mut s, t);
    assert_eq!(lens(&o), vec![(3, 0, 3)]);
}

/// Regression: a static wave was once cut at the first step's token budget, so "static"
/// batches held one or two long prompts however many requests waited.
#[test]
fn static_mode_gathers_a_whole_wave_beyond_the_step_budget() {
    let t = Instant::now();
    let cfg = SchedulerConfig {
        mode: BatchingMode::Static,
        ..config(6, 8)
    };
    let mut s = sched(cfg, 32, false);
    for id in 1..=4 {
        s.add(req(id, 5, 2), t).unwrap();
    }
    // All four join the wave; the budget (6) prefills the first and starts the second.
    let (o, _) = step(&mut s, t);
    assert_eq!(lens(&o), vec![(1, 0, 5), (2, 0, 1)]);
    assert_eq!((s.num_running(), s.num_waiting()), (4, 0));
    // A newcomer waits for the whole wave, which prefills over the next steps.
    s.add(req(5, 5, 2), t).unwrap();
    let (o, _) = step(&mut s, t);
    assert_eq!(lens(&o), vec![(1, 5, 1), (2, 1, 4), (3, 0, 1)]);
    let mut steps = 0;
    while s.num_running() > 0 {
        let (o, _) = step(&mut s, t);
        assert!(
            o.chunks.iter().all(|c| c.seq != 5),
            "5 joined a running wave"
        );
        steps += 1;
        assert!(steps < 20, "the wave never ended");
    }
    let (o, _) = step(&mut s, t);
    assert_eq!(lens(&o), vec![(5, 0, 5)]);
}

/// A wave takes only the prompts that fit in the free blocks together.
#[test]
fn static_wave_is_bounded_by_free_blocks_for_whole_prompts() {
    let t = Instant::now();
    let cfg = SchedulerConfig {
        mode: BatchingMode::Static,
        ..config(4, 8)
    };
    // 5 blocks: two 8-token prompts need 4; a third would need 2 more.
    let mut s = sched(cfg, 5, false);
    for id in 1..=3 {
        s.add(req(id, 8, 1), t).unwrap();
    }
    step(&mut s, t);
    assert_eq!((s.num_running(), s.num_waiting()), (2, 1));
}

#[test]
fn finish_frees_blocks_from_any_state() {
    let t = Instant::now();
    let mut s = sched(config(4, 4), 8, false);
    s.add(req(1, 8, 5), t).unwrap();
    s.add(req(2, 3, 5), t).unwrap();
    step(&mut s, t);
    assert!(s.is_running(1) && s.is_waiting(2));
    assert!(s.finish(2, SeqEnd::Aborted));
    assert!(s.finish(1, SeqEnd::Stopped));
    assert!(!s.finish(1, SeqEnd::Stopped));
    assert_eq!(s.pool().num_free(), 8);
    assert!(!s.has_work());
}

#[test]
fn stale_chunks_and_missing_tokens() {
    let t = Instant::now();
    let mut s = sched(config(16, 4), 8, false);
    s.add(req(1, 3, 5), t).unwrap();
    s.add(req(2, 3, 5), t).unwrap();
    let out = s.schedule(t);
    // 1 was aborted while the step ran: its chunk is ignored.
    s.finish(1, SeqEnd::Aborted);
    // 2's token is missing: it is ended rather than left with nothing to compute.
    let ends = s.update(&out, &[]);
    assert_eq!(ends, vec![(2, SeqEnd::Aborted)]);
    assert!(!s.has_work());
    assert_eq!(s.pool().num_free(), 8);
}

#[test]
fn fork_shares_blocks_and_copies_on_write() {
    let t = Instant::now();
    let mut s = sched(config(16, 4), 8, false);
    s.add(req(1, 6, 5), t).unwrap();
    step(&mut s, t);
    let parent_blocks = s.seq(1).unwrap().block_table.to_vec();
    assert_eq!(parent_blocks.len(), 2);
    s.fork(1, 2, 9).unwrap();
    let child = s.seq(2).unwrap();
    assert_eq!(child.block_table, &parent_blocks[..]);
    assert_eq!(child.num_computed, 6);
    assert_eq!(child.generated(), &[9]);
    assert_eq!(s.pool().ref_count(parent_blocks[1]), 2);
    // Both write position 6, inside shared block 1: the first copies it, the second then
    // holds the only reference and writes in place.
    let (o, _) = step(&mut s, t);
    assert_eq!(o.copies.len(), 1);
    let (src, dst) = o.copies[0];
    assert_eq!(src, parent_blocks[1]);
    let tables: Vec<_> = o.chunks.iter().map(|c| c.block_table.clone()).collect();
    assert_eq!(tables[0][0], tables[1][0], "full block 0 stays shared");
    assert_ne!(tables[0][1], tables[1][1]);
    assert!(tables.iter().any(|t| t[1] == dst));
    assert_eq!(s.pool().ref_count(parent_blocks[0]), 2);
    assert_eq!(s.pool().ref_count(src), 1);
    assert_eq!(o.chunks[1].tokens, vec![9]);
    while s.has_work() {
        step(&mut s, t);
    }
    assert_eq!(s.pool().num_free(), 8);
}

#[test]
fn fork_errors() {
    let t = Instant::now();
    let mut s = sched(config(4, 4), 8, false);
    s.add(req(1, 6, 5), t).unwrap();
    assert_eq!(s.fork(1, 2, 0), Err(SchedulerError::ForkNotReady { id: 1 }));
    step(&mut s, t);
    // Mid-prefill (4 of 6 computed): not ready.
    assert_eq!(s.fork(1, 2, 0), Err(SchedulerError::ForkNotReady { id: 1 }));
    assert_eq!(
        s.fork(9, 2, 0),
        Err(SchedulerError::UnknownSequence { id: 9 })
    );
    assert_eq!(s.fork(1, 1, 0), Err(SchedulerError::DuplicateId { id: 1 }));
    step(&mut s, t);
    assert_eq!(s.fork(1, 2, 0), Ok(()));
}

#[test]
fn policies_order_admission() {
    let t = Instant::now();
    let order = |policy: Policy, aging: f64, now: Instant| {
        let cfg = SchedulerConfig {
            policy,
            aging_per_sec: aging,
            ..config(4, 1)
        };
        let mut s = sched(cfg, 32, false);
        let mut a = req(1, 8, 1);
        a.priority = 0;
        s.add(a, t).unwrap();
        let mut b = req(2, 3, 1);
        b.priority = 2;
        s.add(b, t + Duration::from_secs(10)).unwrap();
        let o = s.schedule(now);
        o.chunks[0].seq
    };
    let later = t + Duration::from_secs(10);
    assert_eq!(order(Policy::Fcfs, 0.0, later), 1);
    assert_eq!(order(Policy::Priority, 0.0, later), 2);
    assert_eq!(order(Policy::Sjf, 0.0, later), 2);
    // Aging: seq 1 waited 10 s longer; at 1 level/s it overtakes priority 2.
    assert_eq!(order(Policy::Priority, 1.0, later), 1);
    // At 1 token/s, 10 s outweigh 5 tokens.
    assert_eq!(order(Policy::Sjf, 1.0, later), 1);
}

#[test]
fn kv_waste_counts_distinct_blocks() {
    let t = Instant::now();
    let mut s = sched(config(32, 4), 16, false);
    s.add(req(1, 6, 5), t).unwrap();
    step(&mut s, t);
    assert_eq!(s.kv_waste(), (8, 6));
    s.fork(1, 2, 3).unwrap();
    // Shared blocks count once.
    assert_eq!(s.kv_waste(), (8, 6));
    s.schedule(t);
    // After copy-on-write: block 0 shared (4), two block-1s with 3 slots each.
    assert_eq!(s.kv_waste(), (12, 10));
}

#[test]
fn fork_takes_the_prompt_and_the_childs_own_token_even_late() {
    let t = Instant::now();
    let mut s = sched(config(16, 4), 8, false);
    s.add(req(1, 6, 5), t).unwrap();
    step(&mut s, t);
    step(&mut s, t);
    // The parent has generated [7, 7] and computed 7 positions; the child gets the prompt,
    // its own first token and the prompt's two blocks.
    s.fork(1, 2, 9).unwrap();
    let parent = s.seq(1).unwrap().block_table.to_vec();
    let child = s.seq(2).unwrap();
    assert_eq!(child.tokens, &[1000, 1001, 1002, 1003, 1004, 1005, 9]);
    assert_eq!(child.generated(), &[9]);
    assert_eq!((child.num_computed, child.block_table), (6, &parent[..2]));
    // Both next write into shared block 1: one copy, each ends with its own block 1.
    let (o, _) = step(&mut s, t);
    assert_eq!(lens(&o), vec![(1, 7, 1), (2, 6, 1)]);
    assert_eq!(o.copies, vec![(parent[1], o.chunks[0].block_table[1])]);
    assert_ne!(o.chunks[0].block_table[1], o.chunks[1].block_table[1]);
    while s.has_work() {
        step(&mut s, t);
    }
    assert_eq!(s.pool().num_free(), 8);
}

#[test]
fn fork_from_a_parent_that_just_ended_reports_the_child_in_the_next_output() {
    let t = Instant::now();
    let mut s = sched(config(16, 4), 8, true);
    s.add(req(1, 6, 1), t).unwrap();
    let (_, ends) = step(&mut s, t);
    assert_eq!(ends, vec![(1, SeqEnd::Length)]);
    // max_tokens 1: the children's first tokens complete them too.
    s.fork(1, 2, 9).unwrap();
    s.fork(1, 3, 8).unwrap();
    assert_eq!(s.fork(1, 3, 8), Err(SchedulerError::DuplicateId { id: 3 }));
    assert!(s.has_work() && !s.is_running(2) && !s.is_waiting(2));
    assert_eq!(s.pool().stats().blocks_used, 0);
    assert!(s.finish(3, SeqEnd::Stopped));
    assert!(!s.finish(3, SeqEnd::Stopped));
    let o = s.schedule(t);
    assert!(o.chunks.is_empty());
    assert_eq!(o.ended, vec![(2, SeqEnd::Length)]);
    assert!(!s.has_work());
    // The parent is forgotten once the next step is planned.
    assert_eq!(
        s.fork(1, 4, 0),
        Err(SchedulerError::UnknownSequence { id: 1 })
    );

    // Same at the context limit: 5 + 1 tokens = max_model_len 6.
    let cfg = SchedulerConfig {
        max_model_len: 6,
        ..config(16, 4)
    };
    let mut s = sched(cfg, 8, false);
    s.add(req(1, 5, 10), t).unwrap();
    let (_, ends) = step(&mut s, t);
    assert_eq!(ends, vec![(1, SeqEnd::ContextFull)]);
    s.fork(1, 2, 9).unwrap();
    assert_eq!(s.schedule(t).ended, vec![(2, SeqEnd::ContextFull)]);
}

#[test]
fn fork_of_a_preempted_parent_recomputes_its_prompt() {
    let t = Instant::now();
    let mut s = sched(config(32, 4), 4, false);
    s.add(req(1, 7, 6), t).unwrap();
    s.add(req(2, 7, 6), t).unwrap();
    step(&mut s, t);
    step(&mut s, t);
    let (o, _) = step(&mut s, t);
    assert_eq!(o.preempted, vec![2]);
    s.fork(2, 3, 9).unwrap();
    let c = s.seq(3).unwrap();
    assert_eq!(c.state, SeqStatus::Waiting);
    assert_eq!((c.tokens.len(), c.num_computed), (8, 0));
    assert!(c.block_table.is_empty());
    let mut saw = false;
    while s.has_work() {
        let (o, _) = step(&mut s, t);
        if let Some(c) = o.chunks.iter().find(|c| c.seq == 3 && c.start == 0) {
            assert_eq!(c.tokens.len(), 8);
            assert_eq!(c.tokens[7], 9);
            assert!(c.sample);
            saw = true;
        }
    }
    assert!(saw);
    assert_eq!(s.pool().num_free(), 4);
}

#[test]
fn a_fork_child_copies_a_cached_block_even_when_it_holds_it_alone() {
    let t = Instant::now();
    let mut s = sched(config(16, 4), 8, true);
    s.add(req(1, 1, 8), t).unwrap();
    for _ in 0..4 {
        step(&mut s, t);
    }
    // The parent's block 0 is full (prompt + 3 generated tokens) and cached under its hash.
    let b0 = s.seq(1).unwrap().block_table[0];
    assert!(s.pool().is_cached(b0));
    s.fork(1, 2, 9).unwrap();
    assert_eq!(s.seq(2).unwrap().block_table, &[b0]);
    assert!(s.finish(1, SeqEnd::Stopped));
    assert_eq!(s.pool().ref_count(b0), 1);
    // The child writes position 1 of block 0: it must copy, not overwrite the cached block.
    let (o, _) = step(&mut s, t);
    assert_eq!(lens(&o), vec![(2, 1, 1)]);
    assert_eq!(o.copies.len(), 1);
    assert_eq!(o.copies[0].0, b0);
    assert_ne!(o.chunks[0].block_table[0], b0);
    assert_eq!(s.pool().ref_count(b0), 0);
    assert!(s.pool().is_cached(b0), "the parent's prefix stays findable");
}

// ------------------------------------------------------------------ speculative decoding

/// Runs the prompt of a 3-token sequence so that it is decoding (tokens 3 + 1 sampled).
fn decoding(s: &mut Scheduler, id: SeqId, max_tokens: usize) {
    s.add(req(id, 3, max_tokens), Instant::now()).unwrap();
    step(s, Instant::now());
}

#[test]
fn proposals_ride_on_the_decode_chunk_and_accepted_ones_count() {
    let mut s = sched(config(16, 4), 8, true);
    decoding(&mut s, 1, 20);
    assert!(s.propose(1, vec![50, 51, 52]));
    let out = s.schedule(Instant::now());
    let c = &out.chunks[0];
    assert_eq!(
        (c.start, c.tokens.clone(), c.num_draft),
        (3, vec![7, 50, 51, 52], 3)
    );
    assert_eq!(c.draft(), &[50, 51, 52]);
    assert_eq!(c.sample_rows(), 4);
    // Two accepted, then 99 sampled instead of 52.
    assert!(s
        .update_speculative(&out, &[(1, vec![50, 51, 99])])
        .is_empty());
    let info = s.seq(1).unwrap();
    assert_eq!(info.tokens[3..], [7, 50, 51, 99]);
    assert_eq!(info.num_computed, 6, "last token, two accepted proposals");
    s.check_invariants().unwrap();
}

#[test]
fn rejected_proposals_give_their_blocks_back() {
    let mut s = sched(config(16, 4), 8, false);
    decoding(&mut s, 1, 20);
    let free_before = s.pool().num_free();
    s.propose(1, (100..108).collect());
    let out = s.schedule(Instant::now());
    assert_eq!(out.chunks[0].num_draft, 8);
    // 3 + 1 + 8 positions = 3 blocks of 4; before, 1 block held.
    assert_eq!(s.pool().num_free(), free_before - 2);
    s.update_speculative(&out, &[(1, vec![5])]);
    assert_eq!(s.seq(1).unwrap().num_computed, 4);
    assert_eq!(s.seq(1).unwrap().block_table.len(), 1);
    assert_eq!(s.pool().num_free(), free_before);
    s.check_invariants().unwrap();
}

#[test]
fn proposals_are_capped_by_max_tokens_budget_and_length() {
    let t = Instant::now();
    // max_tokens 4: one generated, so at most 2 proposals (+1 sampled = 4).
    let mut s = sched(config(16, 4), 8, false);
    decoding(&mut s, 1, 4);
    s.propose(1, vec![1, 2, 3, 4, 5]);
    assert_eq!(s.schedule(t).chunks[0].num_draft, 2);
    // A token budget of 3 leaves room for 2 proposals.
    let mut s = sched(config(3, 4), 8, false);
    decoding(&mut s, 1, 20);
    s.propose(1, vec![1, 2, 3, 4, 5]);
    assert_eq!(s.schedule(t).chunks[0].num_draft, 2);
    // Prefill chunks never carry proposals; proposals for a waiting sequence are refused.
    let mut s = sched(config(16, 4), 8, false);
    s.add(req(1, 3, 20), t).unwrap();
    assert!(!s.propose(1, vec![1, 2]));
    assert_eq!(s.schedule(t).chunks[0].num_draft, 0);
}

#[test]
fn accepting_everything_reaches_max_tokens_exactly() {
    let mut s = sched(config(16, 4), 8, false);
    decoding(&mut s, 1, 4);
    s.propose(1, vec![1, 2, 3]);
    let out = s.schedule(Instant::now());
    assert_eq!(out.chunks[0].num_draft, 2);
    let ends = s.update_speculative(&out, &[(1, vec![1, 2, 9])]);
    assert_eq!(ends, vec![(1, SeqEnd::Length)]);
    s.check_invariants().unwrap();
}

/// SJF orders by predicted job length — prompt left plus expected output — so a short prompt
/// asking for a long explicit output waits behind a longer prompt asking for a short one.
#[test]
fn sjf_ranks_by_prompt_plus_explicit_max_tokens() {
    let t = Instant::now();
    let cfg = SchedulerConfig {
        policy: Policy::Sjf,
        max_model_len: 4096,
        ..config(64, 1)
    };
    let mut s = sched(cfg, 64, false);
    // 2 + 1000 predicted tokens.
    s.add(req(1, 2, 1000), t).unwrap();
    // 20 + 8 predicted tokens.
    s.add(req(2, 20, 8), t).unwrap();
    let out = s.schedule(t);
    assert_eq!(lens(&out), vec![(2, 0, 20)]);
    assert!(s.is_waiting(1));
}

/// Without an explicit `max_tokens` the output is predicted by the running estimate, which
/// starts at its default and moves as sequences finish.
#[test]
fn sjf_without_explicit_max_tokens_uses_the_running_estimate() {
    let t = Instant::now();
    let cfg = SchedulerConfig {
        policy: Policy::Sjf,
        max_model_len: 4096,
        ..config(64, 1)
    };
    let first_admitted = |s: &mut Scheduler, base: SeqId| {
        // A short prompt with a server-default cap of 2000, against a longer prompt whose
        // client asked for 100: 2 + estimate against 40 + 100.
        let mut a = req(base, 2, 2000);
        a.max_tokens_explicit = false;
        s.add(a, t).unwrap();
        s.add(req(base + 1, 40, 100), t).unwrap();
        let out = s.schedule(t);
        let first = out.chunks[0].seq;
        for id in [base, base + 1] {
            s.finish(id, SeqEnd::Aborted);
        }
        first
    };
    let mut s = sched(cfg, 64, false);
    assert_eq!(
        s.output_estimate().tokens(),
        predict::DEFAULT_EXPECTED_OUTPUT
    );
    // 2 + 256 > 40 + 100: the explicit one first. Aborted sequences teach nothing.
    assert_eq!(first_admitted(&mut s, 100), 101);
    assert_eq!(
        s.output_estimate().tokens(),
        predict::DEFAULT_EXPECTED_OUTPUT
    );
    // Ten requests without explicit max_tokens stop after one token each.
    for id in 1..=10 {
        let mut r = req(id, 3, 500);
        r.max_tokens_explicit = false;
        s.add(r, t).unwrap();
        step(&mut s, t);
        assert!(s.finish(id, SeqEnd::Stopped));
    }
    let learned = s.output_estimate().tokens();
    assert!((1.0..100.0).contains(&learned), "{learned}");
    // Now 2 + the estimate < 40 + 100: the short prompt goes first.
    assert_eq!(first_admitted(&mut s, 200), 200);
}

/// The estimate learns from outputs whose length was their own: stopped ones, and ones cut
/// by a limit the client did not choose — not from an explicit `max_tokens` nor an abort.
#[test]
fn output_estimate_learns_only_from_natural_lengths() {
    let t = Instant::now();
    let mut s = sched(config(64, 4), 64, false);
    let run = |s: &mut Scheduler, id: SeqId, max_tokens: usize, explicit: bool| {
        let mut r = req(id, 3, max_tokens);
        r.max_tokens_explicit = explicit;
        s.add(r, t).unwrap();
        let mut ends = Vec::new();
        while ends.is_empty() {
            ends = step(s, t).1;
        }
        assert_eq!(ends, vec![(id, SeqEnd::Length)]);
        s.output_estimate().tokens()
    };
    let start = s.output_estimate().tokens();
    assert_eq!(
        run(&mut s, 1, 2, true),
        start,
        "an explicit max_tokens cut it"
    );
    let learned = run(&mut s, 2, 2, false);
    assert!(learned < start, "{learned} {start}");
    s.add(req(3, 3, 50), t).unwrap();
    step(&mut s, t);
    s.finish(3, SeqEnd::Aborted);
    assert_eq!(s.output_estimate().tokens(), learned);
}

/// Aging still lets a long predicted job overtake: nothing starves under SJF.
#[test]
fn sjf_ages_long_predicted_jobs() {
    let t = Instant::now();
    let cfg = SchedulerConfig {
        policy: Policy::Sjf,
        aging_per_sec: 1.0,
        max_model_len: 4096,
        ..config(64, 1)
    };
    let mut s = sched(cfg, 64, false);
    // 2 + 1000 predicted, arrived 2000 s before a 20 + 8 job.
    s.add(req(1, 2, 1000), t).unwrap();
    let later = t + Duration::from_secs(2000);
    s.add(req(2, 20, 8), later).unwrap();
    let out = s.schedule(later);
    assert_eq!(out.chunks[0].seq, 1);
}

/// A hybrid model's scheduler: `slots` state slots, prefix caching on.
fn hybrid(cfg: SchedulerConfig, blocks: usize, slots: usize) -> Scheduler {
    sched(cfg, blocks, true).with_states(StatePool::new(slots, 64, true))
}

/// Two prompts sharing their first 12 tokens (3 blocks of 4).
fn shared_prefix(id: SeqId, suffix: u32, len: usize) -> SeqRequest {
    let mut r = req(id, len, 2);
    for (i, t) in r.prompt.iter_mut().enumerate() {
        *t = if i < 12 {
            i as u32
        } else {
            500 + suffix + i as u32
        };
    }
    r
}

#[test]
fn a_hybrid_prefill_ends_its_chunks_on_blocks_and_snapshots_there() {
    let t = Instant::now();
    let mut s = hybrid(config(10, 4), 16, 6);
    s.add(shared_prefix(1, 0, 15), t).unwrap();
    // Budget 10: the first chunk stops at the boundary 8, the second at 12 (the last
    // boundary before the final token), the third computes the rest and samples.
    let (a, _) = step(&mut s, t);
    assert_eq!(lens(&a), vec![(1, 0, 8)]);
    let live = a.chunks[0].state_slot.expect("a live slot");
    assert_eq!(a.state_snapshots.len(), 1);
    assert_eq!(a.state_snapshots[0].0, live);
    let (b, _) = step(&mut s, t);
    assert_eq!(lens(&b), vec![(1, 8, 4)]);
    assert_eq!(b.state_snapshots.len(), 1);
    let (c, _) = step(&mut s, t);
    assert_eq!(lens(&c), vec![(1, 12, 3)]);
    assert!(c.chunks[0].sample && c.state_snapshots.is_empty());
    let st = s.stats().states.expect("hybrid stats");
    assert_eq!((st.slots_used, st.snapshots), (1, 2));
    s.check_invariants().unwrap();
}

#[test]
fn a_hybrid_resumes_a_shared_prefix_from_its_snapshot_only() {
    let t = Instant::now();
    let mut s = hybrid(config(32, 4), 16, 6);
    s.add(shared_prefix(1, 0, 15), t).unwrap();
    let (a, _) = step(&mut s, t);
    // One chunk up to the last boundary (12), snapshotted; then the rest.
    assert_eq!(lens(&a), vec![(1, 0, 12)]);
    let snapshot = a.state_snapshots[0].1;
    step(&mut s, t);
    // The second prompt shares 3 blocks; its state resumes from the snapshot at 12.
    s.add(shared_prefix(2, 7, 18), t).unwrap();
    let (b, _) = step(&mut s, t);
    let chunk = b.chunks.iter().find(|c| c.seq == 2).expect("seq 2 runs");
    assert_eq!(chunk.start, 12, "computes only its suffix");
    let live = chunk.state_slot.expect("a live slot");
    assert!(b.state_copies.contains(&(snapshot, live)), "{b:?}");
    assert_eq!(s.stats().prefix_hit_tokens, 12);
    s.check_invariants().unwrap();

    // A prompt that shares only 2 blocks finds blocks but no snapshot there: it recomputes.
    let mut r = shared_prefix(3, 9, 14);
    r.prompt[9] = 9999;
    s.add(r, t).unwrap();
    let (c, _) = step(&mut s, t);
    let chunk = c.chunks.iter().find(|c| c.seq == 3).expect("seq 3 runs");
    assert_eq!(chunk.start, 0);
    assert!(c.state_copies.is_empty());
    s.check_invariants().unwrap();
}

#[test]
fn hybrid_slots_go_back_on_finish_preemption_and_forks_copy_their_parent() {
    let t = Instant::now();
    let mut s = hybrid(config(32, 4), 16, 4);
    s.add(req(1, 6, 4), t).unwrap();
    step(&mut s, t);
    step(&mut s, t);
    s.fork(1, 2, 9).unwrap();
    let (out, _) = step(&mut s, t);
    let slot = |id| {
        out.chunks
            .iter()
            .find(|c| c.seq == id)
            .and_then(|c| c.state_slot)
    };
    let (parent, child) = (slot(1).unwrap(), slot(2).unwrap());
    assert_ne!(parent, child);
    assert!(out.state_copies.contains(&(parent, child)), "{out:?}");
    s.check_invariants().unwrap();
    assert!(s.finish(2, SeqEnd::Aborted));
    assert!(s.finish(1, SeqEnd::Stopped));
    let st = s.stats().states.unwrap();
    assert_eq!(st.slots_used, 0, "{st:?}");
    s.check_invariants().unwrap();
}
