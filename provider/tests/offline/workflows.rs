//! The release workflow (`.github/workflows/release.yml`) and `cargo xtask
//! release` agree: the image the workflow pushes, for both architectures, is
//! the image the release's components name, and the files it attaches to the
//! GitHub release are exactly the files the release writes, each matched
//! once. The workflow cannot run here; this is what can drift between the
//! two without actionlint seeing it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// What a tag push `v0.1.0` by the owner `example` makes of the workflow's expressions.
fn expand(text: &str) -> String {
    text.replace("${{ github.ref_name }}", "v0.1.0").replace("${{ github.repository_owner }}", "example")
}

/// Whether `name` matches `pattern`, whose only wildcard is `*` (any run of characters).
fn matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, rest)) => {
            name.starts_with(head)
                && (0..=name.len() - head.len()).any(|skip| matches(rest, &name[head.len() + skip..]))
        }
    }
}

/// The steps of `job` that use an action whose name starts with `action`.
fn steps_using<'a>(workflow: &'a Value, job: &str, action: &str) -> Vec<&'a Value> {
    workflow["jobs"][job]["steps"]
        .as_array()
        .unwrap_or_else(|| panic!("release.yml has no job {job} with steps"))
        .iter()
        .filter(|s| s["uses"].as_str().is_some_and(|u| u.starts_with(action)))
        .collect()
}

/// The value after `flag` in a shell line like `cargo xtask release --out dist`.
fn flag<'a>(line: &'a str, flag: &str) -> &'a str {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == flag).unwrap_or_else(|| panic!("no {flag} in {line:?}"));
    words[at + 1].trim_matches('"')
}

#[test]
fn the_release_workflow_pushes_the_image_the_release_names_and_attaches_every_file_it_writes() {
    let text = std::fs::read_to_string(repo_root().join(".github/workflows/release.yml")).unwrap();
    let workflow: Value = serde_yaml::from_str(&text).unwrap();
    let image = expand(workflow["env"]["IMAGE"].as_str().expect("release.yml sets env.IMAGE"));
    assert_eq!(image, "ghcr.io/example/cluster-api-provider-libvirt:v0.1.0");

    // The image job pushes that image for both architectures.
    let build = steps_using(&workflow, "image", "docker/build-push-action");
    assert_eq!(build.len(), 1, "one build-push step");
    assert_eq!(build[0]["with"]["tags"], "${{ env.IMAGE }}");
    assert_eq!(build[0]["with"]["push"], true);
    let platforms: BTreeSet<&str> = build[0]["with"]["platforms"].as_str().unwrap().split(',').collect();
    assert_eq!(platforms, BTreeSet::from(["linux/amd64", "linux/arm64"]));

    // The assets job runs the release for the tag and that image, after the image is pushed.
    assert_eq!(workflow["jobs"]["assets"]["needs"], "image");
    let steps = workflow["jobs"]["assets"]["steps"].as_array().unwrap();
    let line = steps
        .iter()
        .filter_map(|s| s["run"].as_str())
        .flat_map(str::lines)
        .find(|l| l.trim_start().starts_with("cargo xtask release"))
        .expect("the assets job runs cargo xtask release");
    assert_eq!(flag(line, "--version"), "$GITHUB_REF_NAME");
    assert_eq!(flag(line, "--image"), "$IMAGE");
    let out_dir = flag(line, "--out");

    // Run the release as the workflow does.
    let out = std::env::temp_dir().join(format!("capl-test-workflow-release-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let output = super::manifests::run_release("v0.1.0", &image, &out);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let dir = out.join("infrastructure-libvirt/v0.1.0");
    let written: BTreeSet<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    let components = std::fs::read_to_string(dir.join("infrastructure-components.yaml")).unwrap();
    let deployment: Value = serde_yaml::Deserializer::from_str(&components)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .find(|d: &Value| d["kind"] == "Deployment")
        .expect("the components hold the manager's Deployment");
    assert_eq!(deployment["spec"]["template"]["spec"]["containers"][0]["image"], image.as_str());

    // Every file written is attached, by exactly one of the workflow's patterns,
    // and every pattern attaches something.
    let upload = steps_using(&workflow, "assets", "softprops/action-gh-release");
    assert_eq!(upload.len(), 1, "one release upload step");
    assert_eq!(upload[0]["with"]["fail_on_unmatched_files"], true);
    let prefix = format!("{out_dir}/infrastructure-libvirt/v0.1.0/");
    let patterns: Vec<String> = upload[0]["with"]["files"]
        .as_str()
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let path = expand(l.trim());
            path.strip_prefix(&prefix)
                .unwrap_or_else(|| panic!("{path} is not in the release directory {prefix}"))
                .to_string()
        })
        .collect();
    for name in &written {
        let by: Vec<&String> = patterns.iter().filter(|p| matches(p, name)).collect();
        assert_eq!(by.len(), 1, "{name} is attached by {by:?}, not exactly one pattern");
    }
    for pattern in &patterns {
        assert!(written.iter().any(|n| matches(pattern, n)), "{pattern} attaches nothing the release writes");
    }
    for required in ["infrastructure-components.yaml", "metadata.yaml", "cluster-template.yaml"] {
        assert!(written.contains(required), "the release lacks {required}");
    }
    std::fs::remove_dir_all(out).unwrap();
}

#[test]
fn a_star_matches_any_run_of_characters() {
    assert!(matches("cluster-template*.yaml", "cluster-template.yaml"));
    assert!(matches("cluster-template*.yaml", "cluster-template-ssh.yaml"));
    assert!(!matches("cluster-template*.yaml", "clusterclass-default.yaml"));
    assert!(matches("metadata.yaml", "metadata.yaml"));
    assert!(!matches("metadata.yaml", "metadata.yml"));
    assert!(matches("a*b*c", "a-b-b-c"));
}
