//! Chat-template renders in child processes that may use at most [`TEMPLATE_MEMORY_BYTES`] of
//! memory and [`RENDER_SECONDS`] of time each, so that a template's intermediate values (a
//! namespace string doubled in a loop: 40 instructions, a terabyte) cannot grow the server.
//!
//! Why a process: minijinja bounds the instructions a render runs (fuel) and [`crate::chat_template`]
//! bounds what it writes, but nothing inside one process can bound what a value allocates
//! between two instructions. An operating-system limit can: the worker sets `RLIMIT_DATA` on
//! itself, a failed allocation aborts the worker alone, and the caller gets
//! `ModelError::TemplateLimit` (a 400 `invalid_template` on the server).
//!
//! This module is the process machinery, blind to what a job means: the pool of workers
//! ([`install`], [`exchange`]) and the worker's side ([`serve`]: limits, then one answer per
//! line). [`crate::chat_template`] says what a job is (its `RenderJob`) and renders it in the
//! worker (`chat_template::serve_worker`). The binary installs the pool with the command that
//! starts a worker (`pagoda` runs itself with a hidden subcommand); a process that installs
//! none (a library user, unit tests) renders in-process with every other limit in force.
//!
//! Protocol: one line per job on the worker's stdin, one line per answer on its stdout; a
//! worker answers one job at a time. Invariants: a worker that fails an exchange (died, closed
//! a pipe, wrote no line) is killed and reaped, never reused; at most `max_workers` run at once.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Condvar, Mutex, OnceLock};

use crate::isolated::DEEP_STACK_BYTES;

/// Memory a template's values may take in one render (the worker's data limit is this plus the
/// deep render stack and room for the worker itself).
pub const TEMPLATE_MEMORY_BYTES: u64 = 512 << 20;

/// Wall-clock seconds one render may take in a worker (fuel stops a template within about a
/// second; this bounds what fuel does not count, such as copying large values).
pub const RENDER_SECONDS: u32 = 20;

/// The worker's own needs beside the values: its heap, compiled templates and pipe buffers.
const WORKER_OVERHEAD_BYTES: u64 = 128 << 20;

/// How to start a worker: a program and its arguments (the worker speaks on stdin/stdout).
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

/// The pool was installed already (it is process-wide and installed once).
#[derive(Debug, thiserror::Error)]
#[error("the template sandbox is installed already")]
pub struct AlreadyInstalled;

/// A worker stopped before it answered: the job went over a limit (a job cannot end its
/// worker in any other way). The message names the limits and how the worker ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "rendering the chat template went over the limit of {mib} MiB of memory or {RENDER_SECONDS} s \
     (its renderer was {0})",
    mib = TEMPLATE_MEMORY_BYTES >> 20
)]
pub struct Stopped(pub String);

static POOL: OnceLock<Pool> = OnceLock::new();

/// Makes every job of this process ([`exchange`]) run in workers started by `command`, at most
/// `max_workers` at once (started when first needed).
pub fn install(command: WorkerCommand, max_workers: usize) -> Result<(), AlreadyInstalled> {
    POOL.set(Pool::new(command, max_workers))
        .map_err(|_| AlreadyInstalled)
}

/// `job` (one line, no newline) answered by a worker when a pool is installed; `None` when jobs
/// stay in-process. `Err(Stopped)`: a worker could not be started or stopped mid-job.
pub(crate) fn exchange(job: &str) -> Option<Result<String, Stopped>> {
    POOL.get().map(|pool| pool.exchange(job))
}

/// The worker's side: limits this process's memory and core dumps, then writes
/// `answer(line)` for each line of `input` until `input` ends, each under an alarm of
/// [`RENDER_SECONDS`] (whose default action ends the process).
pub fn serve(
    input: impl BufRead,
    output: impl Write,
    answer: impl FnMut(&str) -> String,
) -> std::io::Result<()> {
    limit_this_process()?;
    answer_lines(input, output, true, answer)
}

/// One `answer` per line of `input`, each on a line of `output`; with `timed`, under the alarm.
pub(crate) fn answer_lines(
    input: impl BufRead,
    mut output: impl Write,
    timed: bool,
    mut answer: impl FnMut(&str) -> String,
) -> std::io::Result<()> {
    for line in input.lines() {
        let line = line?;
        if timed {
            set_alarm(RENDER_SECONDS);
        }
        let mut reply = answer(&line);
        if timed {
            set_alarm(0);
        }
        debug_assert!(!reply.contains('\n'), "an answer is one line");
        reply.push('\n');
        output.write_all(reply.as_bytes())?;
        output.flush()?;
    }
    Ok(())
}

#[cfg(unix)]
fn limit_this_process() -> std::io::Result<()> {
    let data = TEMPLATE_MEMORY_BYTES + DEEP_STACK_BYTES as u64 + WORKER_OVERHEAD_BYTES;
    set_limit(libc::RLIMIT_DATA, data)?;
    // A worker that runs out of memory aborts: no core file of that memory.
    set_limit(libc::RLIMIT_CORE, 0)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
type Resource = libc::__rlimit_resource_t;
#[cfg(all(unix, not(all(target_os = "linux", target_env = "gnu"))))]
type Resource = libc::c_int;

#[cfg(unix)]
fn set_limit(resource: Resource, bytes: u64) -> std::io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: bytes as libc::rlim_t,
        rlim_max: bytes as libc::rlim_t,
    };
    // SAFETY: setrlimit reads the struct we pass and touches nothing else.
    if unsafe { libc::setrlimit(resource, &limit) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(unix)]
fn set_alarm(seconds: u32) {
    // SAFETY: alarm only (re)arms this process's SIGALRM timer.
    unsafe {
        libc::alarm(seconds);
    }
}

#[cfg(not(unix))]
fn limit_this_process() -> std::io::Result<()> {
    Err(std::io::Error::other(
        "the template worker needs a Unix process limit",
    ))
}

#[cfg(not(unix))]
fn set_alarm(_seconds: u32) {}

/// Workers, started on demand up to a maximum.
struct Pool {
    command: WorkerCommand,
    max_workers: usize,
    state: Mutex<PoolState>,
    freed: Condvar,
}

#[derive(Default)]
struct PoolState {
    idle: Vec<Worker>,
    /// Workers alive: idle or rendering.
    alive: usize,
}

struct Worker {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Pool {
    fn new(command: WorkerCommand, max_workers: usize) -> Pool {
        Pool {
            command,
            max_workers: max_workers.max(1),
            state: Mutex::new(PoolState::default()),
            freed: Condvar::new(),
        }
    }

    fn exchange(&self, job: &str) -> Result<String, Stopped> {
        let mut worker = self.take()?;
        match worker.exchange(job) {
            Ok(reply) => {
                self.give_back(worker);
                Ok(reply)
            }
            Err(why) => {
                let status = worker.end();
                self.forget_one();
                tracing::warn!(
                    %why,
                    status = %status,
                    "a chat-template worker stopped while rendering"
                );
                Err(Stopped(status))
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        // The state stays consistent across a panic (each change is one assignment).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle worker, a new one if fewer than the maximum run, or the next one freed.
    fn take(&self) -> Result<Worker, Stopped> {
        let mut state = self.lock();
        loop {
            if let Some(worker) = state.idle.pop() {
                return Ok(worker);
            }
            if state.alive < self.max_workers {
                state.alive += 1;
                drop(state);
                return self.start().inspect_err(|_| self.forget_one());
            }
            state = self.freed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn start(&self) -> Result<Worker, Stopped> {
        let mut child = Command::new(&self.command.program)
            .args(&self.command.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                Stopped(format!(
                    "not started: {}: {e}",
                    self.command.program.display()
                ))
            })?;
        match (child.stdin.take(), child.stdout.take()) {
            (Some(input), Some(output)) => Ok(Worker {
                child,
                input,
                output: BufReader::new(output),
            }),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                Err(Stopped("started without pipes".into()))
            }
        }
    }

    fn give_back(&self, worker: Worker) {
        self.lock().idle.push(worker);
        self.freed.notify_one();
    }

    fn forget_one(&self) {
        let mut state = self.lock();
        state.alive = state.alive.saturating_sub(1);
        drop(state);
        self.freed.notify_one();
    }
}

impl Worker {
    fn exchange(&mut self, job: &str) -> Result<String, String> {
        debug_assert!(!job.contains('\n'), "a job is one line");
        let mut line = job.to_string();
        line.push('\n');
        self.input
            .write_all(line.as_bytes())
            .and_then(|()| self.input.flush())
            .map_err(|e| format!("cannot send the job: {e}"))?;
        let mut reply = String::new();
        match self.output.read_line(&mut reply) {
            Ok(0) => Err("the worker ended without a reply".into()),
            Ok(_) => Ok(reply.trim_end_matches('\n').to_string()),
            Err(e) => Err(format!("cannot read the reply: {e}")),
        }
    }

    /// Kills the worker (if it still runs) and returns how it ended.
    fn end(mut self) -> String {
        let _ = self.child.kill();
        match self.child.wait() {
            Ok(status) => describe(status),
            Err(e) => format!("unknown ({e})"),
        }
    }
}

#[cfg(unix)]
fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status.signal() {
        Some(libc::SIGABRT) => "aborted (out of memory)".into(),
        Some(libc::SIGALRM) => "stopped by its time limit".into(),
        Some(signal) => format!("killed by signal {signal}"),
        None => status.to_string(),
    }
}

#[cfg(not(unix))]
fn describe(status: std::process::ExitStatus) -> String {
    status.to_string()
}
