//! Which source files of a crate import which: the module tree from the
//! `mod x;` declarations (a declaration alone is not an import), then every
//! `use` and every path in code that starts with `crate::`, `super::`,
//! `self::` or a child module's name, resolved to the file that defines the
//! item it names. And the circles in that graph.
//!
//! A `pub use` passes a name on: it draws no arrow, and a path to the name
//! is followed to the file the name comes from (a `mod.rs` or crate root
//! that only wires is no part of a circle). The unit tests of a file
//! (`#[cfg(test)]`) draw no arrow: they use what they test from anywhere in
//! the crate, as an integration test does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::source::tokens;

/// A module path from the crate root: `["controller", "context"]`.
type ModulePath = Vec<String>;

/// What one file says about modules.
#[derive(Debug, Default)]
struct Scan {
    /// `mod name;` declarations: the inline modules they are in, the name,
    /// and whether it is `#[cfg(test)]`.
    declared: Vec<(ModulePath, String, bool)>,
    /// Inline modules (`mod tests { … }`), as paths from the file's module.
    inline: Vec<ModulePath>,
    paths: Vec<PathUse>,
}

/// A path in a `use` or in code.
#[derive(Debug)]
struct PathUse {
    /// The inline modules it is in.
    inline: ModulePath,
    /// As written: `["super", "context", "Context"]`.
    path: Vec<String>,
    /// For a `use`, the name it brings in.
    brings: Option<String>,
    /// A `pub use` of a name the file does not use itself: it passes the
    /// name on (wiring), and draws no arrow itself.
    re_export: bool,
    /// In a `#[cfg(test)]` module: the unit tests of a file use what they
    /// test from anywhere in the crate, as an integration test would.
    test: bool,
}

/// Where the item whose keyword (`mod`, `use`) is at `i` starts: before
/// its visibility (`pub`, `pub(crate)`, `pub(in …)`), if it has one.
fn item_start(t: &[String], mut i: usize) -> usize {
    if i > 0 && t[i - 1] == ")" {
        while i > 0 && t[i - 1] != "(" {
            i -= 1;
        }
        i = i.saturating_sub(1);
    }
    if i > 0 && t[i - 1] == "pub" { i - 1 } else { i }
}

/// Whether the item whose keyword is at `i` has a visibility: a `pub use` passes a name on.
fn is_pub(t: &[String], i: usize) -> bool {
    item_start(t, i) < i
}

/// Whether the item whose keyword is at `i` has `#[cfg(test)]` right before it.
fn is_cfg_test(t: &[String], i: usize) -> bool {
    let start = item_start(t, i);
    start >= 7 && t[start - 7..start].concat() == "#[cfg(test)]"
}

fn is_ident(token: &str) -> bool {
    token.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
}

fn scan(source: &str) -> Scan {
    let t = tokens(source);
    let at = |i: usize| t.get(i).map(String::as_str).unwrap_or("");
    let mut scan = Scan::default();
    // The inline modules we are in, each with the brace depth inside it and whether it is a test module.
    let mut inline: Vec<(String, usize, bool)> = Vec::new();
    let here =
        |inline: &Vec<(String, usize, bool)>| inline.iter().map(|(name, ..)| name.clone()).collect::<ModulePath>();
    let in_test = |inline: &Vec<(String, usize, bool)>| inline.iter().any(|(.., test)| *test);
    // The names used outside `use` items, so that a `pub use` of a name the file uses itself counts.
    let mut used = BTreeSet::new();
    let mut depth = 0;
    let mut i = 0;
    while i < t.len() {
        match at(i) {
            "mod" if is_ident(at(i + 1)) && at(i + 2) == ";" => {
                scan.declared.push((here(&inline), at(i + 1).to_string(), in_test(&inline) || is_cfg_test(&t, i)));
                i += 3;
            }
            "mod" if is_ident(at(i + 1)) && at(i + 2) == "{" => {
                depth += 1;
                inline.push((at(i + 1).to_string(), depth, is_cfg_test(&t, i)));
                scan.inline.push(here(&inline));
                i += 3;
            }
            "{" => {
                depth += 1;
                i += 1;
            }
            "}" => {
                if inline.last().is_some_and(|(_, d, _)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            "use" => {
                let re_export = is_pub(&t, i);
                i += 1;
                let mut found = Vec::new();
                use_tree(&t, &mut i, Vec::new(), &mut found);
                scan.paths.extend(found.into_iter().map(|(path, name)| PathUse {
                    inline: here(&inline),
                    path,
                    brings: Some(name),
                    re_export,
                    test: in_test(&inline),
                }));
            }
            // A path in code; `pub(in crate::x)` is a visibility, not a use.
            word if is_ident(word)
                && at(i + 1) == "::"
                && at(i.wrapping_sub(1)) != "::"
                && at(i.wrapping_sub(1)) != "in" =>
            {
                let mut path = vec![word.to_string()];
                i += 1;
                while at(i) == "::" && is_ident(at(i + 1)) {
                    path.push(at(i + 1).to_string());
                    i += 2;
                }
                used.extend(path.iter().cloned());
                scan.paths.push(PathUse {
                    inline: here(&inline),
                    path,
                    brings: None,
                    re_export: false,
                    test: in_test(&inline),
                });
            }
            word => {
                if is_ident(word) {
                    used.insert(word.to_string());
                }
                i += 1;
            }
        }
    }
    for u in &mut scan.paths {
        if u.brings.as_ref().is_some_and(|name| used.contains(name)) {
            u.re_export = false;
        }
    }
    scan
}

/// The paths of the use tree at `i` (after `use`), each with `prefix` in
/// front, and the name each brings in (its last part, or what follows `as`).
fn use_tree(t: &[String], i: &mut usize, prefix: Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
    let at = |i: usize| t.get(i).map(String::as_str).unwrap_or("");
    let mut path = prefix;
    loop {
        match at(*i) {
            "::" => *i += 1,
            "{" => {
                *i += 1;
                while !matches!(at(*i), "}" | "") {
                    use_tree(t, i, path.clone(), out);
                    if at(*i) == "," {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            "*" => {
                *i += 1;
                path.push("*".to_string());
                out.push((path, "*".to_string()));
                return;
            }
            word if is_ident(word) => {
                *i += 1;
                // `{self, …}`: the module itself.
                if word != "self" || path.is_empty() {
                    path.push(word.to_string());
                }
                if at(*i) == "::" {
                    continue;
                }
                let mut name = path.last().cloned().unwrap_or_default();
                if at(*i) == "as" {
                    name = at(*i + 1).to_string();
                    *i += 2;
                }
                out.push((path, name));
                return;
            }
            _ => return,
        }
    }
}

/// The source files of one crate (one target: a library, a binary, a test),
/// by path, and the crate root among them.
pub struct Crate<'a> {
    pub root: PathBuf,
    pub files: &'a BTreeMap<PathBuf, String>,
}

/// Per module, the names its `use`s bring in and the absolute paths they
/// stand for (None: a path into another crate).
type Imported = BTreeMap<ModulePath, BTreeMap<String, Option<Vec<String>>>>;

/// An arrow: `from` imports `names` from `to`.
pub type Arrows = BTreeMap<(PathBuf, PathBuf), BTreeSet<String>>;

/// Whether the modules `file` declares are files beside it (a crate root, a
/// `mod.rs`) rather than in a folder of its name.
fn children_beside(file: &Path, root: &Path) -> bool {
    file == root || file.file_name().is_some_and(|n| n == "mod.rs")
}

/// The arrows between the files of `krate`.
pub fn arrows(krate: &Crate) -> Arrows {
    // The module tree: every module, and the file it is written in.
    let mut modules: BTreeMap<ModulePath, PathBuf> = BTreeMap::new();
    let mut scans: Vec<(PathBuf, ModulePath, Scan)> = Vec::new();
    let mut pending = vec![(krate.root.clone(), ModulePath::new(), false)];
    while let Some((file, module, test)) = pending.pop() {
        let Some(source) = krate.files.get(&file) else { continue };
        let mut s = scan(source);
        if test {
            s.paths.iter_mut().for_each(|p| p.test = true);
        }
        modules.insert(module.clone(), file.clone());
        for inline in &s.inline {
            modules.insert([module.clone(), inline.clone()].concat(), file.clone());
        }
        let folder = if children_beside(&file, &krate.root) {
            file.parent().unwrap_or(Path::new("")).to_path_buf()
        } else {
            file.with_extension("")
        };
        for (inline, name, test_only) in &s.declared {
            let dir = inline.iter().fold(folder.clone(), |d, m| d.join(m));
            let beside = dir.join(format!("{name}.rs"));
            let child = if krate.files.contains_key(&beside) { beside } else { dir.join(name).join("mod.rs") };
            pending.push((child, [module.clone(), inline.clone(), vec![name.clone()]].concat(), test || *test_only));
        }
        scans.push((file, module, s));
    }
    // The names each module brings in with `use`, and the paths they stand
    // for (None: from another crate).
    let mut imported: Imported = BTreeMap::new();
    for (_, module, s) in &scans {
        for u in s.paths.iter().filter(|u| !u.test) {
            let here = [module.clone(), u.inline.clone()].concat();
            if let Some(name) = &u.brings {
                let full = absolute(&here, &u.path, &modules);
                imported.entry(here).or_default().insert(name.clone(), full);
            }
        }
    }
    let mut arrows = Arrows::new();
    for (file, module, s) in &scans {
        for u in s.paths.iter().filter(|u| !u.test && !u.re_export) {
            let here = [module.clone(), u.inline.clone()].concat();
            let Some(full) = absolute(&here, &u.path, &modules) else { continue };
            let Some((to, name)) = defined_in(full, &modules, &imported) else { continue };
            if to != *file {
                arrows.entry((file.clone(), to)).or_default().insert(name);
            }
        }
    }
    arrows
}

/// The file that defines what the absolute path `full` names, and the name:
/// the longest start of the path that is a module, the rest an item in it.
/// An item that module only brings in with `use` (a re-export) is followed
/// to where it comes from.
fn defined_in(
    mut full: Vec<String>,
    modules: &BTreeMap<ModulePath, PathBuf>,
    imported: &Imported,
) -> Option<(PathBuf, String)> {
    for _ in 0..8 {
        let n = (0..=full.len()).rev().find(|n| modules.contains_key(&full[..*n]))?;
        let via = full.get(n).and_then(|name| imported.get(&full[..n])?.get(name));
        match via {
            // Brought in from another crate: no file of this one.
            Some(None) => return None,
            Some(Some(source)) if *source != full[..=n] => full = [source.clone(), full[n + 1..].to_vec()].concat(),
            _ => {
                let name = full.get(n).or(full.last()).cloned().unwrap_or_else(|| "crate".to_string());
                return Some((modules[&full[..n]].clone(), name));
            }
        }
    }
    None
}

/// `path`, used in module `here`, from the crate root; None when it names
/// no module of this crate (another crate, a local item, an enum's variant).
fn absolute(here: &[String], path: &[String], modules: &BTreeMap<ModulePath, PathBuf>) -> Option<Vec<String>> {
    let mut base: Vec<String> = here.to_vec();
    let mut rest = path;
    match path.first()?.as_str() {
        "crate" => {
            base.clear();
            rest = &path[1..];
        }
        "self" => rest = &path[1..],
        "super" => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        first => {
            if !modules.contains_key(&[here.to_vec(), vec![first.to_string()]].concat()) {
                return None;
            }
        }
    }
    Some([base, rest.to_vec()].concat())
}

/// The circles of `arrows`: each group of files that reach each other, as one
/// way round it, then every arrow inside the group with the names it takes.
pub fn circles(arrows: &Arrows) -> Vec<String> {
    let mut next: BTreeMap<&Path, Vec<&Path>> = BTreeMap::new();
    for (from, to) in arrows.keys() {
        next.entry(from.as_path()).or_default().push(to.as_path());
    }
    let reach = |start: &Path| -> BTreeSet<&Path> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![start];
        while let Some(f) = todo.pop() {
            for &t in next.get(f).into_iter().flatten() {
                if seen.insert(t) {
                    todo.push(t);
                }
            }
        }
        seen
    };
    let files: BTreeSet<&Path> = arrows.keys().flat_map(|(a, b)| [a.as_path(), b.as_path()]).collect();
    let reached: BTreeMap<&Path, BTreeSet<&Path>> = files.iter().map(|&f| (f, reach(f))).collect();
    let mut done: BTreeSet<&Path> = BTreeSet::new();
    let mut out = Vec::new();
    for &f in &files {
        if done.contains(f) || !reached[f].contains(f) {
            continue;
        }
        let group: BTreeSet<&Path> = reached[f].iter().copied().filter(|g| reached[g].contains(f)).collect();
        done.extend(group.iter().copied());
        let mut text = format!("circle: {}", way_round(f, &group, &next));
        for ((from, to), names) in arrows {
            if group.contains(from.as_path()) && group.contains(to.as_path()) {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                text += &format!("\n  {} -> {}: {}", from.display(), to.display(), names.join(", "));
            }
        }
        out.push(text);
    }
    out
}

/// The shortest way from `start` back to itself inside `group`: "a -> b -> a".
fn way_round(start: &Path, group: &BTreeSet<&Path>, next: &BTreeMap<&Path, Vec<&Path>>) -> String {
    let mut came_from: BTreeMap<&Path, &Path> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    'search: while let Some(f) = queue.pop_front() {
        for &t in next.get(f).into_iter().flatten() {
            if !group.contains(t) || came_from.contains_key(t) {
                continue;
            }
            came_from.insert(t, f);
            if t == start {
                break 'search;
            }
            queue.push_back(t);
        }
    }
    let mut way = vec![start];
    let mut at = came_from[start];
    while at != start {
        way.push(at);
        at = came_from[at];
    }
    way.push(start);
    way.reverse();
    way.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" -> ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &str)]) -> BTreeMap<PathBuf, String> {
        list.iter().map(|(p, s)| (PathBuf::from(p), s.to_string())).collect()
    }

    fn circles_of(list: &[(&str, &str)]) -> Vec<String> {
        let files = files(list);
        circles(&arrows(&Crate { root: "src/lib.rs".into(), files: &files }))
    }

    #[test]
    fn two_files_that_import_each_other_are_a_circle_with_the_names_that_tie_it() {
        let found = circles_of(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a.rs", "use crate::b::{Thing, other};\npub struct A;"),
            ("src/b.rs", "pub fn other() -> super::a::A { crate::a::A }\npub struct Thing;"),
        ]);
        assert_eq!(
            found,
            [
                "circle: src/a.rs -> src/b.rs -> src/a.rs\n  src/a.rs -> src/b.rs: Thing, other\n  src/b.rs -> src/a.rs: A"
            ]
        );
    }

    #[test]
    fn a_longer_circle_through_folders_and_mod_rs_is_found() {
        let found = circles_of(&[
            ("src/lib.rs", "pub mod x;\nmod c;"),
            ("src/x/mod.rs", "mod a;\npub mod b;"),
            ("src/x/a.rs", "use super::b::B;"),
            ("src/x/b.rs", "pub struct B(crate::c::C);"),
            ("src/c.rs", "use crate::x::a;\npub struct C;"),
        ]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("circle: src/c.rs -> src/x/a.rs -> src/x/b.rs -> src/c.rs"), "{}", found[0]);
    }

    #[test]
    fn mod_declarations_alone_and_a_parent_used_by_its_tests_are_no_circle() {
        let found = circles_of(&[
            ("src/lib.rs", "pub mod a;\npub mod b;\npub use a::A;\nfn f() -> b::B { b::B }"),
            ("src/a.rs", "pub struct A;\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::b::B;\n}"),
            ("src/b.rs", "pub struct B;\nmod tests { use super::B; fn t() { let _ = self::B; } }"),
        ]);
        assert_eq!(found, Vec::<String>::new());
    }

    #[test]
    fn a_re_export_is_followed_to_the_file_that_defines_the_name() {
        let found = circles_of(&[
            ("src/lib.rs", "mod a;\nmod b;\npub use a::Context;\nuse b::Error as Failure;"),
            ("src/a.rs", "pub struct Context;\nfn go() -> crate::Failure { todo!() }"),
            ("src/b.rs", "use crate::Context;\npub struct Error;"),
        ]);
        assert_eq!(
            found,
            [
                "circle: src/a.rs -> src/b.rs -> src/a.rs\n  src/a.rs -> src/b.rs: Error\n  src/b.rs -> src/a.rs: Context"
            ]
        );
    }

    #[test]
    fn a_child_using_what_its_parent_defines_is_a_circle() {
        let found = circles_of(&[
            ("src/lib.rs", "mod a;\nuse a::Context;\npub fn run() -> Context { Context }"),
            ("src/a.rs", "pub struct Context;\nfn go() { super::run() }"),
        ]);
        assert_eq!(
            found,
            [
                "circle: src/a.rs -> src/lib.rs -> src/a.rs\n  src/a.rs -> src/lib.rs: run\n  src/lib.rs -> src/a.rs: Context"
            ]
        );
    }

    #[test]
    fn re_exports_and_unit_tests_draw_no_arrow_and_other_crates_are_followed_out() {
        let found = circles_of(&[
            ("src/lib.rs", "mod a;\nmod b;\npub use a::A;\npub(crate) use b::B;\npub use other::Thing;\n"),
            ("src/a.rs", "pub struct A;\nfn f(_: crate::Thing) {}\n#[cfg(test)]\nmod tests {\n    use crate::b::B;\n}"),
            ("src/b.rs", "pub struct B;\nfn g(_: crate::A) {}\n#[cfg(test)]\nmod tests;"),
            ("src/b/tests.rs", "use crate::a::*;"),
        ]);
        assert_eq!(found, Vec::<String>::new());
        let files = files(&[
            ("src/lib.rs", "mod a;\nmod b;"),
            ("src/a.rs", "pub use crate::b::B;\npub struct A;"),
            ("src/b.rs", "use crate::a::A;\npub struct B;"),
        ]);
        let found = arrows(&Crate { root: "src/lib.rs".into(), files: &files });
        let pairs: Vec<_> = found.keys().map(|(a, b)| format!("{} -> {}", a.display(), b.display())).collect();
        assert_eq!(pairs, ["src/b.rs -> src/a.rs"]);
        // A name passed on that the file also uses is an import of it.
        let found = circles_of(&[
            ("src/lib.rs", "mod a;\nmod b;"),
            ("src/a.rs", "pub use crate::b::B;\npub struct A(B);"),
            ("src/b.rs", "use crate::a::A;\npub struct B;"),
        ]);
        assert_eq!(
            found,
            ["circle: src/a.rs -> src/b.rs -> src/a.rs\n  src/a.rs -> src/b.rs: B\n  src/b.rs -> src/a.rs: A"]
        );
    }

    #[test]
    fn paths_in_comments_strings_and_other_crates_are_no_arrows() {
        let files = files(&[
            ("src/lib.rs", "mod a;\nmod b;"),
            ("src/a.rs", "// use crate::b;\nconst S: &str = \"crate::b::X\";\nuse other_crate::b::X;\nuse std::fmt;"),
            ("src/b.rs", "use crate::a as _;"),
        ]);
        let found = arrows(&Crate { root: "src/lib.rs".into(), files: &files });
        let pairs: Vec<_> = found.keys().map(|(a, b)| format!("{} -> {}", a.display(), b.display())).collect();
        assert_eq!(pairs, ["src/b.rs -> src/a.rs"]);
    }
}
