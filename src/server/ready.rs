//! Readiness: the port answers while the model loads.
//!
//! Until the routes exist every request is answered 503 with llama-server's body
//! (`{"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}`, plus
//! `"status": "loading"` on `/health`) and `Retry-After: 1`; then every request goes to them.
//! Routers (sglang-router's startup and health checks, nginx upstream checks) and Kubernetes
//! readiness probes thus tell a replica that is up but not ready from one that is ready.

use std::sync::{Arc, OnceLock};

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use tower::ServiceExt;

/// The app the listener serves: `loading` until `app` is set, then `app`.
pub(super) fn gate(app: Arc<OnceLock<Router>>) -> Router {
    Router::new().fallback(move |req: Request| {
        let app = Arc::clone(&app);
        async move {
            match app.get() {
                Some(router) => match router.clone().oneshot(req).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                },
                None => loading(req.uri().path()),
            }
        }
    })
}

/// The answer while the model loads.
fn loading(path: &str) -> Response {
    let mut body = serde_json::json!({
        "error": {
            "code": 503,
            "message": "Loading model",
            "type": "unavailable_error",
            "param": null,
        }
    });
    if path == "/health" || path == "/v1/health" {
        body["status"] = "loading".into();
    }
    let mut r = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::routing::get;

    async fn call(app: &Router, path: &str) -> (StatusCode, serde_json::Value) {
        let req = Request::builder().uri(path).body(Body::empty()).unwrap();
        let r = app.clone().oneshot(req).await.unwrap();
        let status = r.status();
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn loading_then_ready() {
        let cell = Arc::new(OnceLock::new());
        let app = gate(Arc::clone(&cell));
        let (status, body) = call(&app, "/health").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["status"], "loading");
        assert_eq!(body["error"]["message"], "Loading model");
        let (status, body) = call(&app, "/v1/models").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["error"]["type"], "unavailable_error");
        assert!(body.get("status").is_none());
        let ready = Router::new().route(
            "/health",
            get(|| async { Json(serde_json::json!({"status": "ok"})) }),
        );
        cell.set(ready).unwrap();
        let (status, body) = call(&app, "/health").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["status"], "ok");
    }
}
