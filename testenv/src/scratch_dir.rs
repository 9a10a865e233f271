//! The temporary directory of one control plane (certificates, etcd data, logs, kubeconfig).
//!
//! Directories live in `$TMPDIR/capl-testenv/<pid>-<n>`; a directory left behind by a test
//! process that died without cleaning up (killed, or holding a `static` instance) is removed
//! by the next one that starts, because its pid no longer runs.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result};

pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    pub fn create() -> Result<Self> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join("capl-testenv");
        std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        remove_dirs_of_dead_processes(&root);
        let path = root.join(format!("{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
        if path.exists() {
            std::fs::remove_dir_all(&path).with_context(|| format!("removing the stale {}", path.display()))?;
        }
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the directory. Idempotent.
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        self.remove();
    }
}

fn remove_dirs_of_dead_processes(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|name| name.split('-').next()).and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
