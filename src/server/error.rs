//! OpenAI-style error responses: `{"error": {"message", "type", "param", "code"}}` with the
//! HTTP status a client expects.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `server_error`, ...
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds, for 429 and 503.
    pub retry_after: Option<u64>,
    /// Answer with `Connection: close` (the request body was left unread).
    pub close: bool,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
            close: false,
        }
    }

    /// Any error status, with OpenAI's `type` for its class (`invalid_request_error` for 4xx,
    /// `server_error` for 5xx).
    pub fn with_status(status: StatusCode, message: impl Into<String>) -> ApiError {
        let kind = if status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        };
        ApiError::new(status, kind, message)
    }

    /// 400: the request is malformed or asks for something impossible.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the offending parameter.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::bad_request(message)
        }
    }

    /// 400 naming `param` where one of `ids` is not a token id of a `vocab`-token vocabulary.
    pub fn check_token_ids(
        param: &str,
        ids: impl IntoIterator<Item = u32>,
        vocab: usize,
    ) -> Result<(), ApiError> {
        match ids.into_iter().find(|&t| t as usize >= vocab) {
            Some(bad) => Err(ApiError::invalid_param(
                param,
                format!("token id {bad} is outside the vocabulary of {vocab}"),
            )),
            None => Ok(()),
        }
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "missing or incorrect API key (send `Authorization: Bearer KEY` or `x-api-key: KEY`)",
            )
        }
    }

    pub fn model_not_found(model: &str, served: &str) -> ApiError {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("the model `{model}` does not exist; this server serves `{served}`"),
            )
        }
    }

    pub fn not_found(path: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no route for {path}"),
        )
    }

    /// 413; the rest of the body is not read, so the connection closes.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            close: true,
            ..ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("request body larger than {limit} bytes (--max-body)"),
            )
        }
    }

    /// 408: the body did not arrive within `--body-timeout`.
    pub fn body_timeout(secs: f64) -> ApiError {
        ApiError {
            close: true,
            code: Some("request_timeout"),
            ..ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!("the request body did not arrive within {secs} s (--body-timeout)"),
            )
        }
    }

    /// 429: `parallel` requests are generating and `queue` more wait.
    pub fn queue_full(parallel: usize, queue: usize) -> ApiError {
        ApiError {
            code: Some("rate_limit_exceeded"),
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!(
                    "the server is busy ({parallel} requests generating, {queue} waiting: the --parallel and --queue limits); retry shortly"
                ),
            )
        }
    }

    /// 501: a feature this server was not started with (llama-server's `not_supported_error`).
    pub fn not_supported(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_IMPLEMENTED, "not_supported_error", message)
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl ApiError {
    /// The error's response (status, `Retry-After`, `Connection: close`) with another API's
    /// body (Ollama's, Anthropic's).
    pub fn with_body(self, body: serde_json::Value) -> Response {
        let mut r = self.into_response();
        *r.body_mut() = axum::body::Body::from(body.to_string());
        r.headers_mut().remove(header::CONTENT_LENGTH);
        r
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.close {
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        r
    }
}
