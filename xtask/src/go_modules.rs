//! Go modules built into the node image and its container images: a module
//! of our own per program (go.mod, tools.go), `go build` into a cache
//! directory, and copying files with a mode. Shared by `node_image` and
//! `node_addons`.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use xshell::{Shell, cmd};

/// Writes `<go_dir>/src/<name>/{go.mod,tools.go}` (plus `extra` files) and runs
/// `go mod tidy` when go.mod changed. Same scheme as `control_plane.rs` (duplicated
/// there on purpose: that file belongs to the control-plane build).
pub(crate) fn prepare_module(
    sh: &Shell,
    go_dir: &Path,
    name: &str,
    go_mod: &str,
    commands: &[&str],
    extra: &[(&str, String)],
) -> Result<PathBuf> {
    let module = go_dir.join("src").join(name);
    fs::create_dir_all(&module)?;
    if !commands.is_empty() {
        let imports: String = commands.iter().map(|c| format!("\t_ \"{c}\"\n")).collect();
        sh.write_file(
            module.join("tools.go"),
            format!("//go:build tools\n\n// Package tools pins the commands built from this module.\npackage tools\n\nimport (\n{imports})\n"),
        )?;
    }
    for (file, text) in extra {
        sh.write_file(module.join(file), text)?;
    }
    let template = module.join("go.mod.template");
    let fingerprint = format!("{go_mod}\n{}", extra.iter().map(|(_, t)| t.as_str()).collect::<String>());
    let unchanged =
        fs::read_to_string(&template).is_ok_and(|old| old == fingerprint) && module.join("go.sum").is_file();
    if !unchanged {
        sh.write_file(module.join("go.mod"), go_mod)?;
        let _ = fs::remove_file(module.join("go.sum"));
        let _d = sh.push_dir(&module);
        let t = Instant::now();
        cmd!(sh, "go mod tidy").run().with_context(|| format!("`go mod tidy` failed in {}", module.display()))?;
        eprintln!("go: go mod tidy ({name}) took {:.0?}", t.elapsed());
        sh.write_file(&template, fingerprint)?;
    }
    Ok(module)
}

/// `go build` into `<bin>/<binary>` through a temporary name; `static_build` sets CGO_ENABLED=0.
pub(crate) fn go_build(
    sh: &Shell,
    module: &Path,
    bin: &Path,
    binary: &str,
    package: &str,
    ldflags: &str,
    static_build: bool,
) -> Result<()> {
    let target = bin.join(binary);
    if target.is_file() {
        return Ok(());
    }
    let partial = bin.join(format!(".partial-{binary}"));
    let _d = sh.push_dir(module);
    let _cgo = static_build.then(|| sh.push_env("CGO_ENABLED", "0"));
    let t = Instant::now();
    eprintln!("go: building {binary} from {package} ...");
    cmd!(sh, "nice -n 10 go build -ldflags {ldflags} -o {partial} {package}")
        .run()
        .with_context(|| format!("`go build {package}` failed in {}", module.display()))?;
    fs::rename(&partial, &target)?;
    eprintln!("go: built {binary} in {:.0?}", t.elapsed());
    Ok(())
}

pub(crate) fn install_file(from: &Path, to: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::copy(from, to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// The directory of `module` (`path@version`) in the module cache, downloaded when missing.
pub(crate) fn module_dir(sh: &Shell, module: &str) -> Result<PathBuf> {
    let json = cmd!(sh, "go mod download -json {module}")
        .quiet()
        .read()
        .with_context(|| format!("go mod download {module}"))?;
    // One `"Dir": "<path>",` line.
    json.lines()
        .find_map(|l| l.trim().strip_prefix("\"Dir\": \"")?.strip_suffix("\",").map(PathBuf::from))
        .with_context(|| format!("no Dir in `go mod download -json {module}`:\n{json}"))
}
