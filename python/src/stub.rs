//! One stub process: started with its ends of two socket pairs as fds 3
//! (the server's frames) and 4 (its own), read with a deadline, killed
//! (never left behind) when it is done with.

use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nereid_core::error::{Error, Result};
use parking_lot::Mutex;

use crate::channel::{self, FrameReader};
use crate::instance::Shared;
use crate::metrics::{CustomMetrics, StubMetrics};
use crate::protocol::{FromStub, ToStub};
use crate::pump::{self, Pump};
use crate::shm::{HostPool, PoolSize, StubPool};

/// The fd the stub reads the server's frames from (`NEREID_STUB_FD`).
const STUB_IN_FD: i32 = 3;
/// The fd the stub writes its frames to (`NEREID_STUB_OUT_FD`).
const STUB_OUT_FD: i32 = 4;

/// How a stub is started.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The interpreter.
    pub python: PathBuf,
    /// The folder holding `nereid_stub.py` and `triton_python_backend_utils.py`.
    pub stub_dir: PathBuf,
    pub pool: PoolSize,
}

/// The server's end of the socket to the stub, shared with the tasks that
/// answer its calls: one lock around each whole frame.
pub type Writer = Arc<Mutex<UnixStream>>;

/// A running stub.
pub struct Stub {
    ending: Ending,
    /// Its messages, read by the instance thread; `None` once a [`Pump`]
    /// reads them.
    reader: Option<FrameReader>,
    writer: Writer,
    /// Both sockets once more (to the stub, from it), to shut them
    /// without the writer's lock, which a writer blocked on a stub that
    /// reads nothing may hold, and to wake a pump blocked reading.
    sockets: [UnixStream; 2],
    pub host: Arc<Mutex<HostPool>>,
    pub stub_pool: Arc<Mutex<StubPool>>,
    /// Its custom metrics, by its own numbers.
    pub metrics: StubMetrics,
    /// A decoupled model's reader thread (dropped after the process is
    /// killed, so its thread ends).
    pump: Option<Pump>,
}

/// What says how a stub ended: its process and its last words.
#[derive(Clone)]
pub struct Ending {
    child: Arc<Mutex<Child>>,
    /// The last lines it wrote to stderr (which go on to the server's).
    stderr: StderrTail,
}

/// How a read from the stub failed.
#[derive(Debug)]
pub enum Gone {
    /// It exited (or closed its socket): how, when known.
    Exited(String),
    /// It said nothing for the whole deadline.
    Silent(Duration),
    /// It sent something that is not a message of the protocol.
    Garbled(String),
}

impl Gone {
    pub fn describe(&self) -> String {
        match self {
            Gone::Exited(how) => format!("the Python stub {how}"),
            Gone::Silent(waited) => format!("the Python stub sent nothing for {} s", waited.as_secs_f32()),
            Gone::Garbled(what) => format!("the Python stub broke the protocol: {what}"),
        }
    }
}

static STUBS: AtomicU64 = AtomicU64::new(0);

impl Stub {
    /// Starts a stub for `model`.
    pub fn spawn(launch: &Launch, model: &str) -> Result<Stub> {
        // Its segments' label, in /proc/PID/maps (memfd names are at most
        // 249 bytes: a long model name is cut).
        let name: String = model.chars().take(64).collect();
        let label = format!("nereid-{name}-{}-", STUBS.fetch_add(1, Ordering::Relaxed));
        // One socket pair each way. On one pair, each side's read of the
        // other's frame would also wake the reader blocked on its own end
        // (a Unix stream socket has one wait queue for reading and for
        // room to write): a wasted wake-up per execute on each side.
        let pair =
            || UnixStream::pair().map_err(|e| Error::unavailable(format!("failed to make the stub's socket: {e}")));
        let (to_stub, their_in) = pair()?;
        let (from_stub, their_out) = pair()?;
        let (in_fd, out_fd) = (their_in.as_raw_fd(), their_out.as_raw_fd());
        let mut command = Command::new(&launch.python);
        command
            .arg(launch.stub_dir.join("nereid_stub.py"))
            .env("PYTHONPATH", python_path(&launch.stub_dir))
            .env("NEREID_STUB_FD", STUB_IN_FD.to_string())
            .env("NEREID_STUB_OUT_FD", STUB_OUT_FD.to_string())
            .env("NEREID_MODEL", model)
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: the closure makes only async-signal-safe calls (prctl,
        // fcntl, dup2) on descriptors it owns, between fork and exec.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(move || {
                // Killed with the server, whatever ends it.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The outgoing end must not sit where the incoming one goes.
                let out_fd = match out_fd == STUB_IN_FD {
                    true => libc::fcntl(out_fd, libc::F_DUPFD_CLOEXEC, STUB_OUT_FD + 1),
                    false => out_fd,
                };
                if out_fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                for (fd, target) in [(in_fd, STUB_IN_FD), (out_fd, STUB_OUT_FD)] {
                    // dup2 onto itself would leave close-on-exec set.
                    let done = match fd == target {
                        true => libc::fcntl(target, libc::F_SETFD, 0),
                        false => libc::dup2(fd, target),
                    };
                    if done < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = spawn_kept(command).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => Error::unavailable(format!(
                "the Python interpreter '{}' was not found: Python models need python3 with numpy on the PATH, \
                 or EXECUTION_ENV_PATH",
                launch.python.display()
            )),
            _ => Error::unavailable(format!("failed to start '{}': {e}", launch.python.display())),
        })?;
        drop((their_in, their_out));
        let mut child = child;
        let stderr = StderrTail::follow(child.stderr.take());
        let clone = |socket: &UnixStream| {
            socket
                .try_clone()
                .map_err(|e| Error::unavailable(format!("failed to share the stub's socket: {e}")))
        };
        let sockets = [clone(&to_stub)?, clone(&from_stub)?];
        let writer = Arc::new(Mutex::new(to_stub));
        Ok(Stub {
            sockets,
            ending: Ending {
                child: Arc::new(Mutex::new(child)),
                stderr,
            },
            reader: Some(FrameReader::new(from_stub)),
            host: Arc::new(Mutex::new(HostPool::new(&label, launch.pool, Arc::clone(&writer)))),
            writer,
            stub_pool: Arc::new(Mutex::new(StubPool::default())),
            metrics: StubMetrics::default(),
            pump: None,
        })
    }

    /// Whether the process has ended (killed while idle, say), or its
    /// pump has stopped reading it: the next batch then goes to a new stub
    /// instead of failing on this one.
    pub fn has_exited(&mut self) -> bool {
        !matches!(self.ending.child.lock().try_wait(), Ok(None)) || self.pump.as_ref().is_some_and(Pump::stopped)
    }

    /// From now on a thread of its own reads the stub (a decoupled model's
    /// requests outlive their execute; see [`crate::pump`]).
    pub fn start_pump(&mut self, shared: Arc<Shared>) -> Result<()> {
        let Some(reader) = self.reader.take() else {
            return Ok(());
        };
        let pump = pump::Pump::start(
            reader,
            pump::Parts {
                shared,
                writer: Arc::clone(&self.writer),
                host: Arc::clone(&self.host),
                stub_pool: Arc::clone(&self.stub_pool),
                metrics: std::mem::take(&mut self.metrics),
                ending: self.ending.clone(),
            },
        )?;
        self.pump = Some(pump);
        Ok(())
    }

    /// The pump, once started.
    pub fn pump(&self) -> Option<&Pump> {
        self.pump.as_ref()
    }

    pub fn writer(&self) -> &Writer {
        &self.writer
    }

    /// Sends one message.
    pub fn send(&self, message: &ToStub) -> std::result::Result<(), Gone> {
        send(&self.writer, message).map_err(|e| Gone::Exited(format!("could not be written to ({e})")))
    }

    /// The next message, waiting at most `deadline`. A new segment of the
    /// stub's pool is mapped here, before any message can name it.
    pub fn recv(&mut self, deadline: Duration) -> std::result::Result<FromStub, Gone> {
        let started = Instant::now();
        let until = started + deadline;
        loop {
            match self.recv_frame(until.saturating_duration_since(Instant::now()), started)? {
                FromStub::Segment { seg } => {
                    let fd = self
                        .reader
                        .as_mut()
                        .and_then(FrameReader::take_fd)
                        .ok_or_else(|| Gone::Garbled(format!("segment {seg} came without its descriptor")))?;
                    self.stub_pool.lock().add(seg, fd).map_err(Gone::Garbled)?;
                }
                message => return Ok(message),
            }
        }
    }

    fn recv_frame(&mut self, deadline: Duration, started: Instant) -> std::result::Result<FromStub, Gone> {
        let Some(reader) = self.reader.as_mut() else {
            return Err(Gone::Garbled("the stub is read by its pump".into()));
        };
        read_frame(reader, deadline, started, &self.ending)
    }

    /// The stub's answer to `init` or `auto_complete`: its first message
    /// that is not a log line or a metric update (those are passed on),
    /// within `deadline` in all.
    pub fn answer(
        &mut self,
        deadline: Duration,
        model: &str,
        metrics: &CustomMetrics,
    ) -> std::result::Result<FromStub, Gone> {
        let until = Instant::now() + deadline;
        loop {
            match self.recv(until.saturating_duration_since(Instant::now()))? {
                FromStub::Log {
                    level,
                    message,
                    file,
                    line,
                } => crate::log::emit(model, &level, &message, file.as_deref(), line),
                message @ (FromStub::MetricFamily { .. } | FromStub::Metric { .. } | FromStub::MetricUpdate { .. }) => {
                    self.metrics.apply(metrics, model, &message);
                }
                answer => return Ok(answer),
            }
        }
    }

    /// Asks the stub to finalize and exit, waiting at most `deadline`
    /// (what the model logs meanwhile is logged), then makes sure it is
    /// gone. A decoupled model's open requests may end first, within the
    /// same deadline.
    pub fn finalize(mut self, deadline: Duration, model: &str, metrics: &CustomMetrics) {
        let until = Instant::now() + deadline;
        if let Some(pump) = self.pump.as_ref() {
            pump.wait_for_open(until);
            if send(&self.writer, &ToStub::Finalize).is_ok() {
                pump.finalized(until);
            }
            return;
        }
        if self.send(&ToStub::Finalize).is_ok() {
            while let Ok(message) = self.answer(until.saturating_duration_since(Instant::now()), model, metrics) {
                if matches!(message, FromStub::Finalized) {
                    break;
                }
            }
        }
        // Drop kills what is left.
    }
}

impl Ending {
    /// How the process ended, waiting a moment for it: its socket closes
    /// as it exits.
    pub fn describe(&self) -> String {
        let until = Instant::now() + Duration::from_secs(2);
        let how = loop {
            let status = self.child.lock().try_wait();
            match status {
                Ok(Some(status)) => break describe_exit(status),
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
                _ => break "closed its socket".to_string(),
            }
        };
        match self.stderr.last_lines() {
            Some(lines) => format!("{how}; its last words: {lines}"),
            None => how,
        }
    }
}

/// The next frame from `reader`, waiting at most `deadline`.
pub fn read_frame(
    reader: &mut FrameReader,
    deadline: Duration,
    started: Instant,
    ending: &Ending,
) -> std::result::Result<FromStub, Gone> {
    let _ = reader.set_read_timeout(deadline);
    match reader.read_frame() {
        Ok(Some(message)) => Ok(message),
        Ok(None) => Err(Gone::Exited(ending.describe())),
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
            Err(Gone::Silent(started.elapsed()))
        }
        Err(e) if e.kind() == io::ErrorKind::InvalidData => Err(Gone::Garbled(e.to_string())),
        Err(_) => Err(Gone::Exited(ending.describe())),
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        // Wakes whatever reads or writes it (the pump among them).
        for socket in &self.sockets {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
        let mut child = self.ending.child.lock();
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

/// The tail of a stub's stderr: every line is passed on to the server's
/// stderr as it comes, and the last few are kept to say why it died (a
/// missing numpy, an interpreter that cannot start).
#[derive(Clone, Default)]
struct StderrTail(Arc<Mutex<std::collections::VecDeque<String>>>);

impl StderrTail {
    /// Lines kept, and the longest kept line.
    const LINES: usize = 4;
    const LINE_BYTES: usize = 500;

    fn follow(stderr: Option<std::process::ChildStderr>) -> Self {
        let tail = StderrTail::default();
        let Some(stderr) = stderr else {
            return tail;
        };
        let kept = tail.clone();
        let spawned = std::thread::Builder::new().name("python-stderr".into()).spawn(move || {
            use std::io::BufRead;
            let mut reader = io::BufReader::new(stderr);
            let mut line = Vec::new();
            // Ends when the stub exits (its end of the pipe closes). A
            // line without an end is passed on in pieces.
            while io::Read::take(&mut reader, 64 << 10)
                .read_until(b'\n', &mut line)
                .is_ok_and(|n| n > 0)
            {
                let _ = io::stderr().write_all(&line);
                let text = String::from_utf8_lossy(&line[..line.len().min(Self::LINE_BYTES)]);
                let mut lines = kept.0.lock();
                if lines.len() == Self::LINES {
                    lines.pop_front();
                }
                lines.push_back(text.trim_end().to_string());
                line.clear();
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "the Python stub's stderr cannot be followed");
        }
        tail
    }

    fn last_lines(&self) -> Option<String> {
        let lines = self.0.lock();
        (!lines.is_empty()).then(|| lines.iter().cloned().collect::<Vec<_>>().join(" | "))
    }
}

/// Starts `command` from one thread that lives as long as the process.
///
/// `PR_SET_PDEATHSIG` fires when the thread that forked the child ends, not
/// the process: a stub forked by an instance thread would be killed the
/// moment that thread ends, and an instance's lanes end in any order at
/// unload, so the stub could die before the last lane has finalized it.
/// Forked from this thread instead, a stub dies with the server and
/// otherwise only when it is dropped.
fn spawn_kept(command: Command) -> io::Result<Child> {
    type Spawn = (Command, std::sync::mpsc::SyncSender<io::Result<Child>>);
    static KEEPER: std::sync::OnceLock<std::sync::mpsc::Sender<Spawn>> = std::sync::OnceLock::new();
    let stopped = || io::Error::other("the thread that starts Python stubs has stopped");
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Spawn>();
        let started = std::thread::Builder::new().name("python-stubs".into()).spawn(move || {
            for (mut command, answer) in rx {
                let _ = answer.send(command.spawn());
            }
        });
        if let Err(e) = started {
            tracing::error!("no thread to start Python stubs from: {e}");
        }
        tx
    });
    let (answer, answered) = std::sync::mpsc::sync_channel(1);
    keeper.send((command, answer)).map_err(|_| stopped())?;
    answered.recv().map_err(|_| stopped())?
}

/// Writes one frame through a shared writer.
pub fn send(writer: &Writer, message: &ToStub) -> io::Result<()> {
    let mut stream = writer.lock();
    channel::write_frame(&mut *stream, message)?;
    stream.flush()
}

fn describe_exit(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal} ({})", signal_name(signal)),
        _ => "exited".to_string(),
    }
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGILL => "SIGILL",
        _ => "a signal",
    }
}

/// The stub's folder first, then whatever the server was given.
fn python_path(stub_dir: &Path) -> std::ffi::OsString {
    let mut path = stub_dir.as_os_str().to_owned();
    if let Some(existing) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(existing);
    }
    path
}
