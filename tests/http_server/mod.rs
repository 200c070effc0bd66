//! A small HTTP/1.1 file server for the download tests, on 127.0.0.1 with a free port. It
//! answers GET with whole files (200) or byte ranges (`Range: bytes=N-` → 206 with
//! `Content-Range`, or 416 past the end), records every request it sees, and misbehaves on
//! purpose when a route says so: drop the connection after some bytes, ignore `Range`, send a
//! `Content-Range` that does not fit, answer with an error status, redirect, or stall.
#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the server does for one path.
#[derive(Clone, Default)]
pub struct Route {
    pub body: Vec<u8>,
    /// Sent as `ETag` (quoted by the server).
    pub etag: Option<String>,
    /// Answer 200 with the whole body even when a range is asked for.
    pub ignore_range: bool,
    /// Answer a range request with a 206 whose `Content-Range` starts at 0.
    pub bad_content_range: bool,
    /// For the next requests, one entry each: send only this many body bytes, then close.
    pub drops: VecDeque<usize>,
    /// Answer this status (with a short text body) instead.
    pub status: Option<u16>,
    /// Answer `302 Found` to this location instead.
    pub redirect: Option<String>,
    /// Send the headers, then this many body bytes, then wait this long (or until
    /// [`Server::release`]) before closing.
    pub stall: Option<(usize, Duration)>,
}

impl Route {
    pub fn file(body: &[u8]) -> Route {
        Route {
            body: body.to_vec(),
            etag: Some("v1".to_string()),
            ..Route::default()
        }
    }
}

/// One request as the server saw it (header names in lower case).
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub headers: Vec<(String, String)>,
    /// The status answered.
    pub status: u16,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct State {
    routes: HashMap<String, Route>,
    seen: Vec<Seen>,
    released: bool,
}

pub struct Server {
    port: u16,
    state: Arc<Mutex<State>>,
}

impl Server {
    pub fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a local port");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let st = st.clone();
                std::thread::spawn(move || handle(conn, &st));
            }
        });
        Server { port, state }
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn route(&self, path: &str, route: Route) {
        self.state
            .lock()
            .unwrap()
            .routes
            .insert(path.to_string(), route);
    }

    /// Change a route in place.
    pub fn edit(&self, path: &str, f: impl FnOnce(&mut Route)) {
        f(self
            .state
            .lock()
            .unwrap()
            .routes
            .get_mut(path)
            .expect("route"))
    }

    /// End every stall now (and every later one at once).
    pub fn release(&self) {
        self.state.lock().unwrap().released = true;
    }

    /// Every request so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }
}

fn handle(mut conn: TcpStream, state: &Mutex<State>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
        return;
    }
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let target = request_line.split_whitespace().nth(1).unwrap_or("/");
    let path = target.split('?').next().unwrap_or("/").to_string();

    // Decide the answer under the lock, write it without.
    let (status, head, body, drop_after, stall) = {
        let mut st = state.lock().unwrap();
        let range = headers
            .iter()
            .find(|(k, _)| k == "range")
            .and_then(|(_, v)| v.strip_prefix("bytes="))
            .and_then(|v| v.strip_suffix('-'))
            .and_then(|v| v.parse::<usize>().ok());
        let answer = match st.routes.get_mut(&path) {
            None => (404, String::new(), b"no such file\n".to_vec(), None, None),
            Some(r) => {
                let drop_after = r.drops.pop_front();
                let etag = r
                    .etag
                    .as_ref()
                    .map(|e| format!("ETag: \"{e}\"\r\n"))
                    .unwrap_or_default();
                let len = r.body.len();
                if let Some(s) = r.status {
                    (
                        s,
                        String::new(),
                        format!("error {s}\n").into_bytes(),
                        None,
                        None,
                    )
                } else if let Some(to) = &r.redirect {
                    (302, format!("Location: {to}\r\n"), Vec::new(), None, None)
                } else {
                    match range {
                        Some(n) if !r.ignore_range && n >= len => (
                            416,
                            format!("Content-Range: bytes */{len}\r\n"),
                            Vec::new(),
                            None,
                            None,
                        ),
                        Some(n) if !r.ignore_range => {
                            let start = if r.bad_content_range { 0 } else { n };
                            (
                                206,
                                format!(
                                    "{etag}Accept-Ranges: bytes\r\nContent-Range: bytes {start}-{}/{len}\r\n",
                                    len - 1
                                ),
                                r.body[start..].to_vec(),
                                drop_after,
                                r.stall,
                            )
                        }
                        _ => {
                            let ranges = if r.ignore_range {
                                ""
                            } else {
                                "Accept-Ranges: bytes\r\n"
                            };
                            (
                                200,
                                format!("{etag}{ranges}"),
                                r.body.clone(),
                                drop_after,
                                r.stall,
                            )
                        }
                    }
                }
            }
        };
        st.seen.push(Seen {
            path: path.clone(),
            headers,
            status: answer.0,
        });
        answer
    };
    let reason = match status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\n{head}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = conn.write_all(head.as_bytes());
    let send = drop_after
        .or(stall.map(|(n, _)| n))
        .unwrap_or(body.len())
        .min(body.len());
    let _ = conn.write_all(&body[..send]);
    let _ = conn.flush();
    if let Some((_, wait)) = stall {
        let step = Duration::from_millis(10);
        let mut waited = Duration::ZERO;
        while waited < wait && !state.lock().unwrap().released {
            std::thread::sleep(step);
            waited += step;
        }
    }
    let _ = conn.shutdown(Shutdown::Both);
}
