//! The structure every crate of the workspace keeps: no `#[path]` attribute
//! (a file belongs to the one module its place in the tree says), and no
//! circle of imports between the files of one crate.

mod modules;
mod source;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use modules::{Crate, arrows, circles};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace root").to_path_buf()
}

/// The `members` of the workspace's Cargo.toml.
fn members(root: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("read the workspace Cargo.toml");
    let line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("the workspace Cargo.toml lists its members on one line");
    line.split('"').skip(1).step_by(2).map(str::to_string).collect()
}

/// Every .rs file under `dir` (by path relative to it) with its content,
/// leaving out `target` folders and the folders of `nested` member crates.
fn rust_files(dir: &Path, nested: &[PathBuf]) -> BTreeMap<PathBuf, String> {
    let mut found = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display())) {
            let path = entry.expect("a directory entry").path();
            let name = path.file_name().unwrap_or_default().to_string_lossy().to_string();
            if path.is_dir() {
                if name != "target" && !name.starts_with('.') && !nested.contains(&path) {
                    todo.push(path);
                }
            } else if name.ends_with(".rs") {
                let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
                found.insert(path.strip_prefix(dir).expect("under dir").to_path_buf(), text);
            }
        }
    }
    found
}

/// The crate roots of a package: its library, binaries, tests, examples,
/// benchmarks and build script, where Cargo finds them by default.
fn roots(files: &BTreeMap<PathBuf, String>) -> Vec<PathBuf> {
    files
        .keys()
        .filter(|p| {
            let parts: Vec<&str> = p.iter().map(|c| c.to_str().unwrap_or("")).collect();
            match parts.as_slice() {
                ["build.rs"] | ["src", "lib.rs" | "main.rs"] => true,
                ["src", "bin", _] | ["tests" | "examples" | "benches", _] => p.extension().is_some_and(|e| e == "rs"),
                ["src", "bin", _, "main.rs"] | ["tests" | "examples" | "benches", _, "main.rs"] => true,
                _ => false,
            }
        })
        .cloned()
        .collect()
}

/// Files with a `#[path]` attribute (outside comments and strings).
fn path_attributes(files: &BTreeMap<PathBuf, String>) -> Vec<String> {
    files
        .iter()
        .filter(|(_, text)| {
            let t = source::tokens(text);
            t.windows(3).any(|w| w[0] == "#" && w[1] == "[" && w[2] == "path")
                || t.windows(4).any(|w| w[0] == "#" && w[1] == "!" && w[2] == "[" && w[3] == "path")
        })
        .map(|(p, _)| format!("#[path] in {}", p.display()))
        .collect()
}

/// What is wrong with the structure of the package in `dir`, one entry each.
fn findings(dir: &Path, nested: &[PathBuf]) -> Vec<String> {
    let files = rust_files(dir, nested);
    let mut found = path_attributes(&files);
    let mut all = modules::Arrows::new();
    for root in roots(&files) {
        all.extend(arrows(&Crate { root, files: &files }));
    }
    found.extend(circles(&all));
    found
}

#[test]
fn no_crate_has_a_path_attribute_or_a_circle_of_imports() {
    let root = workspace_root();
    let members = members(&root);
    assert!(members.len() > 3, "the workspace members: {members:?}");
    let dirs: Vec<PathBuf> = members.iter().map(|m| root.join(m)).collect();
    let mut report = Vec::new();
    for (member, dir) in members.iter().zip(&dirs) {
        let nested: Vec<PathBuf> = dirs.iter().filter(|d| *d != dir && d.starts_with(dir)).cloned().collect();
        let found = findings(dir, &nested);
        if !found.is_empty() {
            report.push(format!("{member}:\n{}", found.join("\n")));
        }
    }
    assert!(
        report.is_empty(),
        "the files of a crate import each other in a circle, or use #[path]:\n{}",
        report.join("\n\n")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(list: &[(&str, &str)]) -> BTreeMap<PathBuf, String> {
        list.iter().map(|(p, s)| (PathBuf::from(p), s.to_string())).collect()
    }

    #[test]
    fn a_path_attribute_is_found_but_not_in_a_comment_or_a_string() {
        let files = of(&[
            ("src/lib.rs", "#[path = \"other.rs\"]\nmod x;"),
            ("src/inner.rs", "#![path = \"x\"]"),
            ("src/said.rs", "// #[path = \"x\"]\nconst S: &str = \"#[path]\";"),
        ]);
        assert_eq!(path_attributes(&files), ["#[path] in src/inner.rs", "#[path] in src/lib.rs"]);
    }

    #[test]
    fn every_target_of_a_package_is_a_root() {
        let files = of(&[
            ("build.rs", ""),
            ("src/lib.rs", ""),
            ("src/main.rs", ""),
            ("src/a.rs", ""),
            ("src/bin/tool.rs", ""),
            ("src/bin/big/main.rs", ""),
            ("src/bin/big/part.rs", ""),
            ("tests/one.rs", ""),
            ("tests/two/main.rs", ""),
            ("tests/two/support.rs", ""),
            ("examples/demo.rs", ""),
        ]);
        let found: Vec<String> = roots(&files).iter().map(|p| p.display().to_string()).collect();
        assert_eq!(
            found,
            [
                "build.rs",
                "examples/demo.rs",
                "src/bin/big/main.rs",
                "src/bin/tool.rs",
                "src/lib.rs",
                "src/main.rs",
                "tests/one.rs",
                "tests/two/main.rs"
            ]
        );
    }

    #[test]
    fn the_members_are_read_from_the_workspace_manifest() {
        let members = members(&workspace_root());
        assert!(members.contains(&"provider".to_string()) && members.contains(&"xtask".to_string()), "{members:?}");
    }
}
