//! What the process nodes run: the binaries Nereid's images hold, built
//! from this checkout, and the environment the image would give them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::cluster::Serving;
use crate::env::is_executable;

/// The programs a Nereid image holds, as the process nodes look them up.
const IMAGE_PROGRAMS: &[&str] = &["nereid-server", "nereid-fetch", "nereid-operator", "nereid-gateway"];

/// The pod range of the suite's cluster.
pub const POD_CIDR: &str = "10.244.0.0/16";

/// The process nodes' programs and the S3 endpoint, ready to start;
/// `build` brings the workspace's binaries up to date first.
pub fn serving(repo: &Path, build: bool) -> Result<Serving> {
    // The image's ONNX Runtime: the library scripts/setup.sh installs and
    // names (the process node passes it on to the pods, as the image's ENV).
    let ort = std::env::var_os("ORT_DYLIB_PATH")
        .context("ORT_DYLIB_PATH is not set (scripts/setup.sh installs ONNX Runtime and sets it)")?;
    if !Path::new(&ort).is_file() {
        bail!("ORT_DYLIB_PATH names {ort:?}, which is not a file");
    }
    let moto = match std::env::var_os("NEREID_MOTO_SERVER") {
        Some(path) => PathBuf::from(path),
        None => repo.join(".venv/bin/moto_server"),
    };
    if !is_executable(&moto) {
        bail!(
            "moto's S3 server is missing at {} (scripts/setup.sh installs it)",
            moto.display()
        );
    }
    Ok(Serving {
        workspace_bin: binaries(build)?,
        moto,
        pod_cidr: POD_CIDR,
    })
}

/// The folder of this checkout's binaries, brought up to date first.
///
/// `cargo test --workspace` (the README's command) has built them already,
/// so the build below is a no-op there; run as `cargo test -p
/// nereid-operator --test e2e`, cargo would not have built the server and
/// the process node, or would leave them stale. The same command and
/// profile as the README's, so the features (and the artifacts) are the same.
fn binaries(build: bool) -> Result<PathBuf> {
    let dir = Path::new(env!("CARGO_BIN_EXE_nereid-operator"))
        .parent()
        .context("the target folder")?
        .to_path_buf();
    if let Some(cargo) = std::env::var_os("CARGO").filter(|_| build) {
        let status = Command::new(cargo)
            .args(["test", "--workspace", "--no-run", "--locked", "--quiet"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .context("running cargo to build the workspace's binaries")?;
        if !status.success() {
            bail!("building the workspace's binaries failed: {status}");
        }
    }
    for program in IMAGE_PROGRAMS.iter().chain(&["nereid-proc-node"]) {
        if !is_executable(&dir.join(program)) {
            bail!("{program} is missing from {}", dir.display());
        }
    }
    Ok(dir)
}
