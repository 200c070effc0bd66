//! The HTTP routes: the router, the checks every request passes first (metrics, API keys,
//! browser origins and hosts), and OpenAI's handlers; each request becomes its job in
//! [`super::jobs`].

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use axum::body::{Body, HttpBody};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use super::api::{self, ChatRequest, CompletionRequest};
use super::error::ApiError;
use super::jobs::{chat_job, check_model, completion_job, read_body, tool_error};
use super::metrics::{self, HttpMetrics, Status};
use super::respond;
use super::tenant::{key_matches, KEY};
use super::AppState;

type St = State<Arc<AppState>>;

pub(super) fn router(state: Arc<AppState>) -> Router {
    let mut keyed = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(super::embeddings::embeddings))
        .route("/v1/models", get(models))
        .route("/tokenize", post(super::tokens::tokenize))
        .route("/detokenize", post(super::tokens::detokenize))
        .route("/apply-template", post(super::tokens::apply_template))
        .route("/props", get(super::tokens::props))
        .route("/completion", post(super::native::completion))
        .route("/completions", post(super::native::completion))
        .route("/infill", post(super::native::infill))
        .merge(super::ollama::routes())
        .merge(super::anthropic::routes())
        .merge(super::responses::routes())
        .merge(super::rerank::routes());
    let mut open = Router::new().route("/health", get(health));
    if state.opts.webui {
        open = open.merge(super::webui::routes());
    }
    if state.opts.metrics_public {
        open = open.route("/metrics", get(prometheus));
    } else {
        keyed = keyed.route("/metrics", get(prometheus));
    }
    let keyed = keyed.route_layer(middleware::from_fn_with_state(Arc::clone(&state), auth));
    Router::new()
        .merge(keyed)
        .merge(open)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(Arc::clone(&state), guard))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), count))
        .with_state(state)
}

/// The routes `/metrics` counts by name (any other path is `other`).
const COUNTED: [&str; 13] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/completion",
    "/completions",
    "/infill",
    "/v1/embeddings",
    "/v1/models",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/props",
    "/health",
    "/metrics",
];

/// Records a request as `cancelled` if it is dropped before its answer (the client left).
struct Pending {
    http: Arc<HttpMetrics>,
    endpoint: &'static str,
    answered: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.answered {
            self.http.record_status(self.endpoint, Status::Cancelled);
        }
    }
}

/// Count every answer by route and status, a request whose client left as `cancelled`; and
/// make sure no error leaves without OpenAI's JSON body.
async fn count(State(st): St, req: Request, next: Next) -> Response {
    let ep = req
        .extensions()
        .get::<MatchedPath>()
        .and_then(|m| {
            let mut paths = (COUNTED.iter().chain(&super::ollama::PATHS))
                .chain(&super::anthropic::PATHS)
                .chain(&super::responses::PATHS);
            paths.find(|p| **p == m.as_str())
        })
        .copied()
        .unwrap_or("other");
    let mut pending = Pending {
        http: Arc::clone(&st.http),
        endpoint: ep,
        answered: false,
    };
    let r = next.run(req).await;
    pending.answered = true;
    st.http.record(ep, r.status().as_u16());
    json_error_body(r)
}

/// An error answer without a body gets OpenAI's JSON one. Every error of ours has a body
/// already; this covers what axum might answer by itself, and makes sure that io.rs, which
/// takes a bodiless error head for hyper's own answer, never sees one from the service.
fn json_error_body(r: Response) -> Response {
    let status = r.status();
    let bodiless = r.body().size_hint().exact() == Some(0);
    if !(status.is_client_error() || status.is_server_error()) || !bodiless {
        return r;
    }
    let reason = status.canonical_reason().unwrap_or("error").to_lowercase();
    let mut json = ApiError::with_status(status, reason).into_response();
    for (name, value) in r.headers() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            json.headers_mut().insert(name.clone(), value.clone());
        }
    }
    json
}

/// `--api-key`: the keyed routes need `Authorization: Bearer KEY` (the scheme in any case) or
/// (as Anthropic's clients send it, and llama-server takes it) `x-api-key: KEY`, with one of
/// the keys; the key's hash is the request's tenant ([`tenant`]).
async fn auth(State(st): St, headers: HeaderMap, req: Request, next: Next) -> Response {
    if st.opts.api_keys.is_empty() {
        return next.run(req).await;
    }
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    let given = bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()));
    match given.and_then(|g| key_matches(g, &st.opts.api_keys)) {
        Some(k) => KEY.scope(k, next.run(req)).await,
        None => error_at(req.uri().path(), ApiError::unauthorized()),
    }
}

/// A host name as compared: the host part of a `Host` header value or an `--allowed-host`
/// (`[::1]:8080` → `::1`, `Name.LAN.:80` → `name.lan`), an IP address in its canonical form
/// (`::ffff:127.0.0.1` → `127.0.0.1`).
fn host_name(v: &str) -> String {
    let v = v.trim();
    let name = match v.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        // (An IPv6 address without brackets, as a flag may give it: no port.)
        None if v.matches(':').count() > 1 => v,
        None => v.rsplit_once(':').map_or(v, |(h, _)| h),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    match name.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.to_canonical().to_string(),
        Err(_) => name,
    }
}

/// Whether a `Host` value names this server: `localhost`, a loopback address, the bound
/// address, the address the connection `arrived` on or an `--allowed-host` name.
fn host_allowed(v: &str, h: &super::HttpLimits, arrived: Option<std::net::SocketAddr>) -> bool {
    let name = host_name(v);
    let is = |a: std::net::SocketAddr| a.ip().to_canonical().to_string() == name;
    name == "localhost"
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
        || h.bound.is_some_and(is)
        || arrived.is_some_and(is)
        || h.allowed_hosts.iter().any(|a| host_name(a) == name)
}

/// Whether a page of `origin` may call the server: its own origin (`http://` and the request's
/// `Host`), one given by `--cors-origin`, or any with `--cors-origin '*'`.
fn origin_allowed(origin: &str, host: Option<&str>, h: &super::HttpLimits) -> bool {
    let o = origin.trim().trim_end_matches('/');
    let own = host.is_some_and(|host| {
        o.eq_ignore_ascii_case(&format!("http://{host}"))
            || o.eq_ignore_ascii_case(&format!("https://{host}"))
    });
    own || h
        .cors_origins
        .iter()
        .any(|a| a == "*" || a.eq_ignore_ascii_case(o))
}

/// Browser checks, before any route: a `Host` that is not this server's is refused (403) on a
/// connection that arrived over loopback (DNS rebinding); a request with an `Origin` that is neither the
/// server's own nor allowed by `--cors-origin` is refused (403), an allowed one's preflight
/// (`OPTIONS`) answered and its answers given CORS headers; a POST from a web page (one with an
/// `Origin`, which browsers send on every POST) must declare its body `application/json` (415), so
/// that no form or text post of a page gets through without a preflight. A POST without an
/// `Origin` is no page's: its body is read as JSON whatever it declares, as Ollama and
/// llama-server read it (`curl -d '{..}'` declares a form).
async fn guard(State(st): St, req: Request, next: Next) -> Response {
    let h = &st.opts.http;
    let path = req.uri().path().to_string();
    let headers = req.headers();
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let forbidden = |msg: String| {
        let e = ApiError::with_status(StatusCode::FORBIDDEN, msg);
        error_at(&path, e)
    };
    // (The address the connection arrived on: on a server bound to every address, one that
    // came over loopback is checked as well.)
    let arrived = req.extensions().get::<super::conn::Arrived>().map(|a| a.0);
    if arrived
        .or(h.bound)
        .is_some_and(|a| a.ip().to_canonical().is_loopback())
    {
        if let Some(v) = headers.get(header::HOST) {
            let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
            if !host_allowed(&v, h, arrived) {
                return forbidden(format!(
                    "Host `{v}` is not this server (it listens on loopback; --allowed-host adds a name)"
                ));
            }
        }
    }
    let origin = headers
        .get(header::ORIGIN)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let cross = match &origin {
        None => false,
        Some(o) if !origin_allowed(o, host, h) => {
            return forbidden(format!(
                "requests from the web origin `{o}` are not allowed (--cors-origin allows one)"
            ))
        }
        Some(o) => !host.is_some_and(|host| {
            let o = o.trim().trim_end_matches('/');
            o.eq_ignore_ascii_case(&format!("http://{host}"))
                || o.eq_ignore_ascii_case(&format!("https://{host}"))
        }),
    };
    let allow_origin = |r: &mut Response, o: &str| {
        if let Ok(v) = header::HeaderValue::from_str(o.trim()) {
            r.headers_mut()
                .insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
            r.headers_mut()
                .insert(header::VARY, header::HeaderValue::from_static("Origin"));
        }
    };
    if req.method() == axum::http::Method::OPTIONS {
        if let Some(o) = &origin {
            let asked = headers
                .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
                .cloned()
                .unwrap_or(header::HeaderValue::from_static(
                    "authorization, content-type, x-api-key",
                ));
            let mut r = StatusCode::NO_CONTENT.into_response();
            allow_origin(&mut r, o);
            let hs = r.headers_mut();
            hs.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                header::HeaderValue::from_static("GET, POST, OPTIONS"),
            );
            hs.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
            hs.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                header::HeaderValue::from_static("600"),
            );
            return r;
        }
    }
    if req.method() == axum::http::Method::POST {
        let has_body = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_none_or(|n| n.trim() != "0")
            && (headers.contains_key(header::CONTENT_LENGTH)
                || headers.contains_key(header::TRANSFER_ENCODING));
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|t| {
                let t = t.trim();
                t.eq_ignore_ascii_case("application/json")
                    || (t.len() > 17
                        && t[..12].eq_ignore_ascii_case("application/")
                        && t.to_ascii_lowercase().ends_with("+json"))
            });
        if has_body && !json && origin.is_some() {
            let e = ApiError::with_status(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "the body must be JSON, declared `Content-Type: application/json`",
            );
            return error_at(&path, e);
        }
    }
    let mut r = next.run(req).await;
    if let (true, Some(o)) = (cross, &origin) {
        allow_origin(&mut r, o);
    }
    r
}

/// An error answered on `path`: in Ollama's shape on its `/api/` routes, Anthropic's on
/// `/v1/messages`, else OpenAI's.
fn error_at(path: &str, e: ApiError) -> Response {
    if path.starts_with("/api/") {
        super::ollama::OllamaError::from(e).into_response()
    } else if path == "/v1/messages" || path.starts_with("/v1/messages/") {
        super::anthropic::AnthropicError::from(e).into_response()
    } else {
        e.into_response()
    }
}

async fn not_found(req: Request) -> Response {
    let path = req.uri().path();
    error_at(path, ApiError::not_found(path))
}

async fn method_not_allowed(req: Request) -> Response {
    let path = req.uri().path();
    let e = ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        ..ApiError::bad_request(format!("{} is not allowed on {path}", req.method()))
    };
    error_at(path, e)
}

async fn health(State(st): St) -> Json<serde_json::Value> {
    let s = &st.sched;
    Json(json!({
        "status": "ok",
        "slots_total": s.slots_total.load(Relaxed),
        "slots_in_use": s.slots_in_use.load(Relaxed),
        "queue_depth": s.queue_depth.load(Relaxed),
    }))
}

async fn prometheus(State(st): St) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics::render(&st),
    )
        .into_response()
}

async fn models(State(st): St) -> Json<serde_json::Value> {
    let c = &st.model.config;
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.opts.model_id,
            "object": "model",
            "created": st.started,
            "owned_by": "kiln",
            "meta": {
                "architecture": format!("{:?}", c.arch).to_lowercase(),
                "n_ctx": st.opts.n_ctx,
                "n_ctx_train": c.ctx_train,
                "n_vocab": c.vocab_size,
                "n_embd": c.dim,
                "parallel": st.opts.n_slots,
            },
        }],
    }))
}

async fn chat(State(st): St, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let req: ChatRequest = api::parse(&read_body(&st, &headers, body).await?)?;
    let model = check_model(&st, &req.params.model)?;
    let (job, tools) = chat_job(&st, &req, model)?;
    match respond::run(&st, job).await {
        Err(e) => Err(tool_error(e, tools.as_ref(), &st).await),
        r => r,
    }
}

async fn completions(State(st): St, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let req: CompletionRequest = api::parse(&read_body(&st, &headers, body).await?)?;
    let model = check_model(&st, &req.params.model)?;
    respond::run(&st, completion_job(&st, &req, model)?).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bodiless_errors_get_a_json_body() {
        let bare = (StatusCode::METHOD_NOT_ALLOWED, [(header::ALLOW, "GET")]).into_response();
        let r = json_error_body(bare);
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(r.headers()[header::ALLOW], "GET");
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["message"], "method not allowed");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        // Answers with a body, and successes, are left alone.
        let ours = ApiError::not_found("/x").into_response();
        let body = axum::body::to_bytes(json_error_body(ours).into_body(), 1 << 16)
            .await
            .unwrap();
        assert!(String::from_utf8_lossy(&body).contains("no route for /x"));
        let ok = json_error_body(StatusCode::NO_CONTENT.into_response());
        assert_eq!(ok.status(), StatusCode::NO_CONTENT);
        assert_eq!(ok.body().size_hint().exact(), Some(0));
    }

    #[test]
    fn host_names_are_compared_normalized() {
        for (v, want) in [
            ("localhost", "localhost"),
            (" LocalHost.:8080", "localhost"),
            ("[::1]:80", "::1"),
            ("::1", "::1"),
            ("[0:0:0:0:0:0:0:1]", "::1"),
            ("[::FFFF:127.0.0.1]:80", "127.0.0.1"),
            ("Kiln.Lan.", "kiln.lan"),
            ("10.0.0.2:8080", "10.0.0.2"),
        ] {
            assert_eq!(host_name(v), want, "{v}");
        }
        let h = super::super::HttpLimits {
            allowed_hosts: vec!["Kiln.LAN.".into(), "[FD00::1]:80".into(), "fd00::2".into()],
            bound: Some("0.0.0.0:8080".parse().unwrap()),
            ..Default::default()
        };
        let arrived = Some("192.168.1.5:8080".parse().unwrap());
        for ok in [
            "kiln.lan",
            "KILN.lan.:9",
            "[fd00::1]",
            "[fd00::2]:8080",
            "192.168.1.5:8080",
            "127.0.0.2",
            "[::1]",
            "[::ffff:127.0.0.1]",
            "localhost.",
        ] {
            assert!(host_allowed(ok, &h, arrived), "{ok}");
        }
        for bad in [
            "evil.example",
            "kiln.lan.evil.example",
            "192.168.1.6",
            "[fd00::3]",
            "localhost.evil.example",
            "",
        ] {
            assert!(!host_allowed(bad, &h, arrived), "{bad}");
        }
        assert!(!host_allowed("192.168.1.5", &h, None));
    }
}
