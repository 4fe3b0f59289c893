//! The interactive chat of `pagoda run` (no prompt given), as `ollama run` has it: a line
//! editor with history on a terminal, `/` commands (`/?`, `/help`, `/bye`, `/clear`,
//! `/show ...`, `/set parameter NAME VALUE`, `/set system ...`), `"""` multi-line input,
//! Ctrl-C stopping the answer being written, Ctrl-D leaving.
//!
//! Invariants: a line starting with `/` is never sent to the model (an unknown command gets
//! a message); Ctrl-C during an answer stops it and keeps the session and the conversation
//! (the prompt stays, the partial answer is dropped, as Ollama does); Ctrl-C at the prompt
//! clears the line, and only `/bye` or Ctrl-D (end of input) leave. Messages of the chat go to
//! stderr, answers to stdout.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use rustyline::error::ReadlineError;

use super::run_params::{Params, SETTABLE};

/// Where the lines come from: the line editor on a terminal (editing, history), else plain
/// lines of stdin (a pipe, a file).
enum LineSource {
    Editor(Box<rustyline::DefaultEditor>),
    Plain(std::io::Lines<std::io::StdinLock<'static>>),
}

/// One read of [`LineSource`].
enum Read {
    Line(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    /// Ctrl-D or the end of the input.
    End,
}

impl LineSource {
    /// The editor when stdin and stdout are both terminals.
    fn new() -> anyhow::Result<Self> {
        if std::io::stdin().is_terminal() && std::io::stdout().is_terminal() {
            let editor = rustyline::DefaultEditor::new().context("starting the line editor")?;
            Ok(LineSource::Editor(Box::new(editor)))
        } else {
            Ok(LineSource::Plain(std::io::stdin().lock().lines()))
        }
    }

    fn read(&mut self, prompt: &str) -> anyhow::Result<Read> {
        match self {
            LineSource::Editor(editor) => match editor.readline(prompt) {
                Ok(line) => {
                    if !line.trim().is_empty() {
                        // A history that fails to grow still leaves the chat usable.
                        let _ = editor.add_history_entry(line.as_str());
                    }
                    Ok(Read::Line(line))
                }
                Err(ReadlineError::Interrupted) => Ok(Read::Interrupted),
                Err(ReadlineError::Eof) => Ok(Read::End),
                Err(e) => Err(e).context("reading the prompt"),
            },
            LineSource::Plain(lines) => {
                eprint!("{prompt}");
                std::io::stderr().flush().ok();
                match lines.next() {
                    Some(line) => Ok(Read::Line(line.context("reading the prompt from stdin")?)),
                    None => Ok(Read::End),
                }
            }
        }
    }
}

/// What one complete input asks for.
#[derive(Debug, PartialEq)]
pub enum Input {
    /// Text for the model.
    Prompt(String),
    /// `/?` or `/help`, with the topic (`set`, `show`, `shortcuts`).
    Help(Option<String>),
    Bye,
    Clear,
    /// `/show TOPIC` (`None`: the list of topics).
    Show(Option<String>),
    /// `/set parameter NAME VALUE...` (`None`: the list of parameters).
    SetParameter(Option<(String, Vec<String>)>),
    /// `/set system TEXT`.
    SetSystem(String),
    /// `/set` alone, or with something it does not know (the text after `/set`).
    SetUsage(Option<String>),
    /// A `/` command this chat does not have.
    Unknown(String),
}

/// A `"""` block being read.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Block {
    Prompt,
    System,
}

/// Turns lines into [`Input`]s, holding a `"""` block until its closing `"""`.
#[derive(Debug, Default)]
pub struct InputReader {
    block: Option<(Block, String)>,
}

impl InputReader {
    /// Whether a `"""` block is open (the prompt shows `... `).
    pub fn in_block(&self) -> bool {
        self.block.is_some()
    }

    /// Drops an open block (Ctrl-C).
    pub fn reset(&mut self) {
        self.block = None;
    }

    /// One line; `None` while a block is open or for an empty line.
    pub fn feed(&mut self, line: &str) -> Option<Input> {
        if let Some((kind, mut text)) = self.block.take() {
            return match line.strip_suffix(r#"""""#) {
                Some(last) => {
                    text.push_str(last);
                    Some(match kind {
                        Block::Prompt => Input::Prompt(text),
                        Block::System => Input::SetSystem(text),
                    })
                }
                None => {
                    text.push_str(line);
                    text.push('\n');
                    self.block = Some((kind, text));
                    None
                }
            };
        }
        if let Some(rest) = line.strip_prefix(r#"""""#) {
            return self.open(Block::Prompt, rest);
        }
        let trimmed = line.trim();
        if trimmed.is_empty() {
            return None;
        }
        if !trimmed.starts_with('/') {
            return Some(Input::Prompt(line.to_string()));
        }
        let mut words = trimmed.split_whitespace();
        let command = words.next().unwrap_or_default();
        let topic = words.next().map(String::from);
        Some(match command {
            "/?" | "/help" => Input::Help(topic),
            "/bye" | "/exit" => Input::Bye,
            "/clear" => Input::Clear,
            "/show" => Input::Show(topic),
            "/set" => match topic.as_deref() {
                Some("parameter") => Input::SetParameter(words.next().map(|name| {
                    (
                        name.to_string(),
                        words.map(String::from).collect::<Vec<_>>(),
                    )
                })),
                Some("system") => {
                    let text = trimmed
                        .strip_prefix("/set")
                        .map(str::trim_start)
                        .and_then(|t| t.strip_prefix("system"))
                        .map(str::trim_start)
                        .unwrap_or_default();
                    if text.is_empty() {
                        Input::SetUsage(Some("system".into()))
                    } else if let Some(rest) = text.strip_prefix(r#"""""#) {
                        return self.open(Block::System, rest);
                    } else {
                        Input::SetSystem(text.to_string())
                    }
                }
                _ => Input::SetUsage(topic),
            },
            other => Input::Unknown(other.to_string()),
        })
    }

    /// Starts a `"""` block with `rest` (the text after the opening quotes); a block closed on
    /// the same line is complete at once.
    fn open(&mut self, kind: Block, rest: &str) -> Option<Input> {
        if let Some(whole) = rest.strip_suffix(r#"""""#) {
            return Some(match kind {
                Block::Prompt => Input::Prompt(whole.to_string()),
                Block::System => Input::SetSystem(whole.to_string()),
            });
        }
        let mut text = rest.to_string();
        text.push('\n');
        self.block = Some((kind, text));
        None
    }
}

/// `/?` and `/help`.
pub const HELP: &str = "\
Available Commands:
  /set            Set session variables
  /show           Show model information
  /clear          Clear session context
  /bye            Exit
  /?, /help       Help for a command
  /? shortcuts    Help for keyboard shortcuts

Use \"\"\" to begin a multi-line message.
";

const HELP_SET: &str = "\
Available Commands:
  /set parameter ...     Set a parameter
  /set system <string>   Set system message
";

const HELP_SHOW: &str = "\
Available Commands:
  /show info         Show details for this model
  /show parameters   Show parameters for this session
  /show system       Show system message
  /show template     Show prompt template
";

const HELP_SHORTCUTS: &str = "\
Available keyboard shortcuts:
  Ctrl + a            Move to the beginning of the line (Home)
  Ctrl + e            Move to the end of the line (End)
  Ctrl + k            Delete the sentence after the cursor
  Ctrl + u            Delete the sentence before the cursor
  Ctrl + w            Delete the word before the cursor
  Up / Down           Earlier / later prompts (history)

  Ctrl + l            Clear the screen
  Ctrl + c            Stop the model from responding
  Ctrl + d            Exit (/bye)
";

/// The help for a topic of `/? TOPIC`.
fn help(topic: Option<&str>) -> String {
    match topic {
        None => HELP.to_string(),
        Some("set" | "/set") => HELP_SET.to_string(),
        Some("show" | "/show") => HELP_SHOW.to_string(),
        Some("shortcut" | "shortcuts") => HELP_SHORTCUTS.to_string(),
        Some(other) => format!("No help for '{other}'.\n{HELP}"),
    }
}

/// `/set parameter` alone: what can be set.
fn parameter_usage() -> String {
    let mut out = String::from("Available Parameters:\n");
    for (name, what) in SETTABLE {
        out.push_str(&format!("  /set parameter {name} {what}\n"));
    }
    out
}

/// What the chat needs from the session it drives.
pub trait Chat {
    /// Answers `prompt`, stopping early when `stop` is set; the conversation keeps the
    /// prompt either way, and the answer only when it was not stopped.
    fn answer(&mut self, prompt: &str, params: &Params, stop: &AtomicBool) -> anyhow::Result<()>;
    /// Forgets the conversation (the system message stays).
    fn clear(&mut self);
    /// Sets the system message (first in the conversation from now on).
    fn set_system(&mut self, text: String);
    /// `/show TOPIC` for the model's topics (`info`, `system`, `template`); `None` when the
    /// topic is unknown.
    fn show(&self, topic: &str) -> Option<String>;
}

/// Runs the chat until `/bye` or the end of input.
pub fn run(chat: &mut dyn Chat, params: &mut Params, model: &str) -> anyhow::Result<()> {
    // Ctrl-C from here on stops an answer instead of ending the process (at the prompt the
    // editor reads it as a key).
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))
        .context("installing the Ctrl-C handler")?;
    let mut lines = LineSource::new()?;
    eprintln!("Chatting with {model}. Send a message (/? for help, /bye or Ctrl-D to leave).");
    let mut reader = InputReader::default();
    loop {
        let prompt = if reader.in_block() { "... " } else { ">>> " };
        let line = match lines.read(prompt)? {
            Read::Line(line) => line,
            Read::Interrupted => {
                reader.reset();
                eprintln!("Use Ctrl + d or /bye to exit.");
                continue;
            }
            Read::End => break,
        };
        let Some(input) = reader.feed(&line) else {
            continue;
        };
        match input {
            Input::Prompt(text) => {
                stop.store(false, Ordering::SeqCst);
                if let Err(e) = chat.answer(&text, params, &stop) {
                    // One bad turn (say, a prompt longer than the context) doesn't end it.
                    eprintln!("error: {e:#}");
                }
            }
            Input::Help(topic) => eprint!("{}", help(topic.as_deref())),
            Input::Bye => break,
            Input::Clear => {
                chat.clear();
                eprintln!("Cleared session context");
            }
            Input::Show(None) => eprint!("{HELP_SHOW}"),
            Input::Show(Some(topic)) if topic == "parameters" => {
                eprintln!("Session parameters:");
                for (name, value) in params.rows() {
                    eprintln!("  {name:<30} {value}");
                }
            }
            Input::Show(Some(topic)) => match chat.show(&topic) {
                Some(text) => eprintln!("{}", text.trim_end()),
                None => eprintln!("Unknown command '/show {topic}'. Type /? for help"),
            },
            Input::SetParameter(None) => eprint!("{}", parameter_usage()),
            Input::SetParameter(Some((name, values))) => {
                let values: Vec<&str> = values.iter().map(String::as_str).collect();
                match params.set(&name, &values) {
                    Ok(said) => eprintln!("{said}"),
                    Err(why) => eprintln!("Couldn't set parameter: {why}"),
                }
            }
            Input::SetSystem(text) => {
                chat.set_system(text);
                eprintln!("Set system message.");
            }
            Input::SetUsage(None) => eprint!("{HELP_SET}"),
            Input::SetUsage(Some(what)) if what == "system" => eprint!("{HELP_SET}"),
            Input::SetUsage(Some(what)) => {
                eprintln!("Unknown command '/set {what}'. Type /? for help")
            }
            Input::Unknown(command) => {
                eprintln!("Unknown command '{command}'. Type /? for help")
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(lines: &[&str]) -> Vec<Input> {
        let mut r = InputReader::default();
        lines.iter().filter_map(|l| r.feed(l)).collect()
    }

    #[test]
    fn commands_are_read_and_never_sent_as_prompts() {
        assert_eq!(
            all(&["/?", "/help show", "/bye", "/clear", "/show info", "/what"]),
            [
                Input::Help(None),
                Input::Help(Some("show".into())),
                Input::Bye,
                Input::Clear,
                Input::Show(Some("info".into())),
                Input::Unknown("/what".into()),
            ]
        );
        assert_eq!(
            all(&[
                "/set parameter temperature 0.2",
                "/set parameter",
                "/set foo",
                "/set"
            ]),
            [
                Input::SetParameter(Some(("temperature".into(), vec!["0.2".into()]))),
                Input::SetParameter(None),
                Input::SetUsage(Some("foo".into())),
                Input::SetUsage(None),
            ]
        );
        assert_eq!(
            all(&["/set system You are   terse.", "", "  ", "hello /there"]),
            [
                Input::SetSystem("You are   terse.".into()),
                Input::Prompt("hello /there".into()),
            ]
        );
    }

    #[test]
    fn triple_quotes_make_one_multi_line_input() {
        let mut r = InputReader::default();
        assert_eq!(r.feed(r#""""first"#), None);
        assert!(r.in_block());
        assert_eq!(r.feed("/bye is text here"), None);
        assert_eq!(
            r.feed(r#"last""""#),
            Some(Input::Prompt("first\n/bye is text here\nlast".into()))
        );
        assert!(!r.in_block());
        assert_eq!(
            all(&[r#""""one line""""#]),
            [Input::Prompt("one line".into())]
        );
        assert_eq!(
            all(&[r#"/set system """Be"#, r#"brief.""""#]),
            [Input::SetSystem("Be\nbrief.".into())]
        );
        r.feed(r#"""""#);
        r.reset();
        assert_eq!(r.feed("/clear"), Some(Input::Clear));
    }

    #[test]
    fn help_names_every_command() {
        for command in ["/set", "/show", "/clear", "/bye", "/?", "\"\"\""] {
            assert!(HELP.contains(command), "{command}");
        }
        assert!(help(Some("set")).contains("/set parameter"));
        assert!(parameter_usage().contains("num_predict"));
    }
}
