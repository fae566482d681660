//! The HTTP API: items through the cache, and what an operator looks at.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use onefill::{Cache, Error as CacheError, Outcome};
use serde_json::json;

use crate::origin::{Item, ItemUpdate, Origin};

/// What every handler shares.
#[derive(Clone)]
pub struct App {
    pub origin: Origin,
    /// `None`: `--no-cache`, every read queries PostgreSQL.
    pub cache: Option<Cache<i64, Item>>,
    /// `redis`, `memory` or `off`, for `/stats`.
    pub cache_kind: &'static str,
    pub prometheus: Arc<PrometheusHandle>,
}

pub fn router(app: App) -> Router {
    Router::new()
        .route("/items/{id}", get(get_item).put(put_item))
        .route("/stats", get(stats))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(app)
}

/// `x-cache` tells how onefill answered (`off` without a cache).
const X_CACHE: &str = "x-cache";

async fn get_item(State(app): State<App>, Path(id): Path<i64>) -> Response {
    let Some(cache) = &app.cache else {
        let found = app.origin.read_item(id).await;
        return match found {
            Ok(item) => item_response(id, item, "off"),
            Err(e) => error(StatusCode::BAD_GATEWAY, e.to_string()),
        };
    };
    // The loader is `'static`: it owns a clone of the origin (a pool
    // handle, cheap to clone), not a borrow of the request's state.
    let origin = app.origin.clone();
    let fetched = cache
        .fetch_optional(&id, move |id| async move { origin.read_item(id).await })
        .await;
    match fetched {
        Ok(fetched) => item_response(id, fetched.value, outcome_name(fetched.outcome)),
        Err(e) => cache_error(e),
    }
}

async fn put_item(
    State(app): State<App>,
    Path(id): Path<i64>,
    Json(update): Json<ItemUpdate>,
) -> Response {
    let updated = match app.origin.update_item(id, &update).await {
        Ok(Some(item)) => item,
        Ok(None) => return error(StatusCode::NOT_FOUND, format!("no item {id}")),
        Err(e) => return error(StatusCode::BAD_GATEWAY, e.to_string()),
    };
    // Invalidate, not `set`: two writers' `set`s can land in the other
    // order than their commits and leave the older row cached, while an
    // invalidation also fences out a load that read the row before this
    // write (it answers its callers but is not stored).
    let mut response = Json(&updated).into_response();
    if let Some(cache) = &app.cache {
        if let Err(e) = cache.invalidate(&id).await {
            // The row is written; the cache may serve the old one until
            // its TTL. Say so rather than fail a write that happened.
            eprintln!("onefill-service: invalidating item {id} failed: {e}");
            response
                .headers_mut()
                .insert("x-cache-invalidated", HeaderValue::from_static("false"));
        }
    }
    response
}

async fn stats(State(app): State<App>) -> Response {
    let origin = match app.origin.counts().await {
        Ok(counts) => counts,
        Err(e) => return error(StatusCode::BAD_GATEWAY, e.to_string()),
    };
    Json(json!({
        "database": app.origin.database(),
        "cache": app.cache_kind,
        "origin": origin,
        "onefill": app.cache.as_ref().map(Cache::stats),
    }))
    .into_response()
}

async fn metrics(State(app): State<App>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.prometheus.render(),
    )
        .into_response()
}

async fn healthz(State(app): State<App>) -> Response {
    match app.origin.ping().await {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

fn item_response(id: i64, item: Option<Item>, how: &'static str) -> Response {
    let mut response = match item {
        Some(item) => Json(item).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no item {id}")),
    };
    response
        .headers_mut()
        .insert(X_CACHE, HeaderValue::from_static(how));
    response
}

fn outcome_name(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Hit => "hit",
        Outcome::Stale => "stale",
        Outcome::Loaded => "loaded",
        Outcome::Waited => "waited",
        Outcome::Degraded => "degraded",
        _ => "other",
    }
}

fn cache_error(e: CacheError) -> Response {
    let status = match &e {
        CacheError::Loader(_) | CacheError::LoaderPanicked(_) | CacheError::LoadTimedOut(_) => {
            StatusCode::BAD_GATEWAY
        }
        CacheError::WaitTimedOut(_) | CacheError::Backend(_) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, e.to_string())
}

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}
