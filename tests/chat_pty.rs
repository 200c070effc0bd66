//! `kiln chat` (and `kiln run` with no prompt) on a pseudo-terminal, as a user types: slash
//! commands that never reach the model, /clear, /system, /save + /load, Ctrl-C and Ctrl-D,
//! and the notice when old turns leave a full context.
#![cfg(unix)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use rexpect::process::WaitStatus;
use rexpect::session::PtySession;

struct Chat {
    p: PtySession,
    dir: PathBuf,
}

impl Chat {
    /// `kiln CMD -m MODEL --temp 0 -v ARGS` on a terminal, in a fresh directory with its own
    /// history file.
    fn start(cmd: &str, tag: &str, args: &[&str]) -> Chat {
        Chat::start_with(&common::random_model("random-llama-q4_0"), cmd, tag, args)
    }

    fn start_with(model: &Path, cmd: &str, tag: &str, args: &[&str]) -> Chat {
        let dir = std::env::temp_dir().join(format!("kiln-chat-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
        c.args([
            cmd,
            "-m",
            model.to_str().unwrap(),
            "--temp",
            "0",
            "-v",
            "-t",
            "1",
        ])
        .args(args)
        .current_dir(&dir)
        .env("KILN_HISTORY", dir.join("history"))
        .env("TERM", "xterm");
        let p = rexpect::session::spawn_with_options(
            c,
            rexpect::reader::Options::new()
                .timeout_ms(Some(60_000))
                .strip_ansi_escape_codes(true),
        )
        .unwrap();
        let mut chat = Chat { p, dir };
        chat.expect("/help lists the commands");
        chat
    }

    fn expect(&mut self, s: &str) -> String {
        self.p
            .exp_string(s)
            .unwrap_or_else(|e| panic!("waiting for {s:?}: {e}"))
    }

    fn line(&mut self, s: &str) {
        self.p.send_line(s).unwrap();
    }

    /// Send a message and wait for the end of the reply (the -v statistics line).
    fn say(&mut self, s: &str) -> String {
        self.line(s);
        self.expect("tok/s]")
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn wait_exit(&mut self) -> i32 {
        match self.p.process().wait().unwrap() {
            WaitStatus::Exited(_, code) => code,
            other => panic!("kiln did not exit: {other:?}"),
        }
    }
}

impl Drop for Chat {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn messages(path: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    let v: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    v.iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap().to_string(),
                m["content"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn slash_commands_never_reach_the_model_and_save_load_round_trips() {
    let mut c = Chat::start("chat", "slash", &["-n", "4", "-c", "512"]);
    c.line("/help");
    c.expect("/save FILE");
    c.line("/frobnicate");
    c.expect("unknown command /frobnicate");
    c.line("/system You are terse.");
    c.expect("[system message set]");
    c.line("/save a.json");
    c.expect("[saved 1 messages");
    // Only the system message: no command became a user turn.
    assert_eq!(
        messages(&c.file("a.json")),
        [("system".into(), "You are terse.".into())]
    );

    let reply = c.say("Hello there");
    // The first turn evaluates everything; the prompt holds the system text.
    assert!(reply.contains("[reused 0 of"), "{reply}");
    c.line("/save b.json");
    c.expect("[saved 3 messages");
    let b = messages(&c.file("b.json"));
    assert_eq!(b[0], ("system".into(), "You are terse.".into()));
    assert_eq!(b[1], ("user".into(), "Hello there".into()));
    assert_eq!(b[2].0, "assistant");

    // A multi-line message: a trailing backslash continues the line.
    c.line("first line \\");
    // (each line is sent once the editor asks for it, as a person types)
    c.expect("... ");
    c.say("second line");
    c.line("/save c.json");
    c.expect("[saved 5 messages");
    let cm = messages(&c.file("c.json"));
    assert_eq!(cm[3], ("user".into(), "first line \nsecond line".into()));

    c.line("/clear");
    c.expect("[conversation cleared]");
    c.line("/save d.json");
    c.expect("[saved 1 messages");
    assert_eq!(messages(&c.file("d.json")), messages(&c.file("a.json")));

    c.line("/load b.json");
    c.expect("[loaded 3 messages");
    c.line("/save e.json");
    c.expect("[saved 3 messages");
    assert_eq!(messages(&c.file("e.json")), b);
    // The loaded conversation is the one the model continues: its prefix is reused from
    // the cache where it matches what was evaluated for b.json's turn.
    let reply = c.say("And again");
    assert!(!reply.contains("[reused 0 of"), "{reply}");

    c.line("/load missing.json");
    c.expect("error: reading missing.json");
    c.line("/exit");
    assert_eq!(c.wait_exit(), 0);
}

#[test]
fn multi_line_blocks_are_one_message() {
    let mut c = Chat::start("chat", "block", &["-n", "2", "-c", "512"]);
    for line in ["\"\"\"", "line one", "line two"] {
        c.line(line);
        // Each line is sent once the editor asks for it, as a person types.
        c.expect("... ");
    }
    c.line("\"\"\"");
    c.expect("tok/s]");
    c.line("/save m.json");
    c.expect("[saved 2 messages");
    let m = messages(&c.file("m.json"));
    assert_eq!(m[0], ("user".into(), "line one\nline two".into()));
    c.p.send_control('d').unwrap();
    assert_eq!(c.wait_exit(), 0);
}

#[test]
fn ctrl_d_at_the_prompt_exits_cleanly() {
    let mut c = Chat::start("chat", "ctrld", &["-n", "2"]);
    c.say("hi there");
    c.p.send_control('d').unwrap();
    assert_eq!(c.wait_exit(), 0);
    // The line went to the history file, for the arrow keys of the next chat.
    let history = std::fs::read_to_string(c.file("history")).unwrap();
    assert!(history.lines().any(|l| l == "hi there"), "{history:?}");
}

#[test]
fn ctrl_c_at_the_prompt_clears_then_exits() {
    let mut c = Chat::start("chat", "ctrlc", &["-n", "2"]);
    c.p.send("half a line").unwrap();
    c.p.send_control('c').unwrap();
    c.expect("Ctrl-C again or Ctrl-D to leave");
    // The line was cleared: the next message is not prefixed by it.
    c.say("whole");
    c.line("/save s.json");
    c.expect("[saved 2 messages");
    assert_eq!(
        messages(&c.file("s.json"))[0],
        ("user".into(), "whole".into())
    );
    c.p.send_control('c').unwrap();
    c.expect("Ctrl-C again");
    c.p.send_control('c').unwrap();
    assert_eq!(c.wait_exit(), 0);
}

#[test]
fn ctrl_c_during_a_reply_stops_it_and_returns_to_the_prompt() {
    // An unbounded reply (-n -1, --ignore-eos) of a real model in a large context: only Ctrl-C
    // ends it soon.
    let model = common::real_model("smollm2");
    let mut c = Chat::start_with(
        &model,
        "chat",
        "stop",
        &["-n", "-1", "--ignore-eos", "-c", "8192"],
    );
    c.line("tell me everything");
    // Wait for the reply to be under way (the terminal is out of the line editor's raw mode).
    c.expect("everything");
    c.p.exp_regex("\\n[^\\s]").unwrap();
    c.p.send_control('c').unwrap();
    c.expect("[stopped]");
    c.line("/save r.json");
    c.expect("[saved 2 messages");
    c.p.send_control('d').unwrap();
    assert_eq!(c.wait_exit(), 0);
}

#[test]
fn a_full_context_drops_the_oldest_turns_but_keeps_the_system_message() {
    // 256 tokens (the ChatML prompt of a turn is about 80 of the random model's tokens): each
    // unbounded reply fills the context, so the next turn must drop the previous one.
    let mut c = Chat::start(
        "chat",
        "full",
        &["-n", "-1", "--ignore-eos", "-c", "256", "-sys", "sys"],
    );
    let first = c.say("one");
    assert!(first.contains("[context full: reply cut"), "{first}");
    c.line("two");
    c.expect("[context full: dropped the 2 oldest messages; the system message is kept]");
    let second = c.expect("tok/s]");
    // The system message's tokens were still in the cache and were not evaluated again.
    assert!(!second.contains("[reused 0 of"), "{second}");
    c.line("/save f.json");
    c.expect("[saved");
    let m = messages(&c.file("f.json"));
    assert_eq!(m[0], ("system".into(), "sys".into()));
    assert_eq!(m[1], ("user".into(), "two".into()));
    c.line("/exit");
    assert_eq!(c.wait_exit(), 0);
}

#[test]
fn run_with_no_prompt_on_a_terminal_is_a_chat() {
    let mut c = Chat::start("run", "run", &["-n", "2"]);
    c.say("hi");
    c.line("/exit");
    assert_eq!(c.wait_exit(), 0);
}
