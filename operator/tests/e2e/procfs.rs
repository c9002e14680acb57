//! Processes on this machine, read from /proc: what the harness started and
//! whether it is still there, and which process is a given pod's.

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
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After "pid (comm)": state, ppid, ... start time is the 20th.
        let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
        let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        Some(Process {
            pid,
            ppid: fields.get(1)?.parse().ok()?,
            start_time: fields.get(19)?.parse().ok()?,
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
