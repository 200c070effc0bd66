//! The web chat page at `/` (off with `--no-webui`): `webui/` of the repository, built into the
//! binary, so that it works offline and needs no CDN.
//!
//! The page (`index.html`) is public, like `/health`; it calls the API routes with the key the
//! user gives it, under the server's usual rules. Its scripts, styles and the vendored
//! libraries (`webui/vendor/`, fetched from the npm registry by `webui/vendor.sh` and committed)
//! are served under `/webui/VERSION/`, where VERSION is a hash of every asset: they are cached
//! for good, and a new binary's page names new URLs. The page itself is revalidated each time
//! (`ETag`). Every answer forbids framing and content sniffing; the page's
//! `Content-Security-Policy` allows only this server's own scripts, styles and connections, so
//! that a model's answer, rendered as HTML, can run nothing even if the sanitizer missed it.

use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::error::ApiError;

/// The page, with `{{VERSION}}` where the asset URLs carry the version.
const INDEX: &str = include_str!("../../webui/index.html");

/// Each asset: its name under `/webui/VERSION/`, its content type, its bytes.
const ASSETS: [(&str, &str, &[u8]); 11] = [
    ("app.js", JS, include_bytes!("../../webui/app.js")),
    ("style.css", CSS, include_bytes!("../../webui/style.css")),
    (
        "marked.min.js",
        JS,
        include_bytes!("../../webui/vendor/marked.min.js"),
    ),
    (
        "purify.min.js",
        JS,
        include_bytes!("../../webui/vendor/purify.min.js"),
    ),
    (
        "highlight.min.js",
        JS,
        include_bytes!("../../webui/vendor/highlight.min.js"),
    ),
    (
        "hljs-light.min.css",
        CSS,
        include_bytes!("../../webui/vendor/hljs-light.min.css"),
    ),
    (
        "hljs-dark.min.css",
        CSS,
        include_bytes!("../../webui/vendor/hljs-dark.min.css"),
    ),
    (
        "LICENSE.marked",
        TEXT,
        include_bytes!("../../webui/vendor/LICENSE.marked"),
    ),
    (
        "LICENSE.dompurify",
        TEXT,
        include_bytes!("../../webui/vendor/LICENSE.dompurify"),
    ),
    (
        "LICENSE.highlight.js",
        TEXT,
        include_bytes!("../../webui/vendor/LICENSE.highlight.js"),
    ),
    (
        "VERSIONS",
        TEXT,
        include_bytes!("../../webui/vendor/VERSIONS"),
    ),
];

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";
const HTML: &str = "text/html; charset=utf-8";

/// The page's policy: its own origin only (`'self'`), no plug-ins, no framing, no `<base>`; images
/// also as `data:` URLs (a model's Markdown may hold one).
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `/` and `/webui/{version}/{file}`.
pub(super) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route("/webui/{version}/{file}", get(asset))
}

/// A hash of every asset (FNV-1a, 64 bits, in hex): the version in their URLs.
fn version() -> &'static str {
    static V: OnceLock<String> = OnceLock::new();
    V.get_or_init(|| {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for (name, _, bytes) in ASSETS {
            for b in name.bytes().chain([0]).chain(bytes.iter().copied()) {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        format!("{h:016x}")
    })
}

/// The page with its asset URLs.
fn page() -> &'static str {
    static P: OnceLock<String> = OnceLock::new();
    P.get_or_init(|| INDEX.replace("{{VERSION}}", version()))
}

/// Headers every answer of the page's routes carries.
fn common(r: &mut Response, content_type: &'static str) {
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
}

async fn index(headers: HeaderMap) -> Response {
    let etag = format!("\"{}\"", version());
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut r = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        page().into_response()
    };
    common(&mut r, HTML);
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    r
}

async fn asset(Path((v, file)): Path<(String, String)>) -> Response {
    let Some((_, content_type, bytes)) = ASSETS.iter().find(|(name, _, _)| *name == file) else {
        return ApiError::not_found(&format!("/webui/{v}/{file}")).into_response();
    };
    let mut r = bytes.into_response();
    common(&mut r, content_type);
    // (A page of another version asks for its own URLs: answered with these bytes, but not
    // kept.)
    let cache = if v == version() {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::extract::Request;
    use tower::ServiceExt;

    async fn get(path: &str, headers: &[(&str, &str)]) -> (StatusCode, HeaderMap, Vec<u8>) {
        let mut req = Request::builder().uri(path);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let r = routes::<()>()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let (parts, body) = r.into_parts();
        let body = axum::body::to_bytes(body, 1 << 24).await.unwrap().to_vec();
        (parts.status, parts.headers, body)
    }

    #[tokio::test]
    async fn the_page_names_every_script_and_style_at_this_version() {
        let (status, h, body) = get("/", &[]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(h[header::CONTENT_TYPE], HTML);
        assert_eq!(h[header::CACHE_CONTROL], "no-cache");
        assert!(h[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .contains("script-src 'self'"));
        let page = String::from_utf8(body).unwrap();
        assert!(!page.contains("{{VERSION}}"));
        // Every asset the page refers to is served, with its content type, cached for good.
        let mut named = 0;
        for part in page.split("/webui/").skip(1) {
            let url = format!("/webui/{}", part.split('"').next().unwrap());
            assert!(url.starts_with(&format!("/webui/{}/", version())), "{url}");
            let (status, h, body) = get(&url, &[]).await;
            assert_eq!(status, StatusCode::OK, "{url}");
            assert!(!body.is_empty(), "{url}");
            let want = if url.ends_with(".js") { JS } else { CSS };
            assert_eq!(h[header::CONTENT_TYPE], want, "{url}");
            assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
            assert!(h[header::CACHE_CONTROL]
                .to_str()
                .unwrap()
                .contains("immutable"));
            named += 1;
        }
        // app.js, style.css, the three libraries and the two highlighting themes.
        assert_eq!(named, 7, "{page}");
    }

    #[tokio::test]
    async fn the_page_is_revalidated_by_etag() {
        let (_, h, _) = get("/", &[]).await;
        let etag = h[header::ETAG].to_str().unwrap().to_string();
        let (status, _, body) = get("/", &[("if-none-match", &etag)]).await;
        assert_eq!(status, StatusCode::NOT_MODIFIED);
        assert!(body.is_empty());
        let (status, _, _) = get("/", &[("if-none-match", "\"other\"")]).await;
        assert_eq!(status, StatusCode::OK);
    }

    #[tokio::test]
    async fn unknown_assets_are_not_found_and_old_versions_not_kept() {
        let (status, _, body) = get(&format!("/webui/{}/secret.js", version()), &[]).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(String::from_utf8_lossy(&body).contains("secret.js"));
        let (status, _, _) = get("/webui/v/..%2Fmod.rs", &[]).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, h, _) = get("/webui/0123/app.js", &[]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(h[header::CACHE_CONTROL], "no-cache");
        let (status, h, _) = get(&format!("/webui/{}/LICENSE.marked", version()), &[]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(h[header::CONTENT_TYPE], TEXT);
    }
}
