//! `cargo xtask docker-build` / `docker-push`: shell out to docker.

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

pub fn build(image: &str) -> Result<()> {
    let sh = Shell::new()?;
    docker_engine(&sh)?;
    sh.change_dir(repo_root());
    cmd!(sh, "docker build -t {image} .").run()?;
    Ok(())
}

pub fn push(image: &str) -> Result<()> {
    let sh = Shell::new()?;
    docker_engine(&sh)?;
    cmd!(sh, "docker push {image}").run()?;
    Ok(())
}
