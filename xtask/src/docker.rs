//! `cargo xtask docker-build` / `docker-push`: shell out to docker.
//! (`docker-build --offline` builds without a registry: [`crate::images`].)

use anyhow::{Result, bail};
use xshell::{Shell, cmd};

use crate::repo_root;

fn docker_engine(sh: &Shell) -> Result<()> {
    if cmd!(sh, "docker info").quiet().ignore_stdout().ignore_stderr().run().is_err() {
        bail!(
            "no docker engine answers `docker info`: start dockerd (or point DOCKER_HOST at one) to build the image; \
             the Dockerfile is at the repository root and builds with any BuildKit-enabled engine"
        );
    }
    Ok(())
}

/// Builds the manager image (from the Dockerfile, or offline from this
/// machine's files, see [`crate::images`]) and checks it.
pub fn build(image: &str, offline: bool) -> Result<()> {
    if offline {
        return crate::images::build_provider_offline(image);
    }
    let sh = Shell::new()?;
    docker_engine(&sh)?;
    sh.change_dir(repo_root());
    cmd!(sh, "docker build -t {image} .").run()?;
    crate::images::check_provider_image(image)
}

pub fn push(image: &str) -> Result<()> {
    let sh = Shell::new()?;
    docker_engine(&sh)?;
    cmd!(sh, "docker push {image}").run()?;
    Ok(())
}
