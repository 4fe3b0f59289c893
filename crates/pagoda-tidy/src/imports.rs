//! The import graph of one crate's modules, and its circles.
//!
//! From each crate root (`src/lib.rs`, `src/main.rs`, `src/bin/*.rs`) the `mod` declarations
//! are followed to their files (`foo.rs` or `foo/mod.rs`, inline `mod foo { … }`, `#[path]`);
//! modules and items under `#[cfg(test)]` are left out, and so are `tests/`, `examples/` and
//! `benches/`, which are no part of the crate. An edge `A → B` is drawn when a file names
//! another file's module of the same crate: in a `use` (plain, grouped
//! `use crate::{a::b, c}`, `self`, glob, `pub use`) or in a path in code that starts at
//! `crate::`, `super::`, `self::`, a child module or a name a `use` brought in. A path leads
//! to the deepest module it names (`crate::a::b::Item::f` → `a::b`), following `use`
//! bindings of modules (`use crate::simd; simd::attn::f()` → `simd::attn`).
//!
//! Two things are no edge: a `mod` declaration (it places a file, it does not use it), and a
//! path to one of the module's own ancestors (`super::X`, `crate::X`): a module sits inside
//! them and sees their items, and what a parent re-exports is its face. So a parent that
//! re-exports its children and children that use their parent's shared types make no
//! circle, while two siblings (or cousins) that name each other do.
//!
//! A circle is a strongly connected set of two or more files: each reaches every other by
//! edges, directly or around a loop.
//!
//! Why tokens, not `syn`: module structure needs only `mod`, `use`, paths and attributes,
//! which the lexer reads exactly (comments, strings and char literals cannot leak braces or
//! paths); the whole workspace reads in milliseconds, with no dependency to build.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use crate::lexer::{tokenize, Tok};

/// One module: a file or an inline `mod x { … }` within one.
#[derive(Debug, Default)]
struct Module {
    /// The file its text is in, relative to the crate directory.
    file: PathBuf,
    parent: Option<usize>,
    children: HashMap<String, usize>,
    /// `use` bindings: name → path, as written.
    bindings: Vec<(String, Vec<String>)>,
    /// `use path::*`.
    globs: Vec<Vec<String>>,
    /// Every path the module names that may lead into the crate, as written: the paths of its
    /// `use`s and the paths in its code.
    paths: Vec<Vec<String>>,
}

/// A `mod` declaration found while reading a file.
struct ModDecl {
    name: String,
    /// `#[path = "…"]`.
    path_attr: Option<String>,
    /// The inline module's index, `None` for `mod x;`.
    inline: Option<usize>,
}

/// The import graph of one crate root.
#[derive(Debug)]
pub struct CrateGraph {
    /// Files, relative to the crate directory.
    pub files: Vec<PathBuf>,
    /// `(from, to)` file indices → the paths (as written) that make the edge.
    pub edges: BTreeMap<(usize, usize), BTreeSet<String>>,
}

/// A circle: its files and the edges between them, with the paths that make each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Circle {
    pub files: Vec<PathBuf>,
    pub edges: Vec<(PathBuf, PathBuf, Vec<String>)>,
}

impl std::fmt::Display for Circle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.files.iter().map(|p| p.display().to_string()).collect();
        writeln!(f, "circle of {} files: {}", names.len(), names.join(", "))?;
        for (a, b, why) in &self.edges {
            writeln!(
                f,
                "  {} -> {}: {}",
                a.display(),
                b.display(),
                why.join(", ")
            )?;
        }
        Ok(())
    }
}

/// The crate roots of the crate in `dir`.
pub fn crate_roots(dir: &Path) -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for r in ["src/lib.rs", "src/main.rs"] {
        if dir.join(r).is_file() {
            roots.push(PathBuf::from(r));
        }
    }
    if let Ok(rd) = fs::read_dir(dir.join("src/bin")) {
        let mut bins: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "rs"))
            .filter_map(|p| p.strip_prefix(dir).ok().map(Path::to_path_buf))
            .collect();
        bins.sort();
        roots.extend(bins);
    }
    roots
}

/// The circles of the crate in `dir` (every root), each with its files sorted.
pub fn circles_of_crate(dir: &Path) -> Result<Vec<Circle>, String> {
    let mut out = Vec::new();
    for root in crate_roots(dir) {
        let g = CrateGraph::read(dir, &root)?;
        out.extend(g.circles());
    }
    Ok(out)
}

impl CrateGraph {
    /// Reads the modules reachable from `root` (relative to `dir`) and resolves their paths.
    pub fn read(dir: &Path, root: &Path) -> Result<Self, String> {
        let mut modules: Vec<Module> = Vec::new();
        // (module index, file, "mod-rs" file whose children sit beside it)
        let mut queue = vec![(new_module(&mut modules, root, None), root.to_path_buf())];
        while let Some((m, file)) = queue.pop() {
            let text = fs::read_to_string(dir.join(&file))
                .map_err(|e| format!("{}: {e}", dir.join(&file).display()))?;
            let toks = tokenize(&text);
            let mut decls = Vec::new();
            let mut p = Parser {
                toks: &toks,
                pos: 0,
                modules: &mut modules,
                file: &file,
                decls: &mut decls,
            };
            if p.file_is_test_only() {
                continue;
            }
            p.items(m, false);
            // Where this file's child modules live.
            let file_dir = file.parent().unwrap_or(Path::new("")).to_path_buf();
            let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            let mod_rs = file == root || stem == "mod";
            for (owner, inline_path, decl) in decls {
                if decl.inline.is_some() {
                    continue;
                }
                let base = if mod_rs || decl.path_attr.is_some() && inline_path.is_empty() {
                    file_dir.clone()
                } else {
                    file_dir.join(stem)
                };
                let base = inline_path.iter().fold(base, |b, s| b.join(s));
                let child_file = match &decl.path_attr {
                    Some(p) => base.join(p),
                    None => {
                        let flat = base.join(format!("{}.rs", decl.name));
                        if dir.join(&flat).is_file() {
                            flat
                        } else {
                            base.join(&decl.name).join("mod.rs")
                        }
                    }
                };
                if !dir.join(&child_file).is_file() {
                    return Err(format!(
                        "{}: `mod {}` has no file ({} or its mod.rs)",
                        file.display(),
                        decl.name,
                        child_file.display()
                    ));
                }
                let c = new_module(&mut modules, &child_file, Some(owner));
                modules[owner].children.insert(decl.name.clone(), c);
                queue.push((c, child_file));
            }
        }
        let mut files: Vec<PathBuf> = Vec::new();
        let mut file_index: HashMap<PathBuf, usize> = HashMap::new();
        for m in &modules {
            if !file_index.contains_key(&m.file) {
                file_index.insert(m.file.clone(), files.len());
                files.push(m.file.clone());
            }
        }
        let r = Resolver { modules: &modules };
        let mut edges: BTreeMap<(usize, usize), BTreeSet<String>> = BTreeMap::new();
        for (i, m) in modules.iter().enumerate() {
            for path in &m.paths {
                // A module sits inside its ancestors and sees their items: naming one (the
                // crate root, `super`) is no import.
                let Some(t) = r.target(i, path, 0).filter(|&t| !r.is_ancestor(t, i)) else {
                    continue;
                };
                let (a, b) = (file_index[&m.file], file_index[&modules[t].file]);
                if a != b {
                    edges.entry((a, b)).or_default().insert(path.join("::"));
                }
            }
        }
        Ok(CrateGraph { files, edges })
    }

    /// The strongly connected sets of two or more files.
    pub fn circles(&self) -> Vec<Circle> {
        let n = self.files.len();
        let mut adj = vec![Vec::new(); n];
        for &(a, b) in self.edges.keys() {
            adj[a].push(b);
        }
        let mut out = Vec::new();
        for comp in strongly_connected(&adj) {
            if comp.len() < 2 {
                continue;
            }
            let set: BTreeSet<usize> = comp.iter().copied().collect();
            let mut files: Vec<PathBuf> = comp.iter().map(|&i| self.files[i].clone()).collect();
            files.sort();
            let edges = self
                .edges
                .iter()
                .filter(|((a, b), _)| set.contains(a) && set.contains(b))
                .map(|((a, b), why)| {
                    (
                        self.files[*a].clone(),
                        self.files[*b].clone(),
                        why.iter().cloned().collect(),
                    )
                })
                .collect();
            out.push(Circle { files, edges });
        }
        out.sort_by(|a, b| a.files.cmp(&b.files));
        out
    }
}

fn new_module(modules: &mut Vec<Module>, file: &Path, parent: Option<usize>) -> usize {
    modules.push(Module {
        file: file.to_path_buf(),
        parent,
        ..Module::default()
    });
    modules.len() - 1
}

/// Tarjan's algorithm (iterative): the strongly connected components of `adj`.
fn strongly_connected(adj: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = adj.len();
    let (mut index, mut low) = (vec![usize::MAX; n], vec![0; n]);
    let mut on_stack = vec![false; n];
    let (mut stack, mut comps, mut next) = (Vec::new(), Vec::new(), 0);
    for s in 0..n {
        if index[s] != usize::MAX {
            continue;
        }
        // (node, next edge to look at)
        let mut work = vec![(s, 0)];
        index[s] = next;
        low[s] = next;
        next += 1;
        stack.push(s);
        on_stack[s] = true;
        while let Some(&mut (v, ref mut e)) = work.last_mut() {
            if let Some(&w) = adj[v].get(*e) {
                *e += 1;
                if index[w] == usize::MAX {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(u, _)) = work.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    comp.push(w);
                    if w == v {
                        break;
                    }
                }
                comps.push(comp);
            }
        }
    }
    comps
}

/// Reads one file's tokens into its modules.
struct Parser<'a> {
    toks: &'a [Tok],
    pos: usize,
    modules: &'a mut Vec<Module>,
    file: &'a Path,
    /// (owning module, inline modules between the file and the declaration, declaration)
    decls: &'a mut Vec<(usize, Vec<String>, ModDecl)>,
}

impl<'a> Parser<'a> {
    fn peek(&self, k: usize) -> Option<&'a Tok> {
        let toks: &'a [Tok] = self.toks;
        toks.get(self.pos + k)
    }

    fn ident(&self, k: usize) -> Option<&'a str> {
        match self.peek(k) {
            Some(Tok::Ident(s)) => Some(s),
            _ => None,
        }
    }

    /// `#![cfg(test)]` at the top of the file.
    fn file_is_test_only(&mut self) -> bool {
        while self.peek(0) == Some(&Tok::Punct('#')) && self.peek(1) == Some(&Tok::Punct('!')) {
            self.pos += 1;
            let attr = self.attribute();
            if is_cfg_test(&attr) {
                return true;
            }
        }
        self.pos = 0;
        false
    }

    /// Reads an attribute at `#` (or after `#!`'s `#`): its tokens inside `[…]`.
    fn attribute(&mut self) -> Vec<Tok> {
        self.pos += 1; // '#'
        if self.peek(0) == Some(&Tok::Punct('!')) {
            self.pos += 1;
        }
        let start = self.pos;
        self.skip_group();
        self.toks[start..self.pos].to_vec()
    }

    /// Skips a balanced `(…)`, `[…]` or `{…}` group starting at `pos`.
    fn skip_group(&mut self) {
        let mut depth = 0usize;
        while let Some(t) = self.peek(0) {
            self.pos += 1;
            match t {
                Tok::Punct('(' | '[' | '{') => depth += 1,
                Tok::Punct(')' | ']' | '}') => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        return;
                    }
                }
                _ => {}
            }
        }
    }

    /// Skips one item or statement: up to a `;` outside any group, or the end of the first
    /// `{…}` group.
    fn skip_item(&mut self) {
        while let Some(t) = self.peek(0) {
            match t {
                Tok::Punct(';') => {
                    self.pos += 1;
                    return;
                }
                Tok::Punct('{') => {
                    self.skip_group();
                    return;
                }
                Tok::Punct('(' | '[') => self.skip_group(),
                Tok::Punct('}') => return, // the end of the enclosing block
                _ => self.pos += 1,
            }
        }
    }

    /// Reads items and code into module `m` until the end of the file, or (`inline`) the `}`
    /// that closes the module.
    fn items(&mut self, m: usize, inline: bool) {
        let mut depth = 0usize;
        let mut attrs: Vec<Vec<Tok>> = Vec::new();
        while let Some(t) = self.peek(0).cloned() {
            match &t {
                Tok::Punct('#') => {
                    let a = self.attribute();
                    attrs.push(a);
                    continue;
                }
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    if depth == 0 {
                        if inline {
                            self.pos += 1;
                            return;
                        }
                    } else {
                        depth -= 1;
                    }
                }
                _ => {}
            }
            let test_only = attrs.iter().any(|a| is_cfg_test(a));
            let path_attr = attrs.iter().find_map(|a| path_attr(a));
            attrs.clear();
            if test_only && !matches!(t, Tok::Punct('{' | '}')) {
                self.skip_item();
                continue;
            }
            if let Tok::Punct('{' | '}') = t {
                self.pos += 1;
                continue;
            }
            // `$crate::…` in macros is not a path of this module.
            if t == Tok::Punct('$') {
                self.pos += 1;
                if self.ident(0).is_some() {
                    self.pos += 1;
                }
                continue;
            }
            let Tok::Ident(word) = t else {
                self.pos += 1;
                continue;
            };
            match word.as_str() {
                "mod" if self.ident(1).is_some() => {
                    let name = self.ident(1).unwrap_or_default().to_string();
                    self.pos += 2;
                    if self.peek(0) == Some(&Tok::Punct('{')) {
                        self.pos += 1;
                        let c = new_module(self.modules, self.file, Some(m));
                        self.modules[m].children.insert(name.clone(), c);
                        let path = self.inline_path(m, &name);
                        self.decls.push((
                            m,
                            path,
                            ModDecl {
                                name,
                                path_attr,
                                inline: Some(c),
                            },
                        ));
                        self.items(c, true);
                    } else {
                        self.pos += 1; // ';'
                        let path = self.inline_path(m, "");
                        self.decls.push((
                            m,
                            path,
                            ModDecl {
                                name,
                                path_attr,
                                inline: None,
                            },
                        ));
                    }
                }
                "use" => {
                    self.pos += 1;
                    self.use_tree(m);
                }
                _ => {
                    let after_sep = self.pos > 0 && self.toks[self.pos - 1] == Tok::PathSep;
                    let path = self.path();
                    if !after_sep && path.len() > 1 {
                        self.modules[m].paths.push(path);
                    }
                }
            }
        }
    }

    /// The names of the inline modules from the file's top module down to `m`, then `last`
    /// when not empty.
    fn inline_path(&self, m: usize, last: &str) -> Vec<String> {
        let mut names = Vec::new();
        let mut cur = m;
        while let Some(p) = self.modules[cur].parent {
            if self.modules[p].file != self.modules[cur].file {
                break;
            }
            if let Some((n, _)) = self.modules[p].children.iter().find(|(_, &c)| c == cur) {
                names.push(n.clone());
            }
            cur = p;
        }
        names.reverse();
        if !last.is_empty() {
            names.push(last.to_string());
        }
        names
    }

    /// `a::b::c` from `pos` (at least one identifier).
    fn path(&mut self) -> Vec<String> {
        let mut segs = Vec::new();
        while let Some(s) = self.ident(0) {
            segs.push(s.to_string());
            self.pos += 1;
            if self.peek(0) == Some(&Tok::PathSep) && self.ident(1).is_some() {
                self.pos += 1;
            } else {
                break;
            }
        }
        segs
    }

    /// A `use` tree up to its `;`, into `m`'s bindings, globs and paths.
    fn use_tree(&mut self, m: usize) {
        if self.peek(0) == Some(&Tok::PathSep) {
            // `use ::extern_crate::…`: never this crate.
            self.skip_item();
            return;
        }
        let mut out = Vec::new();
        self.tree(Vec::new(), &mut out);
        while let Some(t) = self.peek(0) {
            self.pos += 1;
            if *t == Tok::Punct(';') {
                break;
            }
        }
        let module = &mut self.modules[m];
        for (path, kind) in out {
            match kind {
                UseKind::Glob => module.globs.push(path.clone()),
                UseKind::Name(alias) => {
                    let name = if alias.is_empty() {
                        path.last().cloned().unwrap_or_default()
                    } else {
                        alias
                    };
                    // `use a::b::{self}` binds `b`.
                    let path = match path.last().map(String::as_str) {
                        Some("self") if path.len() > 1 => path[..path.len() - 1].to_vec(),
                        _ => path.clone(),
                    };
                    let name = if name == "self" {
                        path.last().cloned().unwrap_or_default()
                    } else {
                        name
                    };
                    if name != "_" {
                        module.bindings.push((name, path.clone()));
                    }
                    module.paths.push(path);
                    continue;
                }
            }
            module.paths.push(path);
        }
    }

    /// One use tree under `prefix`.
    fn tree(&mut self, prefix: Vec<String>, out: &mut Vec<(Vec<String>, UseKind)>) {
        let mut path = prefix;
        loop {
            match self.peek(0) {
                Some(Tok::Ident(s)) => {
                    path.push(s.clone());
                    self.pos += 1;
                    if self.peek(0) == Some(&Tok::PathSep) {
                        self.pos += 1;
                        continue;
                    }
                    let mut alias = String::new();
                    if self.ident(0) == Some("as") {
                        alias = self.ident(1).unwrap_or("_").to_string();
                        self.pos += 2;
                    }
                    out.push((path, UseKind::Name(alias)));
                    return;
                }
                Some(Tok::Punct('*')) => {
                    self.pos += 1;
                    out.push((path, UseKind::Glob));
                    return;
                }
                Some(Tok::Punct('{')) => {
                    self.pos += 1;
                    loop {
                        match self.peek(0) {
                            Some(Tok::Punct('}')) => {
                                self.pos += 1;
                                return;
                            }
                            Some(Tok::Punct(',')) => self.pos += 1,
                            None => return,
                            _ => {
                                let before = self.pos;
                                self.tree(path.clone(), out);
                                if self.pos == before {
                                    self.pos += 1;
                                }
                            }
                        }
                    }
                }
                _ => return,
            }
        }
    }
}

enum UseKind {
    /// Bound under this name (empty: the path's last segment).
    Name(String),
    Glob,
}

/// `cfg(test)` or `cfg(all(test, …))`: the item exists only in test builds.
fn is_cfg_test(attr: &[Tok]) -> bool {
    let words: Vec<&str> = attr
        .iter()
        .filter_map(|t| match t {
            Tok::Ident(s) => Some(s.as_str()),
            _ => None,
        })
        .collect();
    words.first() == Some(&"cfg")
        && words.contains(&"test")
        && !words.contains(&"not")
        && !words.contains(&"any")
}

/// `path = "…"`.
fn path_attr(attr: &[Tok]) -> Option<String> {
    match attr {
        [Tok::Punct('['), Tok::Ident(p), Tok::Punct('='), Tok::Str(s), ..] if p == "path" => {
            Some(s.clone())
        }
        _ => None,
    }
}

/// Resolves paths to the module they name.
struct Resolver<'a> {
    modules: &'a [Module],
}

/// Past this many steps through `use` bindings a path is left unresolved (a loop of globs).
const MAX_HOPS: usize = 24;

impl Resolver<'_> {
    fn root(&self, mut m: usize) -> usize {
        while let Some(p) = self.modules[m].parent {
            m = p;
        }
        m
    }

    /// Whether `a` is `b` or one of the modules `b` sits in.
    fn is_ancestor(&self, a: usize, mut b: usize) -> bool {
        loop {
            if a == b {
                return true;
            }
            match self.modules[b].parent {
                Some(p) => b = p,
                None => return false,
            }
        }
    }

    /// The deepest module of this crate that `path` (as written in module `m`) names: for
    /// `crate::a::b::Item::f`, module `a::b`. `None` for paths outside the crate.
    fn target(&self, m: usize, path: &[String], hops: usize) -> Option<usize> {
        if hops > MAX_HOPS || path.is_empty() {
            return None;
        }
        let mut i = 1;
        let mut cur = match path[0].as_str() {
            "crate" => self.root(m),
            "self" => m,
            "super" => {
                let mut cur = self.modules[m].parent?;
                while path.get(i).map(String::as_str) == Some("super") {
                    cur = self.modules[cur].parent?;
                    i += 1;
                }
                cur
            }
            first => self.lookup(m, first, hops)?,
        };
        for seg in &path[i..] {
            match seg.as_str() {
                "self" => {}
                s => match self.modules[cur].children.get(s) {
                    Some(&c) => cur = c,
                    None => break,
                },
            }
        }
        Some(cur)
    }

    /// The module a glob `use` names, through modules only (a glob's path never goes through
    /// another glob here, so resolving one cannot recurse).
    fn glob_target(&self, m: usize, path: &[String]) -> Option<usize> {
        let mut cur = m;
        for (i, seg) in path.iter().enumerate() {
            cur = match seg.as_str() {
                "crate" if i == 0 => self.root(m),
                "self" => cur,
                "super" => self.modules[cur].parent?,
                s => *self.modules[cur].children.get(s)?,
            };
        }
        Some(cur)
    }

    /// The module `name` leads to in module `m`'s namespace: a child module, or the module a
    /// `use` binding (or a glob's module) names.
    fn lookup(&self, m: usize, name: &str, hops: usize) -> Option<usize> {
        let module = &self.modules[m];
        if let Some(&c) = module.children.get(name) {
            return Some(c);
        }
        if let Some((_, target)) = module.bindings.iter().find(|(n, _)| n == name) {
            return self.target(m, target, hops + 1);
        }
        for g in &module.globs {
            let Some(gm) = self.glob_target(m, g) else {
                continue;
            };
            if gm != m {
                if let Some(c) = self.modules[gm].children.get(name) {
                    return Some(*c);
                }
                if let Some((_, target)) = self.modules[gm].bindings.iter().find(|(n, _)| n == name)
                {
                    return self.target(gm, target, hops + 2);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `files` (path, text) under a fresh temporary crate directory.
    fn tree(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pagoda-tidy-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for (p, text) in files {
            let f = dir.join(p);
            fs::create_dir_all(f.parent().expect("a file has a folder")).expect("temp dir");
            fs::write(&f, text).expect("temp file");
        }
        dir
    }

    fn circles(name: &str, files: &[(&str, &str)]) -> Vec<Circle> {
        let dir = tree(name, files);
        let c = circles_of_crate(&dir).expect("reads");
        let _ = fs::remove_dir_all(&dir);
        c
    }

    fn names(c: &Circle) -> Vec<String> {
        c.files.iter().map(|p| p.display().to_string()).collect()
    }

    #[test]
    fn a_direct_circle_is_found_and_named() {
        let c = circles(
            "direct",
            &[
                ("src/lib.rs", "mod a;\nmod b;\n"),
                ("src/a.rs", "use crate::b::B;\npub struct A;\n"),
                (
                    "src/b.rs",
                    "pub struct B;\nfn f() { let _ = crate::a::A; }\n",
                ),
            ],
        );
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(names(&c[0]), ["src/a.rs", "src/b.rs"]);
        let text = c[0].to_string();
        assert!(text.contains("src/a.rs -> src/b.rs: crate::b::B"), "{text}");
        assert!(text.contains("src/b.rs -> src/a.rs: crate::a::A"), "{text}");
    }

    #[test]
    fn a_loop_through_folders_groups_globs_and_reexports_is_found() {
        // x/y.rs -> z.rs (grouped use) -> w.rs (glob) -> x/mod.rs (`super::x`) -> x/y.rs
        // (`pub use`).
        let c = circles(
            "loop",
            &[
                ("src/lib.rs", "pub mod x;\nmod z;\nmod w;\npub use z::Z;\n"),
                ("src/x/mod.rs", "mod y;\npub use y::g;\n"),
                (
                    "src/x/y.rs",
                    "use crate::{z::Z, x as _};\npub fn g() -> Z { Z }\n",
                ),
                (
                    "src/z.rs",
                    "use crate::w::*;\npub struct Z;\nfn k() { helper() }\n",
                ),
                ("src/w.rs", "pub fn helper() { super::x::g(); }\n"),
            ],
        );
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(
            names(&c[0]),
            ["src/w.rs", "src/x/mod.rs", "src/x/y.rs", "src/z.rs"]
        );
    }

    #[test]
    fn foo_rs_beside_foo_folder_and_path_attributes_are_followed() {
        let c = circles(
            "layout",
            &[
                (
                    "src/main.rs",
                    "mod foo;\n#[path = \"other/b.rs\"]\nmod bar;\n",
                ),
                ("src/foo.rs", "mod inner;\npub fn f() {}\n"),
                ("src/foo/inner.rs", "pub fn g() { crate::bar::h(); }\n"),
                ("src/other/b.rs", "pub fn h() { crate::foo::inner::g(); }\n"),
            ],
        );
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(names(&c[0]), ["src/foo/inner.rs", "src/other/b.rs"]);
    }

    #[test]
    fn test_modules_comments_strings_and_one_way_imports_make_no_circle() {
        let c = circles(
            "clean",
            &[
                (
                    "src/lib.rs",
                    "mod a;\nmod b;\n#[cfg(test)]\nmod tests;\npub use a::A;\npub struct Shared;\n",
                ),
                (
                    "src/a.rs",
                    "use crate::b::B;\nuse crate::Shared;\npub struct A(B, Shared);\n#[cfg(test)]\nmod tests {\n    use crate::b::*;\n}\n",
                ),
                (
                    "src/b.rs",
                    "// crate::a::A\npub struct B;\nconst S: &str = \"crate::a::A\";\n#[cfg(test)]\nfn t() { let _ = crate::a::A(B); }\nmod inline { fn f() { self::g(); } fn g() {} }\n",
                ),
                ("src/tests.rs", "use crate::a::A;\n"),
            ],
        );
        assert!(c.is_empty(), "{c:?}");
    }

    #[test]
    fn a_missing_module_file_is_an_error() {
        let dir = tree("missing", &[("src/lib.rs", "mod gone;\n")]);
        let e = circles_of_crate(&dir).expect_err("no file");
        let _ = fs::remove_dir_all(&dir);
        assert!(e.contains("mod gone"), "{e}");
    }
}
