//! `pagoda run`'s interactive chat in a pseudo-terminal, as a person types it: the line
//! editor's prompt, `/` commands answered and never sent to the model, Ctrl-C stopping an
//! answer while the session goes on, `"""` multi-line input, `/bye` leaving with exit 0.

use super::{stderr, tiny_gguf_with, Env, TINY_H, TINY_VOCAB};
use rexpect::process::WaitStatus;
use rexpect::session::spawn_command;

/// A tiny model whose greedy answer never ends before its context is full: its output head
/// scores `a` (token 1) and `b` (token 2) as plus and minus the sum of the hidden state, and
/// every other token (the end of text among them) zero, so one of the two always wins.
fn endless_model(env: &Env) -> std::path::PathBuf {
    let mut head = vec![0.0f32; TINY_VOCAB * TINY_H];
    head[TINY_H..2 * TINY_H].fill(1.0);
    head[2 * TINY_H..3 * TINY_H].fill(-1.0);
    env.file("endless.gguf", &tiny_gguf_with(1, 32768, Some(head)))
}

#[test]
fn the_chat_answers_commands_stops_on_ctrl_c_and_keeps_the_session() {
    let env = Env::new();
    let model = endless_model(&env);
    // Before the pty: the model loads and the answer really is long (so Ctrl-C lands in it).
    let o = env.run(&[
        "run",
        model.to_str().unwrap(),
        "hi",
        "--max-tokens",
        "64",
        "--ctx-size",
        "32768",
        "--temperature",
        "0",
        "--verbose",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("answer: 64 tokens"), "{}", stderr(&o));

    let mut command = env.cmd();
    command.env("TERM", "xterm").args([
        "run",
        model.to_str().unwrap(),
        "--max-tokens",
        "30000",
        "--ctx-size",
        "32768",
        "--temperature",
        "0",
        "--verbose",
    ]);
    let mut p = spawn_command(command, Some(60_000)).expect("start pagoda in a pty");
    let step = |what: &str, r: Result<String, rexpect::error::Error>| {
        r.unwrap_or_else(|e| panic!("{what}: {e}"))
    };
    step("the prompt", p.exp_string(">>> "));

    p.send_line("/?").unwrap();
    step(
        "help",
        p.exp_string("/set            Set session variables"),
    );
    step(
        "help",
        p.exp_string("Use \"\"\" to begin a multi-line message."),
    );
    step("the prompt", p.exp_string(">>> "));
    p.send_line("/help set").unwrap();
    step("help of /set", p.exp_string("/set parameter ..."));
    p.send_line("/nonsense").unwrap();
    step(
        "unknown",
        p.exp_string("Unknown command '/nonsense'. Type /? for help"),
    );
    p.send_line("/set parameter mirostat 2").unwrap();
    step(
        "unknown parameter",
        p.exp_string("unknown parameter 'mirostat'"),
    );
    p.send_line("/show info").unwrap();
    step("/show info", p.exp_string("architecture"));
    step("/show info", p.exp_string("session context"));
    step("the prompt", p.exp_string(">>> "));

    // A long answer, stopped by Ctrl-C once it streams.
    p.send_line("tell me everything").unwrap();
    step(
        "the answer streams",
        p.exp_regex("[ab]{16}").map(|(_, m)| m),
    );
    p.send_control('c').unwrap();
    step("stopped", p.exp_string("finish: stopped"));
    step("the prompt again", p.exp_string(">>> "));

    // The session goes on: settings change, and the next prompt is answered in full.
    p.send_line("/set parameter num_predict 3").unwrap();
    step("set", p.exp_string("Set parameter 'num_predict' to '3'"));
    p.send_line("and now?").unwrap();
    step("a second answer", p.exp_string("answer: 3 tokens"));
    step("a second answer", p.exp_string("finish: Length"));

    // """ opens a block: its lines are one prompt, sent when it closes.
    step("the prompt", p.exp_string(">>> "));
    p.send_line("\"\"\"first line").unwrap();
    step("the block's prompt", p.exp_string("... "));
    p.send_line("/bye is text in a block").unwrap();
    step("the block's prompt", p.exp_string("... "));
    p.send_line("last line\"\"\"").unwrap();
    step("one answer to the block", p.exp_string("answer: 3 tokens"));
    step("the prompt", p.exp_string(">>> "));

    // Ctrl-C at the prompt does not leave.
    p.send_control('c').unwrap();
    step("the hint", p.exp_string("Use Ctrl + d or /bye to exit."));
    p.send_line("/clear").unwrap();
    step("cleared", p.exp_string("Cleared session context"));
    p.send_line("/bye").unwrap();
    step("the end", p.exp_eof());
    match p.process().wait() {
        Ok(WaitStatus::Exited(_, code)) => assert_eq!(code, 0),
        other => panic!("pagoda run did not exit normally: {other:?}"),
    }
}

#[test]
fn ctrl_d_leaves_the_chat() {
    let env = Env::new();
    let model = endless_model(&env);
    let mut command = env.cmd();
    command
        .env("TERM", "xterm")
        .args(["run", model.to_str().unwrap(), "--ctx-size", "512"]);
    let mut p = spawn_command(command, Some(60_000)).expect("start pagoda in a pty");
    p.exp_string(">>> ").expect("the prompt");
    p.send_control('d').unwrap();
    p.exp_eof().expect("the end");
    match p.process().wait() {
        Ok(WaitStatus::Exited(_, code)) => assert_eq!(code, 0),
        other => panic!("pagoda run did not exit normally: {other:?}"),
    }
}
