//! Kept versions and rollback: a replaced tag keeps its previous versions (as many as the keep
//! setting says), a rollback points the tag back and keeps what it replaced (so a second
//! rollback returns), the refusals say what to do and change nothing, `rm` removes every
//! version, and garbage collection never deletes a blob a kept version names (a property test
//! over random pulls, rollbacks and keep settings).

use std::collections::BTreeSet;
use std::fs;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use super::{gguf_bytes, named, sha, Env};
use pagoda_store::versions::short_id;
use pagoda_store::{Store, StoreError};

/// Pulls a GGUF of `seed` as `name` from the file `m.gguf` (rewritten each time).
fn pull_seed(env: &Env, store: &Store, name: &str, seed: u8) {
    let p = env.file("m.gguf", &gguf_bytes(seed, 300));
    store
        .pull(p.to_str().expect("utf-8"), &named(name))
        .expect("pull");
}

/// The bytes `name` resolves to now.
fn current_bytes(store: &Store, name: &str) -> Vec<u8> {
    let r = store.resolve(name).expect("resolve").expect("stored");
    fs::read(r.path).expect("read")
}

#[test]
fn a_rollback_restores_the_previous_version_and_a_second_one_returns() {
    let env = Env::new();
    let store = env.store();
    pull_seed(&env, &store, "m:1", 1);
    pull_seed(&env, &store, "m:1", 2);
    assert_eq!(current_bytes(&store, "m:1"), gguf_bytes(2, 300));
    let versions = store.list_versions().expect("versions");
    assert_eq!(versions.len(), 2, "{versions:?}");
    assert!(versions[0].current && !versions[1].current);
    assert_eq!(versions[1].id, sha(&gguf_bytes(1, 300)).to_string());
    assert!(versions[1].until.is_some());
    // `pagoda list` is unchanged: one row per name.
    assert_eq!(store.list().expect("list").len(), 1);

    let back = store.rollback("m:1", None).expect("rollback");
    assert_eq!(back.from, sha(&gguf_bytes(2, 300)).to_string());
    assert_eq!(back.to, sha(&gguf_bytes(1, 300)).to_string());
    assert_eq!(current_bytes(&store, "m:1"), gguf_bytes(1, 300));
    let versions = store.list_versions().expect("versions");
    assert_eq!(versions.len(), 2);
    assert_eq!(versions[0].id, back.to, "the restored one is current");
    assert_eq!(versions[1].id, back.from, "the replaced one is kept");

    let again = store
        .rollback("m:1", None)
        .expect("rollback of the rollback");
    assert_eq!(again.to, back.from);
    assert_eq!(current_bytes(&store, "m:1"), gguf_bytes(2, 300));
    // By digest prefix, with or without `sha256:`.
    let prefix = format!("sha256:{}", &short_id(&back.to)[..8]);
    store.rollback("m:1", Some(&prefix)).expect("by digest");
    assert_eq!(current_bytes(&store, "m:1"), gguf_bytes(1, 300));
}

#[test]
fn refusals_name_the_problem_and_change_nothing() {
    let env = Env::new();
    let store = env.store();
    let e = store.rollback("ghost:1", None).expect_err("unknown");
    assert!(matches!(e, StoreError::NotFound { .. }), "{e}");
    pull_seed(&env, &store, "m:1", 1);
    let e = store.rollback("m:1", None).expect_err("nothing kept");
    assert!(matches!(e, StoreError::NoPreviousVersion { .. }), "{e}");
    assert!(e.to_string().contains("pagoda list --all"), "{e}");
    let only = env.store().with_keep_versions(1);
    let e = only.rollback("m:1", None).expect_err("nothing kept");
    assert!(e.to_string().contains("PAGODA_KEEP_VERSIONS"), "{e}");

    pull_seed(&env, &store, "m:1", 2);
    let e = store
        .rollback("m:1", Some("zz"))
        .expect_err("unknown digest");
    assert!(matches!(e, StoreError::UnknownVersion { .. }), "{e}");
    assert!(e.to_string().contains("pagoda list --all"), "{e}");
    let e = store.rollback("m:1", Some("")).expect_err("empty digest");
    assert!(matches!(e, StoreError::UnknownVersion { .. }), "{e}");
    let current = sha(&gguf_bytes(2, 300));
    let e = store
        .rollback("m:1", Some(current.short()))
        .expect_err("current");
    assert!(matches!(e, StoreError::VersionIsCurrent { .. }), "{e}");
    assert_eq!(current_bytes(&store, "m:1"), gguf_bytes(2, 300));

    // Ambiguous: with 17 kept versions two share their first hex digit.
    let many = env.store().with_keep_versions(40);
    for seed in 3..20 {
        pull_seed(&env, &many, "m:1", seed);
    }
    let ids: Vec<String> = many
        .list_versions()
        .expect("versions")
        .into_iter()
        .filter(|v| !v.current)
        .map(|v| v.id)
        .collect();
    let digit = ids
        .iter()
        .map(|id| short_id(id)[..1].to_string())
        .find(|d| ids.iter().filter(|id| short_id(id).starts_with(d)).count() > 1)
        .expect("a shared first digit");
    let before = current_bytes(&many, "m:1");
    let e = many.rollback("m:1", Some(&digit)).expect_err("ambiguous");
    assert!(matches!(e, StoreError::AmbiguousVersion { .. }), "{e}");
    assert!(e.to_string().contains("more digits"), "{e}");
    assert_eq!(current_bytes(&many, "m:1"), before, "nothing changed");
}

#[test]
fn rm_removes_the_name_with_every_kept_version() {
    let env = Env::new();
    let store = env.store().with_keep_versions(3);
    for seed in 1..=3 {
        pull_seed(&env, &store, "m:1", seed);
    }
    // Another name shares version 1's weights: they stay after `rm m:1`.
    pull_seed(&env, &store, "other:1", 1);
    assert_eq!(env.blob_dir_entries().len(), 3);
    store.remove("m:1").expect("rm");
    assert_eq!(
        env.blob_dir_entries(),
        vec![sha(&gguf_bytes(1, 300)).file_name()]
    );
    assert_eq!(store.list_versions().expect("versions").len(), 1);
    let left: Vec<_> = fs::read_dir(env.root.join("versions"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_bad_keep_setting_is_refused_by_name() {
    let e = pagoda_store::versions::parse_keep_versions("0").expect_err("0");
    assert!(e.to_string().contains("PAGODA_KEEP_VERSIONS"), "{e}");
}

/// One step of the property test.
#[derive(Debug, Clone)]
enum Step {
    /// Pull content `seed` under tag `tag` (0 or 1).
    Pull { tag: u8, seed: u8 },
    /// Roll tag `tag` back (to the `nth` kept version, or the previous one).
    Rollback { tag: u8, nth: Option<u8> },
    /// Copy tag 0 over tag 1.
    Copy,
    /// Remove tag `tag`.
    Remove { tag: u8 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..2, 0u8..6).prop_map(|(tag, seed)| Step::Pull { tag, seed }),
        3 => (0u8..2, proptest::option::of(0u8..4)).prop_map(|(tag, nth)| Step::Rollback { tag, nth }),
        1 => Just(Step::Copy),
        1 => (0u8..2).prop_map(|tag| Step::Remove { tag }),
    ]
}

#[test]
fn kept_versions_stay_whole_within_the_limit_and_nothing_leaks() {
    let mut runner = TestRunner::new(Config {
        cases: 24,
        ..Config::default()
    });
    let strategy = (1usize..4, proptest::collection::vec(step(), 1..14));
    runner
        .run(&strategy, |(keep, steps)| {
            let env = Env::new();
            let store = env.store().with_keep_versions(keep);
            let tag = |t: u8| format!("m:{t}");
            for s in &steps {
                match s {
                    Step::Pull { tag: t, seed } => pull_seed(&env, &store, &tag(*t), *seed),
                    Step::Rollback { tag: t, nth } => {
                        let kept: Vec<String> = store
                            .list_versions()
                            .expect("versions")
                            .into_iter()
                            .filter(|v| v.name == tag(*t) && !v.current)
                            .map(|v| v.id)
                            .collect();
                        let to = nth.and_then(|n| kept.get(n as usize).cloned());
                        let before = store.resolve(&tag(*t)).expect("resolve").map(|r| r.path);
                        match store.rollback(&tag(*t), to.as_deref()) {
                            Ok(done) => {
                                prop_assert_eq!(
                                    Some(done.to.clone()),
                                    to.or(kept.first().cloned())
                                );
                                // Each version of this test differs in its bytes.
                                let now = current_bytes(&store, &tag(*t));
                                prop_assert_eq!(sha(&now).to_string(), done.to);
                            }
                            Err(StoreError::NotFound { .. }) => prop_assert!(before.is_none()),
                            Err(StoreError::NoPreviousVersion { .. }) => {
                                prop_assert!(kept.is_empty())
                            }
                            Err(e) => prop_assert!(false, "unexpected refusal: {e}"),
                        }
                    }
                    Step::Copy => {
                        let _ = store.copy(&tag(0), &tag(1));
                    }
                    Step::Remove { tag: t } => {
                        let _ = store.remove(&tag(*t));
                    }
                }
                // Invariants after every step.
                let versions = store.list_versions().expect("versions");
                let mut named_blobs = BTreeSet::new();
                for t in 0..2u8 {
                    let mine: Vec<_> = versions.iter().filter(|v| v.name == tag(t)).collect();
                    prop_assert!(
                        mine.len() <= keep,
                        "{} versions of {} with keep {keep}",
                        mine.len(),
                        tag(t)
                    );
                    prop_assert!(mine.iter().filter(|v| v.current).count() <= 1);
                }
                for v in &versions {
                    // Every version's weights are in place (ids are the blobs' digests here).
                    let hex = v.id.trim_start_matches("sha256:");
                    let blob = format!("sha256-{hex}");
                    prop_assert!(
                        env.root.join("blobs").join(&blob).is_file(),
                        "the blob of {} version {} is gone",
                        v.name,
                        v.id
                    );
                    named_blobs.insert(blob);
                }
                // And nothing else is left behind.
                let on_disk: BTreeSet<String> = env.blob_dir_entries().into_iter().collect();
                prop_assert_eq!(&on_disk, &named_blobs);
            }
            Ok(())
        })
        .expect("property");
}
