//! Processes on this machine, read from /proc: what the harness started and
//! whether it is still there, which process is a given pod's, and which
//! network namespaces something still holds.

/// A process, told apart from a later one with the same PID by its start time.
#[derive(Debug, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    pub ppid: u32,
    start_time: u64,
    pub cmdline: String,
}

impl Process {
    pub fn read(pid: u32) -> Option<Process> {
        let stat = Stat::read(pid)?;
        let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        Some(Process {
            pid,
            ppid: stat.field(4)?,
            start_time: stat.field(22)?,
            cmdline: String::from_utf8_lossy(&raw).replace('\0', " ").trim().to_string(),
        })
    }

    /// Still running (a zombie has no command line left and counts as gone).
    pub fn alive(&self) -> bool {
        Process::read(self.pid).is_some_and(|now| now.start_time == self.start_time && !now.cmdline.is_empty())
    }

    /// Whether its environment holds `variable` (`NAME=value`) exactly.
    pub fn has_env(&self, variable: &str) -> bool {
        let environ = std::fs::read(format!("/proc/{}/environ", self.pid)).unwrap_or_default();
        environ.split(|b| *b == 0).any(|var| var == variable.as_bytes())
    }
}

/// `/proc/<pid>/stat`, read once.
struct Stat(String);

impl Stat {
    fn read(pid: u32) -> Option<Stat> {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().map(Stat)
    }

    /// Field `n` (1-based, as proc(5) numbers them), from field 3 on.
    fn field<T: std::str::FromStr>(&self, n: usize) -> Option<T> {
        // Fields 1 and 2 are "pid (comm)"; comm may hold spaces and parentheses.
        let rest = &self.0[self.0.rfind(')')? + 1..];
        rest.split_whitespace().nth(n.checked_sub(3)?)?.parse().ok()
    }
}

/// CPU time `pid` has used (utime + stime), in clock ticks.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = Stat::read(pid)?;
    Some(stat.field::<u64>(14)? + stat.field::<u64>(15)?)
}

/// `pid`'s resident memory now and at its peak (VmRSS, VmHWM), in KiB.
pub fn memory_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let read = |key: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        line[key.len()..].trim().trim_end_matches("kB").trim().parse().ok()
    };
    Some((read("VmRSS:")?, read("VmHWM:")?))
}

/// Every process there is.
pub fn all() -> Vec<Process> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(Process::read)
        .collect()
}

/// Every process below `root`.
pub fn descendants(root: u32) -> Vec<Process> {
    let mut all = all();
    let mut found = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        let (children, rest): (Vec<Process>, Vec<Process>) = all.into_iter().partition(|p| p.ppid == parent);
        all = rest;
        parents.extend(children.iter().map(|p| p.pid));
        found.extend(children);
    }
    found
}

/// Every process whose command line names `marker`, but this one.
pub fn naming(marker: &str) -> Vec<Process> {
    let own = std::process::id();
    all()
        .into_iter()
        .filter(|p| p.pid != own && p.cmdline.contains(marker))
        .collect()
}

/// The network namespace `pid` is in, as the kernel names it ("net:[4026532175]").
pub fn net_namespace(pid: u32) -> Option<String> {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()?;
    Some(link.to_string_lossy().into_owned())
}

/// The network namespaces bind-mounted in `pid`'s mount table (`ip netns
/// add` pins a namespace so): mountinfo lines of type nsfs, whose root
/// field names the namespace.
pub fn pinned_net_namespaces(pid: u32) -> Vec<String> {
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    mountinfo
        .lines()
        .filter(|line| line.contains(" - nsfs "))
        .filter_map(|line| line.split_whitespace().nth(3))
        .filter(|root| root.starts_with("net:["))
        .map(str::to_string)
        .collect()
}

/// Who still holds any of `namespaces`: each process in one, or with one
/// pinned in its mount table, as "pid: namespace".
pub fn net_namespace_holders(namespaces: &[String]) -> Vec<String> {
    let mut holders = Vec::new();
    for process in all() {
        let held = net_namespace(process.pid)
            .into_iter()
            .chain(pinned_net_namespaces(process.pid))
            .filter(|ns| namespaces.contains(ns));
        holders.extend(held.map(|ns| format!("{}: {ns} ({})", process.pid, process.cmdline)));
    }
    holders.sort();
    holders.dedup();
    holders
}
