//! The CPU time a process has used, read from `/proc/<pid>/stat`.
//!
//! Throughput on a shared, noisy two-core machine moves with whatever else
//! runs; the CPU a server spends on each request it answers is the stable
//! figure to set against a baseline measured in the same run (the bare
//! echo servers for nereid-perf, the model run directly for nereid-vad).

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// `/proc/<pid>/stat` counts in USER_HZ ticks, which the kernel fixes at
/// 100 per second for user space on every architecture Linux supports
/// here (x86-64, arm64), whatever the kernel's own HZ.
const TICKS_PER_SECOND: u64 = 100;

/// A process whose user plus system time (all its threads) can be read,
/// with its descendants' when asked: a server whose work runs in child
/// processes (a Python model's stubs) spends that CPU on its requests too.
#[derive(Debug, Clone)]
pub struct ProcessCpu {
    path: PathBuf,
    /// Count every live descendant too (`None`: the process alone).
    tree_root: Option<u32>,
}

impl ProcessCpu {
    /// Another process; checks that its stat is readable now.
    pub fn of(pid: u32) -> io::Result<Self> {
        Self::at(format!("/proc/{pid}/stat"))
    }

    /// Another process and every process below it, as they are at each
    /// reading (a descendant that exited meanwhile is no longer counted).
    pub fn tree_of(pid: u32) -> io::Result<Self> {
        let mut cpu = Self::of(pid)?;
        cpu.tree_root = Some(pid);
        Ok(cpu)
    }

    /// This process.
    pub fn current() -> io::Result<Self> {
        Self::at("/proc/self/stat".into())
    }

    fn at(path: String) -> io::Result<Self> {
        let cpu = ProcessCpu {
            path: path.into(),
            tree_root: None,
        };
        cpu.used()?;
        Ok(cpu)
    }

    /// User plus system time so far; an error once the process is gone.
    pub fn used(&self) -> io::Result<Duration> {
        let own = self.ticks_of(&std::fs::read_to_string(&self.path)?)?;
        let below = match self.tree_root {
            Some(root) => descendants_ticks(root),
            None => 0,
        };
        Ok(Duration::from_micros((own + below) * (1_000_000 / TICKS_PER_SECOND)))
    }

    fn ticks_of(&self, text: &str) -> io::Result<u64> {
        parse_ticks(text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: no CPU times in {text:?}", self.path.display()),
            )
        })
    }
}

/// The ticks of every live descendant of `root` (not `root` itself), from
/// one pass over `/proc`.
fn descendants_ticks(root: u32) -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut children: std::collections::HashMap<u32, Vec<(u32, u64)>> = std::collections::HashMap::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let (Some(parent), Some(ticks)) = (parse_parent(&stat), parse_ticks(&stat)) {
            children.entry(parent).or_default().push((pid, ticks));
        }
    }
    let mut total = 0;
    let mut todo = vec![root];
    while let Some(pid) = todo.pop() {
        for (child, ticks) in children.get(&pid).into_iter().flatten() {
            total += ticks;
            todo.push(*child);
        }
    }
    total
}

/// The parent pid from a stat line: the second field after the command.
fn parse_parent(stat: &str) -> Option<u32> {
    stat[stat.rfind(')')? + 1..]
        .split_ascii_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// utime + stime from a stat line. The command name (field 2) is in
/// parentheses and may hold spaces or parentheses itself, so fields are
/// counted from the last `)`: state is the first after it, utime the 12th
/// and stime the 13th (fields 14 and 15 of proc(5)).
fn parse_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_utime_and_stime_past_an_odd_command_name() {
        let stat = "4242 (tokio (io) 1) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 1000 0 0";
        assert_eq!(parse_ticks(stat), Some(250 + 75));
        assert_eq!(parse_ticks("4242 (short) S 1"), None);
        assert_eq!(parse_ticks("no parenthesis"), None);
        assert_eq!(parse_parent(stat), Some(1));
    }

    #[test]
    fn this_process_uses_cpu_and_a_missing_one_is_an_error() {
        let me = ProcessCpu::of(std::process::id()).unwrap();
        let before = me.used().unwrap();
        // Spin until the counter moves; the bound only stops a broken
        // reader from hanging the test.
        let give_up = std::time::Instant::now() + Duration::from_secs(10);
        let mut x = 0u64;
        while me.used().unwrap() == before && std::time::Instant::now() < give_up {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        }
        assert!(me.used().unwrap() > before, "10 s of spinning did not show");
        assert!(ProcessCpu::current().unwrap().used().unwrap() >= before);
        assert!(ProcessCpu::of(u32::MAX).is_err());
    }
}
