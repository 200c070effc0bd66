//! Reading the user's turns: line editing and history (rustyline), multi-line input, and the
//! slash commands, which never reach the model.

use std::path::PathBuf;

use anyhow::{bail, Result};
use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;

/// What the user typed at the prompt.
#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    /// A message for the model.
    Message(String),
    /// A slash command.
    Command(Command),
    /// Ctrl-C at the prompt: the line was cleared.
    Interrupted,
    /// Ctrl-D at an empty prompt (or the end of piped input).
    Eof,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Help,
    Clear,
    System(String),
    Save(PathBuf),
    Load(PathBuf),
    Exit,
}

pub const HELP: &str = "\
commands (never sent to the model):
  /help          this list
  /clear         forget the conversation (the system message stays)
  /system TEXT   set the system message
  /save FILE     write the conversation as a JSON list of {role, content}
  /load FILE     read a conversation written by /save
  /exit          leave (also /quit, /bye, Ctrl-D, or Ctrl-C twice at the prompt)
input: end a line with \\ to continue it; \"\"\" starts and ends a multi-line block;
start a message with // to send a text beginning with /.
Ctrl-C while the model answers stops the reply.";

/// Parse a slash command (`line` starts with `/`).
pub fn parse_command(line: &str) -> Result<Command> {
    let (name, rest) = match line.split_once(char::is_whitespace) {
        Some((n, r)) => (n, r.trim()),
        None => (line, ""),
    };
    let no_arg = |c: Command| {
        if rest.is_empty() {
            Ok(c)
        } else {
            bail!("{name} takes no argument")
        }
    };
    let path = |make: fn(PathBuf) -> Command| {
        if rest.is_empty() {
            bail!("{name} needs a file name");
        }
        Ok(make(PathBuf::from(rest)))
    };
    match name {
        "/help" | "/?" => no_arg(Command::Help),
        "/clear" | "/reset" => no_arg(Command::Clear),
        "/exit" | "/quit" | "/bye" => no_arg(Command::Exit),
        "/system" => {
            if rest.is_empty() {
                bail!("/system needs the text of the system message");
            }
            Ok(Command::System(rest.to_string()))
        }
        "/save" => path(Command::Save),
        "/load" => path(Command::Load),
        _ => bail!("unknown command {name}; /help lists them (start with // to send a text beginning with /)"),
    }
}

/// The prompt's line editor.
pub struct Reader {
    editor: DefaultEditor,
    history: Option<PathBuf>,
}

impl Reader {
    pub fn new() -> Result<Reader> {
        let mut editor = DefaultEditor::new()?;
        let history = history_path();
        if let Some(h) = &history {
            // A missing or unreadable history is no reason not to chat.
            let _ = editor.load_history(h);
        }
        Ok(Reader { editor, history })
    }

    /// Read one turn: a line, a `\`-continued run of lines, or a `"""` block.
    pub fn read(&mut self) -> Result<Input> {
        let first = match self.line("> ")? {
            Some(l) => l,
            None => return Ok(Input::Eof),
        };
        let Some(first) = first else {
            return Ok(Input::Interrupted);
        };
        let text = if first.trim_start().starts_with("\"\"\"") {
            let mut text = first.trim_start()[3..].to_string();
            if let Some(end) = text.find("\"\"\"") {
                text.truncate(end);
            } else {
                loop {
                    let Some(Some(line)) = self.line("... ")? else {
                        return Ok(Input::Interrupted);
                    };
                    if let Some(end) = line.find("\"\"\"") {
                        push_line(&mut text, &line[..end]);
                        break;
                    }
                    push_line(&mut text, &line);
                }
            }
            text
        } else {
            let mut text = String::new();
            let mut line = first;
            while let Some(cont) = line.strip_suffix('\\') {
                text.push_str(cont);
                text.push('\n');
                let Some(Some(next)) = self.line("... ")? else {
                    return Ok(Input::Interrupted);
                };
                line = next;
            }
            text.push_str(&line);
            text
        };
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return self.read();
        }
        self.remember(&text);
        if let Some(escaped) = trimmed.strip_prefix("//") {
            return Ok(Input::Message(format!("/{escaped}")));
        }
        if trimmed.starts_with('/') && !trimmed.contains('\n') {
            return match parse_command(trimmed) {
                Ok(c) => Ok(Input::Command(c)),
                Err(e) => {
                    eprintln!("{e}");
                    self.read()
                }
            };
        }
        Ok(Input::Message(trimmed.to_string()))
    }

    /// One line: `Some(Some(line))`, `Some(None)` on Ctrl-C, `None` on Ctrl-D / end of input.
    fn line(&mut self, prompt: &str) -> Result<Option<Option<String>>> {
        match self.editor.readline(prompt) {
            Ok(l) => Ok(Some(Some(l))),
            Err(ReadlineError::Interrupted) => Ok(Some(None)),
            Err(ReadlineError::Eof) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn remember(&mut self, text: &str) {
        let _ = self.editor.add_history_entry(text);
        if let Some(h) = &self.history {
            if let Some(dir) = h.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let _ = self.editor.save_history(h);
        }
    }
}

fn push_line(text: &mut String, line: &str) {
    if !text.is_empty() {
        text.push('\n');
    }
    text.push_str(line);
}

/// The history file: `$KILN_HISTORY`, else `chat_history` in kiln's cache directory
/// (`$XDG_CACHE_HOME/kiln`, else `~/.cache/kiln`); `KILN_HISTORY=` (empty) keeps none.
pub fn history_path() -> Option<PathBuf> {
    if let Some(h) = &kiln::tuning::get().history {
        return (!h.as_os_str().is_empty()).then(|| h.clone());
    }
    let xdg = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    let cache = match xdg {
        Some(d) => d,
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache"),
    };
    Some(cache.join("kiln").join("chat_history"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slash_commands_parse() {
        assert_eq!(parse_command("/help").unwrap(), Command::Help);
        assert_eq!(parse_command("/reset").unwrap(), Command::Clear);
        assert_eq!(
            parse_command("/system  be brief ").unwrap(),
            Command::System("be brief".into())
        );
        assert_eq!(
            parse_command("/save a b.json").unwrap(),
            Command::Save("a b.json".into())
        );
        assert!(parse_command("/load").is_err());
        assert!(parse_command("/clear now").is_err());
        assert!(parse_command("/frobnicate")
            .unwrap_err()
            .to_string()
            .contains("unknown command"));
    }
}
