//! The stored responses: each with its conversation (for `previous_response_id`) and the
//! response object as it was answered (for `GET /v1/responses/{id}`), by tenant, the last
//! [`STORE_CAPACITY`] in memory.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use serde_json::Value;

use crate::server::error::ApiError;

/// How many responses the store keeps (all tenants together); the least recently used goes.
pub const STORE_CAPACITY: usize = 1024;

/// A stored response.
struct Stored {
    tenant: u64,
    id: String,
    /// Its conversation as chat messages (input and output).
    messages: Vec<Value>,
    /// The response object.
    response: Value,
}

/// The stored responses, most recently used last.
static STORE: Mutex<VecDeque<Stored>> = Mutex::new(VecDeque::new());

fn lock() -> MutexGuard<'static, VecDeque<Stored>> {
    STORE.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn put(tenant: u64, id: String, messages: Vec<Value>, response: Value) {
    let mut s = lock();
    while s.len() >= STORE_CAPACITY {
        s.pop_front();
    }
    s.push_back(Stored {
        tenant,
        id,
        messages,
        response,
    });
}

/// The tenant's stored response `id`, now the most recently used, through `f`.
fn with<T>(tenant: u64, id: &str, f: impl FnOnce(&Stored) -> T) -> Option<T> {
    let mut s = lock();
    let i = s.iter().position(|r| r.tenant == tenant && r.id == id)?;
    let r = s.remove(i)?;
    let out = f(&r);
    s.push_back(r);
    Some(out)
}

/// The conversation of the tenant's stored response `id`.
pub(super) fn messages(tenant: u64, id: &str) -> Option<Vec<Value>> {
    with(tenant, id, |r| r.messages.clone())
}

/// The tenant's stored response `id`, as it was answered.
pub(super) fn response(tenant: u64, id: &str) -> Option<Value> {
    with(tenant, id, |r| r.response.clone())
}

/// Forget the tenant's stored response `id`; whether there was one.
pub(super) fn delete(tenant: u64, id: &str) -> bool {
    let mut s = lock();
    let found = s.iter().position(|r| r.tenant == tenant && r.id == id);
    found.and_then(|i| s.remove(i)).is_some()
}

/// The 404 of an id the tenant has not stored (or no longer).
pub(super) fn not_found(id: &str) -> ApiError {
    ApiError {
        status: axum::http::StatusCode::NOT_FOUND,
        ..ApiError::invalid_param("response_id", format!("no stored response with id {id:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_store_is_per_tenant_and_bounded() {
        let msgs = vec![json!({"role": "user", "content": "x"})];
        put(7, "resp_a".into(), msgs.clone(), json!({"id": "resp_a"}));
        assert_eq!(messages(7, "resp_a"), Some(msgs));
        assert_eq!(response(7, "resp_a"), Some(json!({"id": "resp_a"})));
        assert!(messages(8, "resp_a").is_none(), "another tenant's");
        assert!(response(8, "resp_a").is_none(), "another tenant's");
        assert!(!delete(8, "resp_a"), "another tenant's");
        for i in 0..STORE_CAPACITY {
            put(9, format!("resp_fill{i}"), Vec::new(), Value::Null);
        }
        assert!(
            messages(7, "resp_a").is_none(),
            "the least recently used goes"
        );
        assert!(messages(9, &format!("resp_fill{}", STORE_CAPACITY - 1)).is_some());
        // Deleted: gone, once.
        assert!(delete(9, "resp_fill5"));
        assert!(response(9, "resp_fill5").is_none());
        assert!(!delete(9, "resp_fill5"));
    }
}
