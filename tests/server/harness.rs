//! A `kiln serve` process for the server tests, and raw HTTP/1.1 over TCP (so that tests can
//! send what no well-behaved client would).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A `kiln serve` process, killed on drop.
pub struct Server {
    pub child: Child,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    /// `127.0.0.1:PORT`
    pub addr: String,
}

impl Server {
    /// Start `kiln serve --port 0 -c 1024 -m MODEL EXTRA...` and wait until it listens.
    pub fn start(model: &Path, extra: &[&str]) -> Server {
        Server::start_with(model, extra, &[], "kiln: listening on ")
    }

    /// [`Server::start`] with environment variables `env`, returning once stderr has shown
    /// `line` followed by the URL (`"kiln: bound to "`: the port answers, the model may still
    /// be loading; `"kiln: listening on "`: ready).
    pub fn start_with(model: &Path, extra: &[&str], env: &[(&str, &str)], line: &str) -> Server {
        Server::launch(model, 1024, extra, env, line)
    }

    /// [`Server::start`] with a context of `ctx` tokens.
    pub fn start_ctx(model: &Path, ctx: usize, extra: &[&str]) -> Server {
        Server::launch(model, ctx, extra, &[], "kiln: listening on ")
    }

    fn launch(
        model: &Path,
        ctx: usize,
        extra: &[&str],
        env: &[(&str, &str)],
        line: &str,
    ) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["serve", "--port", "0", "-c", &ctx.to_string(), "-m"])
            .arg(model)
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kiln serve");
        let stderr = child.stderr.take().expect("piped stderr");
        let mut lines = BufReader::new(stderr).lines();
        let want = line;
        let url = loop {
            let line = lines
                .next()
                .expect("kiln serve exited before listening")
                .expect("read stderr");
            if let Some(u) = line.strip_prefix(want) {
                break u.split([';', ' ']).next().unwrap_or_default().to_string();
            }
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if std::env::var_os("KILN_TEST_SERVER_LOG").is_some() {
                    eprintln!("[server] {line}");
                }
            }
        });
        let addr = url.trim_start_matches("http://").to_string();
        Server { child, url, addr }
    }

    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(&self.addr).expect("connect to kiln serve");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s
    }

    /// Send `raw` on a new connection and read the answer until the server closes it.
    pub fn raw(&self, raw: &[u8]) -> Answer {
        let mut s = self.connect();
        s.write_all(raw).expect("send request");
        read_answer(&mut s)
    }

    /// A request with `Connection: close`.
    pub fn request(&self, method: &str, path: &str, headers: &[&str], body: &str) -> Answer {
        let mut raw =
            format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
        for h in headers {
            raw.push_str(h);
            raw.push_str("\r\n");
        }
        if !body.is_empty() || method == "POST" {
            raw.push_str("Content-Type: application/json\r\n");
            raw.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        raw.push_str("\r\n");
        raw.push_str(body);
        self.raw(raw.as_bytes())
    }

    /// A metric's value from `/metrics` (the full series name, labels included).
    pub fn metric(&self, series: &str, headers: &[&str]) -> Option<f64> {
        let a = self.request("GET", "/metrics", headers, "");
        assert_eq!(a.status, 200, "{}", a.text());
        a.text().lines().find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok())?
        })
    }

    /// SIGTERM.
    pub fn terminate(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -TERM failed");
    }

    /// The exit status, if the process exits within `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if let Some(s) = self.child.try_wait().expect("wait for kiln serve") {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "answer {} is not JSON ({e}): {:?}",
                self.status,
                self.text()
            )
        })
    }

    /// Assert OpenAI's error shape with this status; the error object.
    pub fn expect_error(&self, status: u16, what: &str) -> serde_json::Value {
        assert_eq!(self.status, status, "{what}: {}", self.text());
        assert_eq!(
            self.header("content-type"),
            Some("application/json"),
            "{what}: {:?}",
            self.headers
        );
        let v = self.json();
        let e = &v["error"];
        assert!(
            e["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {v}"
        );
        assert!(
            e["type"].as_str().is_some_and(|t| !t.is_empty()),
            "{what}: {v}"
        );
        for key in ["param", "code"] {
            assert!(e.get(key).is_some(), "{what}: no `{key}` in {v}");
        }
        e.clone()
    }
}

/// The JSON events of a Server-Sent Events body, up to `data: [DONE]`.
pub fn sse_events(body: &str) -> Vec<serde_json::Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .take_while(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("event {d:?}: {e}")))
        .collect()
}

/// Read a status line and headers (up to the blank line).
pub fn read_head(s: &mut TcpStream) -> (u16, Vec<(String, String)>) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(0) => panic!(
                "connection closed in the head: {:?}",
                String::from_utf8_lossy(&head)
            ),
            Ok(_) => head.push(byte[0]),
            Err(e) => panic!(
                "reading the head: {e} after {:?}",
                String::from_utf8_lossy(&head)
            ),
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers)
}

/// Read a whole answer: the head, then the body by Content-Length or to the end.
pub fn read_answer(s: &mut TcpStream) -> Answer {
    let (status, headers) = read_head(s);
    let mut body = Vec::new();
    let len = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok());
    match len {
        Some(n) => {
            body.resize(n, 0);
            s.read_exact(&mut body).expect("read the body");
        }
        None => {
            let _ = s.read_to_end(&mut body);
        }
    }
    Answer {
        status,
        headers,
        body,
    }
}

/// Wait until the server closes `s` (a read returns end of file or a reset); how long it took,
/// or `None` if it was still open after `limit`. Bytes the server sends first are ignored.
pub fn wait_closed(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 4096];
    while start.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(start.elapsed()),
        }
    }
    None
}
