//! The run's own network namespace: the harness re-runs itself, with its
//! arguments, through e2e/netns.sh, and everything it starts (the control
//! plane, the process nodes and their pods' namespaces, kube-proxy, the
//! load it sends) lives in there. The machine's interfaces, routes and
//! iptables are never touched, and when the run ends, however it ends, the
//! kernel removes whatever it made.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitCode};

use anyhow::{Result, bail};

/// Set for the run inside the namespace.
const INSIDE: &str = "NEREID_E2E_NETNS";

/// Whether this process is the run inside the namespace.
pub fn inside() -> bool {
    std::env::var_os(INSIDE).is_some()
}

/// Whether this process may make namespaces: e2e/netns.sh needs root.
pub fn can_enter() -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the effective user.
    if inside() || std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        return Ok(());
    }
    bail!("the e2e suite runs in network namespaces of its own, which needs root")
}

/// Replaces this process with itself run through e2e/netns.sh (same PID,
/// same arguments, same output); returns only if that fails.
pub fn enter(repo: &Path) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("e2e: this binary's path: {e}");
            return ExitCode::FAILURE;
        }
    };
    let error = Command::new("bash")
        .arg(repo.join("e2e/netns.sh"))
        .arg(exe)
        .args(std::env::args_os().skip(1))
        .env(INSIDE, "1")
        .exec();
    eprintln!("e2e: entering the run's network namespace with e2e/netns.sh: {error}");
    ExitCode::FAILURE
}

/// `command` set to make namespaces of its own when it runs this binary
/// (a second harness), instead of sharing this run's.
pub fn outside(command: &mut Command) -> &mut Command {
    command.env_remove(INSIDE)
}
