//! One container's process: spawned in its pod's network namespace with its
//! plan's environment, its output appended to a log file (what `kubectl
//! logs` would show), in its own process group so a signal reaches
//! everything it started, and tied to this runner's life: if the runner
//! dies, the kernel kills it (PR_SET_PDEATHSIG). Whatever the process leaves
//! behind in its group when it exits is killed too, so no path leaves a
//! server behind.

use std::io::SeekFrom;
use std::process::{ExitStatus, Stdio};

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::process::{Child, Command};

use crate::plan::ContainerPlan;

/// The kubelet keeps this much of a failed container's log as its message.
const FALLBACK_LINES: usize = 80;
const FALLBACK_BYTES: usize = 2048;
/// And reads at most this much of a termination-message file.
const MESSAGE_BYTES: u64 = 4096;

pub struct Running {
    child: Child,
    pid: i32,
    /// Where this run's output starts in the (appended) log.
    log_start: u64,
    reaped: bool,
}

/// `program args` with the container's environment and working folder, in
/// the pod's network namespace and a process group of its own that dies
/// with this runner. Must be spawned on a runtime worker thread: the
/// parent-death signal follows the thread that forked.
///
/// `ip netns exec` enters the namespace, mounts the pod's /etc/hosts and
/// resolv.conf over /etc's (in a mount namespace of the process's own) and
/// execs the program in place: the PID, the process group and the
/// parent-death signal set below are the program's.
pub fn command(plan: &ContainerPlan, program: &str, args: &[String]) -> Command {
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", &plan.netns, program])
        .args(args)
        .env_clear()
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&plan.cwd)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    // SAFETY: between fork and exec only async-signal-safe calls are made
    // (setpgid, prctl, getppid), none of which allocate or take locks.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(|| {
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            // The runner may have died between fork and prctl.
            if libc::getppid() == 1 {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    command
}

/// Starts the container's process, with a fresh termination-message file.
pub fn spawn(plan: &ContainerPlan) -> Result<Running> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&plan.log)
        .with_context(|| format!("opening {}", plan.log.display()))?;
    let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
    let stderr = log.try_clone()?;
    // A message left by an earlier run is not this run's.
    let _ = std::fs::remove_file(&plan.termination_log);
    let program = plan.program.to_string_lossy();
    let child = command(plan, &program, &plan.args)
        .stdout(log)
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("starting {}", plan.program.display()))?;
    let pid = child.id().map_or(0, |p| p as i32);
    Ok(Running {
        child,
        pid,
        log_start,
        reaped: false,
    })
}

impl Running {
    /// Sends `signal` to the container's whole process group.
    pub fn signal(&self, signal: i32) {
        if self.pid > 0 {
            // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(-self.pid, signal);
            }
        }
    }

    /// The exit status; cancel-safe, and the same on every call once exited.
    /// Anything the process started and left in its group is killed then.
    pub async fn wait(&mut self) -> Result<ExitStatus> {
        let status = self.child.wait().await?;
        if !self.reaped {
            self.reaped = true;
            self.signal(libc::SIGKILL);
        }
        Ok(status)
    }

    /// The termination message of this run: the container's own file, else
    /// (on failure, with FallbackToLogsOnError) the end of this run's log.
    pub async fn termination_message(
        &self,
        plan: &ContainerPlan,
        failed: bool,
        fallback_to_logs: bool,
    ) -> Option<String> {
        if let Ok(file) = tokio::fs::File::open(&plan.termination_log).await {
            let mut text = String::new();
            let _ = file.take(MESSAGE_BYTES).read_to_string(&mut text).await;
            if !text.trim().is_empty() {
                return Some(text);
            }
        }
        if !(failed && fallback_to_logs) {
            return None;
        }
        let mut log = tokio::fs::File::open(&plan.log).await.ok()?;
        log.seek(SeekFrom::Start(self.log_start)).await.ok()?;
        let mut bytes = Vec::new();
        log.read_to_end(&mut bytes).await.ok()?;
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(FALLBACK_LINES)..].join("\n");
        let start = tail.len().saturating_sub(FALLBACK_BYTES);
        let start = (start..tail.len())
            .find(|i| tail.is_char_boundary(*i))
            .unwrap_or(tail.len());
        Some(tail[start..].to_string())
    }
}

impl Drop for Running {
    /// A process dropped unreaped takes its whole group with it, not only
    /// its leader (which is all `kill_on_drop` reaches).
    fn drop(&mut self) {
        if !self.reaped {
            self.signal(libc::SIGKILL);
        }
    }
}

/// Exit code as the kubelet reports it (128 + signal for a killed process).
pub fn exit_code(status: &ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}
