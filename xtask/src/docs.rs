//! `cargo xtask docs`: builds the book under `docs/` with mdBook into
//! `target/book`, after checking every internal link.
//!
//! mdBook renders a link to a missing page or heading without complaint, so
//! the check is ours: every `[text](target)` of `docs/src/**/*.md` and every
//! link of `README.md` into `docs/` must name a file that exists, and a
//! `#anchor` must be the slug of a heading of that file (GitHub's and
//! mdBook's rule: lowercase, spaces to `-`, other punctuation than `-` and
//! `_` dropped). A broken link fails the command and is named with its page
//! and line.
//!
//! mdBook itself is a crate from crates.io, installed once with `cargo
//! install` into `~/.cache/cluster-api-provider-libvirt/mdbook-<version>/`
//! and reused from there.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};
use xshell::{Shell, cmd};

use crate::{repo_root, step, target_dir};

/// The mdBook release the book is built with.
const MDBOOK_VERSION: &str = "0.5.4";

/// Checks the links, installs mdBook if needed and builds the book into
/// `target/book`. `cargo xtask docs` runs this, and so does `cargo xtask test`.
pub fn build() -> Result<()> {
    let root = repo_root();
    step("check the book's internal links", || check_links(&root))?;
    let mdbook = step("mdBook", ensure_mdbook)?;
    let out = target_dir().join("book");
    let docs = root.join("docs");
    step("build the book", || {
        let sh = Shell::new()?;
        cmd!(sh, "{mdbook} build {docs} --dest-dir {out}").run()?;
        Ok(())
    })?;
    eprintln!("book: {}", out.join("index.html").display());
    Ok(())
}

/// The mdBook binary: the cached one, else `cargo install` into the cache.
fn ensure_mdbook() -> Result<PathBuf> {
    let install_root = crate::paths::user_cache(&format!("mdbook-{MDBOOK_VERSION}"), "mdBook")?;
    let binary = install_root.join("bin/mdbook");
    if binary.is_file() {
        return Ok(binary);
    }
    let sh = Shell::new()?;
    // Built in a target directory of its own, so the repository's lock file
    // and target stay out of it; unoptimized (`--debug`): it compiles in much
    // less time, which on a new machine is most of what the book step costs.
    let build_dir = install_root.join("build");
    cmd!(
        sh,
        "cargo install mdbook --locked --debug --version {MDBOOK_VERSION} --no-default-features --features search --root {install_root} --target-dir {build_dir}"
    )
    .run()
    .context("installing mdBook with cargo install")?;
    // The build directory is only needed once.
    let _ = std::fs::remove_dir_all(&build_dir);
    if !binary.is_file() {
        bail!("cargo install finished but {} does not exist", binary.display());
    }
    Ok(binary)
}

/// A link that points nowhere: where it is and why.
#[derive(Debug, PartialEq, Eq)]
pub struct BrokenLink {
    pub page: PathBuf,
    pub line: usize,
    pub target: String,
    pub reason: String,
}

impl std::fmt::Display for BrokenLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: ({}) {}", self.page.display(), self.line, self.target, self.reason)
    }
}

/// Checks the book's pages and README.md's links into `docs/`; fails naming
/// every broken link.
pub fn check_links(root: &Path) -> Result<()> {
    let src = root.join("docs/src");
    let mut pages = Vec::new();
    markdown_files(&src, &mut pages)?;
    if pages.is_empty() {
        bail!("no pages under {}", src.display());
    }
    let mut broken = Vec::new();
    for page in &pages {
        broken.extend(broken_links(page, |_| true)?);
    }
    let docs = root.join("docs");
    broken.extend(broken_links(&root.join("README.md"), |target| target.starts_with(&docs))?);
    if broken.is_empty() {
        eprintln!("links: {} pages and README.md checked, none broken", pages.len());
        return Ok(());
    }
    let list: Vec<String> = broken.iter().map(|b| format!("  {b}")).collect();
    bail!("{} broken link(s):\n{}", broken.len(), list.join("\n"))
}

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for entry in entries {
        let path = entry?.path();
        if path.is_dir() {
            markdown_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
    out.sort();
    Ok(())
}

/// The broken internal links of one page; `checked` says which resolved
/// files to check (README.md checks only its links into `docs/`).
pub fn broken_links(page: &Path, checked: impl Fn(&Path) -> bool) -> Result<Vec<BrokenLink>> {
    let text = std::fs::read_to_string(page).with_context(|| format!("reading {}", page.display()))?;
    let dir = page.parent().unwrap_or(Path::new("."));
    let mut broken = Vec::new();
    for (line, target) in links(&text) {
        if is_external(&target) {
            continue;
        }
        let (file, anchor) = match target.split_once('#') {
            Some((file, anchor)) => (file, Some(anchor)),
            None => (target.as_str(), None),
        };
        let resolved = if file.is_empty() { page.to_path_buf() } else { normalize(&dir.join(file)) };
        if !checked(&resolved) {
            continue;
        }
        let mut report =
            |reason: String| broken.push(BrokenLink { page: page.to_path_buf(), line, target: target.clone(), reason });
        if !resolved.exists() {
            report(format!("{} does not exist", resolved.display()));
            continue;
        }
        let Some(anchor) = anchor.filter(|a| !a.is_empty()) else { continue };
        if resolved.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let target_text = std::fs::read_to_string(&resolved)?;
        if !heading_slugs(&target_text).contains(anchor) {
            report(format!("no heading of {} has the anchor #{anchor}", resolved.display()));
        }
    }
    Ok(broken)
}

fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The inline links `[text](target)` of a Markdown text, with their line
/// numbers, outside fenced code blocks and inline code. A target's title
/// (`(page.md "title")`) is dropped.
pub fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let line = without_inline_code(line);
        let mut rest = line.as_str();
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("").trim_matches(['<', '>']);
            if !target.is_empty() {
                out.push((index + 1, target.to_string()));
            }
            rest = &after[end..];
        }
    }
    out
}

fn without_inline_code(line: &str) -> String {
    line.split('`').enumerate().filter(|(i, _)| i % 2 == 0).map(|(_, part)| part).collect::<Vec<_>>().join(" ")
}

/// The anchors the headings of a Markdown text get, with `-1`, `-2` ... for
/// repeated ones, as mdBook numbers them.
pub fn heading_slugs(text: &str) -> BTreeSet<String> {
    let mut slugs = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = slug(heading);
        let mut candidate = base.clone();
        let mut n = 0;
        while slugs.contains(&candidate) {
            n += 1;
            candidate = format!("{base}-{n}");
        }
        slugs.insert(candidate);
    }
    slugs
}

/// A heading's anchor: lowercase, spaces to `-`, punctuation other than `-`
/// and `_` dropped (inline code's backticks too).
pub fn slug(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_follow_github_and_mdbook() {
        assert_eq!(slug(" Addresses from IPAM, on a bridged network"), "addresses-from-ipam-on-a-bridged-network");
        assert_eq!(slug("Moving clusters with `clusterctl move`"), "moving-clusters-with-clusterctl-move");
        assert_eq!(slug("Names and identity_2"), "names-and-identity_2");
        let slugs = heading_slugs("# A\n## A\n```\n# not a heading\n```\n#nospace\n");
        assert_eq!(slugs, BTreeSet::from(["a".to_string(), "a-1".to_string()]));
    }

    #[test]
    fn links_skip_code_and_titles() {
        let text = "see [a](a.md#x) and `[b](b.md)`\n```\n[c](c.md)\n```\n[d](d.md \"title\") [e](https://e)\n";
        let found: Vec<String> = links(text).into_iter().map(|(_, t)| t).collect();
        assert_eq!(found, ["a.md#x", "d.md", "https://e"]);
    }

    #[test]
    fn a_broken_link_is_named_and_a_good_one_passes() {
        let dir = std::env::temp_dir().join(format!("capl-docs-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("src/sub")).unwrap();
        std::fs::write(dir.join("src/sub/target.md"), "# Target page\n## A section, here\n").unwrap();
        std::fs::write(
            dir.join("src/page.md"),
            "# Page\n[ok](sub/target.md#a-section-here) [self](#page)\n\
             [missing file](sub/nope.md)\n[missing anchor](sub/target.md#nope)\n",
        )
        .unwrap();
        let broken = broken_links(&dir.join("src/page.md"), |_| true).unwrap();
        let named: Vec<(usize, &str)> = broken.iter().map(|b| (b.line, b.target.as_str())).collect();
        assert_eq!(named, [(3, "sub/nope.md"), (4, "sub/target.md#nope")]);
        assert!(broken[1].reason.contains("#nope"), "{}", broken[1]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The committed book has no broken link (what `cargo xtask docs` checks
    /// first).
    #[test]
    fn the_book_has_no_broken_link() {
        check_links(&repo_root()).unwrap();
    }
}
