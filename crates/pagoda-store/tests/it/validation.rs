//! The validation hook: a store with a validator lists only what it accepts, for every source
//! kind and for `create` / `copy`, and a refused pull leaves nothing behind.
//!
//! The validator here is a stand-in (this crate reads no model contents): it refuses a GGUF
//! whose bytes hold `BROKEN`, and a folder whose `model.safetensors` does.

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::server::{Route, Server};
use super::{catalog_entry, create_in, gguf_bytes, manifest_names, modelfile, named, opts, Env};
use pagoda_store::{Source, Store, StoreError};

const MARK: &[u8] = b"BROKEN";

fn refuses_marked(path: &Path) -> Result<(), String> {
    let file = if path.is_dir() {
        path.join("model.safetensors")
    } else {
        path.to_path_buf()
    };
    let bytes = fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    if bytes.windows(MARK.len()).any(|w| w == MARK) {
        return Err(format!("{}: tensor \"blk.0\" is cut short", file.display()));
    }
    Ok(())
}

fn broken_gguf(seed: u8) -> Vec<u8> {
    let mut b = gguf_bytes(seed, 3000);
    b.extend_from_slice(MARK);
    b
}

fn checked(env: &Env) -> Store {
    env.store().with_validator(refuses_marked)
}

/// Nothing but `expected` blobs in `blobs/`: no other blob, no `partial-*` file; and nothing
/// left in `tmp/`.
fn assert_only_blobs(env: &Env, expected: usize) {
    let entries = env.blob_dir_entries();
    assert_eq!(entries.len(), expected, "{entries:?}");
    assert!(
        entries.iter().all(|e| e.starts_with("sha256-")),
        "{entries:?}"
    );
    let tmp: Vec<_> = fs::read_dir(env.root.join("tmp"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(tmp.is_empty(), "{tmp:?}");
}

fn assert_unloadable(e: &StoreError, name: &str, needles: &[&str]) {
    assert!(matches!(e, StoreError::Unloadable { .. }), "{e}");
    let text = e.to_string();
    assert!(text.contains(&format!("model '{name}'")), "{text}");
    assert!(text.contains("cannot be loaded"), "{text}");
    for n in needles {
        assert!(text.contains(n), "{text} lacks {n:?}");
    }
}

#[test]
fn a_refused_local_file_is_not_listed_and_leaves_no_blob() {
    let env = Env::new();
    let p = env.file("cut.gguf", &broken_gguf(1));
    let store = checked(&env);
    let e = store.pull(p.to_str().unwrap(), &opts()).unwrap_err();
    // The reason names the source, not the blob it was checked in.
    assert_unloadable(
        &e,
        "cut:latest",
        &["cut.gguf", "cut short", "pull it again"],
    );
    assert!(!e.to_string().contains("sha256-"), "{e}");
    assert!(store.list().unwrap().is_empty());
    assert!(store.resolve("cut").unwrap().is_none());
    assert_only_blobs(&env, 0);
    // The original is only read.
    assert!(p.is_file());

    // A good file is stored as before.
    let good = env.file("good.gguf", &gguf_bytes(2, 3000));
    store.pull(good.to_str().unwrap(), &opts()).unwrap();
    assert_eq!(manifest_names(&env), vec!["good:latest"]);
}

#[test]
fn a_refused_folder_is_checked_under_its_real_file_names() {
    let env = Env::new();
    let dir = env.files.join("tiny");
    env.file("tiny/config.json", b"{}");
    env.file("tiny/tokenizer.json", b"{\"t\":1}");
    env.file("tiny/model.safetensors", b"weights BROKEN");
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let store = env.store().with_validator(move |p: &Path| {
        counter.fetch_add(1, Ordering::SeqCst);
        // The folder as it will be served: every file under its own name.
        assert!(p.join("config.json").is_file() && p.join("tokenizer.json").is_file());
        refuses_marked(p)
    });
    let e = store.pull(dir.to_str().unwrap(), &opts()).unwrap_err();
    assert_unloadable(&e, "tiny:latest", &["model.safetensors"]);
    // Named under the source folder, not the scratch folder it was checked in.
    assert!(e.to_string().contains(dir.to_str().unwrap()), "{e}");
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    assert!(store.list().unwrap().is_empty());
    assert!(!env.root.join("models/tiny").exists());
    assert_only_blobs(&env, 0);

    env.file("tiny/model.safetensors", b"weights");
    let r = store.pull(dir.to_str().unwrap(), &opts()).unwrap();
    assert!(r.path.join("model.safetensors").is_file());
    assert_only_blobs(&env, 3);
}

#[test]
fn a_refused_url_or_hugging_face_download_leaves_nothing() {
    let bad = broken_gguf(3);
    let server = Server::start(vec![
        ("/m/bad.gguf", Route::Body(bad.clone())),
        ("/o/r/resolve/main/bad.gguf", Route::Body(bad)),
    ]);
    let env = Env::new();
    let store = checked(&env).with_hf_endpoint(server.base.clone());
    let url = server.url("/m/bad.gguf");
    let e = store.pull(&url, &opts()).unwrap_err();
    assert_unloadable(&e, "bad:latest", &[url.as_str()]);
    let e = store
        .pull("hf://o/r/bad.gguf", &named("hfbad:1"))
        .unwrap_err();
    assert_unloadable(&e, "hfbad:1", &["hf://o/r/bad.gguf"]);
    assert!(store.list().unwrap().is_empty());
    assert_only_blobs(&env, 0);
}

#[test]
fn a_refused_pip_member_or_folder_leaves_nothing() {
    let env = Env::new();
    env.wheel(
        "bad-model",
        "1.0.0",
        &[
            ("bad_model/m.gguf", &broken_gguf(4)),
            ("bad_model/dir/config.json", b"{}"),
            ("bad_model/dir/model.safetensors", b"BROKEN"),
        ],
    );
    let store = checked(&env);
    let e = store
        .pull("pip://bad-model==1.0.0/bad_model/m.gguf", &named("pm:1"))
        .unwrap_err();
    assert_unloadable(&e, "pm:1", &["pip://bad-model==1.0.0"]);
    let e = store
        .pull("pip://bad-model==1.0.0/bad_model/dir/", &named("pf:1"))
        .unwrap_err();
    assert_unloadable(&e, "pf:1", &["model.safetensors"]);
    assert!(store.list().unwrap().is_empty());
    assert_only_blobs(&env, 0);
}

#[test]
fn a_catalog_pull_falls_through_a_refused_source() {
    let env = Env::new();
    let bad = env.file("bad.gguf", &broken_gguf(5));
    let good_bytes = gguf_bytes(6, 3000);
    let good = env.file("good.gguf", &good_bytes);
    let entry = catalog_entry(
        "fallback:1",
        None,
        vec![Source::Path(bad.clone()), Source::Path(good)],
    );
    let store = checked(&env).with_catalog(vec![entry]);
    let r = store.pull("fallback:1", &opts()).unwrap();
    assert_eq!(fs::read(&r.path).unwrap(), good_bytes);
    assert_only_blobs(&env, 1);

    // Every source refused: the failures list each reason.
    let entry = catalog_entry(
        "nogood:1",
        None,
        vec![Source::Path(bad.clone()), Source::Path(bad)],
    );
    let store = checked(&env).with_catalog(vec![entry]);
    let e = store.pull("nogood:1", &opts()).unwrap_err();
    assert!(matches!(e, StoreError::AllSourcesFailed { .. }), "{e}");
    assert!(e.to_string().contains("cannot be loaded"), "{e}");
    assert_eq!(manifest_names(&env), vec!["fallback:1"]);
    assert_only_blobs(&env, 1);
}

#[test]
fn a_refused_pull_keeps_blobs_other_models_use_and_the_old_version() {
    let env = Env::new();
    let bytes = broken_gguf(7);
    let p = env.file("shared.gguf", &bytes);
    // Stored before validation existed (or by hand): the blob belongs to that model.
    env.store()
        .pull(p.to_str().unwrap(), &named("old:1"))
        .unwrap();
    let good = env.file("v1.gguf", &gguf_bytes(8, 3000));
    let store = checked(&env);
    store.pull(good.to_str().unwrap(), &named("m:1")).unwrap();
    assert_only_blobs(&env, 2);

    let e = store
        .pull(p.to_str().unwrap(), &named("other:1"))
        .unwrap_err();
    assert_unloadable(&e, "other:1", &[]);
    // A refused new version of m:1 leaves m:1 as it was.
    let e = store
        .pull(
            p.to_str().unwrap(),
            &pagoda_store::PullOptions {
                name: Some("m:1".into()),
                force: true,
                ..opts()
            },
        )
        .unwrap_err();
    assert_unloadable(&e, "m:1", &[]);
    assert_eq!(manifest_names(&env), vec!["m:1", "old:1"]);
    assert_only_blobs(&env, 2);
    assert!(store.resolve("old:1").unwrap().is_some());
    let m = store.resolve("m:1").unwrap().unwrap();
    assert_eq!(fs::read(&m.path).unwrap(), gguf_bytes(8, 3000));
}

#[test]
fn create_and_copy_refuse_an_unloadable_base() {
    let env = Env::new();
    let p = env.file("base.gguf", &broken_gguf(9));
    env.store()
        .pull(p.to_str().unwrap(), &named("broken:1"))
        .unwrap();
    let store = checked(&env);

    let e = store
        .create(
            "child:1",
            &modelfile("FROM broken:1\nSYSTEM hi\n"),
            &create_in(&env.files),
        )
        .unwrap_err();
    assert_unloadable(&e, "child:1", &["broken:1", "pagoda rm broken:1"]);
    assert!(!e.to_string().contains("sha256-"), "{e}");
    let e = store
        .create_from_stored("child:1", &modelfile("FROM broken:1\n"))
        .unwrap_err();
    assert_unloadable(&e, "child:1", &["broken:1"]);
    let e = store.copy("broken:1", "copy:1").unwrap_err();
    assert_unloadable(&e, "copy:1", &["broken:1"]);

    // FROM a path to an unloadable file: its blob is taken back.
    env.file("cut.gguf", &broken_gguf(10));
    let e = store
        .create(
            "child:2",
            &modelfile("FROM ./cut.gguf\n"),
            &create_in(&env.files),
        )
        .unwrap_err();
    assert_unloadable(&e, "child:2", &["cut.gguf"]);

    assert_eq!(manifest_names(&env), vec!["broken:1"]);
    assert_only_blobs(&env, 1);
}

#[test]
fn create_from_stored_takes_only_store_names() {
    let env = Env::new();
    let good = env.file("good.gguf", &gguf_bytes(11, 3000));
    let store = checked(&env);
    store
        .pull(good.to_str().unwrap(), &named("base:1"))
        .unwrap();

    let r = store
        .create_from_stored("kid:1", &modelfile("FROM base:1\nSYSTEM Be brief.\n"))
        .unwrap();
    let layer = r.manifest.unwrap().modelfile.unwrap();
    assert_eq!(layer.from, "base:1");
    assert_eq!(layer.system.as_deref(), Some("Be brief."));

    // A path that exists (absolute, relative to the working directory, or a file URL), a URL,
    // a catalog name not pulled yet: none is fetched.
    let cwd_dir = std::env::current_dir().unwrap();
    for from in [
        good.to_str().unwrap().to_string(),
        format!("file://{}", good.display()),
        "https://example.com/m.gguf".to_string(),
        "hf://o/r/m.gguf".to_string(),
        "smollm2:135m".to_string(),
        cwd_dir.file_name().unwrap().to_string_lossy().into_owned(),
        "src".to_string(),
    ] {
        let e = store
            .create_from_stored("x:1", &modelfile(&format!("FROM {from}\n")))
            .unwrap_err();
        assert!(matches!(e, StoreError::FromNotStored { .. }), "{from}: {e}");
        assert!(
            e.to_string().contains("must name a model in the store"),
            "{e}"
        );
    }
    let e = store
        .create_from_stored("x:1", &modelfile("FROM base:1\nADAPTER ./lora\n"))
        .unwrap_err();
    assert!(matches!(e, StoreError::Adapter { .. }), "{e}");
    assert_eq!(manifest_names(&env), vec!["base:1", "kid:1"]);
    assert_only_blobs(&env, 1);
}
