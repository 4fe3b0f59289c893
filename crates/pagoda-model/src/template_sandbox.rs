//! Chat-template renders in child processes that may use at most [`TEMPLATE_MEMORY_BYTES`] of
//! memory and [`RENDER_SECONDS`] of time each, so that a template's intermediate values (a
//! namespace string doubled in a loop: 40 instructions, a terabyte) cannot grow the server.
//!
//! Why a process: minijinja bounds the instructions a render runs (fuel) and [`crate::chat_template`]
//! bounds what it writes, but nothing inside one process can bound what a value allocates
//! between two instructions. An operating-system limit can: the worker sets `RLIMIT_DATA` on
//! itself, a failed allocation aborts the worker alone, and the caller gets
//! [`ModelError::TemplateLimit`] (a 400 `invalid_template` on the server).
//!
//! The binary installs the pool ([`install`]) with the command that starts a worker (`pagoda`
//! runs itself with a hidden subcommand that calls [`serve_worker`]); a process that installs
//! none (a library user, unit tests) renders in-process with every other limit in force.
//!
//! Protocol: one JSON line per job on the worker's stdin ([`RenderJob`]), one JSON line per
//! reply on its stdout ([`RenderReply`]); a worker renders one job at a time and keeps the
//! templates it compiled. Invariants: a worker that fails an exchange (died, closed a pipe,
//! answered garbage) is killed and reaped, never reused; at most `max_workers` run at once; a
//! job's result is exactly what the in-process render returns (the tests compare both on every
//! golden template).

use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Condvar, Mutex, OnceLock};

use serde::{Deserialize, Serialize};

use crate::chat_template::{ChatMessage, ChatTemplate};
use crate::isolated::DEEP_STACK_BYTES;
use crate::ModelError;

/// Memory a template's values may take in one render (the worker's data limit is this plus the
/// deep render stack and room for the worker itself).
pub const TEMPLATE_MEMORY_BYTES: u64 = 512 << 20;

/// Wall-clock seconds one render may take in a worker (fuel stops a template within about a
/// second; this bounds what fuel does not count, such as copying large values).
pub const RENDER_SECONDS: u32 = 20;

/// The worker's own needs beside the values: its heap, compiled templates and pipe buffers.
const WORKER_OVERHEAD_BYTES: u64 = 128 << 20;

/// Compiled templates a worker keeps (a server renders with a handful).
const COMPILED_KEPT: usize = 32;

/// One render, as sent to a worker.
#[derive(Debug, Serialize, Deserialize)]
pub struct RenderJob<'a> {
    pub source: Cow<'a, str>,
    pub bos_token: Cow<'a, str>,
    pub eos_token: Cow<'a, str>,
    pub messages: Cow<'a, [ChatMessage]>,
    /// Each tool as the template sees it (maps keep the order written), or none.
    pub tools: Option<Vec<serde_json::Value>>,
    pub add_generation_prompt: bool,
}

/// A worker's answer to one [`RenderJob`].
#[derive(Debug, Serialize, Deserialize)]
pub enum RenderReply {
    Rendered(String),
    /// Over a render limit: [`ModelError::TemplateLimit`].
    Limit(String),
    /// Any other failure: [`ModelError::ChatTemplate`].
    Failed(String),
}

impl RenderReply {
    fn from_result(result: Result<String, ModelError>) -> RenderReply {
        match result {
            Ok(text) => RenderReply::Rendered(text),
            Err(ModelError::TemplateLimit(m)) => RenderReply::Limit(m),
            Err(ModelError::ChatTemplate(m)) => RenderReply::Failed(m),
            Err(other) => RenderReply::Failed(other.to_string()),
        }
    }

    fn into_result(self) -> Result<String, ModelError> {
        match self {
            RenderReply::Rendered(text) => Ok(text),
            RenderReply::Limit(m) => Err(ModelError::TemplateLimit(m)),
            RenderReply::Failed(m) => Err(ModelError::ChatTemplate(m)),
        }
    }
}

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

static POOL: OnceLock<Pool> = OnceLock::new();

/// Makes every chat-template render of this process run in workers started by `command`, at
/// most `max_workers` at once (started when first needed).
pub fn install(command: WorkerCommand, max_workers: usize) -> Result<(), AlreadyInstalled> {
    POOL.set(Pool::new(command, max_workers))
        .map_err(|_| AlreadyInstalled)
}

/// Renders `job` in a worker when a pool is installed; `None` when renders stay in-process.
pub(crate) fn render(job: &RenderJob<'_>) -> Option<Result<String, ModelError>> {
    POOL.get().map(|pool| pool.render(job))
}

/// The worker's side: limits this process's memory and core dumps, then answers jobs from
/// `input` on `output` until `input` ends. Called by the binary's hidden worker command.
pub fn serve_worker(input: impl BufRead, output: impl Write) -> std::io::Result<()> {
    limit_this_process()?;
    answer_jobs(input, output, true)
}

/// Answers one job per line of `input`; with `timed`, each render runs under an alarm of
/// [`RENDER_SECONDS`] (whose default action ends the process).
fn answer_jobs(input: impl BufRead, mut output: impl Write, timed: bool) -> std::io::Result<()> {
    let mut compiled: HashMap<(String, String, String), ChatTemplate> = HashMap::new();
    for line in input.lines() {
        let line = line?;
        let reply = match serde_json::from_str::<RenderJob<'_>>(&line) {
            Ok(job) => {
                if timed {
                    set_alarm(RENDER_SECONDS);
                }
                let result = render_here(&mut compiled, job);
                if timed {
                    set_alarm(0);
                }
                RenderReply::from_result(result)
            }
            Err(e) => RenderReply::Failed(format!("the template worker got a bad job: {e}")),
        };
        let mut text = serde_json::to_string(&reply).map_err(std::io::Error::other)?;
        text.push('\n');
        output.write_all(text.as_bytes())?;
        output.flush()?;
    }
    Ok(())
}

fn render_here(
    compiled: &mut HashMap<(String, String, String), ChatTemplate>,
    job: RenderJob<'_>,
) -> Result<String, ModelError> {
    let key = (
        job.source.into_owned(),
        job.bos_token.into_owned(),
        job.eos_token.into_owned(),
    );
    if !compiled.contains_key(&key) {
        if compiled.len() >= COMPILED_KEPT {
            compiled.clear();
        }
        let template = ChatTemplate::new(key.0.clone(), key.1.clone(), key.2.clone())?;
        compiled.insert(key.clone(), template);
    }
    let template = compiled
        .get(&key)
        .ok_or_else(|| ModelError::ChatTemplate("the compiled template went missing".into()))?;
    template.render_in_process(
        &job.messages,
        job.tools.as_deref(),
        job.add_generation_prompt,
    )
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

    fn render(&self, job: &RenderJob<'_>) -> Result<String, ModelError> {
        let mut worker = self.take()?;
        match worker.exchange(job) {
            Ok(reply) => {
                self.give_back(worker);
                reply.into_result()
            }
            Err(why) => {
                let status = worker.end();
                self.forget_one();
                tracing::warn!(
                    %why,
                    status = %status,
                    "a chat-template worker stopped while rendering"
                );
                Err(stopped_error(&status))
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        // The state stays consistent across a panic (each change is one assignment).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle worker, a new one if fewer than the maximum run, or the next one freed.
    fn take(&self) -> Result<Worker, ModelError> {
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

    fn start(&self) -> Result<Worker, ModelError> {
        let mut child = Command::new(&self.command.program)
            .args(&self.command.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                ModelError::ChatTemplate(format!(
                    "cannot start the chat-template worker {}: {e}",
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
                Err(ModelError::ChatTemplate(
                    "the chat-template worker has no pipes".into(),
                ))
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
    fn exchange(&mut self, job: &RenderJob<'_>) -> Result<RenderReply, String> {
        let mut line = serde_json::to_string(job).map_err(|e| e.to_string())?;
        line.push('\n');
        self.input
            .write_all(line.as_bytes())
            .and_then(|()| self.input.flush())
            .map_err(|e| format!("cannot send the job: {e}"))?;
        let mut reply = String::new();
        match self.output.read_line(&mut reply) {
            Ok(0) => Err("the worker ended without a reply".into()),
            Ok(_) => serde_json::from_str(&reply).map_err(|e| format!("a bad reply: {e}")),
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

/// The client's error for a worker that stopped mid-render: the template went over the memory
/// or time limit (a template cannot end its worker in any other way).
fn stopped_error(status: &str) -> ModelError {
    ModelError::TemplateLimit(format!(
        "rendering the chat template went over the limit of {} MiB of memory or {RENDER_SECONDS} s \
         (its renderer was {status})",
        TEMPLATE_MEMORY_BYTES >> 20
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job<'a>(source: &'a str, messages: &'a [ChatMessage]) -> RenderJob<'a> {
        RenderJob {
            source: source.into(),
            bos_token: "<s>".into(),
            eos_token: "</s>".into(),
            messages: messages.into(),
            tools: None,
            add_generation_prompt: true,
        }
    }

    fn answer(lines: &[String]) -> Vec<RenderReply> {
        let input = lines.join("\n");
        let mut out = Vec::new();
        answer_jobs(input.as_bytes(), &mut out, false).unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn a_worker_answers_each_job_as_the_in_process_render_does() {
        let messages = [ChatMessage::new("user", "Hi \"there\"\n")];
        let source = crate::chat_template::CHATML_TEMPLATE;
        let expected = ChatTemplate::new(source.into(), "<s>".into(), "</s>".into())
            .unwrap()
            .render_in_process::<()>(&messages, None, true)
            .unwrap();
        let line = serde_json::to_string(&job(source, &messages)).unwrap();
        let replies = answer(&[line.clone(), "not json".into(), line]);
        assert_eq!(replies.len(), 3);
        assert!(matches!(&replies[0], RenderReply::Rendered(t) if *t == expected));
        assert!(matches!(&replies[1], RenderReply::Failed(m) if m.contains("bad job")));
        assert!(matches!(&replies[2], RenderReply::Rendered(t) if *t == expected));
    }

    #[test]
    fn a_worker_reports_limits_and_template_errors_as_the_in_process_render_does() {
        let messages = [ChatMessage::new("user", "x")];
        let bomb =
            "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}";
        let broken = "{% for m in messages %}";
        let raising = "{{ raise_exception('no system role') }}";
        let replies = answer(&[
            serde_json::to_string(&job(bomb, &messages)).unwrap(),
            serde_json::to_string(&job(broken, &messages)).unwrap(),
            serde_json::to_string(&job(raising, &messages)).unwrap(),
        ]);
        assert!(matches!(&replies[0], RenderReply::Limit(m) if m.contains("instructions")));
        assert!(matches!(&replies[1], RenderReply::Failed(m) if m.contains("compile")));
        assert!(matches!(&replies[2], RenderReply::Failed(m) if m.contains("no system role")));
    }

    #[test]
    fn tools_keep_the_order_their_keys_were_written_in() {
        let tools = vec![serde_json::json!({"z": 1, "a": {"y": true, "b": null}})];
        let messages = [ChatMessage::new("user", "x")];
        let mut j = job("{{ tools | tojson }}", &messages);
        j.tools = Some(tools);
        let replies = answer(&[serde_json::to_string(&j).unwrap()]);
        assert!(
            matches!(&replies[0], RenderReply::Rendered(t) if t == r#"[{"z": 1, "a": {"y": true, "b": null}}]"#),
            "{replies:?}"
        );
    }
}
