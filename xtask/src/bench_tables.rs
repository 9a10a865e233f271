//! `cargo xtask bench-tables`: the book's performance page shows one table
//! per benchmark, the latest. Each benchmark writes its printed table into
//! `target/bench/<name>.json` (`{"table": {"title", "rows"}}`); this replaces
//! the block between `<!-- bench: <name> -->` and `<!-- /bench: <name> -->` in
//! `docs/src/performance.md` with it. A benchmark without a JSON file keeps
//! its table; nothing is ever appended. `cargo xtask bench` runs this after a
//! successful run.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{repo_root, target_dir};

/// The benchmarks, in the order the page shows them.
pub const BENCHMARKS: &[&str] = &["ratios", "scale", "steady", "floor", "overhead", "contention", "faults"];

/// The page that holds the tables, relative to the repository root.
pub const PAGE: &str = "docs/src/performance.md";

pub fn write() -> Result<()> {
    let page = repo_root().join(PAGE);
    let mut text = std::fs::read_to_string(&page).with_context(|| format!("reading {}", page.display()))?;
    let dir = target_dir().join("bench");
    let mut replaced = Vec::new();
    for name in BENCHMARKS {
        let path = dir.join(format!("{name}.json"));
        if !path.is_file() {
            continue;
        }
        let json: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)
            .with_context(|| format!("parsing {}", path.display()))?;
        text = replace_block(&text, name, &render(&json, &path)?)?;
        replaced.push(*name);
    }
    if replaced.is_empty() {
        bail!("no benchmark results in {}: run `cargo xtask bench` first", dir.display());
    }
    std::fs::write(&page, text).with_context(|| format!("writing {}", page.display()))?;
    eprintln!("{PAGE}: replaced the tables of {}", replaced.join(", "));
    Ok(())
}

/// The Markdown table of one benchmark's JSON.
pub fn render(json: &Value, path: &Path) -> Result<String> {
    let table = json.get("table").with_context(|| {
        format!("{} has no \"table\": written by an older runner; run the benchmark again", path.display())
    })?;
    let title = table["title"].as_str().unwrap_or_default();
    let rows = table["rows"].as_array().with_context(|| format!("{}: table.rows is not a list", path.display()))?;
    let cell = |v: &Value| v.as_str().unwrap_or_default().replace('|', "\\|");
    let mut out = format!("| {} | |\n|---|---|\n", title.replace('|', "\\|"));
    for row in rows {
        out.push_str(&format!("| {} | {} |\n", cell(&row[0]), cell(&row[1])));
    }
    Ok(out)
}

/// `text` with the block of benchmark `name` replaced by `table`.
pub fn replace_block(text: &str, name: &str, table: &str) -> Result<String> {
    replace_marked(text, PAGE, "bench", name, table)
}

/// The text of `page` with the block between `<!-- <tag>: <name> -->` and
/// `<!-- /<tag>: <name> -->` replaced by `table`.
pub fn replace_marked(text: &str, page: &str, tag: &str, name: &str, table: &str) -> Result<String> {
    let (start, end) = (format!("<!-- {tag}: {name} -->\n"), format!("<!-- /{tag}: {name} -->"));
    let Some(from) = text.find(&start).map(|i| i + start.len()) else {
        bail!("{page} has no `{}` marker", start.trim());
    };
    let Some(to) = text[from..].find(&end).map(|i| i + from) else {
        bail!("{page} has no `{end}` marker after `{}`", start.trim());
    };
    Ok(format!("{}{table}{}", &text[..from], &text[to..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_replaces_its_table_and_leaves_the_others() {
        let page = "# P\n<!-- bench: scale -->\n| old | |\n<!-- /bench: scale -->\n\
                    <!-- bench: floor -->\n| floor | |\n<!-- /bench: floor -->\n";
        let json = serde_json::json!({"table": {"title": "scale: 3 machines", "rows": [["a|b", "1"], ["c", "2"]]}});
        let table = render(&json, Path::new("scale.json")).unwrap();
        let once = replace_block(page, "scale", &table).unwrap();
        let twice = replace_block(&once, "scale", &table).unwrap();
        assert_eq!(once, twice, "replaced, never appended");
        assert!(once.contains("| scale: 3 machines | |\n|---|---|\n| a\\|b | 1 |\n| c | 2 |\n<!-- /bench: scale -->"));
        assert!(!once.contains("| old |") && once.contains("| floor | |"));
        assert!(replace_block(page, "steady", &table).is_err());
    }

    #[test]
    fn the_page_has_a_block_for_every_benchmark() {
        let text = std::fs::read_to_string(repo_root().join(PAGE)).unwrap();
        for name in BENCHMARKS {
            replace_block(&text, name, "").unwrap();
        }
    }
}
